"""Stores of families whose draws read coded covariance factors besides the mean (SWAG, Kronecker / dense Laplace).

Their draws (each family's module in :mod:`edgebnn.families`) ask :func:`factor` for every factor of the covariance
they read. It decodes the factor from the encoding's codes when the store of the builder's choice is a
:class:`FactorStore` (the family's own store of its lowered encoding), codes it at export for ``--weights
int8|int4`` (the family's ``factors`` function, :attr:`edgebnn.families.Family.factors`), and writes the given fp32
values otherwise (the float store, ``--weights fp32``, a runtime that does not run the decode). The decodes, each
the encoding's numpy decode in the same float32 operations (exact)::

    mean       = float32(q) · Δ            q packed at B bits (pooled unpack, :func:`.base.unpack_codes`)
    a σ code   = levels[codes]             a SigmaCode: its table and packed codes (:func:`.gaussian.sigma_code`)
    a row code = float32(q) · scale        int8, one scale per row (:func:`row_code`; transposed on request)

``stddev`` (the marginal σ, which no export of these families reads: their noise is never per weight) is fp32.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store, code_pool, reshape_to, scaled, unpack_codes
from edgebnn.exporters.stores.gaussian import RequantStore
from edgebnn.exporters.stores.registry import SMALL, decode, store_for
from edgebnn.family import family_of
from edgebnn.ir.encodings import Encoding, RowCode
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
    builder's choice where it is a :class:`FactorStore`, coded at export by the family's ``factors`` for ``--weights
    int8|int4``, else ``value`` (the factor, float32) as a constant."""
    store: Store = store_for(enc, b.fmt.weights, b.fmt.runtimes)
    family = family_of(enc.op_type)
    requant = isinstance(store, RequantStore) and family is not None and family.factors is not None
    if value.size < SMALL or not (isinstance(store, FactorStore) or requant):
        b.stored[name] = "float"
        return b.f32(name, value)
    b.stored[name] = store.op_type
    b.min_opset = max(b.min_opset, store.opset)
    if isinstance(store, FactorStore):
        return store.factor(b, enc, field, name)
    assert family is not None and family.factors is not None and isinstance(store, RequantStore)
    out: str = family.factors(b, enc, field, name, store.bits)
    return out


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


