"""The float store: the encoding decoded in numpy at export, written as fp32 constants (any encoding).

    mean = enc.mean(),  σ = enc.stddev(),  σ² = enc.moments()[1]       (4 bytes per weight each)

The fallback for encodings without a store of their own, the ``--weights fp32`` choice, and what runtimes that
cannot run a decode get (TensorRT: :mod:`edgebnn.devices`).
"""

from __future__ import annotations

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import ORT, TRT, Store
from edgebnn.ir.encodings import Encoding


class FloatStore(Store):
    op_type = "float"
    opset = 1
    runtimes = (ORT, TRT)

    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        return b.f32(name, enc.mean())

    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        return b.f32(name, enc.stddev())

    def variance(self, b: Builder, enc: Encoding, name: str) -> str:
        return b.f32(name, enc.moments()[1])

    def nbytes(self, enc: Encoding) -> int:
        return 2 * 4 * enc.size


FLOAT = FloatStore()
