"""Adapter for blitz-bayesian-pytorch: ``BayesianLinear``, ``BayesianConv1d/2d/3d``, sigma = log1p(exp(rho)).

A blitz layer holds its posterior twice: ``weight_mu``/``weight_rho`` (used by ``forward_frozen``) and
``weight_sampler.mu``/``rho`` (used by the sampling ``forward``). They share storage when the layer is
built, but ``.to()``/``.cuda()``/``.double()`` copies each separately and training then moves only one;
such a layer is refused rather than guessing which copy is the trained posterior. The ``freeze`` flag
only selects the forward and does not change the posterior.

Refused, naming the layer: ``BayesianLSTM``/``BayesianGRU`` (recurrent), ``BayesianEmbedding`` (a lookup,
not a weight applied by Gemm/Conv) and layers wrapped by ``blitz.utils.Flipout`` (a changed forward).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edgebnn.errors import InvalidWeightsError, UnsupportedLayerError
from edgebnn.importers.base import LayerPosterior, conv_posterior, describe, loaded, softplus, to_numpy

if TYPE_CHECKING:
    import torch

_READ = ("BayesianLinear", "BayesianConv1d", "BayesianConv2d", "BayesianConv3d")
_REFUSED = {
    "BayesianLSTM": "recurrent layers are not supported from blitz; keep the recurrence deterministic "
    "(nn.LSTM/nn.GRU) with a Bayesian head, or use bayesian-torch's LSTMReparameterization",
    "BayesianEmbedding": "embeddings are not supported; keep the embedding deterministic (nn.Embedding) "
    "and make the layers after it Bayesian",
}
_REFUSED["BayesianGRU"] = _REFUSED["BayesianLSTM"]
_BAYESIAN_LAYERS = _READ + tuple(_REFUSED)


def _read(module: Any, path: str, name: str) -> tuple[np.ndarray, np.ndarray]:
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
    """Reads blitz's Linear and Conv layers; its recurrent and embedding layers are refused."""

    library = "blitz"

    def matches(self, module: torch.nn.Module) -> bool:
        modules = loaded("blitz.modules")
        layers = () if modules is None else tuple(getattr(modules, name) for name in _BAYESIAN_LAYERS)
        return isinstance(module, layers)

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        modules = loaded("blitz.modules")
        name = type(module).__name__
        if modules is None or name not in _BAYESIAN_LAYERS or type(module) is not getattr(modules, name):
            reason = f"not supported; edgebnn reads blitz {', '.join(_READ)}"
            raise UnsupportedLayerError(f"{describe(module, path)}: {reason}")
        if name in _REFUSED:
            raise UnsupportedLayerError(f"{describe(module, path)}: {_REFUSED[name]}")
        weight = _read(module, path, "weight")
        # with bias=False blitz adds zeros; BayesianLinear still holds unused bias_mu/bias_rho then
        bias = _read(module, path, "bias") if module.bias else (None, None)
        if name == "BayesianLinear":
            return LayerPosterior(path, "linear", *weight, *bias)
        return conv_posterior(module, path, weight, bias)


ADAPTER = BlitzAdapter()
