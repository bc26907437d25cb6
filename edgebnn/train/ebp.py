"""Expectation Backpropagation (Soudry, Hubara & Meir, NeurIPS 2014) for binary-weight MLPs.

Network: v_0 = x, u_m = W_m v_{m-1} / √K_m, v_m = sign(u_m) for hidden layers; a single output unit
u_L predicts the label y ∈ {-1, +1}. Every weight is binary, W_ij ∈ {-1, +1}, and the mean-field posterior
is P(W_ij) ∝ exp(h_ij W_ij): <W_ij> = tanh h_ij, P(W_ij = +1) = S(2 h_ij). A bias is a weight on a constant
input feature (append a column of ones to x).

Online EP, one example at a time, no learning rate (Sec. 4). Forward pass (Eq. 4.1-4.2, <W²> = 1):

    μ_k,m = Σ_r <W_kr,m> <v_r,m-1> / √K_m,
    σ²_k,m = (1/K_m) Σ_r [(δ_m1 (<v_r,m-1>² - 1) + 1) - <W_kr,m>² <v_r,m-1>²],
    <v_k,m> = 2 Φ(μ_k,m / σ_k,m) - 1.

Backward pass (Eq. 4.3-4.5), with N(0 | μ, σ²) the Gaussian density at 0:

    Δ_L = y N(0 | μ_L, σ_L²) / Φ(y μ_L / σ_L),
    Δ_i,l-1 = (2/√K_l) N(0 | μ_i,l-1, σ²_i,l-1) Σ_j <W_ji,l> Δ_j,l,
    h_ij,l ← h_ij,l + Δ_i,l <v_j,l-1> / √K_l          (the log-posterior update of Eq. 4.5).

Δ_L is evaluated in the log domain (log φ - log Φ), which removes the overflow the paper's footnote 4
works around. Outputs (Eq. 4.6-4.7): EBP-D, the MAP weights W* = sign(h) in one deterministic pass; EBP-P,
the Bayes output P(y = +1) = Φ(μ_L/σ_L) from the propagated moments, or the average of networks with binary
weights sampled from P(W = +1).

For deployment, :class:`EBPNet` turns the output unit into two logits (-κ u_L/2, κ u_L/2), so one binary
network predicts P(y = +1 | W) = S(κ u_L); the temperature κ is fitted on the training data
(:func:`fit_temperature`). Its :class:`BinaryLinear` layers import as Gaussians with the same mean and sign
probability (see :mod:`edgebnn.importers.recipes`), so ``lower(ir, "binary")`` reproduces P(W = +1) and
the exported ensemble averages S sampled binary networks (EBP-P).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.train._loop import EpochStats, TrainResult

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_MIN_VAR = 1e-12
_SIGMA_AT_HALF = 2.0 / math.sqrt(2.0 * math.pi)  # lim |tanh h| / |Φ⁻¹(S(2h))| as h → 0


class BinaryLinear(nn.Module):
    """A layer of binary weights W ∈ {-1, +1} with P(W = +1) = S(2h); no bias; computes ``x · <W>ᵀ``."""

    def __init__(self, in_features: int, out_features: int, init_scale: float = 1.0):
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise InvalidOptionError(f"BinaryLinear({in_features}, {out_features}): feature counts must be positive")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.h = nn.Parameter(init_scale * torch.randn(out_features, in_features), requires_grad=False)

    @property
    def weight_mean(self) -> Tensor:
        """<W> = tanh h."""
        return torch.tanh(self.h)

    def gaussian_posterior(self) -> tuple[Tensor, Tensor]:
        """(μ, σ) with μ = <W> = 2p - 1 and Φ(μ/σ) = p = P(W = +1): σ = |μ| / |Φ⁻¹(p)| (0.798 at p = ½)."""
        mu = torch.tanh(self.h.double())
        z = torch.special.ndtri(torch.sigmoid(2.0 * self.h.double())).abs()
        sigma = torch.where(z > 1e-6, mu.abs() / z.clamp_min(1e-6), torch.full_like(mu, _SIGMA_AT_HALF))
        return mu.float(), sigma.float()

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.linear(x, self.weight_mean)


class EBPNet(nn.Module):
    """Binary-weight MLP ``sizes[0] -> ... -> 1`` with sign hidden units; returns two logits ±κ u_L / 2."""

    temperature: Tensor

    def __init__(self, sizes: list[int] | tuple[int, ...], init_scale: float = 1.0):
        super().__init__()
        if len(sizes) < 2 or sizes[-1] != 1 or any(int(s) < 1 for s in sizes):
            raise InvalidOptionError(f"EBPNet sizes={list(sizes)}: need at least two positive sizes ending in 1")
        modules = nn.ModuleList(BinaryLinear(a, b, init_scale) for a, b in itertools.pairwise(sizes))
        self.layers = cast("Sequence[BinaryLinear]", modules)  # a ModuleList of BinaryLinear
        self.fan_in = [int(s) for s in sizes[:-1]]
        self.register_buffer("temperature", torch.tensor(1.0))

    def forward(self, x: Tensor) -> Tensor:
        """Logits of the posterior-mean network (weights <W>; :func:`binary_outputs` runs binary weights)."""
        return self._run(x, list(self.layers))

    def logits(self, x: Tensor, weights: list[Tensor]) -> Tensor:
        """Logits of the network with the given weight matrices, one per layer; stacked ``[S, out, in]`` with
        ``x`` ``[S, N, in]`` run S networks at once."""
        def times(w: Tensor) -> Callable[[Tensor], Tensor]:
            return lambda v: torch.matmul(v, w.transpose(-1, -2))

        return self._run(x, [times(w) for w in weights])

    def _run(self, x: Tensor, layers: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
        v = x
        for i, (layer, fan_in) in enumerate(zip(layers, self.fan_in, strict=True)):
            u = layer(v) * (1.0 / math.sqrt(fan_in))
            v = u if i == len(layers) - 1 else torch.sign(u)
        half = 0.5 * self.temperature * v
        return torch.cat([-half, half], dim=-1)


def _check_data(net: EBPNet, x: np.ndarray, y: np.ndarray, what: str) -> tuple[Tensor, Tensor]:
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y)
    inputs = net.layers[0].in_features
    if xa.ndim != 2 or xa.shape[1] != inputs or len(xa) == 0:
        raise InvalidOptionError(
            f"{what} data of shape {xa.shape} does not match the model's input: need (N, {inputs}) with N >= 1"
        )
    if not np.all(np.isfinite(xa)):
        raise InvalidOptionError(f"{what} data contain NaN or inf values")
    if ya.shape != (len(xa),) or not np.all(np.isin(ya, (0, 1))):
        raise InvalidOptionError(f"{what} labels must be {len(xa)} values in {{0, 1}}")
    for c in (0, 1):
        if not np.any(ya == c):
            raise InvalidOptionError(f"before epoch 1: class {c} has no {what} examples (an empty class)")
    return torch.from_numpy(xa), torch.from_numpy(2.0 * ya.astype(np.float64) - 1.0)


def moments(net: EBPNet, x: Tensor) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Forward pass of Eq. 4.1-4.2 on a batch: per layer μ, σ², and the mean activities <v> (input first)."""
    v = x
    mus, variances, vs = [], [], [v]
    for m, layer in enumerate(net.layers):
        mean_w = torch.tanh(layer.h.double())
        k = layer.in_features
        mu = v @ mean_w.T / math.sqrt(k)
        # Eq. 4.2: the inputs are exact in layer 1 (<v²> = <v>²), ±1 activities after it (<v²> = 1).
        spread = (v * v) @ (1.0 - mean_w * mean_w).T / k if m == 0 else 1.0 - (v * v) @ (mean_w * mean_w).T / k
        var = spread.clamp_min(_MIN_VAR)
        mus.append(mu)
        variances.append(var)
        v = 2.0 * torch.special.ndtr(mu / var.sqrt()) - 1.0
        vs.append(v)
    return mus, variances, vs


def _gauss_at_zero(mu: Tensor, var: Tensor) -> Tensor:
    return torch.exp(-0.5 * mu * mu / var - _LOG_SQRT_2PI) / var.sqrt()


def _update(net: EBPNet, x: Tensor, y: Tensor) -> tuple[list[Tensor], float]:
    """The EBP increments of every h for one example (Eq. 4.3-4.5), and -log P(y | x) before the update."""
    mus, variances, vs = moments(net, x[None])
    mu, sd = mus[-1][0, 0], variances[-1][0, 0].sqrt()
    t = mu / sd
    log_like = torch.special.log_ndtr(y * t)
    delta = (y / sd * torch.exp(-0.5 * t * t - _LOG_SQRT_2PI - log_like)).reshape(1)
    steps: list[Tensor] = []
    for m in range(len(net.layers) - 1, -1, -1):
        layer = net.layers[m]
        root_k = math.sqrt(layer.in_features)
        steps.append(torch.outer(delta, vs[m][0]) / root_k)
        if m > 0:
            back = torch.tanh(layer.h.double()).T @ delta
            delta = 2.0 / root_k * _gauss_at_zero(mus[m - 1][0], variances[m - 1][0]) * back
    return steps[::-1], float(-log_like)


def train_ebp(
    net: EBPNet,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int = 3,
    seed: int = 0,
    val: tuple[np.ndarray, np.ndarray] | None = None,
) -> TrainResult:
    """Train ``net`` in place with EBP: online, one example at a time, no learning rate.

    Args:
        net: The binary-weight MLP (its initial h is the prior).
        x: Training inputs ``(N, in)`` (append a column of ones for a bias).
        y: Labels in {0, 1} (class 1 is y = +1).
        epochs: Passes over the data, each in a fresh seeded order (paper: 3).
        seed: Seeds the order.
        val: Optional ``(x, y)`` for the per-epoch EBP-P accuracy.

    Returns:
        The history (``nll``: mean -log P(y | x) of each example before its update; ``kl`` 0, ``beta`` 1).

    Raises:
        InvalidOptionError: Data that do not match the model's input, labels outside {0, 1}, an empty class.
        EdgeBNNError: An update became NaN or inf; names the epoch and the example; h keeps its last
            finite value.
    """
    if not isinstance(epochs, int) or epochs < 1:
        raise InvalidOptionError(f"epochs={epochs!r} must be an integer >= 1")
    xt, yt = _check_data(net, x, y, "training")
    checked_val = None if val is None else _check_data(net, *val, "validation")
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    history: list[EpochStats] = []
    with torch.no_grad():
        for epoch in range(1, epochs + 1):
            total = 0.0
            for n in rng.permutation(len(xt)):
                steps, loss = _update(net, xt[n], yt[n])
                if not (math.isfinite(loss) and all(bool(torch.isfinite(s).all()) for s in steps)):
                    raise EdgeBNNError(
                        f"ebp: epoch {epoch}: the update for training example {int(n)} became NaN or inf "
                        f"(-log P(y|x) = {loss:.4g}); h keeps its last finite value"
                    )
                for layer, step in zip(net.layers, steps, strict=True):
                    layer.h.add_(step.to(layer.h.dtype))
                total += loss
            val_acc = None
            if checked_val is not None:
                p = bayes_probability(net, checked_val[0].numpy())
                val_acc = float(np.mean((p > 0.5) == (checked_val[1].numpy() > 0)))
            history.append(EpochStats(epoch, total / len(xt), total / len(xt), 0.0, 1.0, val_acc))
    return TrainResult(tuple(history), history[-1].val_accuracy, time.perf_counter() - started)


def bayes_probability(net: EBPNet, x: np.ndarray) -> np.ndarray:
    """EBP-P from the propagated moments: P(y = +1 | x) = Φ(μ_L / σ_L) = (1 + <v_L>) / 2 (Eq. 4.7)."""
    with torch.no_grad():
        mus, variances, _ = moments(net, torch.as_tensor(np.asarray(x, dtype=np.float64)))
        return torch.special.ndtr(mus[-1] / variances[-1].sqrt())[:, 0].numpy()


def binary_weights(net: EBPNet, samples: int | None, seed: int = 0) -> list[Tensor]:
    """Binary weight matrices: the MAP signs W* = sign(h) (``samples=None``, EBP-D, Eq. 4.6), or ``[S, out, in]``
    draws with P(W = +1) = S(2h) (EBP-P by sampling)."""
    if samples is None:
        return [torch.where(layer.h >= 0, 1.0, -1.0) for layer in net.layers]
    gen = torch.Generator().manual_seed(seed)
    out = []
    for layer in net.layers:
        p = torch.sigmoid(2.0 * layer.h)
        u = torch.rand((samples, *p.shape), generator=gen)
        out.append(torch.where(u < p, 1.0, -1.0))
    return out


def binary_outputs(net: EBPNet, x: np.ndarray, weights: list[Tensor]) -> np.ndarray:
    """P(y = +1 | x) averaged over the binary networks in ``weights`` (see :func:`binary_weights`)."""
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
    with torch.no_grad():
        if weights[0].ndim == 3:
            xt = xt.expand(len(weights[0]), *xt.shape)
        probs = torch.softmax(net.logits(xt, weights), dim=-1)[..., 1]
        return (probs.mean(0) if probs.ndim == 2 else probs).numpy()


def fit_temperature(net: EBPNet, x: np.ndarray, y: np.ndarray, weights: list[Tensor]) -> float:
    """Set ``net.temperature`` to the κ (log grid 0.01..100) that maximises the training log-likelihood of the
    binary networks in ``weights``; returns it."""
    labels = np.asarray(y)
    best, best_ll = 1.0, -math.inf
    for kappa in np.geomspace(0.01, 100.0, 81):
        net.temperature.fill_(float(kappa))
        p1 = binary_outputs(net, x, weights)
        p = np.where(labels == 1, p1, 1.0 - p1)
        ll = float(np.mean(np.log(np.maximum(p, 1e-12))))
        if ll > best_ll:
            best, best_ll = float(kappa), ll
    net.temperature.fill_(best)
    return best
