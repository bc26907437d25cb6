"""Any posterior's mean and σ stored compactly on request (``--weights int8`` / ``int4``).

A float posterior has no integer codes of its own, so this store quantizes at export:

    mean  μ ≈ s_o · q,   q symmetric ``bits``-bit integers, one scale per slice of axis 0 (output channel),
          s_o = max|μ_o| / (2^(bits-1) - 1)                            (each μ moves by at most s_o / 2)
    σ     a :class:`~edgebnn.ir.encodings.SigmaCode` of ``bits`` bits: the lowering's log-domain Lloyd-Max
          table (σ spans decades; what matters is relative error), each level the RMS of its bin

decoded in the graph as ``Cast(q) · s`` and ``Gather(levels, codes)`` (:mod:`.base`). ``bits`` 8: int8 codes;
4: a packed nibble stream. Bytes per weight: ``bits / 8`` for μ plus ``bits / 8`` for σ (int4: 1 byte
for μ and σ together against 8 as fp32).
"""

from __future__ import annotations

import numpy as np

from edgebnn.exporters import quantize
from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store, table_lookup, unpack_codes
from edgebnn.ir.encodings import Encoding, SigmaCode
from edgebnn.ir.encodings.packing import pack_int, packed_nbytes


def sigma_at(values: np.ndarray, bits: int) -> SigmaCode:
    """``values`` (a σ) as a ``bits``-bit log-domain code, seeded (the export is deterministic)."""
    return SigmaCode.fit(values, bits, np.random.default_rng(0))


def sigma_code(b: Builder, code: SigmaCode, shape: tuple[int, ...], name: str) -> str:
    """The decode of a σ code: ``levels[codes]`` shaped ``shape``."""
    codes = unpack_codes(b, code.codes, code.bits, code.n, name + "/c") if code.bits else None
    return table_lookup(b, code.levels, codes, code.n, shape, name)


class RequantStore(Store):
    """μ as per-channel ``bits``-bit integers, σ as a ``bits``-bit code (not registered: chosen by ``--weights``)."""

    def __init__(self, bits: int) -> None:
        self.bits = bits
        self.op_type = f"int{bits}"  # type: ignore[misc]

    def decoded_mean(self, enc: Encoding) -> np.ndarray:
        """What :meth:`mean` decodes to, in numpy (the tests' reference)."""
        q, scale = quantize.rows(enc.mean(), self.bits)
        return (q.astype(np.float32).reshape(len(q), -1) * scale[:, None]).reshape(enc.shape)

    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        q, scale = quantize.rows(enc.mean(), self.bits)
        n = enc.size
        codes = unpack_codes(b, pack_int(q, self.bits), self.bits, n, name + "/q", signed=True)
        rows = b.add("Reshape", [codes, b.const(name + ".rows", np.array([len(q), -1], np.int64))], name + "/rows")
        flat = b.add("Mul", [rows, b.f32(name + ".scale", scale[:, None])], name + "/scaled")
        return b.add("Reshape", [flat, b.const(name + ".shape", np.array(enc.shape, np.int64))], name)

    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        return sigma_code(b, sigma_at(enc.stddev(), self.bits), enc.shape, name)

    def nbytes(self, enc: Encoding) -> int:
        code = sigma_at(enc.stddev(), self.bits)
        q_bytes = packed_nbytes(enc.size, self.bits) + 4 * enc.shape[0]
        return int(q_bytes + code.nbytes)
