"""2DGBNN stage 3 (stochastic weight sharing, AISTATS 2025): retrain a BNN with its weights tied to a codebook.

Stages 1-2 (Algorithm 1, lines 1-26), per weight matrix of a trained mean-field BNN, on the points
x_i = (μ_i, σ_i) of the (μ, σ) plane:

1. outliers keep their own Gaussian: |μ_i| > τ_w (0.2; raised to the (1 - ``max_outlier_fraction``) quantile
   of |μ| when more weights than that would qualify, as the ``codebook`` pass does);
2. the inliers are clustered into K groups (k-means, as the reference code), each group becomes the 2-D
   Gaussian N(m_k, S_k) of its members; groups with fewer than ``min_cluster_size`` members are dropped
   (their members become outliers);
3. components closer than the squared Wasserstein-2 distance τ_d are merged (Eq. 5-6);
4. an inlier whose squared Mahalanobis distance to its component exceeds 5.991 (χ²₂ 95%) moves to the most
   likely component that passes the test, if one does (the hard form of the ellipse step, Eq. 7).

Stage 3 (Algorithm 1, lines 27-37): every inlier weight is tied to its component, whose weight
distribution N(m_k, s_k²) — the component's (μ, σ) coordinates, both trainable — is drawn ONCE per
component per forward pass and shared by all its members; outliers and biases keep their own Gaussians
(w = μ + σ ε, one draw per pass). The objective is Eq. 10,

    L̂(D, q) = E_q[log p(y | X, w)] - Σ_k π_k KL(N_k || p(w_in)) - KL(q(w_out) || p(w_out)),

with the GMM term weighted by the mixture weights π_k = n_k / n_in as Eq. 10 writes it (one component's worth of
KL for all the inliers of a layer, not one per member) and the BNN's own N(0, prior_sigma²) prior; maximised with
Adam on mini-batches (the loss is -L̂ / N_train), the components' (m_k, s_k) at ``component_lr`` (10x the rest).
Between epochs, components are merged again (τ_d) and the inliers re-assigned (step 4) with the
components' current means and their stage-2 covariances.

Why those two settings (issue 38; the paper trains ResNets for 200 epochs at a stage-3 learning rate of 1e-5,
10x below its first training, and does not say how Eq. 10's sum is scaled): a draw shared by the n_k members of a
component moves them together, so a component needs a much smaller s_k than its members' independent σ gave
them for the same output noise. Counting the KL once per member (n_k times, an earlier reading of Eq. 10) pulls
every s_k back to the prior's scale and, with one learning rate for all, the s_k hardly move in 30 epochs: on
digits (5 seeds) the deployed model's NLL was 0.19-0.33 against the plain BNN's 0.07-0.11, ECE 0.11-0.22 against
0.02-0.03. Tying alone, before any training, is as bad (seed 0: NLL 0.29, ECE 0.20). With π_k and the components
at 1e-2, stage 3 shrinks s_k by about a fifth and the tied model is as calibrated as the plain BNN (docs/recipes.md).

The retrained model imports as Gaussians — every inlier carries its component's (m_k, s_k) — and
:func:`lower_stage3` (``lower(ir, "codebook", sampling="shared")``) finds the components back and keeps the
shared draws it was trained with (see :mod:`edgebnn.passes.codebook`; the pass's post-training default draws
each weight independently, which is what a posterior trained without sharing needs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgebnn.data import DigitsSplits
from edgebnn.errors import InvalidOptionError
from edgebnn.ir import BNNModel
from edgebnn.nn import BayesConv2d, BayesLinear, _gaussian_kl, bayesian_layers
from edgebnn.passes import PassResult, lower
from edgebnn.passes.codebook import blend_candidates, member_moments, merge_pair, own_mahalanobis, wasserstein2_sq
from edgebnn.train._loop import TrainResult, check_options, run_epochs, training_arrays


@dataclass(frozen=True)
class TieConfig:
    """Stages 1-2 settings (paper defaults where it gives one).

    Attributes:
        clusters: k-means groups per weight matrix before dropping and merging.
        outlier_threshold: τ_w: |μ| above it is an outlier.
        max_outlier_fraction: At most this fraction of a matrix becomes an |μ|-outlier.
        min_cluster_size: Groups with fewer members are dropped (members become outliers).
        merge_threshold: τ_d, merge components closer than this squared W2 distance.
        mahalanobis: χ²₂ bound of the ellipse test.
    """

    clusters: int = 16
    outlier_threshold: float = 0.2
    max_outlier_fraction: float = 0.02
    min_cluster_size: int = 20
    merge_threshold: float = 1.5e-7
    mahalanobis: float = 5.991

    def __post_init__(self) -> None:
        if not (isinstance(self.clusters, int) and self.clusters >= 1):
            raise InvalidOptionError(f"clusters={self.clusters!r} must be an integer >= 1")
        if not (isinstance(self.min_cluster_size, int) and self.min_cluster_size >= 1):
            raise InvalidOptionError(f"min_cluster_size={self.min_cluster_size!r} must be an integer >= 1")
        for name in ("outlier_threshold", "mahalanobis"):
            if not getattr(self, name) > 0:
                raise InvalidOptionError(f"{name}={getattr(self, name)!r} must be positive")
        if not 0 <= self.max_outlier_fraction <= 1 or self.merge_threshold < 0:
            raise InvalidOptionError("max_outlier_fraction must lie in [0, 1] and merge_threshold be >= 0")


class TiedBayesLayer(nn.Module):
    """A :class:`BayesLinear`/:class:`BayesConv2d` whose inlier weights share their component's draw.

    ``assign[i]`` is the component of weight i (flat index), -1 for an outlier. Components: trainable
    ``comp_mu`` and ``comp_rho`` (σ_k = softplus), fixed 2-D covariances ``comp_cov`` from stage 2, and
    ``alive`` (False once merged into another).
    """

    assign: Tensor
    points: Tensor
    comp_cov: Tensor
    alive: Tensor

    def __init__(self, layer: BayesLinear | BayesConv2d, assign: np.ndarray, means: np.ndarray, covs: np.ndarray,
                 points: np.ndarray):
        super().__init__()
        self.layer = layer
        self.use_mean = False
        self.register_buffer("assign", torch.as_tensor(assign, dtype=torch.long))
        self.register_buffer("points", torch.as_tensor(points, dtype=torch.float32))
        self.register_buffer("comp_cov", torch.as_tensor(covs, dtype=torch.float64))
        self.register_buffer("alive", torch.ones(len(means), dtype=torch.bool))
        sigma = torch.as_tensor(means[:, 1], dtype=torch.float32).clamp_min(1e-6)
        self.comp_mu = nn.Parameter(torch.as_tensor(means[:, 0], dtype=torch.float32))
        self.comp_rho = nn.Parameter(sigma + torch.log(-torch.expm1(-sigma)))  # softplus⁻¹

    @property
    def comp_sigma(self) -> Tensor:
        """σ_k = softplus(ρ_k)."""
        return F.softplus(self.comp_rho)

    def _tie(self, own: Tensor, shared: Tensor) -> Tensor:
        inlier = self.assign >= 0
        tied = shared[self.assign.clamp_min(0)]
        return torch.where(inlier, tied, own.reshape(-1)).reshape(own.shape)

    def posterior(self) -> tuple[Tensor, Tensor]:
        """Per-weight (μ, σ): the component's for inliers, the weight's own for outliers."""
        return (self._tie(self.layer.weight_mu, self.comp_mu),
                self._tie(self.layer.weight_sigma, self.comp_sigma))

    def forward(self, x: Tensor) -> Tensor:
        """Posterior mean (``use_mean``) or one draw per component, per outlier and per bias."""
        layer = self.layer
        if self.use_mean:
            return layer._apply_linear_op(x, self.posterior()[0], layer.bias_mu)
        shared = self.comp_mu + self.comp_sigma * torch.randn_like(self.comp_mu)
        own = layer.weight_mu + layer.weight_sigma * torch.randn_like(layer.weight_mu)
        bias = None
        if layer.bias_mu is not None and layer.bias_sigma is not None:
            bias = layer.bias_mu + layer.bias_sigma * torch.randn_like(layer.bias_mu)
        return layer._apply_linear_op(x, self._tie(own, shared), bias)

    def kl(self) -> Tensor:
        """Eq. 10's KL terms: Σ_k π_k KL(N(m_k, s_k²) || p), π_k = n_k / n_in, + KL of the outliers and the bias."""
        layer = self.layer
        inlier = self.assign >= 0
        counts = torch.bincount(self.assign[inlier], minlength=len(self.comp_mu)).to(self.comp_mu.dtype)
        ratio = (self.comp_sigma / layer.prior_sigma) ** 2
        per_comp = 0.5 * (ratio + (self.comp_mu / layer.prior_sigma) ** 2 - 1.0 - torch.log(ratio))
        out = ~inlier
        weights = counts / counts.sum().clamp_min(1.0)  # π_k (Eq. 10)
        total = torch.sum(weights * per_comp) + _gaussian_kl(
            layer.weight_mu.reshape(-1)[out], layer.weight_sigma.reshape(-1)[out], layer.prior_sigma
        )
        if layer.bias_mu is not None and layer.bias_sigma is not None:
            total = total + _gaussian_kl(layer.bias_mu, layer.bias_sigma, layer.prior_sigma)
        return total

    @torch.no_grad()
    def refresh(self, config: TieConfig) -> dict[str, int]:
        """Between epochs: merge live components closer than τ_d, then re-assign ellipse inliers."""
        means = torch.stack([self.comp_mu, self.comp_sigma], 1).double().cpu().numpy()
        covs = self.comp_cov.cpu().numpy()
        live = np.flatnonzero(self.alive.cpu().numpy())
        merged = 0
        while len(live) > 1:
            d = wasserstein2_sq(means[live][:, None], covs[live][:, None], means[live][None], covs[live][None])
            np.fill_diagonal(d, np.inf)
            if d.min() >= config.merge_threshold:
                break
            a, b = np.unravel_index(int(np.argmin(d)), d.shape)
            i, j = live[a], live[b]
            means[i], covs[i] = merge_pair(means[i], covs[i], means[j], covs[j])
            self.assign[self.assign == int(j)] = int(i)
            self.alive[int(j)] = False
            live = live[live != j]
            merged += 1
        self.comp_mu[:] = torch.as_tensor(means[:, 0], dtype=self.comp_mu.dtype)
        sigma = torch.as_tensor(means[:, 1], dtype=self.comp_rho.dtype).clamp_min(1e-6)
        self.comp_rho[:] = sigma + torch.log(-torch.expm1(-sigma))
        self.comp_cov[:] = torch.as_tensor(covs)
        moved = reassign(self.assign, self.points.cpu().numpy(), means, covs, self.alive.cpu().numpy(), config)
        return {"merged": merged, "moved": moved}


def reassign(assign: Tensor, points: np.ndarray, means: np.ndarray, covs: np.ndarray, alive: np.ndarray,
             config: TieConfig) -> int:
    """Step 4 in place: inliers outside their component's 95% ellipse move to the most likely passing one."""
    idx = np.flatnonzero(assign.cpu().numpy() >= 0)
    if idx.size == 0:
        return 0
    comp = assign.cpu().numpy()[idx]
    u, v = points[idx, 0], points[idx, 1]
    far = own_mahalanobis(u, v, comp, means, covs) > config.mahalanobis
    if not far.any():
        return 0
    live = np.flatnonzero(alive)
    best, logp = blend_candidates(u[far], v[far], means[live], covs[live], config.mahalanobis, 1)
    ok = np.isfinite(logp[:, 0])
    target = live[best[ok, 0]]
    rows = idx[far][ok]
    changed = int(np.count_nonzero(target != comp[far][ok]))
    assign[torch.as_tensor(rows)] = torch.as_tensor(target, dtype=assign.dtype)
    return changed


def _cluster(mu: np.ndarray, sigma: np.ndarray, config: TieConfig, seed: int) -> tuple[np.ndarray, ...]:
    """Stages 1-2 on one flat weight: ``(assign, means, covs)`` (``assign`` -1 for outliers)."""
    from sklearn.cluster import KMeans

    tau = config.outlier_threshold
    if np.mean(np.abs(mu) > tau) > config.max_outlier_fraction:
        tau = float(np.quantile(np.abs(mu), 1.0 - config.max_outlier_fraction))
    assign = np.full(mu.size, -1, np.int64)
    inl = np.flatnonzero(np.abs(mu) <= tau)
    k = min(config.clusters, inl.size // config.min_cluster_size)
    if k < 1:
        return assign, np.zeros((0, 2)), np.zeros((0, 2, 2))
    pts = np.stack([mu[inl], sigma[inl]], 1).astype(np.float64)
    labels = KMeans(n_clusters=k, n_init=1, random_state=seed).fit_predict(pts)
    count, means, covs = member_moments(pts[:, 0].astype(np.float32), pts[:, 1].astype(np.float32), labels, k)
    keep = count >= config.min_cluster_size
    relabel = np.full(k, -1, np.int64)
    relabel[keep] = np.arange(int(keep.sum()))
    assign[inl] = relabel[labels]
    return assign, means[keep], covs[keep]


def tie_to_codebook(model: nn.Module, config: TieConfig | None = None, *, seed: int = 0) -> dict[str, dict[str, int]]:
    """Stages 1-2: replace every Bayesian weight matrix of a trained BNN by a :class:`TiedBayesLayer`, in place.

    Returns:
        Per layer: ``outliers``, ``components`` and ``moved`` (inliers re-assigned by the ellipse test).
    """
    config = config or TieConfig()
    report: dict[str, dict[str, int]] = {}
    layers = list(bayesian_layers(model))
    if not layers:
        raise InvalidOptionError("tie_to_codebook: the model has no BayesLinear/BayesConv2d layers")
    for path, layer in layers:
        if not path:
            raise InvalidOptionError("tie_to_codebook: wrap a bare Bayesian layer in a container first")
        mu = layer.weight_mu.detach().cpu().numpy().reshape(-1)
        sigma = layer.weight_sigma.detach().cpu().numpy().reshape(-1)
        assign, means, covs = _cluster(mu, sigma, config, seed)
        tied = TiedBayesLayer(layer, assign, means, covs, np.stack([mu, sigma], 1))
        moved = tied.refresh(config)["moved"]
        parent_path, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent_path) if parent_path else model, name, tied)
        report[path] = {"outliers": int((tied.assign < 0).sum()), "components": int(tied.alive.sum()),
                        "moved": moved}
    return report


def tied_layers(model: nn.Module) -> list[tuple[str, TiedBayesLayer]]:
    """``(path, layer)`` of every :class:`TiedBayesLayer` of ``model``."""
    return [(p, m) for p, m in model.named_modules() if isinstance(m, TiedBayesLayer)]


def train_stage3(
    model: nn.Module,
    data: DigitsSplits | tuple[np.ndarray, np.ndarray],
    *,
    config: TieConfig | None = None,
    epochs: int = 30,
    batch_size: int = 64,
    lr: float = 1e-3,
    component_lr: float = 1e-2,
    kl_warmup_epochs: int = 0,
    seed: int = 0,
) -> TrainResult:
    """Stage 3: retrain a model prepared by :func:`tie_to_codebook` in place (Eq. 10; merge and re-assign
    between epochs).

    Args:
        model: A classifier returning logits ``(N, C)`` whose Bayesian layers are :class:`TiedBayesLayer`.
        data: A :class:`DigitsSplits` (validation accuracy per epoch) or an ``(x, y)`` training pair.
        config: The merge and ellipse settings used between epochs.
        epochs: Passes over the training data.
        batch_size: Examples per Adam step.
        lr: Peak Adam learning rate (cosine decay to 0) of the outliers, biases and other parameters.
        component_lr: Peak learning rate of the components' (m_k, ρ_k): shared draws need smaller s_k than the
            members' σ, which they reach only at a higher rate (module docstring).
        kl_warmup_epochs: KL warm-up epochs (0: the retraining starts from a trained posterior).
        seed: Seeds torch and the shuffling.

    Raises:
        InvalidOptionError: Bad options, malformed data, inputs the model rejects, an empty class, or no
            tied layers.
        EdgeBNNError: NaN or inf loss or parameters; names the epoch, the model keeps finite parameters.
    """
    config = config or TieConfig()
    check_options(epochs, batch_size, kl_warmup_epochs, lr)
    if not (isinstance(component_lr, (int, float)) and np.isfinite(component_lr) and component_lr > 0):
        raise InvalidOptionError(f"component_lr={component_lr!r} must be a positive finite number")
    layers = [m for _, m in tied_layers(model)]
    if not layers:
        raise InvalidOptionError("train_stage3: no TiedBayesLayer in the model; run tie_to_codebook first")
    x, y, val = training_arrays(model, data)

    def loss_terms(xb: Tensor, yb: Tensor) -> tuple[Tensor, Tensor]:
        return F.cross_entropy(model(xb), yb), torch.stack([m.kl() for m in layers]).sum()

    def between_epochs(_epoch: int) -> None:
        for m in layers:
            m.refresh(config)

    shared = {id(p) for m in layers for p in (m.comp_mu, m.comp_rho)}
    groups = [{"params": [p for p in model.parameters() if id(p) not in shared], "lr": lr},
              {"params": [p for m in layers for p in (m.comp_mu, m.comp_rho)], "lr": component_lr}]
    return run_epochs(model, groups, x, y, val, loss_terms,
                      recipe="2dgbnn", epochs=epochs, batch_size=batch_size, kl_warmup_epochs=kl_warmup_epochs,
                      seed=seed, after_epoch=between_epochs)


def lower_stage3(bnn: BNNModel, *, seed: int = 0, **options: Any) -> PassResult:
    """Lower a stage-3 model, imported into the IR, with ``codebook`` at ``sampling="shared"``: one draw per
    entry per sample, as it was trained (Eq. 10).

    Args:
        bnn: The IR of a model retrained by :func:`train_stage3` (``import_model``).
        seed: Seed of the lowering.
        **options: More ``codebook`` options (e.g. ``clusters``).

    Returns:
        The lowering result of :func:`edgebnn.passes.lower`.
    """
    return lower(bnn, "codebook", seed=seed, sampling="shared", **options)


def stage_summary(model: nn.Module) -> dict[str, Any]:
    """Totals over the tied layers: weights, outliers and live components."""
    layers = [m for _, m in tied_layers(model)]
    weights = sum(int(m.assign.numel()) for m in layers)
    outliers = sum(int((m.assign < 0).sum()) for m in layers)
    return {"weights": weights, "outliers": outliers, "outlier_fraction": round(outliers / max(weights, 1), 4),
            "components": sum(int(m.alive.sum()) for m in layers)}
