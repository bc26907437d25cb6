"""Deep ensembles (Lakshminarayanan et al. 2017): the posterior is M member weight sets; sample s is member
``s mod M`` in every layer (``MemberSetWeight``; lowered with ``fixed``: ``MemberSetFixedWeight``). Imported from a
list of trained models by :mod:`edgebnn.importers.ensemble`.

Exports: exact in ``baked`` with S = M (each member once); any other S would weigh members unequally, ``noise`` /
``shared`` have no noise to draw (the members are constants) and ``analytic`` would propagate the members' mean
and variance (a Gaussian), not the ensemble: all refused in one line.

``fixed`` puts every member on ONE per-layer grid shared by the M members::

    w_k ≈ Δ · q_k,   q_k = clip(round(w_k / Δ), -L, L),   L = 2^(B-1) - 1

with Δ the least-error step for B bits over the pooled members (``fixed``'s clipping search, on a seeded
subsample of at most 32 768 values). ``--bits N`` forces B. ``auto`` picks the smallest B whose rounding error
stays within a fraction of the members' own spread, the variance rule of ``fixed`` with the ensemble's
between-member variance v̄ = mean_i Var_k[w_k,i] in place of the posterior variance:

    mean_{k,i} (w_k,i − Δ q_k,i)²  <=  f · v̄ · MEMBER_FRACTION

A member is a point estimate, not a distribution: its rounding error is not averaged away by the member's own
noise as a Gaussian's is, so the budget is MEMBER_FRACTION (1/100) of ``fixed``'s. Report keys: ``scale`` (Δ),
``members`` (M), ``variance_bits``, ``hw_dtype``.

Store of the lowered ensemble: its ``baked`` members as the IR's codes. Every member lies on the layer's one grid,
so the batched form's member tensor (whatever layout its layer kind gives it: [S, in, out], [S·out, in],
[S·O, C, k, k]) is written as its integer codes at the member set's B bits, pooled and unpacked in the graph
(:func:`edgebnn.exporters.stores.base.unpack_codes`), times the shared step::

    W = float32(q) · Δ          q = rint(W / Δ), |q| <= 2^(B-1) - 1       (exactly the members: W was Δ · q)

B bits per member weight plus one scale, against 32 (the float store). The codes are found again from the drawn
values (the layer kind lays them out); a tensor whose values are not exactly ``float32(q) · Δ`` is written fp32.
Member biases stay fp32 (a bias draw is taken apart from its layer's grid: a few floats per member). The store's
``mean`` / ``stddev`` are the mixture's moments, which no export reads for a member set: fp32 constants.
"""

from __future__ import annotations

import numpy as np

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store, code_pool, scaled
from edgebnn.exporters.stores.registry import SMALL
from edgebnn.family import Analytic, ExportRequest, Family, register_family
from edgebnn.ir import EncodedWeight
from edgebnn.ir.encodings import Encoding, Grid, MemberSet, MemberSetFixedWeight, MemberSetWeight
from edgebnn.ir.encodings.packing import MAX_BITS, packed_nbytes
from edgebnn.passes.base import LayerOutcome, LayerPass, Lowering, kept, sum_sq_diff
from edgebnn.passes.fixed import FixedConfig, best_step, fit_sample, hw_dtype

MEMBER_FRACTION = 0.01


class MemberSetFixedStore(Store):
    op_type = "MemberSetFixedWeight"
    writes_members = True

    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        return b.f32(name, enc.mean())

    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        return b.f32(name, enc.stddev())

    def nbytes(self, enc: Encoding) -> int:
        """The members' codes (M · n at B bits) and one scale: what the baked graph stores for them."""
        assert isinstance(enc, MemberSetFixedWeight)
        return int(packed_nbytes(enc.m * enc.size, enc.bits) + 1 + 4)

    def members(self, b: Builder, enc: Encoding, name: str, value: np.ndarray, grid: Grid) -> str | None:
        """The member tensor ``value`` (on ``enc``'s grid) as its codes times the step, or None when it is not."""
        assert isinstance(enc, MemberSetFixedWeight)
        if value.size < SMALL or grid.step != enc.scale:
            return None
        step = np.float32(enc.scale)
        q = np.rint(np.asarray(value, np.float32) / step)
        limit = (1 << (enc.bits - 1)) - 1
        if np.abs(q).max(initial=0) > limit or not np.array_equal(q.astype(np.float32) * step, value):
            return None
        codes = code_pool(b).take(q.astype(np.int16), enc.bits, True, name + "/q")
        b.stored[name] = self.op_type
        b.min_opset = max(b.min_opset, self.opset)
        return scaled(b, codes, float(step), tuple(value.shape), name)


def fixed_members(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    """Every member on one per-layer fixed-point grid (module docstring)."""
    enc = weight.encoding
    assert isinstance(enc, MemberSet) and isinstance(pass_.config, FixedConfig)
    config = pass_.config
    values = enc.values()
    flat = values.reshape(-1)
    top = float(np.max(np.abs(flat))) if flat.size else 0.0
    spread = sum_sq_diff(enc.stddev()) / enc.size
    sample = fit_sample(flat, rng)
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


def members(nodes: list) -> int | None:
    """M, the ``members`` attribute of the member-set nodes."""
    sizes = {a.i for n in nodes for a in n.attribute if a.name == "members"}
    return max(sizes) if sizes else None


def exact_exports(req: ExportRequest) -> str | None:
    """``baked`` with S = M only (module docstring)."""
    m = members(req.nodes)
    if req.mode != "baked":
        why = ("would propagate the members' mean and variance (a Gaussian), not the ensemble"
               if req.mode == "analytic" else "has no noise to draw (the members are constants)")
        return f"--mode {req.mode} {why}; export a deep ensemble with --mode baked"
    if m is not None and req.samples != m:
        return (f"--samples {req.samples}: a deep ensemble of {m} members exports exactly with --samples {m} "
                "(each member once)")
    return None


FAMILY = register_family(Family(
    "ensemble", (MemberSetWeight, MemberSetFixedWeight), "deep ensemble: M member weight sets, sample s = member s",
    stores={"MemberSetFixedWeight": MemberSetFixedStore()},
    lowerings={"MemberSetWeight": {"float": kept(), "fixed": Lowering(fixed_members, {"bits"})},
               "MemberSetFixedWeight": {"float": kept(), "fixed": kept("already fixed point: kept")}},
    analytic=Analytic("refused", "would propagate the members' mean and variance (a Gaussian), not the ensemble; "
                                 "export a deep ensemble with --mode baked"),
    exports=exact_exports, default_samples=members, label="deep ensemble",
))
