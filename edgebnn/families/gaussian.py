"""The mean-field Gaussian family: every weight ``w ~ N(μ, σ²)`` on its own (``GaussianWeight``), what
Bayes-by-backprop and variational inference train (edgebnn's layers and recipes, bayesian-torch, torchbnn, blitz)
and what a diagonal Laplace or SWAG-diagonal posterior is.

- importers: one adapter per library (:mod:`edgebnn.importers`), each reading a layer's μ and σ;
- draw: ``W_s = μ + σ ⊙ ε_s`` (the default for ``GAUSSIAN`` encodings, :func:`edgebnn.exporters.draws.gaussian_draw`);
- store: none (``--weights ir`` writes μ and σ as fp32; ``--weights int8|int4`` codes them at export);
- lowerings: the schemes themselves (:mod:`edgebnn.passes`: ``fixed``, ``mcq``, ``codebook``, ``ternary``,
  ``binary``, ``prune``) lower this encoding into the quantized families;
- analytic: exact (independent weights).
"""

from __future__ import annotations

from edgebnn.family import EXACT, Family, register_family
from edgebnn.importers import bayesian_torch, blitz, edgebnn_layers, recipes, torchbnn
from edgebnn.ir.encodings import GaussianWeight

FAMILY = register_family(Family(
    "gaussian", (GaussianWeight,), "mean-field Gaussian: w ~ N(mu, sigma^2) per weight (VI, diagonal Laplace)",
    adapters=(edgebnn_layers.ADAPTER, recipes.VNQ_ADAPTER, recipes.BC_ADAPTER, recipes.EBP_ADAPTER,
              recipes.TIED_ADAPTER, bayesian_torch.ADAPTER, torchbnn.ADAPTER, blitz.ADAPTER),
    analytic=EXACT,
))
