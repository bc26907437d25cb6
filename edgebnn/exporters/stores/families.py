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

``--weights int8|int4`` on these families, float or lowered (:class:`RequantFactors`), fits the same codes at
export: the mean per output channel at 8 / 4 bits (:mod:`.gaussian`), SWAG's σ as a log code of that width, a
Kronecker D as one of at least 6 bits (at 4 it cost dNLL +0.008), the deviations, eigenvectors and dense factors as
int8 row codes. Measured on digits (``bench/family_stores.py``, against the same IR's ``--weights fp32`` export,
same noise): SWAG K = 5 int8 2.6x smaller than the fp32 BNN, dNLL +0.0000; int4 3.0x, +0.0055 (accuracy -0.3
pt); Kronecker last layer int8 dNLL +0.0006, int4 +0.0030 (-0.8 pt: the mean at 4 bits, where the lowering's
whitened rule asks for 6). Re-quantizing the mean alone (the factors fp32) paid nothing there: SWAG 1.05x.

Kept fp32, and why: the GLM predictive of a Kronecker / dense last layer (``analytic``, :mod:`..glm`) reads Q_i, D²
and Q_o² computed in float64 and rounded once; squaring decoded codes in the graph rounds in float32, so that decode
would not be exact (the GLM graph is the same bytes lowered or not).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable

import numpy as np

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store, code_pool, reshape_to, scaled, table_lookup, unpack_codes
from edgebnn.exporters.stores.gaussian import RequantStore
from edgebnn.exporters.stores.registry import SMALL, decode, register_store, store_for
from edgebnn.ir.encodings import (
    DenseFixedWeight,
    DenseGaussianWeight,
    Encoding,
    KronFixedWeight,
    KronGaussianWeight,
    LowRankFixedWeight,
    LowRankGaussianWeight,
    RowCode,
    SigmaCode,
)
from edgebnn.ir.encodings.lowrank import FixedMean


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
    builder's choice where it is a :class:`FactorStore` (``--weights int8|int4``: :class:`RequantFactors`), else
    ``value`` (the factor, float32) as a constant."""
    store: Store = store_for(enc, b.store_choice, b.store_runtimes)
    if isinstance(store, RequantStore):
        store = RequantFactors(store.bits)
    if not isinstance(store, FactorStore) or value.size < SMALL:
        b.stored[name] = "float"
        return b.f32(name, value)
    b.stored[name] = store.op_type
    b.min_opset = max(b.min_opset, store.opset)
    return store.factor(b, enc, field, name)


def mean(b: Builder, enc: Encoding, name: str) -> str:
    """The mean a draw adds (:func:`~edgebnn.exporters.stores.registry.decode`: the codes, or the choice's store)."""
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


def _lowrank(enc: Encoding) -> LowRankGaussianWeight:
    assert isinstance(enc, LowRankGaussianWeight)
    return enc


def _kron(enc: Encoding) -> KronGaussianWeight:
    assert isinstance(enc, KronGaussianWeight)
    return enc


def _dense(enc: Encoding) -> DenseGaussianWeight:
    assert isinstance(enc, DenseGaussianWeight)
    return enc


def _sigma_at(values: np.ndarray, bits: int) -> SigmaCode:
    return SigmaCode.fit(values, bits, np.random.default_rng(0))  # seeded: the export is deterministic


# A Kronecker D (the eigenvalues, the covariance itself) at 4 bits cost dNLL +0.008 on the digits last layer, at 6
# +0.002 (bench/family_stores.py; the lowering's KRON_SCALE_BITS): --weights int4 codes it at 6.
KRON_SCALE_MIN_BITS = 6
# field -> (builder, encoding, value name, bits) -> the coded factor, for --weights int8|int4 (RequantFactors)
_REQUANT: dict[str, Callable[[Builder, Encoding, str, int], str]] = {
    "sigma": lambda b, e, n, bits: sigma_code(b, _sigma_at(_lowrank(e).sigma, bits), e.shape, n),
    "deviations": lambda b, e, n, bits: reshape_to(b, row_code(b, RowCode.fit(_lowrank(e).deviations.reshape(
        _lowrank(e).rank * e.shape[0], -1)), n + "/d"), (_lowrank(e).rank, e.size), n),
    "q_out": lambda b, e, n, bits: row_code(b, RowCode.fit(_kron(e).q_out.T), n, transpose=True),
    "q_in_t": lambda b, e, n, bits: row_code(b, RowCode.fit(_kron(e).q_in.T), n),
    "scale": lambda b, e, n, bits: sigma_code(b, _sigma_at(_kron(e).scale, max(bits, KRON_SCALE_MIN_BITS)),
                                              _kron(e).matrix_shape, n),
    "scale_t": lambda b, e, n, bits: row_code(b, RowCode.fit(_dense(e).scale.T), n),
}


class RequantFactors(FactorStore):
    """``--weights int8|int4`` on a correlated family (float or lowered): the mean per output channel at ``bits``
    (:class:`.gaussian.RequantStore`), SWAG's σ and a Kronecker D as ``bits``-bit log codes, SWAG's deviations, the
    eigenvectors and a dense factor as int8 row codes (the lowering's codes, fitted at export; not registered)."""

    def __init__(self, bits: int) -> None:
        self.bits = bits
        self.op_type = f"int{bits}"  # type: ignore[misc]

    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        return RequantStore(self.bits).mean(b, enc, name)

    def factor(self, b: Builder, enc: Encoding, field: str, name: str) -> str:
        return _REQUANT[field](b, enc, name, self.bits)

    def nbytes(self, enc: Encoding) -> int:
        return RequantStore(self.bits).nbytes(enc)
