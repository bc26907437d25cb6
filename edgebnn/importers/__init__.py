"""Importers: read a trained PyTorch BNN (edgebnn, bayesian-torch, torchbnn, blitz) into the IR.

``import_model`` does the work; :mod:`edgebnn.importers.checkpoint` loads factories and weights safely;
:mod:`edgebnn.importers.ensemble` (deep ensembles) and :mod:`edgebnn.importers.swag` (SWAG statistics) import
plain models as the posterior families.
"""

from __future__ import annotations

from edgebnn.importers._torch import find_bayesian_layers, import_model
from edgebnn.importers.base import LayerAdapter, LayerPosterior

__all__ = ["LayerAdapter", "LayerPosterior", "find_bayesian_layers", "import_model"]
