"""``codebook``: stochastic weight sharing on the (μ, σ) plane (2DGBNN), post-training.

Per weight matrix, on the points x_i = (μ_i, σ_i):

1. **Outliers** keep their own Gaussian: |μ_i| > τ (``outlier_threshold``, paper: 0.2); if that would take
   more than ``max_outlier_fraction`` of the layer (τ is absolute, layers differ in scale), τ is raised to
   that quantile of |μ| and the note says so. With ``gradients`` (``{weight name: array}``) the top
   ``gradient_top`` (1%) of |∇| in the layer are outliers too. Exact zeros (μ = σ = 0, e.g. after
   ``prune``) share a reserved entry (0, 0), so pruned weights stay exact zeros.
2. **Mini-batch Gaussian mixture** on the inliers, in weight units (both axes shifted, then divided by ONE
   common scale, so the geometry is kept): on the (μ, σ) plane the Euclidean distance between two points
   is exactly the Wasserstein-2 distance between the 1-D Gaussians N(μ, σ²) they stand for, so the
   mixture's components share one isotropic covariance ``var · I`` (like the reference code's k-means,
   which a full-covariance likelihood fit is not: it spends components on σ structure the accuracy does
   not need). Mixing weights, means and ``var`` are fitted by online EM (Cappé & Moulines) on a seeded
   pool of at most 65 536 points, from ``K`` equal-count slices along the pool's principal axis: per
   mini-batch of ``batch_size`` the statistics (Σ r_k, Σ r_k x, Σ ||x||²) are blended in with step
   γ_t = (t + 2)^-0.6, ``steps`` times (full-batch EM when the pool fits one batch). The fit costs
   O(steps · batch · K) whatever the layer size; assigning all n points to their most probable component
   is O(n K), chunk by chunk.
3. Each component then gets the full 2-D Gaussian of its members (mean and covariance): the "Gaussians"
   of the paper, used for merging, the Mahalanobis test and the plots.
4. **Wasserstein-2 merging**: components with W2² < ``merge_threshold`` (paper: 1.5e-7, in the weights'
   units) are merged, closest pair first, until none is left, where for 2-D Gaussians

       W2² = ||m1 - m2||² + tr S1 + tr S2 - 2 sqrt(tr(S1 S2) + 2 sqrt(det S1 det S2))

   (the closed form of tr (S1^½ S2 S1^½)^½ for 2 × 2 matrices) and the merged component is the paper's
   eq. 5-6: m = (m1 + m2)/2, S = (S1 + S2)/2 + (m1 - m2)(m1 - m2)ᵀ/8 + ½ (S1^½ S2 S1^½)^½.
   Components with fewer than ``min_cluster_size`` members (paper: 30) are dropped; their members become
   outliers.
5. **Ellipse blending**: an inlier whose squared Mahalanobis distance to its component exceeds
   ``mahalanobis`` (5.991, the χ²₂ 95% point) is re-examined against every component. If two or more
   components pass the test, it is blended over the (at most ``blend_max``) most likely of them with
   α_k ∝ N(x_i; m_k, S_k); if one passes, it moves there; if none does, it stays (counted as ``unmatched``).
   As in the paper (tens to hundreds of "ellipses" per million weights) this is rare, which suits the
   storage: a blended weight costs a flat index plus ``blend_max`` (entry, α) byte pairs.
6. The stored entry of component k is (mean μ of its members, root mean square σ of its members), so the
   entry's spread is the members' posterior σ, not the spread of their means.

Sampling (``sampling``, recorded in the encoding, :class:`~edgebnn.ir.encodings.CodebookWeight`):
``independent`` (default) draws every weight on its own from its entry's N(m_k, s_k²) (outliers from their
own Gaussian, blended weights from their mixture's moments): the mean-field posterior the codebook came
from, with K-entry storage. ``shared`` is the paper's stochastic weight sharing (one draw per entry per
sample, shared by its members), for posteriors trained with it (2DGBNN stage 3, ``edgebnn.train.dgbnn``).
Applied post-training to a posterior trained with independent noise, ``shared`` correlates thousands of
weights the posterior learned as independent; on the digits CNN (f = 0.25) it took NLL from 0.11 to 0.47 and made
noise blobs look more familiar than digits to the mutual information (docs/uncertainty.md), so the report
notes it on every layer it encodes. Indices are packed to ceil(log2 K) bits.

Bits from variance (``bits=None``): the smallest K = 2^b (b = 1..8) whose within-cluster squared error
of the means, measured on the pool, is at most ``noise_fraction`` · mean(σ²) (default 0.1, as ``fixed``:
the error is an offset every draw shares); ``bits=N`` / ``clusters=K``
force it (then merging may still leave fewer entries).

Fallbacks, each reported in ``note``: biases (1-D), layers too small to cluster (fewer than
K · ``min_cluster_size`` inliers — including "K larger than the number of points"), and, in ``auto``
mode, layers whose variance budget no K they can fill meets (K is capped at n_inliers / min_cluster_size
and at 2^8) are lowered with ``fixed``. The gradient part of the paper's merge test (merge only
low-gradient components) is not used: lowering sees a trained posterior, not a training run.

Report keys besides the common ones: ``clusters`` (entries, zero entry included), ``outliers``,
``outlier_threshold`` (τ used), ``blended``, ``unmatched``, ``merged``, ``dropped_clusters``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import BNNModel, EncodedWeight
from edgebnn.ir.encodings import CodebookWeight
from edgebnn.ir.encodings.codebook import SAMPLINGS
from edgebnn.passes.base import (
    DEFAULT_NOISE_FRACTION,
    LayerOutcome,
    QuantConfig,
    check_float,
    check_int,
    degenerate_note,
    join_notes,
    posterior,
    sum_sq_diff,
)
from edgebnn.passes.fixed import MatrixPass

MAX_CLUSTERS = 4096
AUTO_MAX_BITS = 8
_POOL = 65536
_ASSIGN_CHUNK = 8192
_SUM_CHUNK = 1 << 18
_REG = 1e-6  # covariance floor, in standardised units
_FULL_EM_ITERS = 30


@dataclass(frozen=True)
class CodebookConfig(QuantConfig):
    """Settings of ``codebook`` (defaults from the 2DGBNN paper where it gives one).

    Attributes:
        clusters: Force K mixture components (then ``bits`` must be None).
        outlier_threshold: τ, |μ| above it is an outlier.
        max_outlier_fraction: At most this fraction of a layer becomes an |μ|-outlier (τ is raised).
        gradients: ``{weight name: gradient array}``; the top ``gradient_top`` of |∇| are outliers.
        gradient_top: Fraction of each layer's largest gradients kept as outliers.
        min_cluster_size: Components with fewer members are dropped (members become outliers).
        merge_threshold: Merge components closer than this squared Wasserstein-2 distance.
        mahalanobis: Squared Mahalanobis distance beyond which an inlier is blended.
        blend_max: Most components one blended weight mixes (0: no blending).
        batch_size: Mini-batch size of the online EM.
        steps: Mini-batch EM steps.
        sampling: ``independent`` (each weight draws from its entry on its own) or ``shared`` (2DGBNN: one
            draw per entry per sample; for posteriors trained for it).
        noise_fraction: f of the variance rule (default :data:`~edgebnn.passes.base.DEFAULT_NOISE_FRACTION`).
    """

    noise_fraction: float = DEFAULT_NOISE_FRACTION
    clusters: int | None = None
    outlier_threshold: float = 0.2
    max_outlier_fraction: float = 0.02
    gradients: Mapping[str, np.ndarray] | None = field(default=None, compare=False)
    gradient_top: float = 0.01
    min_cluster_size: int = 30
    merge_threshold: float = 1.5e-7
    mahalanobis: float = 5.991
    blend_max: int = 2
    batch_size: int = 4096
    steps: int = 50
    sampling: str = "independent"

    BITS_RANGE: ClassVar[tuple[int, int]] = (1, 12)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.clusters is not None:
            check_int(self.clusters, "clusters", 1, MAX_CLUSTERS)
            if self.bits is not None:
                raise InvalidOptionError(f"clusters={self.clusters} and bits={self.bits}: give one")
        check_float(self.outlier_threshold, "outlier_threshold", 0.0, 1e30, lo_open=True)
        check_float(self.max_outlier_fraction, "max_outlier_fraction", 0.0, 1.0)
        check_float(self.gradient_top, "gradient_top", 0.0, 1.0)
        check_int(self.min_cluster_size, "min_cluster_size", 1, 1 << 30)
        check_float(self.merge_threshold, "merge_threshold", 0.0, 1e30)
        check_float(self.mahalanobis, "mahalanobis", 0.0, 1e30, lo_open=True)
        check_int(self.blend_max, "blend_max", 0, 16)
        check_int(self.batch_size, "batch_size", 16, 1 << 20)
        check_int(self.steps, "steps", 1, 100000)
        if self.sampling not in SAMPLINGS:
            raise InvalidOptionError(f"sampling={self.sampling!r}: choose {' or '.join(SAMPLINGS)}")
        if self.gradients is not None and not isinstance(self.gradients, Mapping):
            raise InvalidOptionError("gradients must map weight names to arrays")


# --- 2-D Gaussian algebra (components as arrays: means [K, 2], covariances [K, 2, 2]) -----------------------


def _sqrtm2(s: np.ndarray) -> np.ndarray:
    """Square roots of symmetric PSD 2 × 2 matrices [..., 2, 2]: (S + √det S · I) / √(tr S + 2√det S)."""
    det = np.sqrt(np.maximum(s[..., 0, 0] * s[..., 1, 1] - s[..., 0, 1] * s[..., 1, 0], 0))
    t = np.sqrt(np.maximum(s[..., 0, 0] + s[..., 1, 1] + 2 * det, 1e-300))
    return (s + det[..., None, None] * np.eye(2)) / t[..., None, None]


def wasserstein2_sq(m1: np.ndarray, s1: np.ndarray, m2: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """Squared W2 distance between 2-D Gaussians (broadcasting over leading dims)."""
    det1 = np.linalg.det(s1)
    det2 = np.linalg.det(s2)
    cross = np.einsum("...ij,...ji->...", s1, s2) + 2 * np.sqrt(np.maximum(det1 * det2, 0))
    tr = np.trace(s1, axis1=-2, axis2=-1) + np.trace(s2, axis1=-2, axis2=-1)
    return np.sum((m1 - m2) ** 2, axis=-1) + np.maximum(tr - 2 * np.sqrt(np.maximum(cross, 0)), 0)


def merge_pair(m1: np.ndarray, s1: np.ndarray, m2: np.ndarray, s2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The paper's merge (eq. 5-6)."""
    r1 = _sqrtm2(s1)
    d = (m1 - m2)[:, None]
    cov = (s1 + s2) / 2 + (d @ d.T) / 8 + _sqrtm2(r1 @ s2 @ r1) / 2
    return (m1 + m2) / 2, cov


def merge_components(
    means: np.ndarray, covs: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge the closest pair while its W2² < threshold.

    Returns the merged means and covariances and, per input component, the index it ended up in.
    """
    means, covs = means.copy(), covs.copy()
    label = np.arange(len(means))
    dist = wasserstein2_sq(means[:, None], covs[:, None], means[None], covs[None])
    np.fill_diagonal(dist, np.inf)
    while dist.size and dist.min() < threshold:
        i, j = np.unravel_index(int(np.argmin(dist)), dist.shape)
        means[i], covs[i] = merge_pair(means[i], covs[i], means[j], covs[j])
        keep = np.arange(len(means)) != j
        means, covs = means[keep], covs[keep]
        dist = dist[np.ix_(keep, keep)]
        label[label == j] = i
        label[label > j] -= 1
        i -= int(j < i)
        row = wasserstein2_sq(means[i], covs[i], means, covs)
        row[i] = np.inf
        dist[i], dist[:, i] = row, row
    return means, covs, label


def _log_scores(x: np.ndarray, means: np.ndarray, var: float, log_weights: np.ndarray) -> np.ndarray:
    """log π_k N(x; m_k, var·I) up to a per-point constant, float32 [n, K].

    = (x · m_k - ||m_k||²/2) / var + log π_k; written as two broadcast products because a matrix product
    with an inner dimension of 2 is slower through BLAS than in plain numpy.
    """
    w = (means / var).astype(np.float32)
    bias = (log_weights - 0.5 * np.sum(means**2, axis=1) / var).astype(np.float32)
    scores = x[:, :1] * w[:, 0]
    scores += x[:, 1:] * w[:, 1]
    scores += bias
    return scores


def _responsibilities(x: np.ndarray, means: np.ndarray, var: float, log_weights: np.ndarray) -> np.ndarray:
    """Posterior component probabilities under the tied isotropic mixture, float32 [n, K]."""
    resp = _log_scores(x, means, var, log_weights)
    resp -= resp.max(axis=1, keepdims=True)
    np.maximum(resp, -80, out=resp)  # exp underflows to 0 either way; avoid slow denormals
    np.exp(resp, out=resp)
    resp /= resp.sum(axis=1, keepdims=True)
    return resp


def fit_mixture(
    pool: np.ndarray, k: int, rng: np.random.Generator, *, batch_size: int, steps: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """Mini-batch (online) EM for a K-component mixture with one shared isotropic covariance ``var · I``.

    Starts from ``k`` equal-count slices along the pool's principal axis. Returns means [K, 2], mixing
    weights [K] and ``var``.
    """
    centred = pool - pool.mean(axis=0)
    axis = np.linalg.eigh(centred.T @ centred)[1][:, -1]
    slices = np.array_split(np.argsort(centred @ axis, kind="stable"), k)
    means = np.stack([pool[sl].mean(axis=0) for sl in slices])
    weights = np.array([len(sl) for sl in slices], float) / len(pool)
    floor = 1e-12 * max(float(np.mean(np.sum(centred**2, axis=1))), 1e-30)
    spread = sum(float(np.sum((pool[sl] - means[i]) ** 2)) for i, sl in enumerate(slices))
    var = max(spread / len(pool) / 2, floor)
    x32 = pool.astype(np.float32)
    full = len(pool) <= batch_size
    s0, s1, sx2 = np.zeros(k), np.zeros((k, 2)), 0.0  # running per-point statistics; step 0 replaces them
    for t in range(_FULL_EM_ITERS if full else steps):
        x = x32 if full else x32[rng.integers(0, len(pool), batch_size)]
        resp = _responsibilities(x, means, var, np.log(weights))
        b0 = resp.mean(axis=0, dtype=np.float64)
        b1 = np.stack([(resp * x[:, :1]).mean(axis=0, dtype=np.float64),
                       (resp * x[:, 1:]).mean(axis=0, dtype=np.float64)], axis=1)
        bx2 = float(np.mean(np.sum(x.astype(np.float64) ** 2, axis=1)))
        gamma = 1.0 if full or t == 0 else (t + 2) ** -0.6
        s0, s1, sx2 = (1 - gamma) * s0 + gamma * b0, (1 - gamma) * s1 + gamma * b1, (1 - gamma) * sx2 + gamma * bx2
        alive = s0 > 1e-12
        means[alive] = s1[alive] / s0[alive, None]
        weights = np.maximum(s0, 1e-12) / np.maximum(s0, 1e-12).sum()
        var = max((sx2 - float(np.sum(s0 * np.sum(means**2, axis=1)))) / 2, floor)
    return means, weights, var


def assign(u: np.ndarray, v: np.ndarray, means: np.ndarray, weights: np.ndarray, var: float) -> np.ndarray:
    """Most probable component (int32) of each standardised point under the tied isotropic mixture."""
    comp = np.empty(u.size, np.int32)
    x = np.empty((min(u.size, _ASSIGN_CHUNK), 2), np.float32)
    log_weights = np.log(weights)
    for start in range(0, u.size, _ASSIGN_CHUNK):
        stop = min(start + _ASSIGN_CHUNK, u.size)
        xs = x[: stop - start]
        xs[:, 0], xs[:, 1] = u[start:stop], v[start:stop]
        comp[start:stop] = np.argmax(_log_scores(xs, means, var, log_weights), axis=1)
    return comp


def group_sums(comp: np.ndarray, k: int, *values: np.ndarray) -> np.ndarray:
    """``[len(values) + 1, k]``: member counts, then per-component sums of each array (float64).

    Chunked, so numpy's internal int64/float64 copies stay small however many points there are.
    """
    out = np.zeros((len(values) + 1, k))
    for start in range(0, comp.size, _SUM_CHUNK):
        c = comp[start : start + _SUM_CHUNK]
        out[0] += np.bincount(c, minlength=k)
        for row, arr in enumerate(values, start=1):
            out[row] += np.bincount(c, arr[start : start + _SUM_CHUNK], k)
    return out


def member_moments(u: np.ndarray, v: np.ndarray, comp: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Per component: member count, mean [K, 2] and covariance [K, 2, 2] (plus a small floor).

    Two passes (means, then centred products), chunk by chunk in float32 with float64 sums.
    """
    count, su, sv = group_sums(comp, k, u, v)
    safe = np.maximum(count, 1)
    mean = np.stack([su, sv], axis=1) / safe[:, None]
    m32 = mean.astype(np.float32)
    second = np.zeros((3, k))
    for start in range(0, comp.size, _SUM_CHUNK):
        c = comp[start : start + _SUM_CHUNK]
        du = u[start : start + _SUM_CHUNK] - m32[c, 0]
        dv = v[start : start + _SUM_CHUNK] - m32[c, 1]
        second += group_sums(c, k, du * du, dv * dv, du * dv)[1:]
    cov = np.empty((k, 2, 2))
    cov[:, 0, 0] = second[0] / safe + _REG
    cov[:, 1, 1] = second[1] / safe + _REG
    cov[:, 0, 1] = cov[:, 1, 0] = second[2] / safe
    return count, mean, cov


def mahalanobis_sq(u: np.ndarray, v: np.ndarray, means: np.ndarray, covs: np.ndarray) -> np.ndarray:
    """Squared Mahalanobis distance of points to component(s): broadcasting over u/v vs means/covs."""
    det = covs[..., 0, 0] * covs[..., 1, 1] - covs[..., 0, 1] ** 2
    du, dv = u - means[..., 0], v - means[..., 1]
    return (covs[..., 1, 1] * du * du - 2 * covs[..., 0, 1] * du * dv + covs[..., 0, 0] * dv * dv) / det


def own_mahalanobis(u: np.ndarray, v: np.ndarray, comp: np.ndarray, means: np.ndarray, covs: np.ndarray) -> np.ndarray:
    """Squared Mahalanobis distance (float32) of each point to its own component, chunk by chunk."""
    det = covs[:, 0, 0] * covs[:, 1, 1] - covs[:, 0, 1] ** 2
    prec = np.stack([covs[:, 1, 1], -covs[:, 0, 1], covs[:, 0, 0]], axis=1) / det[:, None]
    prec, m = prec.astype(np.float32), means.astype(np.float32)
    out = np.empty(u.size, np.float32)
    for start in range(0, u.size, _ASSIGN_CHUNK * 8):
        stop = min(start + _ASSIGN_CHUNK * 8, u.size)
        c = comp[start:stop]
        du, dv, p = u[start:stop] - m[c, 0], v[start:stop] - m[c, 1], prec[c]
        out[start:stop] = p[:, 0] * du * du + 2 * p[:, 1] * du * dv + p[:, 2] * dv * dv
    return out


def blend_candidates(
    u: np.ndarray, v: np.ndarray, means: np.ndarray, covs: np.ndarray, limit: float, top: int
) -> tuple[np.ndarray, np.ndarray]:
    """For each point, the ``top`` most likely components whose Mahalanobis² <= ``limit``.

    Returns ``(components [n, top], log-densities [n, top])``; slots without a passing component hold -inf.
    """
    log_det = np.log(covs[:, 0, 0] * covs[:, 1, 1] - covs[:, 0, 1] ** 2)
    comps = np.zeros((u.size, top), np.int64)
    logp = np.full((u.size, top), -np.inf)
    step = max(1, (1 << 18) // len(means))  # points per chunk: bounds the [points, K] temporaries
    for start in range(0, u.size, step):
        stop = min(start + step, u.size)
        d2 = mahalanobis_sq(u[start:stop, None], v[start:stop, None], means[None], covs[None])
        lp = np.where(d2 <= limit, -0.5 * d2 - 0.5 * log_det, -np.inf)
        best = np.argsort(-lp, axis=1, kind="stable")[:, :top]
        comps[start:stop] = best
        logp[start:stop] = np.take_along_axis(lp, best, axis=1)
    return comps, logp


# --- the pass ---------------------------------------------------------------------------------------------


def _outlier_mask(
    name: str, mu: np.ndarray, config: CodebookConfig
) -> tuple[np.ndarray, float, str | None]:
    mag = np.abs(mu)
    tau = config.outlier_threshold
    note = None
    cap = int(config.max_outlier_fraction * mu.size)
    if np.count_nonzero(mag > tau) > cap:
        tau = float(np.partition(mag, mu.size - cap - 1)[mu.size - cap - 1]) if cap < mu.size else 0.0
        note = f"outlier threshold raised to {tau:.4g} to keep outliers <= {config.max_outlier_fraction:.3g}"
    out = mag > tau
    grads = (config.gradients or {}).get(name)
    if grads is not None:
        g = np.abs(np.asarray(grads, np.float32)).reshape(-1)
        if g.size != mu.size:
            raise InvalidOptionError(f"gradients[{name!r}] has {g.size} elements, the weight has {mu.size}")
        n_top = int(np.ceil(config.gradient_top * mu.size))
        if n_top:
            out[np.argpartition(g, mu.size - n_top)[mu.size - n_top :]] = True
    return out, tau, note


def _cluster_error(pool: np.ndarray, means: np.ndarray, weights: np.ndarray, var: float) -> float:
    """Mean squared error of the pool's μ coordinate against its cluster's member mean."""
    comp = assign(pool[:, 0], pool[:, 1], means, weights, var)
    count = np.maximum(np.bincount(comp, minlength=len(means)), 1)
    centre = np.bincount(comp, weights=pool[:, 0], minlength=len(means)) / count
    return float(np.mean((pool[:, 0] - centre[comp]) ** 2))


def _frame(mu: np.ndarray, sigma: np.ndarray) -> tuple[np.ndarray, float]:
    """Centre of the (μ, σ) cloud and ONE scale for both axes (Euclidean geometry, i.e. W2, is kept)."""
    centre = np.array([mu.mean(dtype=np.float64), sigma.mean(dtype=np.float64)])
    scale = float(mu.std(dtype=np.float64)) or float(sigma.std(dtype=np.float64)) or 1.0
    return centre, scale


def _choose_mixture(
    pool: np.ndarray, forced: int | None, most: int, has_zero: bool, budget: float, rng: np.random.Generator,
    config: CodebookConfig,
) -> tuple[np.ndarray, np.ndarray, float] | str:
    """Fit the mixture with the forced K, or the smallest K = 2^b (- zero entry) meeting the budget.

    Returns why not when no K the layer can fill meets the budget.
    """
    fit = {"batch_size": config.batch_size, "steps": config.steps}
    if forced is not None:
        return fit_mixture(pool, forced, rng, **fit)
    for bits in range(1, AUTO_MAX_BITS + 1):
        k = min((1 << bits) - int(has_zero), most)
        means, weights, var = fit_mixture(pool, k, rng, **fit)
        err = _cluster_error(pool, means, weights, var)
        if err <= budget:
            return means, weights, var
        if k == most:
            break
    return (
        f"the cluster error {err:.3g} stays above the variance budget {budget:.3g} up to K={k}, the most "
        f"this layer allows"
    )


def lower_codebook(
    name: str, mu: np.ndarray, sigma: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator,
    config: CodebookConfig,
) -> LayerOutcome | str:
    """Encode one Gaussian weight as a :class:`CodebookWeight`, or return why it is too small to cluster."""
    n = mu.size
    zero = (mu == 0) & (sigma == 0)
    has_zero = bool(zero.any())
    outlier, tau, tau_note = _outlier_mask(name, mu, config)
    outlier &= ~zero
    inlier = ~(outlier | zero)
    del zero  # weight-sized masks and arrays are dropped as soon as they are used: a big layer holds few at once
    n_in = int(np.count_nonzero(inlier))
    most = n_in // config.min_cluster_size
    forced = config.clusters or ((1 << config.bits) - int(has_zero) if config.bits else None)
    if forced is not None and forced > most:
        return f"{n_in} inlier weights cannot fill {forced} clusters of >= {config.min_cluster_size} (min_cluster_size)"
    if most < 1:
        return f"{n_in} inlier weights are too few to cluster (min_cluster_size {config.min_cluster_size})"

    # standardised inlier coordinates and the seeded fitting pool
    u, v = mu[inlier], sigma[inlier]
    centre, scale = _frame(u, v)
    u -= np.float32(centre[0])
    u /= np.float32(scale)
    v -= np.float32(centre[1])
    v /= np.float32(scale)
    pick = rng.choice(n_in, _POOL, replace=False) if n_in > _POOL else np.arange(n_in)
    pool = np.stack([u[pick], v[pick]], axis=1).astype(np.float64)
    budget = config.noise_fraction * sum_sq_diff(sigma) / n / scale**2
    mixture = _choose_mixture(pool, forced, most, has_zero, budget, rng, config)
    if isinstance(mixture, str):
        return mixture
    means, weights, var = mixture

    # hard assignment, member Gaussians, Wasserstein merging (in weight units)
    comp = assign(u, v, means, weights, var)
    count, m_std, cov_std = member_moments(u, v, comp, len(means))
    live = count > 0
    remap = (np.cumsum(live) - 1).astype(np.int32)
    m_raw, cov_raw, label = merge_components(m_std[live] * scale + centre, cov_std[live] * scale**2,
                                             config.merge_threshold)
    merged = int(np.count_nonzero(live)) - len(m_raw)
    comp = label.astype(np.int32)[remap][comp]  # the two maps composed first: one weight-sized array, not two
    m_std, cov_std = (m_raw - centre) / scale, cov_raw / scale**2

    # components too small to share become outliers
    small = group_sums(comp, len(m_std))[0] < config.min_cluster_size
    dropped = int(np.count_nonzero(small))
    if dropped == len(m_std):
        return f"every cluster has fewer than {config.min_cluster_size} members"
    gone = small[comp]
    outlier[inlier] = gone  # outlier is False on every inlier: this marks the inliers that are gone
    inlier &= ~outlier
    keep = ~small
    m_std, cov_std, m_raw, cov_raw = m_std[keep], cov_std[keep], m_raw[keep], cov_raw[keep]
    stay = ~gone
    if gone.any():
        u = u[stay]
        v = v[stay]
    comp = comp[stay]
    comp = (np.cumsum(keep) - 1).astype(np.int32)[comp]
    del gone, stay

    # ellipse blending of inliers outside their component's 95% ellipse
    top = max(config.blend_max, 1)
    blended, b_comps, b_logp, unmatched = np.zeros(0, np.int64), np.zeros((0, top), np.int64), np.zeros((0, top)), 0
    far = np.flatnonzero(own_mahalanobis(u, v, comp, m_std, cov_std) > config.mahalanobis)
    if far.size and config.blend_max > 0:
        cands, logp = blend_candidates(u[far], v[far], m_std, cov_std, config.mahalanobis, config.blend_max)
        n_pass = np.isfinite(logp).sum(axis=1)
        unmatched = int(np.count_nonzero(n_pass == 0))
        comp[far[n_pass == 1]] = cands[n_pass == 1, 0]
        multi = n_pass >= 2
        blended, b_comps, b_logp = far[multi], cands[multi], logp[multi]
    elif far.size:
        unmatched = int(far.size)

    # entries: members' mean μ and rms σ; a component left without hard members keeps its Gaussian
    k = len(m_raw)
    del u, v
    blend_flat = np.flatnonzero(inlier)[blended]
    hard = inlier.copy()
    hard[blend_flat] = False
    hard_var = sigma[hard]
    members, sum_mu, sum_var = group_sums(
        np.delete(comp, blended) if blended.size else comp, k, mu[hard], np.square(hard_var, out=hard_var)
    )
    del hard, hard_var
    safe = np.maximum(members, 1)
    entry_mu = np.where(members > 0, sum_mu / safe, m_raw[:, 0])
    entry_var = np.where(members > 0, sum_var / safe, m_raw[:, 1] ** 2 + cov_raw[:, 1, 1])
    offset = int(has_zero)
    codebook = np.zeros((k + offset, 2), np.float32)
    codebook[offset:, 0], codebook[offset:, 1] = entry_mu, np.sqrt(entry_var)
    indices = np.zeros(n, np.uint16)  # K <= 4096 + the zero entry
    indices[inlier] = comp + offset
    alpha = np.exp(b_logp - b_logp[:, :1])  # slot 0 is the most likely: alpha in (0, 1], -inf slots -> 0
    alpha_q = np.rint(alpha * 255).astype(np.uint8)
    alpha_q[:, 0] = 255
    out_idx = np.flatnonzero(outlier)
    enc = CodebookWeight(
        shape, indices, codebook, out_idx, mu[out_idx], sigma[out_idx], blend_flat, b_comps + offset, alpha_q,
        sampling=config.sampling,
    )
    extra = {
        "clusters": k + offset,
        "outliers": int(out_idx.size),
        "outlier_threshold": tau,
        "blended": int(blended.size),
        "unmatched": unmatched,
        "merged": merged,
        "dropped_clusters": dropped,
    }
    return LayerOutcome(enc, join_notes(degenerate_note(mu, sigma), tau_note), extra)


class CodebookPass(MatrixPass):
    """Lower every Gaussian weight matrix to a 2DGBNN stochastic weight-sharing codebook."""

    name = "codebook"
    config_type = CodebookConfig
    config: CodebookConfig
    ENCODING = "CodebookWeight"

    def post_training_note(self, model: BNNModel) -> str | None:
        """Shared draws keep only posteriors trained with them (2DGBNN stage 3); independent ones keep any."""
        if self.config.sampling != "shared" or "edgebnn-2dgbnn" in model.manifest.source_library.split("+"):
            return None
        return (f"sampling='shared' on a posterior not trained with shared draws (source "
                f"{model.manifest.source_library!r}): one draw per entry correlates weights the posterior "
                "learned as independent and inflates the uncertainty (use sampling='independent', or train with "
                "edgebnn.train.dgbnn)")

    def lower_matrix(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome | str:
        mu, sigma = posterior(weight)
        out = lower_codebook(weight.name, mu, sigma, weight.encoding.shape, rng, self.config)
        return f"too small to cluster: {out}" if isinstance(out, str) else out
