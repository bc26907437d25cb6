"""Adapter for edgebnn's own layers (:mod:`edgebnn.nn`): ``weight_mu``/``weight_rho``, sigma = softplus(rho)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgebnn.importers.base import LayerPosterior, pair, softplus, to_numpy

if TYPE_CHECKING:
    import torch


class EdgeBNNAdapter:
    library = "edgebnn"

    def matches(self, module: torch.nn.Module) -> bool:
        from edgebnn.nn import BayesConv2d, BayesLinear

        return isinstance(module, (BayesLinear, BayesConv2d))

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        from edgebnn.nn import BayesConv2d

        has_bias = getattr(module, "bias_mu", None) is not None
        common = {
            "path": path,
            "weight_mu": to_numpy(module.weight_mu),
            "weight_sigma": softplus(to_numpy(module.weight_rho)),
            "bias_mu": to_numpy(module.bias_mu) if has_bias else None,
            "bias_sigma": softplus(to_numpy(module.bias_rho)) if has_bias else None,
        }
        if isinstance(module, BayesConv2d):
            return LayerPosterior(
                kind="conv2d",
                stride=pair(module.stride, "stride", path),
                padding=pair(module.padding, "padding", path),
                dilation=pair(module.dilation, "dilation", path),
                groups=int(module.groups),
                **common,
            )
        return LayerPosterior(kind="linear", **common)


ADAPTER = EdgeBNNAdapter()
