"""The choice of a store for an export: each family's own stores (:attr:`edgebnn.families.Family.stores`, by
encoding op type), the float store, or the re-quantizing store of ``--weights int8|int4``."""

from __future__ import annotations

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store
from edgebnn.exporters.stores.float_ import FLOAT
from edgebnn.exporters.stores.gaussian import RequantStore
from edgebnn.family import family_of
from edgebnn.ir.encodings import Encoding

# tensors of fewer numbers stay fp32: their decode's nodes outweigh 4 bytes a number (on the bayesian-torch digits
# CNN's noise export: 16 kept the fewest bytes of 8, 16, 32, 64)
SMALL = 16


def own_store(op_type: str) -> Store | None:
    """The compact store the family of ``op_type`` gives it (``--weights ir``), or None."""
    family = family_of(op_type)
    store: Store | None = None if family is None else family.stores.get(op_type)
    return store


def store_for(enc: Encoding, weights: str = "ir", runtimes: tuple[str, ...] | None = None) -> Store:
    """The store that writes ``enc`` for the ``weights`` choice (:data:`edgebnn.exporters.STORE_CHOICES`); the float
    store where the chosen one's decode does not run on every runtime of ``runtimes`` (None: any runtime)."""
    family = family_of(enc.op_type)
    requantize = weights in ("int8", "int4")
    if weights == "fp32" or (requantize and family is not None and not family.requantize):
        return FLOAT
    store: Store = RequantStore(int(weights[3:])) if requantize else own_store(enc.op_type) or FLOAT
    if runtimes is not None and not set(runtimes) <= set(store.runtimes):
        return FLOAT
    return store


def decode(b: Builder, enc: Encoding, what: str, name: str) -> str:
    """Emit ``enc``'s ``what`` (``mean``, ``stddev`` or ``variance``) as the fp32 value ``name``, written by the
    store of the builder's ``fmt.weights`` (the float store where it does not run on ``b.fmt.runtimes``)."""
    store = store_for(enc, b.fmt.weights, b.fmt.runtimes)
    if enc.size < SMALL:  # a few numbers: fp32 constants are smaller than their decode's nodes
        store = FLOAT
    b.min_opset = max(b.min_opset, store.opset)
    b.stored[name] = store.op_type
    out: str = getattr(store, what)(b, enc, name)
    return out


def wrote_members(b: Builder) -> bool:
    """Whether the builder wrote any baked members as codes (the export then takes short value names too)."""
    return any(store is not None and store.writes_members
               for store in (own_store(op) for op in set(b.stored.values())))
