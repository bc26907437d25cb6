"""Variational Network Quantization (Achterhold et al., ICLR 2018): train for ternary weights {-a, 0, a}.

Posterior: mean-field Gaussian q(w_ij) = N(θ_ij, σ_ij²), parameterised by θ and log σ² (Sec. 2.3, Eq. 3).

Prior: the quantizing prior, a mixture of shifted log-uniform priors at the codebook c = (-a, 0, a) with
equal weights (Eq. 12), one learnable level ``a`` per layer.

KL: the paper's approximation (Eq. 16-17). Molchanov's sparse-VD approximation for the zero-centred
log-uniform prior (Eq. 7), written as a KL (the additive constant chosen so that KL → 0 as α → ∞),

    F_KL,LU(θ, σ) = k1 - k1 S(k2 + k3 log α) + ½ log(1 + 1/α),   α = σ²/θ²,
    k1 = 0.63576, k2 = 1.87320, k3 = 1.48695,   S the logistic sigmoid,

is shifted to each non-zero level and mixed with Gaussian windows on the reference codebook
c_r = (-r, 0, r), r = 0.2:

    F_KL(θ, σ, c_r) = Σ_{c_k ≠ 0} Ω(θ - c_k) F_KL,LU(θ - c_k, σ) + Ω_0(θ) F_KL,LU(θ, σ),
    Ω(θ) = exp(-θ²/τ²),   Ω_0(θ) = 1 - Σ_{c_k ≠ 0} Ω(θ - c_k),   τ = 0.075.

A learned level a reuses it by scaling (Appendix A.4, Eq. 20-22): KL(q || p_{c_a}) ≈ F_KL(θ/s, σ/s, c_r)
with s = a/r, so the gradient reaches ``a`` through the KL (and through the θ clipping below).

Training (Sec. 4): local reparameterization (Appendix A.2: b ~ N(x·θ, x²·σ²) per example), KL warm-up
β: 0 → 1, log σ² clipped to (-10, 1), θ clipped to (-a - σ/e, a + σ/e) (outside the outer funnels: a shifted
log α of 2, e^-1 = 0.3679) with gradient stopping — the forward pass uses the clipped value, the gradient
goes to the unclipped shadow weight. The levels learn with a learning rate ``level_lr_factor`` (1/100)
times the means' and are clipped to a ≥ 0.05 after every step. Biases are deterministic.

Pruning-aware training (not the paper's; ``prune_epochs``, :data:`RECIPE`: the last 50 of 250 epochs): the forward
pass of every layer treats the weights of log α >= :data:`PRUNE_LOG_ALPHA` as pruned, mean and σ both 0
(Molchanov's sparse-VD evaluation mask, applied in training), the mask recomputed every step from the current θ and
σ; the KL is unchanged. The kept weights learn to do without the pruned ones, and the pruned means feel only the
KL, which pulls them to its minima at the levels: nearly all go to 0 (a few sit at ±a with σ > e·a, as without the
phase), so pruning at the lowering barely moves the logits. The model is returned with the mask off: its posterior
mean (``use_mean``) is still the clipped means of ALL weights.

Post-training (Sec. 3.2, Eq. 13-15; no fine-tuning): prune log α ≥ log T_α = 2, assign each remaining weight to
argmin_k (c_k - θ)² on the learned codebook (-a, 0, a). :func:`lower_to_ternary` runs edgebnn's ``ternary``
pass with ``levels=`` :func:`learned_levels` (without it the pass re-fits a by Lloyd's rule on the kept means).

Claim (docs/recipes.md, ``examples/train_vnq.py``, asserted on seed 0 in ``tests/integration/test_recipes.py``): on
digits, :func:`vnq_cnn` trained with :data:`RECIPE` and lowered to ternary without fine-tuning, the sampled
ensemble of :data:`ENSEMBLE_SAMPLES` members is at most one test image (0.28 point of 360; issue 23's goal: within
0.5 point) below the posterior-mean network of all the clipped means. ``examples/train_vnq.py --seed 0/1/2``
measures -1 / +1 / 0 images (seeds 3, 4: -1 / 0; seed 0 trained on two torch threads: -1), and the ternary mean
network the same. Without the phase (``prune_epochs=0``, the paper) they were -1 / 0 / -1 with the ternary mean
network at -2 / 0 / -2 and seed 0 on two threads at -3: zeroing the pruned means moved the logits at least as much
as rounding the kept ones (seed 0: median over test images of the largest |Δlogit| 0.41 against 0.18; seeds 1-4:
0.20-0.37); with the phase pruning moves them by 0.05 (seeds 1-4: 0.02-0.07) and rounding (0.23-0.36) is what is
left. The deployed ensemble's accuracy is unchanged on seeds 0-2 (0.9528 / 0.9500 / 0.9611; seed 3: two images
lower); the posterior mean lost an image on seeds 1 and 2 (0.9472 / 0.9611, from 0.9500 / 0.9639) — part of the
closing is the reference moving. The ensemble's accuracy equals the ternary mean network's on every seed measured
(kept σ are small). A 100-epoch phase measured 0 / 0 / -1 and seeds 3, 4 at -2 / -1: no better.
"""

from __future__ import annotations

import math
from collections import OrderedDict
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

RECIPE: dict[str, Any] = {"epochs": 250, "lr": 0.01, "kl_warmup_epochs": 80, "prune_epochs": 50}  # of the claim
ENSEMBLE_SAMPLES = 64  # members of the recipe's sampled ensemble (16 leave one test image of MC noise)

K1, K2, K3 = 0.63576, 1.87320, 1.48695
REFERENCE_LEVEL = 0.2
TAU = 0.075
LOG_SIGMA2_RANGE = (-10.0, 1.0)
MIN_LEVEL = 0.05
PRUNE_LOG_ALPHA = 2.0  # log T_α: VNQ prunes log α >= 2 (Sec. 3.2), in training's last phase and at lowering
_FUNNEL = math.exp(-1.0)  # |θ - c| <= σ/e  <=>  shifted log α >= 2
_EPS = 1e-16


def kl_log_uniform(theta: Tensor, log_sigma2: Tensor) -> Tensor:
    """Elementwise F_KL,LU (Eq. 7 as a KL): approximate KL(N(θ, σ²) || log-uniform), in nats."""
    log_alpha = log_sigma2 - torch.log(theta * theta + _EPS)
    return K1 - K1 * torch.sigmoid(K2 + K3 * log_alpha) + 0.5 * F.softplus(-log_alpha)


def kl_quantizing(theta: Tensor, log_sigma2: Tensor, level: Tensor) -> Tensor:
    """Sum of F_KL(θ/s, σ/s, c_r) (Eq. 16-17 with the rescaling of Eq. 22), s = level / r."""
    s = level / REFERENCE_LEVEL
    t = theta / s
    ls2 = log_sigma2 - 2.0 * torch.log(s)
    total = torch.zeros((), dtype=theta.dtype, device=theta.device)
    omega0 = torch.ones_like(t)
    for c in (-REFERENCE_LEVEL, REFERENCE_LEVEL):
        window = torch.exp(-((t - c) ** 2) / TAU**2)
        omega0 = omega0 - window
        total = total + torch.sum(window * kl_log_uniform(t - c, ls2))
    return total + torch.sum(omega0.clamp_min(0.0) * kl_log_uniform(t, ls2))


class _VNQLayer(nn.Module):
    """θ, log σ², a deterministic bias and the learnable level ``a`` of one VNQ layer."""

    def __init__(self, weight_shape: tuple[int, ...], bias: bool, init_log_sigma2: float, init_level: float):
        super().__init__()
        if not (math.isfinite(init_level) and init_level >= MIN_LEVEL):
            raise InvalidOptionError(f"init_level={init_level!r} must be a finite number >= {MIN_LEVEL}")
        lo, hi = LOG_SIGMA2_RANGE
        if not lo <= init_log_sigma2 <= hi:
            raise InvalidOptionError(f"init_log_sigma2={init_log_sigma2!r} must lie in [{lo}, {hi}]")
        self.use_mean = False
        self.pruning = False
        self.weight_mu = nn.Parameter(torch.empty(weight_shape))
        self.weight_log_sigma2 = nn.Parameter(torch.full(weight_shape, float(init_log_sigma2)))
        self.level = nn.Parameter(torch.tensor(float(init_level)))
        nn.init.kaiming_uniform_(self.weight_mu, a=math.sqrt(5))
        if bias:
            bound = 1.0 / math.sqrt(self.weight_mu[0].numel())
            self.bias = nn.Parameter(torch.empty(weight_shape[0]).uniform_(-bound, bound))
        else:
            self.register_parameter("bias", None)

    def clipped_mu(self) -> Tensor:
        """θ clipped to the outer funnels (-a - σ/e, a + σ/e); the gradient passes to the shadow θ."""
        bound = self.level.detach() + _FUNNEL * self.weight_sigma.detach()
        clipped = torch.maximum(torch.minimum(self.weight_mu, bound), -bound)
        return self.weight_mu + (clipped - self.weight_mu).detach()

    @property
    def weight_sigma(self) -> Tensor:
        """σ = exp(½ log σ²) with log σ² clipped to (-10, 1)."""
        return torch.exp(0.5 * self.weight_log_sigma2.clamp(*LOG_SIGMA2_RANGE))

    def kl(self) -> Tensor:
        """Approximate KL to the quantizing prior at (-a, 0, a) (Eq. 16-17, 22), in nats."""
        return kl_quantizing(self.clipped_mu(), self.weight_log_sigma2.clamp(*LOG_SIGMA2_RANGE), self.level)

    @torch.no_grad()
    def clip_(self) -> None:
        """In place: log σ² into (-10, 1), a >= 0.05 (run after every optimiser step)."""
        self.weight_log_sigma2.clamp_(*LOG_SIGMA2_RANGE)
        self.level.clamp_(min=MIN_LEVEL)

    def log_alpha(self) -> Tensor:
        """log σ² - log θ² of the clipped means (the pruning criterion, Eq. 9)."""
        mu = self.clipped_mu().detach()
        return self.weight_log_sigma2.detach().clamp(*LOG_SIGMA2_RANGE) - torch.log(mu * mu + _EPS)

    def pruned(self) -> Tensor:
        """Boolean mask of the weights VNQ prunes: log α >= :data:`PRUNE_LOG_ALPHA`, i.e. σ² >= e² θ².

        Written as the ``ternary`` pass writes it (σ² against float32 e^2 · θ², no logarithm), so that the
        weights masked in training are exactly the ones the lowering prunes.
        """
        mu = self.clipped_mu().detach()
        sigma = self.weight_sigma.detach()
        return sigma * sigma >= float(np.float32(math.exp(PRUNE_LOG_ALPHA))) * (mu * mu)

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Posterior mean (``use_mean``), local reparameterization (training) or one weight sample (eval).

        With ``pruning`` set, the weights :meth:`pruned` marks (recomputed on every call) enter with mean and
        σ both 0, as the ternary lowering will set them: they get no gradient from the data term.
        """
        mu = self.clipped_mu()
        sigma = self.weight_sigma
        if self.pruning:
            kept = (~self.pruned()).to(mu.dtype)
            mu, sigma = mu * kept, sigma * kept
        if self.use_mean:
            return self._op(x, mu, self.bias)
        if self.training:
            mean = self._op(x, mu, self.bias)
            var = self._op(x * x, sigma * sigma, None)
            return mean + var.clamp_min(1e-12).sqrt() * torch.randn_like(mean)
        return self._op(x, mu + sigma * torch.randn_like(sigma), self.bias)


class VNQLinear(_VNQLayer):
    """Fully-connected VNQ layer, weight layout ``[out_features, in_features]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, init_log_sigma2: float = -8.0,
                 init_level: float = REFERENCE_LEVEL):
        if in_features < 1 or out_features < 1:
            raise InvalidOptionError(f"VNQLinear({in_features}, {out_features}): feature counts must be positive")
        super().__init__((out_features, in_features), bias, init_log_sigma2, init_level)

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.linear(x, weight, bias)


class VNQConv2d(_VNQLayer):
    """2-D convolution VNQ layer, weight layout ``[out, in, kh, kw]`` (no groups, no dilation)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, bias: bool = True,
                 init_log_sigma2: float = -8.0, init_level: float = REFERENCE_LEVEL):
        kernel = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        if in_channels < 1 or out_channels < 1 or min(kernel) < 1:
            raise InvalidOptionError(f"VNQConv2d({in_channels}, {out_channels}, {kernel}): sizes must be positive")
        super().__init__((out_channels, in_channels, *kernel), bias, init_log_sigma2, init_level)

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.conv2d(x, weight, bias, self.stride, self.padding)


def vnq_cnn() -> nn.Module:
    """``edgebnn.models.digits_cnn``'s shape (conv 16, conv 32, fc 64, fc 10) with VNQ layers, for 1x8x8 inputs."""
    return nn.Sequential(OrderedDict([
        ("conv1", VNQConv2d(1, 16, 3, padding=1)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", VNQConv2d(16, 32, 3, padding=1)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()), ("fc1", VNQLinear(128, 64)), ("relu3", nn.ReLU()), ("fc2", VNQLinear(64, 10)),
    ]))


def vnq_layers(model: nn.Module) -> list[tuple[str, _VNQLayer]]:
    """``(path, layer)`` of every VNQ layer of ``model``, in registration order."""
    return [(p, m) for p, m in model.named_modules() if isinstance(m, _VNQLayer)]


def train_vnq(
    model: nn.Module,
    data: DigitsSplits | tuple[np.ndarray, np.ndarray],
    *,
    epochs: int = 60,
    batch_size: int = 64,
    lr: float = 3e-3,
    level_lr_factor: float = 0.01,
    kl_warmup_epochs: int = 15,
    prune_epochs: int = 0,
    seed: int = 0,
) -> TrainResult:
    """Train a model of VNQ layers in place (ELBO with the quantizing-prior KL; see the module doc).

    Args:
        model: A classifier returning logits ``(N, C)``, whose weight layers are :class:`VNQLinear` /
            :class:`VNQConv2d`.
        data: A :class:`DigitsSplits` (validation accuracy per epoch) or an ``(x, y)`` training pair.
        epochs: Passes over the training data.
        batch_size: Examples per Adam step.
        lr: Peak Adam learning rate of θ, log σ² and the biases (cosine decay to 0).
        level_lr_factor: The levels' learning rate as a fraction of ``lr`` (paper: 100x lower).
        kl_warmup_epochs: Epochs of the linear KL warm-up β: 0 → 1 (paper: 15).
        prune_epochs: Pruning-aware training (not the paper's): over the last ``prune_epochs`` epochs every
            layer runs with ``pruning`` set, the weights of log α >= 2 entering the forward pass with mean and
            σ 0 (the mask recomputed every step; the KL unchanged; validation sees the masked model too).
            0 (the paper): never. The model is returned with ``pruning`` off.
        seed: Seeds torch and the shuffling.

    Returns:
        The per-epoch history (``kl`` is the approximate KL to the quantizing prior).

    Raises:
        InvalidOptionError: Bad options, malformed data, inputs the model rejects, an empty class, or a
            model without VNQ layers.
        EdgeBNNError: NaN or inf loss or parameters; names the epoch, the model keeps finite parameters.
    """
    check_options(epochs, batch_size, kl_warmup_epochs, lr)
    if not (math.isfinite(level_lr_factor) and level_lr_factor > 0):
        raise InvalidOptionError(f"level_lr_factor={level_lr_factor!r} must be a positive number")
    if not isinstance(prune_epochs, int) or isinstance(prune_epochs, bool) or not 0 <= prune_epochs <= epochs:
        raise InvalidOptionError(f"prune_epochs={prune_epochs!r} must be an integer in [0, epochs={epochs}]")
    layers = [m for _, m in vnq_layers(model)]
    if not layers:
        raise InvalidOptionError("train_vnq: the model has no VNQLinear/VNQConv2d layers")
    x, y, val = training_arrays(model, data)
    levels = [m.level for m in layers]
    level_ids = {id(p) for p in levels}
    others = [p for p in model.parameters() if id(p) not in level_ids]
    groups: list[dict[str, Any]] = [{"params": others, "lr": lr}, {"params": levels, "lr": lr * level_lr_factor}]

    def loss_terms(xb: Tensor, yb: Tensor) -> tuple[Tensor, Tensor]:
        kl = torch.stack([m.kl() for m in layers]).sum()
        return F.cross_entropy(model(xb), yb), kl

    def clip() -> None:
        for m in layers:
            m.clip_()

    def set_pruning(on: bool) -> None:
        for m in layers:
            m.pruning = on

    def start_pruning_phase(epoch: int) -> None:  # after `epoch`: the last prune_epochs epochs remain
        if prune_epochs and epoch == epochs - prune_epochs:
            set_pruning(True)

    start_pruning_phase(0)
    try:
        return run_epochs(model, groups, x, y, val, loss_terms, recipe="vnq", epochs=epochs, batch_size=batch_size,
                          kl_warmup_epochs=kl_warmup_epochs, seed=seed, after_step=clip,
                          after_epoch=start_pruning_phase)
    finally:
        set_pruning(False)


def level_table(model: nn.Module) -> dict[str, dict[str, float]]:
    """Per VNQ layer: learned level ``a`` and the fraction of weights with log α >= 2 (pruned by VNQ)."""
    return {
        path: {"level": float(m.level.detach()), "prunable": float(m.pruned().float().mean())}
        for path, m in vnq_layers(model)
    }


def learned_levels(model: nn.Module) -> dict[str, float]:
    """``{weight name: a}``: the level each VNQ layer learned, keyed like the IR's weights (``conv1.weight``)."""
    return {f"{path}.weight": float(m.level.detach()) for path, m in vnq_layers(model)}


def lower_to_ternary(model: nn.Module, bnn: BNNModel, *, seed: int = 0) -> tuple[BNNModel, dict[str, Any]]:
    """Lower the IR of a VNQ-trained model with ``ternary``: prune log α >= 2, round to the learned ±a or 0.

    Args:
        model: A model trained with :func:`train_vnq`.
        bnn: Its IR, as ``edgebnn.importers.import_model(model, input_shape)`` gave it.
        seed: Seed of the lowering.

    Returns:
        The lowered IR and the lowering report (each ternary row's ``level`` is the learned one,
        ``level_from`` ``"levels"``).
    """
    result = lower(bnn, "ternary", seed=seed, levels=learned_levels(model), prune_log_alpha=PRUNE_LOG_ALPHA)
    return result.model, result.report
