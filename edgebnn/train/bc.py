"""Bayesian Compression (Louizos, Ullrich & Welling, NeurIPS 2017) with group normal-Jeffreys scales.

Model (Sec. 4.1): every group i of weights shares a scale z_i, w_ij = z_i · w̃_ij, with the normal-Jeffreys
prior p(z) ∝ 1/|z| and p(w̃_ij | z_i) = N(0, z_i²) (Eq. 4). Groups are the input neurons of a fully-connected
layer (axis 1 of ``[out, in]``) and the filters of a convolution (axis 0), the paper's choice and the
convention of edgebnn's ``prune`` pass. Posterior (Eq. 6): q(z_i) = N(μ_zi, σ_zi²),
q(w̃_ij) = N(μ_ij, σ_ij²), all independent; biases are deterministic.

ELBO (Eq. 7): E_q[log p(D | W)] - E_q(z)[KL(q(W̃ | z) || p(W̃ | z))] - KL(q(z) || p(z)) with

    KL(q(W̃ | z) || p(W̃ | z)) = ½ Σ_ij (-log σ_ij² + σ_ij² + μ_ij² - 1)                       (Eq. 8)
    KL(q(z) || p(z)) ≈ Σ_i (k1 - k1 S(k2 + k3 log α_i) + ½ m(-log α_i)),   α_i = σ_zi² / μ_zi²      (Eq. 9)

(k1, k2, k3 = 0.63576, 1.87320, 1.48695; S the sigmoid, m the softplus). Training uses local
reparameterization: a fully-connected layer samples z per example and input, then the pre-activation
N((x ⊙ z) μᵀ, (x ⊙ z)² (σ²)ᵀ); a convolution samples the pre-activation of w̃ and multiplies each filter's map
by its own z draw. KL warm-up as in :func:`~edgebnn.train.train_bnn`.

Compression (Sec. 4.1 and 5): prune group i when log α_i >= t (reference code: around -3), use the masked
posterior mean Ŵ = diag(m ⊙ μ_z) M_W (Eq. 10) and the marginal variances

    V(w_ij) = σ_zi² (σ_ij² + μ_ij²) + σ_ij² μ_zi²                                            (Eq. 11)

to pick the bits of each layer. In edgebnn: the importer carries w̃, :func:`group_scales` gives
``{weight name: (μ_z, σ_z)}``, and ``lower(ir, "prune+fixed", group_scales=...)`` folds Eq. 10-11, prunes the
groups and picks the fixed-point width of each layer from its posterior variance (:func:`compress` does
all of it on the imported IR and reports the pruned architecture and the bits per layer).

The group horseshoe prior (Sec. 4.2) is not implemented.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgebnn.data import DigitsSplits
from edgebnn.errors import InvalidOptionError
from edgebnn.ir import BNNModel
from edgebnn.nn import _pair
from edgebnn.passes import lower
from edgebnn.train._loop import TrainResult, check_options, run_epochs, training_arrays
from edgebnn.train.vnq import kl_log_uniform

GROUP_LOG_ALPHA_THRESHOLD = -3.0
_EPS = 1e-16


class _GroupNJLayer(nn.Module):
    """The posterior of one group normal-Jeffreys layer: scales z (one per group) and factors w̃."""

    group_axis: int

    def __init__(self, weight_shape: tuple[int, ...], groups: int, bias: bool, init_log_sigma2: float):
        super().__init__()
        if not (math.isfinite(init_log_sigma2) and init_log_sigma2 < 0):
            raise InvalidOptionError(f"init_log_sigma2={init_log_sigma2!r} must be a negative number")
        self.use_mean = False
        fan_in = int(np.prod(weight_shape[1:]))
        self.weight_mu = nn.Parameter(torch.randn(weight_shape) / math.sqrt(fan_in))
        self.weight_log_sigma2 = nn.Parameter(torch.full(weight_shape, float(init_log_sigma2)))
        self.z_mu = nn.Parameter(1.0 + 0.01 * torch.randn(groups))
        self.z_log_sigma2 = nn.Parameter(torch.full((groups,), float(init_log_sigma2)))
        if bias:
            self.bias = nn.Parameter(torch.zeros(weight_shape[0]))
        else:
            self.register_parameter("bias", None)

    @property
    def weight_sigma(self) -> Tensor:
        """σ of the factors w̃."""
        return torch.exp(0.5 * self.weight_log_sigma2)

    @property
    def z_sigma(self) -> Tensor:
        """σ_z of the group scales."""
        return torch.exp(0.5 * self.z_log_sigma2)

    def log_alpha(self) -> Tensor:
        """Group log α = log σ_z² - log μ_z² (the pruning criterion)."""
        return self.z_log_sigma2 - torch.log(self.z_mu * self.z_mu + _EPS)

    def kl(self) -> Tensor:
        """Eq. 8 (factors, to N(0, 1)) plus Eq. 9 (scales, to the normal-Jeffreys prior), in nats."""
        s2 = torch.exp(self.weight_log_sigma2)
        kl_w = 0.5 * torch.sum(-self.weight_log_sigma2 + s2 + self.weight_mu**2 - 1.0)
        return kl_w + torch.sum(kl_log_uniform(self.z_mu, self.z_log_sigma2))

    def _scale_shape(self) -> list[int]:
        shape = [1] * self.weight_mu.ndim
        shape[self.group_axis] = -1
        return shape

    def weights(self, sample: bool) -> Tensor:
        """The weight W = z · w̃: a posterior sample, or the posterior mean μ_z μ (Eq. 10 without the mask)."""
        if not sample:
            return self.z_mu.view(self._scale_shape()) * self.weight_mu
        z = self.z_mu + self.z_sigma * torch.randn_like(self.z_mu)
        w = self.weight_mu + self.weight_sigma * torch.randn_like(self.weight_mu)
        return z.view(self._scale_shape()) * w

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        raise NotImplementedError

    def _local(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Posterior mean (``use_mean``), local reparameterization (training) or one weight sample (eval)."""
        if self.use_mean or not self.training:
            return self._op(x, self.weights(not self.use_mean), self.bias)
        return self._local(x)


class GroupNJLinear(_GroupNJLayer):
    """Fully-connected layer with one normal-Jeffreys scale per input neuron; weight ``[out, in]``."""

    group_axis = 1

    def __init__(self, in_features: int, out_features: int, bias: bool = True, init_log_sigma2: float = -9.0):
        if in_features < 1 or out_features < 1:
            raise InvalidOptionError(f"GroupNJLinear({in_features}, {out_features}): feature counts must be positive")
        super().__init__((out_features, in_features), in_features, bias, init_log_sigma2)

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.linear(x, weight, bias)

    def _local(self, x: Tensor) -> Tensor:
        xz = x * (self.z_mu + self.z_sigma * torch.randn_like(x))
        mean = F.linear(xz, self.weight_mu, self.bias)
        var = F.linear(xz * xz, torch.exp(self.weight_log_sigma2))
        return mean + var.clamp_min(1e-12).sqrt() * torch.randn_like(mean)


class GroupNJConv2d(_GroupNJLayer):
    """2-D convolution with one normal-Jeffreys scale per filter; weight ``[out, in, kh, kw]``."""

    group_axis = 0

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, bias: bool = True,
                 init_log_sigma2: float = -9.0):
        kernel = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        if in_channels < 1 or out_channels < 1 or min(kernel) < 1:
            raise InvalidOptionError(f"GroupNJConv2d({in_channels}, {out_channels}, {kernel}): sizes must be positive")
        super().__init__((out_channels, in_channels, *kernel), out_channels, bias, init_log_sigma2)

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.conv2d(x, weight, bias, self.stride, self.padding)

    def _local(self, x: Tensor) -> Tensor:
        mean = F.conv2d(x, self.weight_mu, None, self.stride, self.padding)
        var = F.conv2d(x * x, torch.exp(self.weight_log_sigma2), None, self.stride, self.padding)
        pre = mean + var.clamp_min(1e-12).sqrt() * torch.randn_like(mean)
        z = self.z_mu + self.z_sigma * torch.randn(len(x), len(self.z_mu), device=x.device)
        out = pre * z[:, :, None, None]
        return out if self.bias is None else out + self.bias[:, None, None]


def group_layers(model: nn.Module) -> list[tuple[str, _GroupNJLayer]]:
    """``(path, layer)`` of every group normal-Jeffreys layer of ``model``, in registration order."""
    return [(p, m) for p, m in model.named_modules() if isinstance(m, _GroupNJLayer)]


def train_bc(
    model: nn.Module,
    data: DigitsSplits | tuple[np.ndarray, np.ndarray],
    *,
    epochs: int = 60,
    batch_size: int = 64,
    lr: float = 3e-3,
    kl_warmup_epochs: int = 10,
    seed: int = 0,
) -> TrainResult:
    """Train a model of group normal-Jeffreys layers in place (Eq. 7-9; see the module doc).

    Args:
        model: A classifier returning logits ``(N, C)`` built from :class:`GroupNJLinear` /
            :class:`GroupNJConv2d` (plain layers are trained as deterministic ones).
        data: A :class:`DigitsSplits` (validation accuracy per epoch) or an ``(x, y)`` training pair.
        epochs: Passes over the training data.
        batch_size: Examples per Adam step.
        lr: Peak Adam learning rate (cosine decay to 0).
        kl_warmup_epochs: Epochs of the linear KL warm-up.
        seed: Seeds torch and the shuffling.

    Returns:
        The per-epoch history.

    Raises:
        InvalidOptionError: Bad options, malformed data, inputs the model rejects, an empty class, or a
            model without group layers.
        EdgeBNNError: NaN or inf loss or parameters; names the epoch, the model keeps finite parameters.
    """
    check_options(epochs, batch_size, kl_warmup_epochs, lr)
    layers = [m for _, m in group_layers(model)]
    if not layers:
        raise InvalidOptionError("train_bc: the model has no GroupNJLinear/GroupNJConv2d layers")
    x, y, val = training_arrays(model, data)

    def loss_terms(xb: Tensor, yb: Tensor) -> tuple[Tensor, Tensor]:
        return F.cross_entropy(model(xb), yb), torch.stack([m.kl() for m in layers]).sum()

    return run_epochs(model, [{"params": list(model.parameters()), "lr": lr}], x, y, val, loss_terms,
                      recipe="bc", epochs=epochs, batch_size=batch_size, kl_warmup_epochs=kl_warmup_epochs, seed=seed)


def group_scales(model: nn.Module) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{weight name: (μ_z, σ_z)}`` for ``lower(..., group_scales=...)`` (names as the importer writes them)."""
    return {
        f"{path}.weight": (m.z_mu.detach().cpu().numpy().astype(np.float32),
                           m.z_sigma.detach().cpu().numpy().astype(np.float32))
        for path, m in group_layers(model)
    }


def compress(
    model: nn.Module,
    bnn: BNNModel,
    *,
    threshold: float = GROUP_LOG_ALPHA_THRESHOLD,
    seed: int = 0,
    **options: Any,
) -> tuple[BNNModel, dict[str, Any]]:
    """Lower with ``prune+fixed`` (``bits="auto"``): pruned groups and bits per layer.

    Args:
        model: A model trained with :func:`train_bc`.
        bnn: Its IR, as ``edgebnn.importers.import_model(model, input_shape)`` gave it.
        threshold: Prune groups with log α >= this.
        seed: Seed of the lowering.
        **options: More options for :func:`edgebnn.passes.lower` (e.g. ``noise_fraction``).

    Returns:
        The lowered IR and the lowering report with ``architecture`` added: per group layer the number of
        groups kept and in all, and the bits the variance rule gave.
    """
    result = lower(bnn, "prune+fixed", seed=seed, bits="auto", group_scales=group_scales(model),
                   group_log_alpha_threshold=threshold, **options)
    report = dict(result.report)
    bits = {row["name"]: row["bits"] for row in report["layers"]}
    report["architecture"] = {
        path: {
            "groups": int(m.z_mu.numel()),
            "kept": int((m.log_alpha() < threshold).sum()),
            "axis": "input neurons" if m.group_axis == 1 else "filters",
            "bits": bits.get(f"{path}.weight"),
        }
        for path, m in group_layers(model)
    }
    return result.model, report
