"""Adapter for edgebnn's own layers (:mod:`edgebnn.nn`): ``weight_mu``/``weight_rho``, sigma = softplus(rho)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edgebnn.importers.base import LayerPosterior, ntuple, softplus, to_numpy

if TYPE_CHECKING:
    import torch


class EdgeBNNAdapter:
    library = "edgebnn"

    def matches(self, module: torch.nn.Module) -> bool:
        from edgebnn.nn import BayesConv2d, BayesLinear

        return isinstance(module, (BayesLinear, BayesConv2d))

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        from edgebnn.nn import BayesConv2d

        m: Any = module
        bias: tuple[np.ndarray, np.ndarray] | tuple[None, None] = (None, None)
        if m.bias_mu is not None:
            bias = (to_numpy(m.bias_mu), softplus(to_numpy(m.bias_rho)))
        weight = (to_numpy(m.weight_mu), softplus(to_numpy(m.weight_rho)))
        if not isinstance(m, BayesConv2d):
            return LayerPosterior(path, "linear", *weight, *bias)
        return LayerPosterior(
            path, "conv", weight[0], weight[1], bias[0], bias[1], stride=ntuple(m.stride, 2, "stride", path),
            padding=ntuple(m.padding, 2, "padding", path), dilation=ntuple(m.dilation, 2, "dilation", path),
            groups=int(m.groups),
        )


ADAPTER = EdgeBNNAdapter()
