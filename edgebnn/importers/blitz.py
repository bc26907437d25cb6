"""Adapter for blitz-bayesian-pytorch: ``BayesianLinear`` and ``BayesianConv2d``, sigma = log1p(exp(rho)).

A blitz layer holds its posterior twice: ``weight_mu``/``weight_rho`` (used by ``forward_frozen``) and
``weight_sampler.mu``/``rho`` (used by the sampling ``forward``). They share storage when the layer is
built, but ``.to()``/``.cuda()``/``.double()`` copies each separately and training then moves only one;
such a layer is refused rather than guessing which copy is the trained posterior. The ``freeze`` flag
only selects the forward and does not change the posterior.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgebnn.errors import InvalidWeightsError, UnsupportedLayerError
from edgebnn.importers.base import LayerPosterior, softplus, to_numpy
from edgebnn.importers.bayesian_torch import conv_geometry, describe, loaded

if TYPE_CHECKING:
    import torch

_BAYESIAN_LAYERS = (
    "BayesianLinear",
    "BayesianConv1d",
    "BayesianConv2d",
    "BayesianConv3d",
    "BayesianLSTM",
    "BayesianGRU",
    "BayesianEmbedding",
)


def _read(module: torch.nn.Module, path: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sigma of ``{name}_mu``/``{name}_rho``, checked against the layer's ``{name}_sampler``."""
    mu, rho = to_numpy(getattr(module, f"{name}_mu")), to_numpy(getattr(module, f"{name}_rho"))
    sampler = getattr(module, f"{name}_sampler")
    for mine, theirs in ((mu, sampler.mu), (rho, sampler.rho)):
        if not np.array_equal(mine, to_numpy(theirs), equal_nan=True):
            raise InvalidWeightsError(
                f"{describe(module, path)}: {name}_mu/{name}_rho differ from {name}_sampler.mu/rho "
                "(blitz's two copies drift apart after .to()/.cuda()/.double()); "
                "load the state_dict into a freshly built model"
            )
    return mu, softplus(rho)


class BlitzAdapter:
    """Reads blitz layers; its other Bayesian layers (1-D/3-D convs, RNNs, embeddings) are refused."""

    library = "blitz"

    def matches(self, module: torch.nn.Module) -> bool:
        modules = loaded("blitz.modules")
        layers = () if modules is None else tuple(getattr(modules, name) for name in _BAYESIAN_LAYERS)
        return isinstance(module, layers)

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        modules = loaded("blitz.modules")
        cls = type(module)
        if modules is None or cls not in (modules.BayesianLinear, modules.BayesianConv2d):
            raise UnsupportedLayerError(
                f"{describe(module, path)}: not supported; edgebnn reads blitz BayesianLinear, BayesianConv2d"
            )
        weight_mu, weight_sigma = _read(module, path, "weight")
        # with bias=False blitz adds zeros; BayesianLinear still holds unused bias_mu/bias_rho then
        bias_mu, bias_sigma = _read(module, path, "bias") if module.bias else (None, None)
        if cls is modules.BayesianLinear:
            return LayerPosterior(path, "linear", weight_mu, weight_sigma, bias_mu, bias_sigma)
        geometry = conv_geometry(module, path, (weight_mu.shape[2], weight_mu.shape[3]))
        return LayerPosterior(path, "conv2d", weight_mu, weight_sigma, bias_mu, bias_sigma, **geometry)


ADAPTER = BlitzAdapter()
