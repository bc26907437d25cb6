"""Adapter for bayesian-torch (Intel Labs): reparameterization and flipout Linear/Conv2d layers.

Also home of :func:`loaded`, :func:`describe` and :func:`conv_geometry`, which the blitz and torchbnn
adapters share.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Literal, TypedDict

from edgebnn.errors import UnsupportedLayerError
from edgebnn.importers.base import LayerPosterior, pair, softplus, to_numpy

if TYPE_CHECKING:
    import torch


class ConvGeometry(TypedDict):
    """The conv geometry fields of a :class:`LayerPosterior`."""

    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int


def loaded(name: str) -> ModuleType | None:
    """Module ``name`` if its package has been imported, else None.

    No instance of a library's layers can exist before the library is imported, so an adapter never
    imports a library the model has not already imported, and edgebnn works without it.
    """
    if sys.modules.get(name.partition(".")[0]) is None:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # an unrelated package of the same name
        return None


def describe(module: torch.nn.Module, path: str) -> str:
    """The prefix of every message about one layer: ``layer 'features.0' (Conv2dFlipout)``."""
    return f"layer {path!r} ({type(module).__name__})"


def conv_geometry(module: torch.nn.Module, path: str, kernel: tuple[int, int]) -> ConvGeometry:
    """Stride, padding, dilation and groups of a layer that calls ``F.conv2d`` with its own attributes.

    String padding is converted where torch's meaning is a symmetric pad: ``'valid'`` always,
    ``'same'`` when stride is 1 and each dilated kernel extent is even; otherwise the layer is refused.
    """
    stride = pair(module.stride, "stride", path)
    dilation = pair(module.dilation, "dilation", path)
    padding = module.padding
    if isinstance(padding, str):
        extents = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
        if padding == "valid":
            padding = (0, 0)
        elif padding == "same" and stride == (1, 1) and all(e % 2 == 0 for e in extents):
            padding = (extents[0] // 2, extents[1] // 2)
        else:
            raise UnsupportedLayerError(
                f"{describe(module, path)}: padding={padding!r} with kernel {kernel}, stride {stride} and "
                f"dilation {dilation} is not a symmetric pad; give padding as ints"
            )
    groups = module.groups
    if not isinstance(groups, int) or groups < 1:
        raise UnsupportedLayerError(f"{describe(module, path)}: groups={groups!r} is not a positive int")
    padding = pair(padding, "padding", path)
    return ConvGeometry(stride=stride, padding=padding, dilation=dilation, groups=groups)


class BayesianTorchAdapter:
    """Reads bayesian-torch layers: sigma = log1p(exp(rho)) for weights and biases.

    Every bayesian-torch variational layer matches, so that those edgebnn cannot read (1-D/3-D and
    transposed convs, LSTMs, quantized layers, subclasses) are refused by :meth:`extract` instead of
    being exported as if they were deterministic.
    """

    library = "bayesian-torch"

    def matches(self, module: torch.nn.Module) -> bool:
        layers = loaded("bayesian_torch.layers")
        return layers is not None and isinstance(module, layers.BaseVariationalLayer_)

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        layers = loaded("bayesian_torch.layers")
        kinds: dict[type, Literal["linear", "conv2d"]] = {}
        if layers is not None:
            kinds = {
                layers.LinearReparameterization: "linear",
                layers.LinearFlipout: "linear",
                layers.Conv2dReparameterization: "conv2d",
                layers.Conv2dFlipout: "conv2d",
            }
        kind = kinds.get(type(module))
        if kind is None:
            names = ", ".join(cls.__name__ for cls in kinds) or "layers"
            raise UnsupportedLayerError(
                f"{describe(module, path)}: not supported; edgebnn reads bayesian-torch {names}"
            )
        bias_mu = None if module.mu_bias is None else to_numpy(module.mu_bias)
        bias_sigma = None if module.rho_bias is None else softplus(to_numpy(module.rho_bias))
        if kind == "linear":
            return LayerPosterior(
                path=path,
                kind=kind,
                weight_mu=to_numpy(module.mu_weight),
                weight_sigma=softplus(to_numpy(module.rho_weight)),
                bias_mu=bias_mu,
                bias_sigma=bias_sigma,
            )
        weight_mu = to_numpy(module.mu_kernel)
        return LayerPosterior(
            path=path,
            kind=kind,
            weight_mu=weight_mu,
            weight_sigma=softplus(to_numpy(module.rho_kernel)),
            bias_mu=bias_mu,
            bias_sigma=bias_sigma,
            **conv_geometry(module, path, (weight_mu.shape[2], weight_mu.shape[3])),
        )


ADAPTER = BayesianTorchAdapter()
