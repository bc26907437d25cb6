"""The binary family (EBP): ``BinaryWeight``, one sign bit per weight, a per-layer scale ``a`` and a
flip-probability code ``f``, each weight ``±a`` with its sign flipped with probability ``f``.

Store (``--weights ir``), with ``f_l`` the flip levels (both float32), exactly the encoding's ``mean()`` /
``stddev()`` (the same float32 operations per level as per weight)::

    signed = [-a, a][sign bit]                        (Gather from a 2-entry table)
    mean   = signed · (1 - 2 f)[flip code]            (per-level table, as ``BinaryWeight.mean()`` computes it)
    σ      = (2a · sqrt(f (1 - f)))[flip code]

Bytes: 1 bit per weight, the flip code and two small tables. No in-graph draw (``--mode baked`` stores its
members). Analytic: exact (independent weights, their two moments).
"""

from __future__ import annotations

import numpy as np

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store, table_lookup, unpack_codes
from edgebnn.family import EXACT, Family, register_family
from edgebnn.ir.encodings import BinaryWeight, Encoding


class BinaryStore(Store):
    op_type = "BinaryWeight"

    def _flip(self, b: Builder, enc: BinaryWeight, table: np.ndarray, name: str) -> str:
        codes = unpack_codes(b, enc.flip.codes, enc.flip.bits, enc.size, name + "/f") if enc.flip.bits else None
        return table_lookup(b, table, codes, enc.size, enc.shape, name)

    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        assert isinstance(enc, BinaryWeight)
        a = np.float32(enc.scale)
        bits = unpack_codes(b, enc.packed, 1, enc.size, name + "/sign")
        signed = table_lookup(b, np.array([-a, a], np.float32), bits, enc.size, enc.shape, name + "/signed")
        shrink = self._flip(b, enc, 1 - 2 * enc.flip.levels, name + "/shrink")
        return b.add("Mul", [signed, shrink], name)

    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        assert isinstance(enc, BinaryWeight)
        f = enc.flip.levels
        return self._flip(b, enc, (2 * enc.scale) * np.sqrt(f * (1 - f)), name)

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, BinaryWeight)
        return int(enc.packed.nbytes + 1 + 8 + enc.flip.nbytes + 1 + 4 * enc.flip.levels.size)


FAMILY = register_family(Family(
    "binary", (BinaryWeight,), "binary (EBP): a sign bit per weight, a scale and a flip-probability code",
    stores={"BinaryWeight": BinaryStore()},
    analytic=EXACT,
))
