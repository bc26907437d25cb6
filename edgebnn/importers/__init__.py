"""Importers: read a trained PyTorch BNN (edgebnn, bayesian-torch, torchbnn, blitz) into the IR.

``import_model`` does the work; :mod:`edgebnn.importers.checkpoint` loads factories and weights safely.
"""

from __future__ import annotations

from edgebnn.importers._torch import find_bayesian_layers, import_model
from edgebnn.importers.base import LayerAdapter, LayerPosterior

__all__ = ["LayerAdapter", "LayerPosterior", "find_bayesian_layers", "import_model"]
