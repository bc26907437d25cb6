"""``ternary``: VNQ post-training ternarisation to levels {-a, 0, +a} per layer, σ kept as a code.

Variational Network Quantization, post-training step (no fine-tuning):

1. prune: log α_i = log σ_i² - log μ_i² >= 2 (``prune_log_alpha``), i.e. σ_i² >= e² μ_i²: 0 lies well inside
   the weight's posterior; a pruned weight becomes an exact, deterministic zero (its σ is coded as 0);
2. the level ``a``: the one given in ``levels`` (``{weight name: a}``, data like ``gradients``: VNQ learns ``a``
   in training and its KL pulls the kept means to ±a, so the paper rounds to the learned level; Sec. 3.2),
   else the one that minimises the squared error of the remaining means against their nearest level:
   Lloyd's fixed point a = mean{|μ_i| : |μ_i| > a/2} (1-D k-means with the centre 0 held fixed, started at
   mean|μ|, run on a seeded subsample of at most 65 536 weights), for a post-hoc model (or a weight
   ``levels`` does not name);
3. every remaining weight goes to argmin_k (c_k - μ_i)², c = (-a, 0, a): ±a when |μ_i| > a/2, else 0 (a weight
   rounded to 0 keeps its σ, only pruned ones are deterministic).

Codes are 2 bits (four per byte), always; ``bits`` may only be None or 2. Biases (1-D weights) are lowered
with ``fixed`` instead — one level per layer is far too coarse for them — and the report says so.
Degenerate layers: when every weight is pruned (e.g. all-zero μ) the level is set to 1 (unused) and the
note says so.

Report keys besides the common ones: ``level`` (a), ``level_from`` (``"levels"``: given, or ``"lloyd"``: fitted),
``pruned`` (fraction pruned by log α).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import BNNModel, EncodedWeight
from edgebnn.ir.encodings import SigmaCode, TernaryWeight
from edgebnn.passes.base import (
    F32_TINY,
    LayerOutcome,
    QuantConfig,
    check_float,
    degenerate_note,
    join_notes,
    posterior,
)
from edgebnn.passes.fixed import MatrixPass

_FIT_SAMPLE = 65536
_LLOYD_ITERS = 30
_F32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class TernaryConfig(QuantConfig):
    """Settings of ``ternary``.

    Attributes:
        prune_log_alpha: Prune weights with log(σ²/μ²) at or above this (VNQ: 2).
        levels: ``{weight name: a}``, the level to round to (VNQ's learned levels,
            ``edgebnn.train.vnq.learned_levels``); a weight it does not name gets Lloyd's fit, a bias's entry
            is unused (biases go to ``fixed``). Data like ``gradients``: not stored in the lowering config,
            so ``edgebnn lower --config`` replays such a lowering with Lloyd's levels.
    """

    prune_log_alpha: float = 2.0
    levels: Mapping[str, float] | None = field(default=None, compare=False)

    BITS_RANGE: ClassVar[tuple[int, int]] = (2, 2)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_float(self.prune_log_alpha, "prune_log_alpha", -50.0, 50.0)
        if self.levels is None:
            return
        if not isinstance(self.levels, Mapping):
            raise InvalidOptionError("levels must map weight names to positive levels a")
        for name, a in self.levels.items():
            ok = isinstance(a, (int, float, np.floating)) and not isinstance(a, bool) and math.isfinite(a)
            if not ok or not F32_TINY <= a <= _F32_MAX:  # stored as a float32: no under/overflow
                raise InvalidOptionError(f"levels[{name!r}]={a!r}: must be a finite positive number")


def ternary_level(magnitudes: np.ndarray, rng: np.random.Generator) -> float:
    """Lloyd's level ``a`` for {-a, 0, a} on the kept ``|μ|`` (0 when all are 0)."""
    m = magnitudes if magnitudes.size <= _FIT_SAMPLE else rng.choice(magnitudes, _FIT_SAMPLE, replace=False)
    m = m.astype(np.float64)
    a = float(m.mean()) if m.size else 0.0
    for _ in range(_LLOYD_ITERS):
        big = m[m > a / 2]
        new = float(big.mean()) if big.size else a
        if new == a:
            break
        a = new
    return a


def lower_ternary(
    mu: np.ndarray, sigma: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator, config: TernaryConfig,
    level: float | None = None,
) -> LayerOutcome:
    """Encode one Gaussian weight (flat ``mu``, ``sigma``) as a :class:`TernaryWeight`.

    ``level`` is the given ``a`` (None: Lloyd's fit on the kept means).
    """
    threshold = np.float32(np.exp(config.prune_log_alpha))
    pruned = np.square(sigma) >= threshold * np.square(mu)
    level_from = "lloyd" if level is None else "levels"
    if level is None:
        level = ternary_level(np.abs(mu[~pruned]), rng)
    note = degenerate_note(mu, sigma)
    if level == 0:
        level = 1.0
        note = join_notes(note, "every weight is pruned or zero: level set to 1 (unused)")
    level = float(np.float32(level))
    codes = np.zeros(mu.size, np.int16)
    big = (np.abs(mu) > np.float32(level / 2)) & ~pruned
    codes[big] = np.where(mu[big] > 0, 1, -1)
    sigma_kept = np.where(pruned, np.float32(0), sigma)
    enc = TernaryWeight(codes.reshape(shape), level, 2, SigmaCode.fit(sigma_kept, config.sigma_bits, rng))
    pruned_fraction = float(np.count_nonzero(pruned) / mu.size)
    return LayerOutcome(enc, note, {"level": enc.scale, "level_from": level_from, "pruned": pruned_fraction})


class TernaryPass(MatrixPass):
    """Lower every Gaussian weight matrix to VNQ ternary codes plus a σ code."""

    name = "ternary"
    config_type = TernaryConfig
    config: TernaryConfig
    TRAINED_BY = ("edgebnn-vnq", "edgebnn.train.vnq")
    ENCODING = "TernaryWeight"

    def run(self, model: BNNModel, seed: int) -> tuple[list[dict[str, Any]], bool]:
        names = set(model.encoded_weight_names())
        unknown = sorted(set(self.config.levels or {}) - names)
        if unknown:
            raise InvalidOptionError(f"levels names unknown weights {unknown}; weights are {sorted(names)}")
        return super().run(model, seed)

    def lower_matrix(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        mu, sigma = posterior(weight)
        given = (self.config.levels or {}).get(weight.name)
        level = None if given is None else float(given)
        return lower_ternary(mu, sigma, weight.encoding.shape, rng, self.config, level)
