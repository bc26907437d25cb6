"""Mean-field Gaussian Bayesian layers: :class:`BayesLinear` and :class:`BayesConv2d`.

Every weight (and bias) has an independent Gaussian posterior ``N(mu, sigma²)`` with
``sigma = softplus(rho) = log1p(exp(rho))``; the parameters are named ``weight_mu``, ``weight_rho``,
``bias_mu`` and ``bias_rho``. The prior is ``N(0, prior_sigma²)`` on every weight and bias.

A forward pass depends on the mode:

* training (``module.train()``): the local reparameterization trick. The pre-activations are sampled
  directly, independently per example: ``mean = x·mu``, ``var = x²·sigma²``, ``out = mean + sqrt(var)·ε``.
  This has lower-variance gradients than sampling one weight matrix per batch.
* evaluation (``module.eval()``): one weight sample ``w = mu + sigma·ε`` per forward pass, shared by the
  whole batch, so ``S`` repeated forwards give an ``S``-member Monte Carlo ensemble.
* posterior mean (``layer.use_mean = True``, or ``with posterior_mean(model):`` for every layer of a
  model): the deterministic layer with ``w = mu``, in either mode.

:meth:`kl` gives the closed-form KL from the posterior to the prior, :func:`kl_divergence` its sum over a
model.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgebnn.errors import InvalidOptionError

# Floor on the sampled pre-activation variance: sqrt has an infinite derivative at 0 (an all-zero input
# patch with no bias has variance exactly 0); below the floor the gradient is cut instead.
_MIN_VARIANCE = 1e-12


def _pair(value: int | tuple[int, int], what: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return (int(value[0]), int(value[1]))
    raise InvalidOptionError(f"{what}={value!r} must be an int or a pair of ints")


def _gaussian_kl(mu: Tensor, sigma: Tensor, prior_sigma: float) -> Tensor:
    """Sum of KL(N(mu, sigma²) || N(0, prior_sigma²)) over all elements."""
    ratio = (sigma / prior_sigma) ** 2
    return 0.5 * torch.sum(ratio + (mu / prior_sigma) ** 2 - 1.0 - torch.log(ratio))


class _BayesLayer(nn.Module):
    """Parameters, sigma, KL and the posterior-mean switch shared by the Bayesian layers."""

    weight_mu: nn.Parameter
    weight_rho: nn.Parameter
    bias_mu: nn.Parameter | None
    bias_rho: nn.Parameter | None

    def __init__(self, weight_shape: tuple[int, ...], bias: bool, prior_sigma: float, init_rho: float):
        super().__init__()
        if not (math.isfinite(prior_sigma) and prior_sigma > 0):
            raise InvalidOptionError(f"prior_sigma={prior_sigma!r} must be a positive finite number")
        if not math.isfinite(init_rho):
            raise InvalidOptionError(f"init_rho={init_rho!r} must be finite")
        self.prior_sigma = float(prior_sigma)
        self.init_rho = float(init_rho)
        self.use_mean = False
        self.weight_mu = nn.Parameter(torch.empty(weight_shape))
        self.weight_rho = nn.Parameter(torch.empty(weight_shape))
        if bias:
            self.bias_mu = nn.Parameter(torch.empty(weight_shape[0]))
            self.bias_rho = nn.Parameter(torch.empty(weight_shape[0]))
        else:
            self.register_parameter("bias_mu", None)
            self.register_parameter("bias_rho", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise ``mu`` like torch's Linear/Conv2d (Kaiming-uniform) and ``rho`` to ``init_rho``."""
        nn.init.kaiming_uniform_(self.weight_mu, a=math.sqrt(5))
        nn.init.constant_(self.weight_rho, self.init_rho)
        if self.bias_mu is not None and self.bias_rho is not None:
            fan_in = self.weight_mu[0].numel()
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(self.bias_mu, -bound, bound)
            nn.init.constant_(self.bias_rho, self.init_rho)

    @property
    def weight_sigma(self) -> Tensor:
        """Posterior standard deviation of the weights, ``softplus(weight_rho)``."""
        return F.softplus(self.weight_rho)

    @property
    def bias_sigma(self) -> Tensor | None:
        """Posterior standard deviation of the bias, ``softplus(bias_rho)``; None without a bias."""
        return None if self.bias_rho is None else F.softplus(self.bias_rho)

    def kl(self) -> Tensor:
        """Closed-form KL divergence from the posterior to the prior ``N(0, prior_sigma²)``, in nats."""
        total = _gaussian_kl(self.weight_mu, self.weight_sigma, self.prior_sigma)
        if self.bias_mu is not None and self.bias_rho is not None:
            total = total + _gaussian_kl(self.bias_mu, F.softplus(self.bias_rho), self.prior_sigma)
        return total

    def _apply_linear_op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Run the layer: posterior mean, local reparameterization (training) or one weight sample (eval)."""
        if self.use_mean:
            return self._apply_linear_op(x, self.weight_mu, self.bias_mu)
        weight_sigma = self.weight_sigma
        bias_sigma = self.bias_sigma
        if self.training:
            mean = self._apply_linear_op(x, self.weight_mu, self.bias_mu)
            var = self._apply_linear_op(x * x, weight_sigma**2, None if bias_sigma is None else bias_sigma**2)
            return mean + var.clamp_min(_MIN_VARIANCE).sqrt() * torch.randn_like(mean)
        weight = self.weight_mu + weight_sigma * torch.randn_like(weight_sigma)
        bias = None
        if self.bias_mu is not None and bias_sigma is not None:
            bias = self.bias_mu + bias_sigma * torch.randn_like(bias_sigma)
        return self._apply_linear_op(x, weight, bias)


class BayesLinear(_BayesLayer):
    """Mean-field Gaussian fully-connected layer; weight layout ``[out_features, in_features]``.

    Args:
        in_features: Size of each input example.
        out_features: Size of each output example.
        bias: Whether the layer has a (Bayesian) bias.
        prior_sigma: Standard deviation of the zero-mean Gaussian prior.
        init_rho: Initial ``rho`` of every weight (``sigma = softplus(init_rho)``, 0.0067 for -5).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        prior_sigma: float = 1.0,
        init_rho: float = -5.0,
    ):
        if in_features < 1 or out_features < 1:
            raise InvalidOptionError(f"BayesLinear({in_features}, {out_features}): feature counts must be positive")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        super().__init__((self.out_features, self.in_features), bias, prior_sigma, init_rho)

    def _apply_linear_op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias_mu is not None}, prior_sigma={self.prior_sigma:g}"
        )


class BayesConv2d(_BayesLayer):
    """Mean-field Gaussian 2-D convolution; weight layout ``[out, in/groups, kh, kw]``.

    Args:
        in_channels: Channels of the input image.
        out_channels: Channels of the output image.
        kernel_size: Kernel height and width (an int for a square kernel).
        stride: Stride (int or pair).
        padding: Zero padding on each side (int or pair).
        dilation: Spacing between kernel taps (int or pair).
        groups: Number of blocked connections from input to output channels.
        bias: Whether the layer has a (Bayesian) bias.
        prior_sigma: Standard deviation of the zero-mean Gaussian prior.
        init_rho: Initial ``rho`` of every weight (``sigma = softplus(init_rho)``, 0.0067 for -5).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        prior_sigma: float = 1.0,
        init_rho: float = -5.0,
    ):
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        self.dilation = _pair(dilation, "dilation")
        if min(self.kernel_size + self.stride + self.dilation) < 1 or min(self.padding) < 0:
            raise InvalidOptionError(
                f"BayesConv2d: kernel_size, stride and dilation must be positive and padding non-negative, got "
                f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}"
            )
        if in_channels < 1 or out_channels < 1 or groups < 1:
            raise InvalidOptionError(
                f"BayesConv2d({in_channels}, {out_channels}, groups={groups}): counts must be positive"
            )
        if in_channels % groups or out_channels % groups:
            raise InvalidOptionError(
                f"BayesConv2d({in_channels}, {out_channels}): groups={groups} must divide both channel counts"
            )
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.groups = int(groups)
        super().__init__(
            (self.out_channels, self.in_channels // self.groups, *self.kernel_size), bias, prior_sigma, init_rho
        )

    def _apply_linear_op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
            f"bias={self.bias_mu is not None}, prior_sigma={self.prior_sigma:g}"
        )


def bayesian_layers(model: nn.Module) -> Iterator[tuple[str, BayesLinear | BayesConv2d]]:
    """Yield ``(path, layer)`` for every :class:`BayesLinear` and :class:`BayesConv2d` in ``model``.

    Args:
        model: Any module; it may itself be a Bayesian layer (its path is then ``""``).

    Yields:
        The dotted module path and the layer, in registration order.
    """
    for path, module in model.named_modules():
        if isinstance(module, (BayesLinear, BayesConv2d)):
            yield path, module


def kl_divergence(model: nn.Module) -> Tensor:
    """Sum of :meth:`kl` over every Bayesian layer of ``model`` (0 when it has none).

    Args:
        model: Any module.

    Returns:
        A scalar tensor, differentiable with respect to the posterior parameters.
    """
    terms = [layer.kl() for _, layer in bayesian_layers(model)]
    if not terms:
        return torch.zeros(())
    return torch.stack(terms).sum()


@contextlib.contextmanager
def posterior_mean(model: nn.Module) -> Iterator[nn.Module]:
    """Run every Bayesian layer of ``model`` with its posterior mean weights inside the ``with`` block.

    Each layer's ``use_mean`` flag is set on entry and restored to its previous value on exit.

    Args:
        model: Any module.

    Yields:
        ``model`` itself.
    """
    layers = [layer for _, layer in bayesian_layers(model)]
    previous = [layer.use_mean for layer in layers]
    for layer in layers:
        layer.use_mean = True
    try:
        yield model
    finally:
        for layer, flag in zip(layers, previous, strict=True):
            layer.use_mean = flag
