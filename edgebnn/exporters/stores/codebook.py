"""Store of ``CodebookWeight`` (2DGBNN): packed entry indices plus the K-entry table.

    mean = m[index],  σ = s[index]       Gather from the codebook's columns (float32 [K] each)
    outliers and blended weights         overwritten with their own moments (``ScatterElements`` of the
                                         ``CodebookWeight.mean()`` / ``stddev()`` values at their flat indices)

Exactly the encoding's ``mean()`` / ``stddev()``. Bytes: the packed B-bit indices, the table, and per outlier or
blended weight one index (uint16/uint32) and one float32 for each of μ and σ.
"""

from __future__ import annotations

import numpy as np

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import INT64, TRT, Store, reshape_to, unpack_codes
from edgebnn.exporters.stores.registry import register_store
from edgebnn.ir.encodings import CodebookWeight, Encoding
from edgebnn.ir.encodings.codebook import index_dtype


@register_store("CodebookWeight")
class CodebookStore(Store):
    def _own(self, enc: CodebookWeight) -> np.ndarray:
        return np.union1d(enc.outlier_index, enc.blend_index).astype(np.int64)

    def _column(self, b: Builder, enc: Encoding, name: str, column: int, values: np.ndarray) -> str:
        assert isinstance(enc, CodebookWeight)
        table = b.f32(name + ".table", enc.codebook[:, column])
        if enc.bits:
            idx = unpack_codes(b, enc.packed, enc.bits, enc.size, name + "/idx")
            flat = b.add("Gather", [table, idx], name + "/inliers", axis=0)
        else:  # one entry
            flat = b.add("Expand", [table, b.const(name + ".n", np.array([enc.size], np.int64))], name + "/inliers")
        own = self._own(enc)
        if own.size:
            # TensorRT imports no uint16/uint32 weights: int32 there (4 bytes an outlier instead of 2)
            dtype = np.int32 if TRT in (b.store_runtimes or ()) else index_dtype(enc.size)
            at = b.add("Cast", [b.const(name + ".own_index", own.astype(dtype))], name + "/own", to=INT64)
            flat = b.add("ScatterElements", [flat, at, b.f32(name + ".own", values.reshape(-1)[own])],
                         name + "/flat", axis=0)
        return reshape_to(b, flat, enc.shape, name)

    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        return self._column(b, enc, name, 0, enc.mean())

    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        return self._column(b, enc, name, 1, enc.stddev())

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, CodebookWeight)
        own = self._own(enc).size
        return int(enc.packed.nbytes + 1 + enc.codebook.nbytes + own * (np.dtype(index_dtype(enc.size)).itemsize + 8))
