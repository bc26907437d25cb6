"""Lowering the posterior families that are not mean-field Gaussians: deep ensembles and SWAG.

``float`` keeps every family as imported. ``fixed`` encodes a deep ensemble's members
(:class:`~edgebnn.ir.encodings.MemberSetWeight` [M, *shape]) on ONE per-layer grid shared by the M members:

    w_k ≈ Δ · q_k,   q_k = clip(round(w_k / Δ), -L, L),   L = 2^(B-1) - 1

with Δ the least-error step for B bits over the pooled members (``fixed``'s clipping search, on a seeded
subsample of at most 32 768 values). ``--bits N`` forces B. ``auto`` picks the smallest B whose rounding error
stays within a fraction of the members' own spread, the variance rule of ``fixed`` with the ensemble's
between-member variance v̄ = mean_i Var_k[w_k,i] in place of the posterior variance:

    mean_{k,i} (w_k,i − Δ q_k,i)²  <=  f · v̄ · MEMBER_FRACTION

A member is a point estimate, not a distribution: its rounding error is not averaged away by the member's own
noise as a Gaussian's is, so the budget is MEMBER_FRACTION (1/100) of ``fixed``'s. Other schemes (codebook,
ternary, binary, mcq, prune) are refused for member sets in one line, and every scheme but ``float`` for SWAG's
low-rank Gaussian (its deviations matrix is the posterior: no scheme here encodes it).

Report keys besides the common ones: ``scale`` (Δ), ``members`` (M), ``variance_bits``, ``hw_dtype``.
"""

from __future__ import annotations

import numpy as np

from edgebnn.ir import EncodedWeight
from edgebnn.ir.encodings import MemberSet, MemberSetFixedWeight
from edgebnn.ir.encodings.packing import MAX_BITS
from edgebnn.passes.base import LayerOutcome, LayerPass, register_family_lowering, sum_sq_diff
from edgebnn.passes.fixed import FixedConfig, best_step, hw_dtype

MEMBER_FRACTION = 0.01
_FIT_SAMPLE = 32768


def keep(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    """``float``: the family as imported."""
    return LayerOutcome(weight.encoding)


for _op in ("MemberSetWeight", "MemberSetFixedWeight", "LowRankGaussianWeight"):
    register_family_lowering(_op, "float")(keep)


@register_family_lowering("MemberSetFixedWeight", "fixed")
def already_fixed(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    return LayerOutcome(weight.encoding, "already fixed point: kept")


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
