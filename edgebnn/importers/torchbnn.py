"""Adapter for torchbnn (Harry24k): ``BayesLinear`` and ``BayesConv2d``, sigma = exp(log_sigma)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgebnn.errors import UnsupportedLayerError
from edgebnn.importers.base import LayerPosterior, to_numpy
from edgebnn.importers.bayesian_torch import conv_geometry, describe, loaded

if TYPE_CHECKING:
    import torch


def _sigma(log_sigma: torch.Tensor) -> np.ndarray:
    return np.exp(to_numpy(log_sigma).astype(np.float64)).astype(np.float32)


class TorchBNNAdapter:
    """Reads torchbnn layers; its Bayesian batch norm matches too, and is refused."""

    library = "torchbnn"

    def matches(self, module: torch.nn.Module) -> bool:
        bnn = loaded("torchbnn")
        layers = () if bnn is None else (bnn.BayesLinear, bnn.BayesConv2d, bnn.BayesBatchNorm2d)
        return isinstance(module, layers)

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        bnn = loaded("torchbnn")
        cls = type(module)
        if bnn is None or cls not in (bnn.BayesLinear, bnn.BayesConv2d):
            raise UnsupportedLayerError(
                f"{describe(module, path)}: not supported; edgebnn reads torchbnn BayesLinear and BayesConv2d"
            )
        bias_mu = bias_sigma = None
        if module.bias:  # torchbnn keeps a bool here; bias_mu is None when it is False
            bias_mu, bias_sigma = to_numpy(module.bias_mu), _sigma(module.bias_log_sigma)
        weight_mu, weight_sigma = to_numpy(module.weight_mu), _sigma(module.weight_log_sigma)
        if cls is bnn.BayesLinear:
            return LayerPosterior(path, "linear", weight_mu, weight_sigma, bias_mu, bias_sigma)
        if module.padding_mode != "zeros":
            mode = module.padding_mode
            raise UnsupportedLayerError(f"{describe(module, path)}: padding_mode={mode!r} is not supported")
        geometry = conv_geometry(module, path, (weight_mu.shape[2], weight_mu.shape[3]))
        return LayerPosterior(path, "conv2d", weight_mu, weight_sigma, bias_mu, bias_sigma, **geometry)


ADAPTER = TorchBNNAdapter()
