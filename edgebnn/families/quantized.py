"""The fixed-point families a Gaussian lowers to: ``FixedPointWeight`` (``fixed``, bits from the posterior
variance), ``IntCountWeight`` (``mcq``, Monte Carlo Quantization counts) and ``TernaryWeight`` (``ternary``, VNQ):
integers times one scale per layer, plus a σ code. Each draws ``mean + σ ⊙ ε`` (``GAUSSIAN``).

Store (``--weights ir``), exactly the encoding's ``mean()`` / ``stddev()``::

    mean  = float32(q) · scale           q: the IR's packed B-bit codes (ternary: 2-bit), unpacked in the graph
    σ     = levels[σ codes]              the IR's SigmaCode: its levels table and packed codes (none when L = 1)

Bytes are the IR's own (the packed streams, the table, one scale), plus one padding byte per stream.
Analytic: exact (independent weights).
"""

from __future__ import annotations

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store, scaled, unpack_codes
from edgebnn.exporters.stores.gaussian import sigma_code
from edgebnn.family import EXACT, Family, register_family
from edgebnn.ir.encodings import Encoding, FixedPointWeight, IntCountWeight, TernaryWeight
from edgebnn.ir.encodings.fixedpoint import QuantizedWeight


class QuantizedStore(Store):
    """Integers times one scale (the mean) and a σ code."""

    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        assert isinstance(enc, QuantizedWeight)
        codes = unpack_codes(b, enc.packed, enc.bits, enc.size, name + "/q", signed=True)
        return scaled(b, codes, enc.scale, enc.shape, name)

    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        assert isinstance(enc, QuantizedWeight)
        return sigma_code(b, enc.sigma, enc.shape, name)

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, QuantizedWeight)
        return int(enc.packed.nbytes + 1 + 4 + enc.sigma.nbytes + (1 if enc.sigma.bits else 0))


class FixedPointStore(QuantizedStore):
    """Uniform fixed point ``scale · q``."""

    op_type = "FixedPointWeight"


class IntCountStore(QuantizedStore):
    """MCQ integer counts times the layer's scale."""

    op_type = "IntCountWeight"


class TernaryStore(QuantizedStore):
    """Ternary codes {-1, 0, 1} times the layer's level."""

    op_type = "TernaryWeight"


FAMILY = register_family(Family(
    "quantized", (FixedPointWeight, IntCountWeight, TernaryWeight),
    "fixed point, MCQ counts, ternary: integers x one scale per layer, and a sigma code",
    stores={s.op_type: s() for s in (FixedPointStore, IntCountStore, TernaryStore)},
    analytic=EXACT,
))
