"""Stores of the "integers times one scale, plus a σ code" encodings: ``FixedPointWeight``, ``IntCountWeight``
(MCQ counts), ``TernaryWeight``.

    mean  = float32(q) · scale           q: the IR's packed B-bit codes (ternary: 2-bit), unpacked in the graph
    σ     = levels[σ codes]              the IR's SigmaCode: its levels table and packed codes (none when L = 1)

Exactly the encoding's ``mean()`` / ``stddev()``; bytes are the IR's own (the packed streams, the table, one
scale), plus one padding byte per stream.
"""

from __future__ import annotations

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store, scaled, table_lookup, unpack_codes
from edgebnn.exporters.stores.registry import register_store
from edgebnn.ir.encodings import Encoding, SigmaCode
from edgebnn.ir.encodings.fixedpoint import QuantizedWeight


def sigma_table(b: Builder, code: SigmaCode, enc: Encoding, name: str) -> str:
    """``levels[codes]`` of a SigmaCode, shaped like the weight."""
    codes = unpack_codes(b, code.codes, code.bits, code.n, name + "/c") if code.bits else None
    return table_lookup(b, code.levels, codes, code.n, enc.shape, name)


class QuantizedStore(Store):
    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        assert isinstance(enc, QuantizedWeight)
        codes = unpack_codes(b, enc.packed, enc.bits, enc.size, name + "/q", signed=True)
        return scaled(b, codes, enc.scale, enc.shape, name)

    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        assert isinstance(enc, QuantizedWeight)
        return sigma_table(b, enc.sigma, enc, name)

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, QuantizedWeight)
        return int(enc.packed.nbytes + 1 + 4 + enc.sigma.nbytes + (1 if enc.sigma.bits else 0))


@register_store("FixedPointWeight")
class FixedPointStore(QuantizedStore):
    """Uniform fixed point ``scale · q``."""


@register_store("IntCountWeight")
class IntCountStore(QuantizedStore):
    """MCQ integer counts times the layer's scale."""


@register_store("TernaryWeight")
class TernaryStore(QuantizedStore):
    """Ternary codes {-1, 0, 1} times the layer's level."""
