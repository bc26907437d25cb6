"""``prune``: weight pruning by dropout rate, and group pruning for models with group scales.

Weight pruning (sparse VD / VNQ): a weight whose posterior is dominated by noise,

    log α_i = log σ_i² - log μ_i² >= t      (``log_alpha_threshold``, default 3: α >= e³ ≈ 20),

is set to an exact, deterministic zero: μ_i = σ_i = 0.

Group pruning (Bayesian Compression, group normal-Jeffreys): the weights of one group share a scale
z_g ~ N(μ_z, σ_z²) with w_ij = z_g · w̃_ij; the IR stores the w̃ posterior and ``group_scales`` gives
``{weight name: (μ_z, σ_z)}`` per group — input neurons (axis 1) of a 2-D weight, filters (axis 0) of a
conv weight. The pass folds the scale into every weight with the marginal moments of the product,

    μ'_ij = μ_z μ̃_ij,   σ'_ij² = σ_z² (σ̃_ij² + μ̃_ij²) + σ̃_ij² μ_z²,

then prunes whole groups whose log α_g = log σ_z² - log μ_z² >= ``group_log_alpha_threshold`` (default
-3, the reference code's usual value), then prunes single weights as above. The output is still a
``GaussianWeight`` (dense fp32: pruning single weights does not shrink the file), so ``prune`` composes with
every other scheme: ``prune+codebook``, ``prune+mcq``, ... (not ``prune+binary``: a binary weight cannot be 0).
Whole units left dead (a pruned input neuron or filter) leave the graph in the ``shrink`` pass that ``lower``
ends with (:mod:`edgebnn.passes.shrink`).

Report keys besides the common ones: ``pruned`` (fraction of weights zeroed by this pass),
``groups_pruned`` (number of groups, or None without group scales).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import BNNModel, EncodedWeight, GaussianWeight
from edgebnn.passes.base import LayerOutcome, LayerPass, PassConfig, check_float, posterior


@dataclass(frozen=True)
class PruneConfig(PassConfig):
    """Settings of ``prune``.

    Attributes:
        log_alpha_threshold: Prune single weights with log(σ²/μ²) at or above this.
        group_scales: ``{weight name: (μ_z, σ_z)}``, 1-D arrays, one entry per group (see module doc).
        group_log_alpha_threshold: Prune groups with log(σ_z²/μ_z²) at or above this.
    """

    log_alpha_threshold: float = 3.0
    group_scales: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = field(default=None, compare=False)
    group_log_alpha_threshold: float = -3.0

    def __post_init__(self) -> None:
        check_float(self.log_alpha_threshold, "log_alpha_threshold", -50.0, 50.0)
        check_float(self.group_log_alpha_threshold, "group_log_alpha_threshold", -50.0, 50.0)
        if self.group_scales is not None and not isinstance(self.group_scales, Mapping):
            raise InvalidOptionError("group_scales must map weight names to (mu_z, sigma_z) pairs")


def group_axis(shape: tuple[int, ...]) -> int:
    """Axis that indexes the groups: inputs (1) of a 2-D weight, filters (0) otherwise."""
    return 1 if len(shape) == 2 else 0


def _group_scale(name: str, pair: object, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    axis = group_axis(shape)
    try:
        mu_z, sigma_z = (np.asarray(a, np.float32).reshape(-1) for a in pair)  # type: ignore[attr-defined]
    except (TypeError, ValueError) as e:
        raise InvalidOptionError(f"group_scales[{name!r}] must be a (mu_z, sigma_z) pair of arrays") from e
    if len(shape) < 2 or mu_z.shape != (shape[axis],) or sigma_z.shape != mu_z.shape:
        raise InvalidOptionError(
            f"group_scales[{name!r}]: need two arrays of {shape[axis] if len(shape) >= 2 else '?'} entries "
            f"(axis {axis} of weight shape {list(shape)}), got {mu_z.shape} and {sigma_z.shape}"
        )
    if not (np.all(np.isfinite(mu_z)) and np.all(np.isfinite(sigma_z))) or np.any(sigma_z < 0):
        raise InvalidOptionError(f"group_scales[{name!r}]: values must be finite with sigma_z >= 0")
    return mu_z, sigma_z


def prune_weights(mu: np.ndarray, sigma: np.ndarray, log_alpha_threshold: float) -> np.ndarray:
    """Mask of weights with log(σ²/μ²) >= threshold (μ = σ = 0 counts as pruned)."""
    return np.square(sigma) >= np.float32(np.exp(log_alpha_threshold)) * np.square(mu)


class PrunePass(LayerPass):
    """Zero the weights (and groups) whose posterior is dominated by noise; stays Gaussian."""

    name = "prune"
    config_type = PruneConfig
    config: PruneConfig

    def run(self, model: BNNModel, seed: int) -> tuple[list[dict[str, object]], bool]:
        scales = self.config.group_scales or {}
        names = set(model.encoded_weight_names())
        unknown = sorted(set(scales) - names)
        if unknown:
            raise InvalidOptionError(f"group_scales names unknown weights {unknown}; weights are {sorted(names)}")
        return super().run(model, seed)

    def lower_weight(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        shape = weight.encoding.shape
        mu, sigma = (a.reshape(shape) for a in posterior(weight))
        groups_pruned = None
        pair = (self.config.group_scales or {}).get(weight.name)
        if pair is not None:
            mu_z, sigma_z = _group_scale(weight.name, pair, shape)
            axis = group_axis(shape)
            bshape = [1] * len(shape)
            bshape[axis] = shape[axis]
            mz, sz = mu_z.reshape(bshape), sigma_z.reshape(bshape)
            var = np.square(sz) * (np.square(sigma) + np.square(mu)) + np.square(sigma) * np.square(mz)
            mu, sigma = mz * mu, np.sqrt(var)
            dead = prune_weights(mu_z, sigma_z, self.config.group_log_alpha_threshold).reshape(bshape)
            groups_pruned = int(np.count_nonzero(dead))
            mu, sigma = np.where(dead, 0, mu), np.where(dead, 0, sigma)
        cut = prune_weights(mu, sigma, self.config.log_alpha_threshold)
        if pair is None and not np.any(cut & (sigma > 0)):
            return LayerOutcome(weight.encoding, None, {"pruned": 0.0, "groups_pruned": None})
        mu, sigma = np.where(cut, 0, mu).astype(np.float32), np.where(cut, 0, sigma).astype(np.float32)
        already = weight.encoding.mean() == 0
        pruned = float(np.count_nonzero((mu == 0) & ~already) / mu.size)
        return LayerOutcome(GaussianWeight(mu, sigma), None, {"pruned": pruned, "groups_pruned": groups_pruned})
