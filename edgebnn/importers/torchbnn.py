"""Adapter for torchbnn (Harry24k): ``BayesLinear``, ``BayesConv2d`` and ``BayesBatchNorm2d``.

sigma = exp(log_sigma). ``BayesBatchNorm2d`` samples its affine scale and shift; in eval mode it
normalises with the running statistics, so it imports as a batch norm whose scale and shift are Gaussian.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edgebnn.errors import UnsupportedLayerError
from edgebnn.importers.base import LayerPosterior, conv_posterior, describe, loaded, to_numpy

if TYPE_CHECKING:
    import torch


def _sigma(log_sigma: Any) -> np.ndarray:
    return np.exp(to_numpy(log_sigma).astype(np.float64)).astype(np.float32)


def _batchnorm(m: Any, path: str) -> LayerPosterior:
    if not m.affine:
        raise UnsupportedLayerError(f"{describe(m, path)}: affine=False has no posterior; use nn.BatchNorm2d")
    if not m.track_running_stats:
        raise UnsupportedLayerError(
            f"{describe(m, path)}: track_running_stats=False normalises with each batch's statistics; "
            "train with running statistics so one example's prediction does not depend on the batch"
        )
    return LayerPosterior(
        path, "batchnorm", to_numpy(m.weight_mu), _sigma(m.weight_log_sigma), to_numpy(m.bias_mu),
        _sigma(m.bias_log_sigma), running_mean=to_numpy(m.running_mean), running_var=to_numpy(m.running_var),
        eps=float(m.eps),
    )


class TorchBNNAdapter:
    """Reads torchbnn's Bayesian layers."""

    library = "torchbnn"

    def matches(self, module: torch.nn.Module) -> bool:
        bnn = loaded("torchbnn")
        layers = () if bnn is None else (bnn.BayesLinear, bnn.BayesConv2d, bnn.BayesBatchNorm2d)
        return isinstance(module, layers)

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        bnn = loaded("torchbnn")
        cls = type(module)
        if bnn is None or cls not in (bnn.BayesLinear, bnn.BayesConv2d, bnn.BayesBatchNorm2d):
            raise UnsupportedLayerError(
                f"{describe(module, path)}: not supported; edgebnn reads torchbnn BayesLinear, BayesConv2d and "
                "BayesBatchNorm2d"
            )
        m: Any = module
        if cls is bnn.BayesBatchNorm2d:
            return _batchnorm(m, path)
        bias: tuple[np.ndarray, np.ndarray] | tuple[None, None] = (None, None)
        if m.bias:  # torchbnn keeps a bool here; bias_mu is None when it is False
            bias = (to_numpy(m.bias_mu), _sigma(m.bias_log_sigma))
        weight = (to_numpy(m.weight_mu), _sigma(m.weight_log_sigma))
        if cls is bnn.BayesLinear:
            return LayerPosterior(path, "linear", *weight, *bias)
        if m.padding_mode != "zeros":
            raise UnsupportedLayerError(f"{describe(m, path)}: padding_mode={m.padding_mode!r} is not supported")
        return conv_posterior(m, path, weight, bias)


ADAPTER = TorchBNNAdapter()
