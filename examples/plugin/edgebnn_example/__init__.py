"""An example edgebnn plug-in package, written against edgebnn's public interface only (docs/extending.md).

- :mod:`edgebnn_example.rownoise`: a posterior family (Gaussian noise multiplying each output row of a weight), its
  torch layer and importer, its in-graph draw, a compact store and a ``fixed`` lowering.

Installed, it declares each module as an entry point in the group ``edgebnn.plugins`` (pyproject.toml), so every
``edgebnn`` command and ``import edgebnn`` users load it by themselves.
"""
