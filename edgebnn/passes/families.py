"""Lowering the posterior families that are not mean-field Gaussians: deep ensembles, SWAG and correlated Laplace.

``float`` keeps every family as imported. ``fixed`` encodes a deep ensemble's members
(:class:`~edgebnn.ir.encodings.MemberSetWeight` [M, *shape]) on ONE per-layer grid shared by the M members:

    w_k ≈ Δ · q_k,   q_k = clip(round(w_k / Δ), -L, L),   L = 2^(B-1) - 1

with Δ the least-error step for B bits over the pooled members (``fixed``'s clipping search, on a seeded
subsample of at most 32 768 values). ``--bits N`` forces B. ``auto`` picks the smallest B whose rounding error
stays within a fraction of the members' own spread, the variance rule of ``fixed`` with the ensemble's
between-member variance v̄ = mean_i Var_k[w_k,i] in place of the posterior variance:

    mean_{k,i} (w_k,i − Δ q_k,i)²  <=  f · v̄ · MEMBER_FRACTION

A member is a point estimate, not a distribution: its rounding error is not averaged away by the member's own
noise as a Gaussian's is, so the budget is MEMBER_FRACTION (1/100) of ``fixed``'s.

``fixed`` on SWAG (:class:`~edgebnn.ir.encodings.LowRankGaussianWeight` → ``LowRankFixedWeight``) and on the
correlated Laplace blocks (``KronGaussianWeight`` → ``KronFixedWeight``, ``DenseGaussianWeight`` →
``DenseFixedWeight``) puts the mean on ``fixed``'s grid (its least-error step search) at the smallest width that
keeps the rounding error e = μ − Δq within the posterior's own noise:

- SWAG, ``fixed``'s variance rule with the marginal σ (the low-rank part included)::

      mean_i e_i²  <=  f · mean_i σ_i²                       (f = ``noise_fraction``, DEFAULT_NOISE_FRACTION)

- Kronecker / dense Laplace, the same rule in the posterior's whitened coordinates (the error measured against
  the covariance Σ = L Lᵀ direction by direction, i.e. the KL divergence of the shifted posterior, per weight)::

      mean_j (L⁻¹ e)_j²  <=  f · WHITENED_FRACTION           L⁻¹ e = (Q_oᵀ E Q_i) / D (Kronecker), lstsq (dense)

  The marginal σ of a Laplace layer is mostly its prior (σ ≈ δ^(-1/2) in every direction the data leaves alone),
  so the marginal rule let a last-layer Kronecker mean down to 2 bits and cost dNLL +0.09 on digits
  (``bench/family_stores.py``); directions the data pins down have D ≪ σ, and the whitened rule sees them.
  ``WHITENED_FRACTION`` (1/100): at f = 0.1 alone the mean took 3 bits and cost dNLL +0.023; at f/100 it takes
  6 and costs below 0.001.

The covariance factors are coded too (:mod:`edgebnn.ir.encodings.lowrank`, :mod:`~edgebnn.ir.encodings.kron`):
SWAG's diagonal σ as a log-domain :class:`~edgebnn.ir.encodings.SigmaCode` of ``max(sigma_bits,
FAMILY_SIGMA_BITS)`` bits; a Kronecker layer's eigenvalue scale D as one of ``KRON_SCALE_BITS`` (6: at 4 it cost
dNLL +0.008, at 6 +0.002, at 8 +0.000 for 600 more bytes on a 10 × 32 layer); SWAG's deviations, the Kronecker
eigenvectors and a dense factor as int8 row codes (:class:`~edgebnn.ir.encodings.RowCode`: at most half a percent
of each row's largest value; the eigenvectors' code moved dNLL by 3e-5). ``--bits N`` forces the mean's width.
Other schemes (codebook, ternary, binary, mcq, prune) cannot keep these posteriors (their noise is not per weight)
and are refused in one line.

Report keys besides the common ones: ``scale`` (Δ), ``members`` (M), ``variance_bits``, ``hw_dtype``,
``whitened_error`` (Laplace: the achieved mean_j (L⁻¹ e)_j²).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgebnn.ir import EncodedWeight
from edgebnn.ir.encodings import (
    DenseFixedWeight,
    DenseGaussianWeight,
    Encoding,
    FixedPointWeight,
    KronFixedWeight,
    KronGaussianWeight,
    LowRankFixedWeight,
    LowRankGaussianWeight,
    MemberSet,
    MemberSetFixedWeight,
    RowCode,
    SigmaCode,
)
from edgebnn.ir.encodings.packing import MAX_BITS
from edgebnn.passes.base import LayerOutcome, LayerPass, register_family_lowering, sum_sq_diff
from edgebnn.passes.fixed import FixedConfig, best_step, hw_dtype, lower_fixed

MEMBER_FRACTION = 0.01
FAMILY_SIGMA_BITS = 4
KRON_SCALE_BITS = 6
WHITENED_FRACTION = 0.01
_FIT_SAMPLE = 32768
FIXED_KINDS = ("MemberSetFixedWeight", "LowRankFixedWeight", "KronFixedWeight", "DenseFixedWeight")


def keep(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    """``float``: the family as imported."""
    return LayerOutcome(weight.encoding)


for _op in ("MemberSetWeight", "LowRankGaussianWeight", "KronGaussianWeight", "DenseGaussianWeight", *FIXED_KINDS):
    register_family_lowering(_op, "float")(keep)


def already_fixed(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    return LayerOutcome(weight.encoding, "already fixed point: kept")


for _op in FIXED_KINDS:
    register_family_lowering(_op, "fixed")(already_fixed)


def _fixed_mean(pass_: LayerPass, enc: Encoding, rng: np.random.Generator) -> tuple[FixedPointWeight, LayerOutcome]:
    """``fixed``'s grid for ``enc``'s mean, by the variance rule on its marginal σ (the σ code it fits is one
    level, unused), and the outcome whose note and report keys the family's lowering keeps."""
    assert isinstance(pass_.config, FixedConfig)
    c = pass_.config
    out = lower_fixed(enc.mean().reshape(-1), enc.stddev().reshape(-1), enc.shape, rng, bits=c.bits,
                      noise_fraction=c.noise_fraction, sigma_bits=0, clip=c.clip)
    assert isinstance(out.encoding, FixedPointWeight)
    return out.encoding, out


def _whitened_mean(pass_: LayerPass, enc: Encoding, whiten: Callable[[np.ndarray], np.ndarray],
                   rng: np.random.Generator) -> tuple[np.ndarray, float, int, LayerOutcome]:
    """The mean's grid by the whitened rule (module docstring): the smallest width whose least-error step (``fixed``'s
    search) keeps ``mean((L⁻¹ e)²) <= f``; ``whiten(e)`` is ``L⁻¹ e`` for the error ``e`` (the weight's shape).
    Returns ``(q, step, bits, outcome)`` (the outcome carries the note and report keys)."""
    assert isinstance(pass_.config, FixedConfig)
    c = pass_.config
    mu = enc.mean()
    flat = mu.reshape(-1)
    top = float(np.max(np.abs(flat))) if flat.size else 0.0
    sample = (flat if flat.size <= _FIT_SAMPLE else rng.choice(flat, _FIT_SAMPLE, replace=False)).astype(np.float64)
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


def _sigma_bits(pass_: LayerPass) -> int:
    assert isinstance(pass_.config, FixedConfig)
    return max(pass_.config.sigma_bits, FAMILY_SIGMA_BITS)


@register_family_lowering("LowRankGaussianWeight", "fixed")
def fixed_lowrank(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    """SWAG: the mean on a grid, σ a log code, D an int8 code per (iterate, output channel)."""
    enc = weight.encoding
    assert isinstance(enc, LowRankGaussianWeight)
    fp, mean = _fixed_mean(pass_, enc, rng)
    rows = enc.deviations.reshape(enc.rank * (enc.shape[0] if enc.shape else 1), -1)
    out = LowRankFixedWeight(fp.q, fp.scale, fp.bits, SigmaCode.fit(enc.sigma, _sigma_bits(pass_), rng),
                             RowCode.fit(rows), enc.scale)
    return LayerOutcome(out, mean.note, mean.extra)


@register_family_lowering("KronGaussianWeight", "fixed")
def fixed_kron(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    """Kronecker Laplace: the mean on a grid by the whitened rule, the eigenvectors int8 per eigenvector, D a log
    code. Whitening: ``L⁻¹ e = (Q_oᵀ E Q_i) / D`` (E the error as [out, rest])."""
    enc = weight.encoding
    assert isinstance(enc, KronGaussianWeight)
    q_out, q_in, d = (a.astype(np.float64) for a in (enc.q_out, enc.q_in, enc.scale))

    def whiten(e: np.ndarray) -> np.ndarray:
        rotated = q_out.T @ e.reshape(enc.matrix_shape) @ q_in
        return np.divide(rotated, d, out=np.where(np.abs(rotated) > 0, np.inf, 0.0), where=d > 0)

    q, step, bits, mean = _whitened_mean(pass_, enc, whiten, rng)
    out = KronFixedWeight(q, step, bits, RowCode.fit(enc.q_out.T), RowCode.fit(enc.q_in.T),
                          SigmaCode.fit(enc.scale, KRON_SCALE_BITS, rng))
    return LayerOutcome(out, mean.note, mean.extra)


@register_family_lowering("DenseGaussianWeight", "fixed")
def fixed_dense(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    """A dense Gaussian block: the mean on a grid by the whitened rule (``L⁻¹ e`` the least-squares solution of
    ``L z = e``), the factor L int8 per column."""
    enc = weight.encoding
    assert isinstance(enc, DenseGaussianWeight)
    factor = enc.scale.astype(np.float64)

    def whiten(e: np.ndarray) -> np.ndarray:
        return np.asarray(np.linalg.lstsq(factor, e.reshape(-1), rcond=None)[0])

    q, step, bits, mean = _whitened_mean(pass_, enc, whiten, rng)
    out = DenseFixedWeight(q, step, bits, RowCode.fit(enc.scale.T))
    return LayerOutcome(out, mean.note, mean.extra)


@register_family_lowering("MemberSetWeight", "fixed")
def fixed_members(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    """Every member on one per-layer fixed-point grid (module docstring)."""
    enc = weight.encoding
    assert isinstance(enc, MemberSet) and isinstance(pass_.config, FixedConfig)
    config = pass_.config
    values = enc.values()
    flat = values.reshape(-1)
    top = float(np.max(np.abs(flat))) if flat.size else 0.0
    spread = sum_sq_diff(enc.stddev()) / enc.size
    sample = (flat if flat.size <= _FIT_SAMPLE else rng.choice(flat, _FIT_SAMPLE, replace=False)).astype(np.float64)
    note, rule_bits = None, None
    if top == 0:
        width, step = config.bits or 2, 1.0
        note = "all members are 0"
    elif config.bits is not None:
        width, (step, _) = config.bits, best_step(sample, top, config.bits, config.clip)
    else:
        budget = config.noise_fraction * MEMBER_FRACTION * spread
        for width in range(2, MAX_BITS + 1):
            step, error = best_step(sample, top, width, config.clip)
            if error <= budget:
                rule_bits = width
                break
        else:
            note = f"no grid of <= {MAX_BITS} bits keeps the error within the members' spread budget; using {MAX_BITS}"
    limit = (1 << (width - 1)) - 1
    q = np.clip(np.rint(values / np.float32(step)), -limit, limit).astype(np.int16)
    out = MemberSetFixedWeight(q, step, width)
    extra = {"scale": out.scale, "members": out.m, "variance_bits": rule_bits, "hw_dtype": hw_dtype(width)}
    return LayerOutcome(out, note, extra)
