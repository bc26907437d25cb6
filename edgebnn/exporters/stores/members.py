"""Store of ``MemberSetFixedWeight`` (a deep ensemble lowered with ``fixed``): the baked members as the IR's codes.

A deep ensemble is exported ``baked`` with S = M (:mod:`edgebnn.exporters.families`): its members are the graph's
constants, not moments. Every member lies on the layer's one grid, so the batched form's member tensor (whatever
layout its layer kind gives it: [S, in, out], [S·out, in], [S·O, C, k, k]) is written as its integer codes at the
member set's B bits, pooled and unpacked in the graph (:func:`.base.unpack_codes`), times the shared step::

    W = float32(q) · Δ          q = rint(W / Δ), |q| <= 2^(B-1) - 1       (exactly the members: W was Δ · q)

B bits per member weight plus one scale, against 32 (the float store). The codes are found again from the drawn
values (the layer kind lays them out); a tensor whose values are not exactly ``float32(q) · Δ`` is written fp32.
Member biases stay fp32 (a bias draw is taken apart from its layer's grid: a few floats per member).

:meth:`MemberSetFixedStore.mean` / ``stddev`` are the mixture's moments, which no export reads for a member set
(``baked`` only; a member set is never hoisted): fp32 constants.
"""

from __future__ import annotations

import numpy as np

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store, code_pool, scaled
from edgebnn.exporters.stores.registry import SMALL, register_store, store_for
from edgebnn.ir.encodings import Encoding, Grid, MemberSetFixedWeight
from edgebnn.ir.encodings.packing import packed_nbytes


@register_store("MemberSetFixedWeight")
class MemberSetFixedStore(Store):
    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        return b.f32(name, enc.mean())

    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        return b.f32(name, enc.stddev())

    def nbytes(self, enc: Encoding) -> int:
        """The members' codes (M · n at B bits) and one scale: what the baked graph stores for them."""
        assert isinstance(enc, MemberSetFixedWeight)
        return int(packed_nbytes(enc.m * enc.size, enc.bits) + 1 + 4)

    def members(self, b: Builder, enc: MemberSetFixedWeight, name: str, value: np.ndarray) -> str | None:
        """The member tensor ``value`` (on ``enc``'s grid) as its codes times the step, or None when it is not."""
        step = np.float32(enc.scale)
        q = np.rint(np.asarray(value, np.float32) / step)
        limit = (1 << (enc.bits - 1)) - 1
        if np.abs(q).max(initial=0) > limit or not np.array_equal(q.astype(np.float32) * step, value):
            return None
        codes = code_pool(b).take(q.astype(np.int16), enc.bits, True, name + "/q")
        b.stored[name] = self.op_type
        b.min_opset = max(b.min_opset, self.opset)
        return scaled(b, codes, float(step), tuple(value.shape), name)


def member_codes(b: Builder, enc: Encoding) -> None:
    """Let the builder write ``enc``'s baked members as codes (its ``draw_codes``) where the store of its choice
    has them (a ``MemberSetFixedWeight``); otherwise the builder writes fp32. Call before each baked layer."""
    store = store_for(enc, b.store_choice, b.store_runtimes)
    if not isinstance(store, MemberSetFixedStore) or not isinstance(enc, MemberSetFixedWeight):
        b.draw_codes = None
        return

    def write(bb: Builder, name: str, value: np.ndarray, grid: Grid) -> str | None:
        if value.size < SMALL or grid.step != enc.scale:
            return None
        return store.members(bb, enc, name, value)

    b.draw_codes = write


def wrote_members(b: Builder) -> bool:
    """Whether the builder wrote any baked members as codes (the export then takes short value names too)."""
    return MemberSetFixedStore.op_type in b.stored.values()
