"""Adapter for bayesian-torch (Intel Labs): every reparameterization and flipout layer.

Linear, Conv1d/2d/3d and ConvTranspose1d/2d/3d, each as ``...Reparameterization`` and ``...Flipout``:
sigma = log1p(exp(rho)) for weights and biases. Flipout changes how training draws noise (one weight
perturbation per example), not the posterior: the IR carries the same mean-field Gaussian.

bayesian-torch's ``BatchNorm{1,2,3}dLayer`` are deterministic batch norms that pass ``(out, kl)`` tuples
through; they have no posterior and are exported as batch norms.

``LSTMReparameterization``/``LSTMFlipout`` are not layers to this adapter: they are a loop over time around two
of its linear layers (``ih``, ``hh``), which it reads, and the loop is exported unrolled, drawing the weights
at every step as bayesian-torch does (:mod:`edgebnn.importers.recurrent`).

Refused, naming the layer: the quantized layers ``bnn_to_qbnn`` produces (their int8 tensors live in torch's
quantized backend; import the float model and quantize with an edgebnn scheme instead), and subclasses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgebnn.errors import UnsupportedLayerError
from edgebnn.importers.base import LayerPosterior, conv_posterior, describe, loaded, softplus, to_numpy
from edgebnn.importers.recurrent import unrolled_bayesian_rnn

if TYPE_CHECKING:
    import torch

_CONVS = ("Conv1d", "Conv2d", "Conv3d")
_TRANSPOSED = ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d")
_METHODS = ("Reparameterization", "Flipout")
_LINEAR = tuple(f"Linear{m}" for m in _METHODS)
_SUPPORTED = _LINEAR + tuple(f"{c}{m}" for c in _CONVS + _TRANSPOSED for m in _METHODS)


def _refusal(module: Any) -> str:
    name = type(module).__name__
    if name.startswith("LSTM"):
        return "a subclass or modified bayesian-torch LSTM; edgebnn reads LSTMReparameterization and LSTMFlipout"
    if name.startswith("Quantized"):
        return (
            "quantized bayesian-torch layers hold int8 tensors of torch's quantized backend; import the "
            "float model (before bnn_to_qbnn) and lower it with an edgebnn scheme (mcq, fixed, codebook...)"
        )
    return f"not supported; edgebnn reads bayesian-torch {', '.join(_SUPPORTED)}"


class BayesianTorchAdapter:
    """Reads bayesian-torch layers: sigma = log1p(exp(rho)) for weights and biases.

    Every bayesian-torch variational layer but its two LSTMs matches, so that those edgebnn cannot read (quantized
    layers, subclasses) are refused by :meth:`extract` instead of being exported as if deterministic.
    """

    library = "bayesian-torch"

    def matches(self, module: torch.nn.Module) -> bool:
        layers = loaded("bayesian_torch.layers")
        return (layers is not None and isinstance(module, layers.BaseVariationalLayer_)
                and not unrolled_bayesian_rnn(module))  # its ih/hh linear layers are read instead

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        layers = loaded("bayesian_torch.layers")
        name = type(module).__name__
        if layers is None or name not in _SUPPORTED or type(module) is not getattr(layers, name, None):
            raise UnsupportedLayerError(f"{describe(module, path)}: {_refusal(module)}")
        m: Any = module
        bias = (None, None) if m.mu_bias is None else (to_numpy(m.mu_bias), softplus(to_numpy(m.rho_bias)))
        if name in _LINEAR:
            return LayerPosterior(path, "linear", to_numpy(m.mu_weight), softplus(to_numpy(m.rho_weight)), *bias)
        weight = (to_numpy(m.mu_kernel), softplus(to_numpy(m.rho_kernel)))
        return conv_posterior(m, path, weight, bias, transposed=name.startswith("ConvTranspose"))


ADAPTER = BayesianTorchAdapter()
