"""The stores' registry: one :class:`.base.Store` per encoding op type, and the choice of a store for an export.

The store modules (:mod:`.quantized`, :mod:`.codebook`, ...) register here with :func:`register_store`; the
package (:mod:`edgebnn.exporters.stores`) imports them all and is the face the exporters import.
"""

from __future__ import annotations

from collections.abc import Callable

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store
from edgebnn.exporters.stores.float_ import FLOAT
from edgebnn.exporters.stores.gaussian import RequantStore
from edgebnn.ir.encodings import Encoding

STORES: dict[str, Store] = {}
# tensors of fewer numbers stay fp32: their decode's nodes outweigh 4 bytes a number (on the bayesian-torch digits
# CNN's noise export: 16 kept the fewest bytes of 8, 16, 32, 64)
SMALL = 16


def register_store(op_type: str) -> Callable[[type[Store]], type[Store]]:
    """Class decorator: store encodings of ``op_type`` with (an instance of) the decorated class."""
    def register(cls: type[Store]) -> type[Store]:
        cls.op_type = op_type
        STORES[op_type] = cls()
        return cls
    return register


def store_for(enc: Encoding, weights: str = "ir", runtimes: tuple[str, ...] | None = None) -> Store:
    """The store that writes ``enc`` for the ``weights`` choice (:data:`edgebnn.exporters.STORE_CHOICES`); the float
    store where the chosen one's decode does not run on every runtime of ``runtimes`` (None: any runtime)."""
    if weights == "fp32" or enc.op_type == "DropoutMask":
        return FLOAT
    store: Store = RequantStore(int(weights[3:])) if weights in ("int8", "int4") else STORES.get(enc.op_type, FLOAT)
    if runtimes is not None and not set(runtimes) <= set(store.runtimes):
        return FLOAT
    return store


def decode(b: Builder, enc: Encoding, what: str, name: str) -> str:
    """Emit ``enc``'s ``what`` (``mean``, ``stddev`` or ``variance``) as the fp32 value ``name``, written by the
    store of the builder's ``store_choice`` (the float store where it does not run on ``b.store_runtimes``)."""
    store = store_for(enc, b.store_choice, b.store_runtimes)
    if enc.size < SMALL:  # a few numbers: fp32 constants are smaller than their decode's nodes
        store = FLOAT
    b.min_opset = max(b.min_opset, store.opset)
    b.stored[name] = store.op_type
    out: str = getattr(store, what)(b, enc, name)
    return out
