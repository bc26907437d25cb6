"""An example edgebnn plug-in package, written against edgebnn's public interface only (docs/extending.md).

- :mod:`edgebnn_example.rownoise`: a posterior family (Gaussian noise multiplying each output row of a weight), its
  torch layer and importer, its in-graph draw, a compact store and a ``fixed`` lowering;
- :mod:`edgebnn_example.multilabel`: a task (K independent labels, a sigmoid each: per-label predictive, entropy and
  mutual information; per-label accuracy, binary cross-entropy, ECE over (input, label) pairs, Brier).

Installed, it declares each module as an entry point in the group ``edgebnn.plugins`` (pyproject.toml), so every
``edgebnn`` command and ``import edgebnn`` users load it by themselves.
"""
