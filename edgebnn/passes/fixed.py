"""``fixed``: per-layer uniform fixed point with the step chosen from the posterior variance.

Bayesian Compression's rule: the unit round-off must stay below the posterior noise. With the layer's
mean posterior variance v̄ = mean(σ²) and the stated fraction f (``noise_fraction``, default 0.1: the
rounding error is one offset every draw shares, and at 0.25 it cost measurable calibration and OOD
separation — docs/uncertainty.md), ``auto`` picks the
smallest width B (sign included, 2..16) whose grid keeps the quantisation noise within budget:

    grid_B(Δ):  q_i = clip(round(μ_i / Δ), -L, L),   w̄_i = Δ q_i,   L = 2^(B-1) - 1
    noise_B     = min over Δ of mean_i (μ_i - w̄_i)²  <=  f · v̄

The paper's grid spans the range (Δ = max|μ| / L: pure rounding, noise ≈ Δ²/12, i.e.
``bits = ceil(log2(range/Δ)) + 1`` for Δ = sqrt(12 f v̄)); trained weights are heavy-tailed, so letting
the few largest clip (``clip=True``, the default: Δ is the least-error one among 32 log-spaced steps from
max|μ|/L down to a sixteenth of it, measured on a seeded subsample of at most 32 768 weights) reaches the
same noise with fewer bits. ``clip=False`` keeps the paper's full-range grid. ``--bits N`` forces B = N
(same choice of Δ). The report keeps ``variance_bits`` (what the rule asked for), ``clipped`` (fraction
of weights beyond the grid) and ``hw_dtype`` (what the hardware stores: TensorRT runs int4 and int8).
σ keeps its own per-weight code (:class:`~edgebnn.ir.encodings.SigmaCode`), so the layer still samples.

Degenerate layers: all-zero μ give q = 0 with Δ = 1 (any positive step decodes to 0); σ = 0 everywhere
leaves no noise budget, so ``auto`` ends at 16 bits. Both are reported in ``note``.

With ``grams`` (input second moments from calibration data, :mod:`edgebnn.passes.gptq`) a weight's codes on
the same grid are chosen to keep the layer's output error small (GPTQ) instead of each weight's own error.

Report keys besides the common ones: ``scale`` (Δ), ``variance_bits``, ``clipped``, ``hw_dtype``, ``rounding``
(``nearest`` or ``gptq``; with ``gptq`` also ``output_error`` and ``output_error_nearest``, the relative output
error of both roundings).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import BNNModel, EncodedWeight
from edgebnn.ir.encodings import Encoding, FixedPointWeight, SigmaCode
from edgebnn.ir.encodings.packing import MAX_BITS
from edgebnn.passes.base import (
    DEFAULT_NOISE_FRACTION,
    F32_TINY,
    LayerOutcome,
    LayerPass,
    QuantConfig,
    degenerate_note,
    join_notes,
    posterior,
    sum_sq_diff,
)
from edgebnn.passes.gptq import InputGram, compensated_codes, output_error

_FIT_SAMPLE = 32768
_STEPS_TRIED = 32


@dataclass(frozen=True)
class FixedConfig(QuantConfig):
    """Settings of ``fixed`` (see :class:`~edgebnn.passes.base.QuantConfig`).

    Attributes:
        noise_fraction: f of the variance rule (default :data:`~edgebnn.passes.base.DEFAULT_NOISE_FRACTION`: the
            rounding error is a fixed offset of the mean, which every draw shares).
        clip: Choose each width's step by least squared error, clipping the tails (True), or span the
            full range max|μ| so nothing clips (False, the paper's plain grid).
        grams: ``{weight name: InputGram}`` from :func:`edgebnn.passes.gptq.layer_grams`: those weights' means
            are rounded to compensate each other's output error (GPTQ) instead of to nearest. Data, like
            ``gradients``: not stored in the lowering config.
    """

    noise_fraction: float = DEFAULT_NOISE_FRACTION
    clip: bool = True
    grams: Mapping[str, InputGram] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.clip, bool):
            raise InvalidOptionError(f"clip={self.clip!r}: must be true or false")
        if self.grams is not None and not (isinstance(self.grams, Mapping)
                                           and all(isinstance(g, InputGram) for g in self.grams.values())):
            raise InvalidOptionError("grams must map weight names to InputGram (edgebnn.passes.gptq.layer_grams)")


def grid_error(values: np.ndarray, step: float, limit: int) -> float:
    """Mean squared error of rounding ``values`` to ``step · q``, ``|q| <= limit`` (rounding + clipping)."""
    q = np.clip(np.rint(values / step), -limit, limit)
    return float(np.mean((values - q * step) ** 2))


def best_step(sample: np.ndarray, top: float, width: int, clip: bool) -> tuple[float, float]:
    """The step of a ``width``-bit symmetric grid and its squared error on ``sample``.

    Without ``clip`` the grid spans ``top``; with it, the least-error step among 32 log-spaced ones
    from ``top / limit`` down to a sixteenth of that. Every step is a normal float32 (at least
    :data:`~edgebnn.passes.base.F32_TINY`): means so small that the grid would need a finer step use fewer of its
    levels instead, each still within half a (normal, exactly stored) step of its grid value.
    """
    limit = (1 << (width - 1)) - 1
    full = top / limit
    tried = full * np.geomspace(1.0, 1 / 16, _STEPS_TRIED) if clip else np.array([full])
    steps = [max(float(np.float32(s)), F32_TINY) for s in tried]
    errors = [grid_error(sample, s, limit) for s in steps]
    best = int(np.argmin(errors))
    return steps[best], errors[best]


def hw_dtype(bits: int) -> str:
    """The smallest integer type an accelerator stores ``bits``-bit weights in."""
    return "int4" if bits <= 4 else "int8" if bits <= 8 else "int16"


def lower_fixed(
    mu: np.ndarray,
    sigma: np.ndarray,
    shape: tuple[int, ...],
    rng: np.random.Generator,
    *,
    bits: int | None,
    noise_fraction: float,
    sigma_bits: int,
    clip: bool = True,
    gram: InputGram | None = None,
) -> LayerOutcome:
    """Encode one Gaussian weight (flat ``mu``, ``sigma``) as a :class:`FixedPointWeight`.

    Args:
        mu: Posterior means, flat float32.
        sigma: Posterior standard deviations, flat float32.
        shape: The weight's shape.
        rng: Picks the fitting subsamples (grid search, σ code).
        bits: Forced width (2..16) or None for the variance rule.
        noise_fraction: f of the variance rule.
        sigma_bits: Bits of the σ code.
        clip: Least-error steps that may clip the tails, or the full-range grid.
        gram: The weight's input second moment: round to compensate the output error (:mod:`.gptq`).

    Returns:
        The encoding, a note for capped or degenerate layers, and the report keys of this module.
    """
    top = float(np.max(np.abs(mu))) if mu.size else 0.0
    var = sum_sq_diff(sigma) / sigma.size if sigma.size else 0.0
    note = degenerate_note(mu, sigma)
    sample = mu if mu.size <= _FIT_SAMPLE else rng.choice(mu, _FIT_SAMPLE, replace=False)
    sample = sample.astype(np.float64)
    rule_bits: int | None = None
    if top == 0:
        width, step = bits or 2, 1.0
    elif bits is not None:
        width, (step, _) = bits, best_step(sample, top, bits, clip)
    else:
        budget = noise_fraction * var
        for width in range(2, MAX_BITS + 1):
            step, error = best_step(sample, top, width, clip)
            if error <= budget:
                rule_bits = width
                break
        else:
            note = join_notes(note, f"no grid of <= {MAX_BITS} bits keeps the noise within the variance budget; "
                                    f"using {MAX_BITS}")
    limit = (1 << (width - 1)) - 1
    q = mu / np.float32(step)
    np.rint(q, out=q)
    np.clip(q, -limit, limit, out=q)
    codes = q.astype(np.int16).reshape(shape)
    rounding: dict[str, Any] = {"rounding": "nearest"}
    if gram is not None and top > 0:
        w = gram.rows(mu.reshape(shape))
        pruned = (mu == 0) & (sigma == 0)
        zero = gram.rows(pruned.reshape(shape)).astype(bool) if pruned.any() else None
        compensated = compensated_codes(w, gram.h, step, limit, zero)
        nearest = output_error(w, gram.rows(codes) * step, gram.h)
        rounding = {"rounding": "gptq", "output_error": output_error(w, compensated * step, gram.h),
                    "output_error_nearest": nearest}
        codes = gram.unrows(compensated, shape)
    enc = FixedPointWeight(codes, step, width, SigmaCode.fit(sigma, sigma_bits, rng))
    clipped = float(np.count_nonzero(np.abs(mu) > (limit + 0.5) * step) / mu.size) if mu.size else 0.0
    extra = {"scale": enc.scale, "variance_bits": rule_bits, "hw_dtype": hw_dtype(width), "clipped": clipped,
             **rounding}
    return LayerOutcome(enc, note, extra)


def fallback_fixed(
    weight: EncodedWeight, rng: np.random.Generator, reason: str, *, noise_fraction: float, sigma_bits: int
) -> LayerOutcome:
    """Lower ``weight`` with ``fixed`` (auto bits) because its own scheme does not apply; says why."""
    mu, sigma = posterior(weight)
    out = lower_fixed(
        mu, sigma, weight.encoding.shape, rng, bits=None, noise_fraction=noise_fraction, sigma_bits=sigma_bits
    )
    return LayerOutcome(out.encoding, join_notes(f"{reason}: lowered with fixed instead", out.note), out.extra)


class MatrixPass(LayerPass):
    """A scheme for weight matrices: 1-D weights (biases), and matrices it declines, fall back to ``fixed``.

    Subclasses implement :meth:`lower_matrix`, returning the outcome or the reason to fall back; their config
    has ``noise_fraction`` and ``sigma_bits`` for the fallback. A scheme that keeps only posteriors trained
    for it names their recipe in ``TRAINED_BY`` (its importer's ``source_library``) and its encoding in
    ``ENCODING``; applied to any other posterior, every layer it encodes gets :meth:`post_training_note`.
    """

    TRAINED_BY: ClassVar[tuple[str, str] | None] = None  # (source_library, recipe module) of its posteriors
    ENCODING: ClassVar[str] = ""

    def post_training_note(self, model: BNNModel) -> str | None:
        """The warning for posteriors the scheme was not trained for (``None`` when it was, or needs none)."""
        if self.TRAINED_BY is None or self.TRAINED_BY[0] in model.manifest.source_library.split("+"):
            return None
        return (f"post-training {self.name} of a posterior not trained for it (source "
                f"{model.manifest.source_library!r}): expect lost accuracy and calibration (train with "
                f"{self.TRAINED_BY[1]}, or measure with --eval)")

    def run(self, model: BNNModel, seed: int) -> tuple[list[dict[str, Any]], bool]:
        rows, modified = super().run(model, seed)
        note = self.post_training_note(model)
        if note:
            for row in rows:
                if row["kind"] == self.ENCODING and row["skipped"] is None:
                    row["note"] = join_notes(note, row["note"])
        return rows, modified

    @abstractmethod
    def lower_matrix(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome | str:
        """Encode one Gaussian weight of rank >= 2, or say why ``fixed`` should take it instead."""

    def lower_weight(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        out = "bias (1-D)" if len(weight.encoding.shape) == 1 else self.lower_matrix(weight, rng)
        if not isinstance(out, str):
            return out
        c: Any = self.config  # MatrixPass configs carry noise_fraction and sigma_bits
        return fallback_fixed(weight, rng, out, noise_fraction=c.noise_fraction, sigma_bits=c.sigma_bits)


class FixedPass(LayerPass):
    """Lower every Gaussian weight to per-layer fixed point (Bayesian Compression's variance rule)."""

    name = "fixed"
    config_type = FixedConfig
    config: FixedConfig

    def lower_weight(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        mu, sigma = posterior(weight)
        c = self.config
        gram = None if c.grams is None else c.grams.get(weight.name)
        if gram is not None and gram.h.shape != (gram.columns(weight.encoding.shape),) * 2:
            raise InvalidOptionError(f"grams[{weight.name!r}]: a {gram.h.shape} matrix for a weight of shape "
                                     f"{weight.encoding.shape} (another model's calibration?)")
        return lower_fixed(
            mu, sigma, weight.encoding.shape, rng,
            bits=c.bits, noise_fraction=c.noise_fraction, sigma_bits=c.sigma_bits, clip=c.clip,
            gram=gram,
        )


def fit_sample(flat: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """What a family's grid is fitted on: ``flat`` (float64), or ``_FIT_SAMPLE`` of its values drawn without
    replacement when it has more."""
    return (flat if flat.size <= _FIT_SAMPLE else rng.choice(flat, _FIT_SAMPLE, replace=False)).astype(np.float64)


# -- ``fixed`` on the posterior families' means (their lowerings, :mod:`edgebnn.families`) -------------------------

# the σ code of a family's lowering takes at least this many bits (SWAG's diagonal σ), whatever ``sigma_bits`` asks
FAMILY_SIGMA_BITS = 4
# the whitened rule's budget is this fraction of ``fixed``'s: at f = 0.1 alone a last-layer Kronecker mean took 3 bits
# and cost dNLL +0.023 on digits; at f/100 it takes 6 and costs below 0.001 (bench/family_stores.py)
WHITENED_FRACTION = 0.01


def fixed_mean(pass_: LayerPass, enc: Encoding, rng: np.random.Generator) -> tuple[FixedPointWeight, LayerOutcome]:
    """``fixed``'s grid for ``enc``'s mean by the variance rule on its marginal σ (the σ code it fits is one level,
    unused), and the outcome whose note and report keys a family's lowering keeps::

        mean_i e_i²  <=  f · mean_i σ_i²        (e = μ − Δq, f = ``noise_fraction``)
    """
    assert isinstance(pass_.config, FixedConfig)
    c = pass_.config
    out = lower_fixed(enc.mean().reshape(-1), enc.stddev().reshape(-1), enc.shape, rng, bits=c.bits,
                      noise_fraction=c.noise_fraction, sigma_bits=0, clip=c.clip)
    assert isinstance(out.encoding, FixedPointWeight)
    return out.encoding, out


@dataclass(frozen=True)
class MeanGrid:
    """The variance rule's grid for one weight's mean (:func:`variance_grid`).

    Attributes:
        q: The integer codes, int16, the weight's shape: ``mean ≈ step · q``, ``|q| <= 2**(bits - 1) - 1``.
        step: The grid's step Δ (a normal float32).
        bits: The width B, sign included (2..16).
        note: A capped or degenerate layer's note (None when there is none), for the lowering's outcome.
        extra: The report keys ``fixed`` writes (``scale``, ``variance_bits``, ``hw_dtype``, ``clipped``,
            ``rounding``), for the lowering's outcome.
    """

    q: np.ndarray
    step: float
    bits: int
    note: str | None
    extra: dict[str, Any]


def variance_grid(config: QuantConfig, mean: np.ndarray, stddev: np.ndarray, rng: np.random.Generator) -> MeanGrid:
    """``fixed``'s grid for a mean (any shape) by the variance rule on its marginal σ ``stddev`` (same shape)::

        mean_i e_i²  <=  f · mean_i σ_i²        (e = μ − Δq, f = ``config.noise_fraction``)

    the smallest width whose least-error step keeps it (``config.clip``, default True: the step may clip the
    tails; False: the full-range grid), or the width ``config.bits`` forces. ``rng`` picks the fitting subsample
    (a lowering's seeded generator: the same seed gives the same codes)."""
    mean = np.asarray(mean, np.float32)
    out = lower_fixed(mean.reshape(-1), np.asarray(stddev, np.float32).reshape(-1), mean.shape, rng,
                      bits=config.bits, noise_fraction=config.noise_fraction, sigma_bits=0,
                      clip=getattr(config, "clip", True))
    enc = out.encoding
    assert isinstance(enc, FixedPointWeight)
    return MeanGrid(enc.q, enc.scale, enc.bits, out.note, out.extra)


def whitened_mean(pass_: LayerPass, enc: Encoding, whiten: Callable[[np.ndarray], np.ndarray],
                  rng: np.random.Generator) -> tuple[np.ndarray, float, int, LayerOutcome]:
    """The mean's grid by the whitened rule: the smallest width whose least-error step (:func:`best_step`) keeps
    the rounding error e = μ − Δq within the posterior's noise measured direction by direction::

        mean_j (L⁻¹ e)_j²  <=  f · WHITENED_FRACTION        (Σ = L Lᵀ the covariance; ``whiten(e)`` is L⁻¹ e)

    A marginal σ that is mostly prior (a Laplace layer's, in every direction the data leaves alone) would let the
    mean drop to 2 bits; directions the data pins down have a small variance, and the whitened rule sees them.
    Returns ``(q, step, bits, outcome)`` (the outcome carries the note and report keys)."""
    assert isinstance(pass_.config, FixedConfig)
    c = pass_.config
    mu = enc.mean()
    flat = mu.reshape(-1)
    top = float(np.max(np.abs(flat))) if flat.size else 0.0
    sample = fit_sample(flat, rng)
    note, rule_bits, error = None, None, 0.0
    widths = [c.bits] if c.bits is not None else list(range(2, MAX_BITS + 1))
    step = 1.0
    for width in widths:
        step = best_step(sample, top, width, c.clip)[0] if top > 0 else 1.0
        limit = (1 << (width - 1)) - 1
        q = np.clip(np.rint(mu / np.float32(step)), -limit, limit).astype(np.int16)
        white = whiten(mu.astype(np.float64) - q * np.float64(np.float32(step)))
        error = float(np.mean(np.square(white))) if white.size else 0.0
        if c.bits is None and error <= c.noise_fraction * WHITENED_FRACTION:
            rule_bits = width
            break
    else:
        if c.bits is None:
            note = (f"no grid of <= {MAX_BITS} bits keeps the whitened error within "
                    f"{c.noise_fraction * WHITENED_FRACTION:g}; using {MAX_BITS}")
    extra = {"scale": float(np.float32(step)), "variance_bits": rule_bits, "hw_dtype": hw_dtype(width),
             "whitened_error": error}
    return q, step, width, LayerOutcome(enc, note, extra)


def family_sigma_bits(pass_: LayerPass) -> int:
    """The bits of a family lowering's σ code: ``sigma_bits``, at least :data:`FAMILY_SIGMA_BITS`."""
    assert isinstance(pass_.config, QuantConfig)
    return max(pass_.config.sigma_bits, FAMILY_SIGMA_BITS)


