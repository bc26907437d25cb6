"""Stores of the lowered correlated families: SWAG (``LowRankFixedWeight``) and Kronecker / dense Laplace
(``KronFixedWeight``, ``DenseFixedWeight``): the mean's codes and the covariance factors' codes, decoded in graph.

Their draws (:mod:`edgebnn.exporters.draws`) read, besides the mean, the factors of the covariance; each emitter
asks :func:`factor` for them, which decodes them from the encoding's codes when the store of the builder's choice
is a :class:`FactorStore`, and writes the given fp32 values otherwise (the float store, ``--weights fp32|int8|int4``,
TensorRT). What is stored and decoded (:mod:`edgebnn.ir.encodings.lowrank`, :mod:`edgebnn.ir.encodings.kron`)::

    mean               = float32(q) · Δ            q packed at B bits (pooled unpack, :func:`.base.unpack_codes`)
    σ (SWAG), D (Kron) = levels[codes]             a SigmaCode: its table and packed codes
    D (SWAG) [K, n]    = float32(d_q) · d_scale    int8 [K·out, rest], one scale per row (RowCode)
    Q_iᵀ, Lᵀ           = float32(q) · scale        int8 RowCodes, one scale per eigenvector / column of L
    Q_o                = Transpose(Q_oᵀ decoded)

Every decode is the encoding's numpy decode in the same float32 operations (exact); the emitters then apply the
draw's own constants in graph (``sqrt(scale)``, ``1/sqrt(K−1)``), the same float32 products numpy takes. ``stddev``
(the marginal σ, which no export of these families reads: their noise is never per weight) is fp32.

``--weights int8|int4`` on these families (and on the float ``LowRankGaussianWeight`` / ``KronGaussianWeight``)
re-quantizes the mean only (:mod:`.gaussian`, per output channel) and keeps the factors fp32: the factors are the
posterior's covariance, and coding them is a lowering decision whose cost the ``fixed`` report shows
(``distortion_std``), not an export afterthought.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores import SMALL, decode, register_store, store_for
from edgebnn.exporters.stores.base import Store, code_pool, reshape_to, scaled, table_lookup, unpack_codes
from edgebnn.ir.encodings import (
    DenseFixedWeight,
    Encoding,
    KronFixedWeight,
    LowRankFixedWeight,
    RowCode,
    SigmaCode,
)
from edgebnn.ir.encodings.kron import FixedMean


class FactorStore(Store):
    """A store whose encodings' draws read coded factors besides the mean (:func:`factor`)."""

    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        assert isinstance(enc, FixedMean) and isinstance(enc, Encoding)
        codes = unpack_codes(b, enc.packed, enc.bits, enc.size, name + "/q", signed=True)
        return scaled(b, codes, enc.quant_step, enc.shape, name)

    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        return b.f32(name, enc.stddev())

    @abstractmethod
    def factor(self, b: Builder, enc: Encoding, field: str, name: str) -> str:
        """Emit the decode of the draw factor ``field`` of ``enc`` as the value ``name``."""


def factor(b: Builder, enc: Encoding, field: str, name: str, value: np.ndarray) -> str:
    """The draw factor ``field`` of ``enc`` as the fp32 value ``name``: decoded from the codes of the store of the
    builder's choice where it is a :class:`FactorStore`, else ``value`` (the factor, float32) as a constant."""
    store = store_for(enc, b.store_choice, b.store_runtimes)
    if not isinstance(store, FactorStore) or value.size < SMALL:
        b.stored[name] = "float"
        return b.f32(name, value)
    b.stored[name] = store.op_type
    b.min_opset = max(b.min_opset, store.opset)
    return store.factor(b, enc, field, name)


def mean(b: Builder, enc: Encoding, name: str) -> str:
    """The mean a draw adds (:func:`~edgebnn.exporters.stores.decode`: the codes, or the choice's store)."""
    return decode(b, enc, "mean", name)


def row_code(b: Builder, code: RowCode, name: str, transpose: bool = False) -> str:
    """``float32(q) · scale[:, None]`` [rows, cols] (``transpose``: its transpose)."""
    rows, cols = code.q.shape
    flat = code_pool(b).take(code.q, 8, True, name + "/q")
    grid = reshape_to(b, flat, (rows, cols), name + "/rows")
    out = b.add("Mul", [grid, b.f32(name + ".scale", code.scale[:, None])], name + ("/t" if transpose else ""))
    return b.add("Transpose", [out], name, perm=[1, 0]) if transpose else out


def sigma_code(b: Builder, code: SigmaCode, shape: tuple[int, ...], name: str) -> str:
    """``levels[codes]`` shaped ``shape``."""
    codes = unpack_codes(b, code.codes, code.bits, code.n, name + "/c") if code.bits else None
    return table_lookup(b, code.levels, codes, code.n, shape, name)


@register_store("LowRankFixedWeight")
class LowRankFixedStore(FactorStore):
    """SWAG: ``sigma`` (σ, the weight's shape) and ``deviations`` (D, [K, n])."""

    def factor(self, b: Builder, enc: Encoding, field: str, name: str) -> str:
        assert isinstance(enc, LowRankFixedWeight)
        if field == "sigma":
            return sigma_code(b, enc.sigma_code, enc.shape, name)
        assert field == "deviations", field
        return reshape_to(b, row_code(b, enc.dev_code, name + "/d"), (enc.rank, enc.size), name)

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, LowRankFixedWeight)
        return int(enc.packed.nbytes + 1 + 4 + enc.sigma_code.nbytes + enc.dev_code.nbytes)


@register_store("KronFixedWeight")
class KronFixedStore(FactorStore):
    """Kronecker Laplace: ``q_out`` (Q_o), ``q_in_t`` (Q_iᵀ), ``scale`` (D, [out, rest])."""

    def factor(self, b: Builder, enc: Encoding, field: str, name: str) -> str:
        assert isinstance(enc, KronFixedWeight)
        if field == "q_out":
            return row_code(b, enc.q_out_code, name, transpose=True)
        if field == "q_in_t":
            return row_code(b, enc.q_in_code, name)
        assert field == "scale", field
        return sigma_code(b, enc.scale_code, enc.matrix_shape, name)

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, KronFixedWeight)
        return int(enc.packed.nbytes + 1 + 4 + enc.q_out_code.nbytes + enc.q_in_code.nbytes + enc.scale_code.nbytes)


@register_store("DenseFixedWeight")
class DenseFixedStore(FactorStore):
    """A dense Gaussian block: ``scale_t`` (Lᵀ, [r, numel])."""

    def factor(self, b: Builder, enc: Encoding, field: str, name: str) -> str:
        assert isinstance(enc, DenseFixedWeight) and field == "scale_t", field
        return row_code(b, enc.scale_code, name)

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, DenseFixedWeight)
        return int(enc.packed.nbytes + 1 + 4 + enc.scale_code.nbytes)
