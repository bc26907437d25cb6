"""Stores: each encoding's codes written into the exported graph compactly, with their in-graph decode.

One store per encoding op type (:data:`STORES`, :func:`register_store`, in the style of :data:`..draws.DRAWS`
and :data:`..layers.LAYERS`); the contract and the shared decode pieces are in :mod:`.base`. Every export mode
that reads a posterior's moments (``noise``, ``shared``, ``analytic``) asks
:func:`store_for` for the store of the ``weights`` choice:

``ir`` (the default)   the encoding's own store (its packed codes; :mod:`.quantized`, :mod:`.codebook`,
                       :mod:`.binary`), the float store where it has none (``GaussianWeight``, dropout masks);
``fp32``               the float store (:mod:`.float_`): decoded at export, 4 bytes per number;
``int8`` / ``int4``    any posterior re-quantized at export (:mod:`.gaussian`): per-channel integer μ, a
                       log-domain σ code.

A runtime that cannot run a store's decode (``edgebnn.devices.DeviceProfile.decodes``: TensorRT) gets the float
store. ``baked`` stores drawn members, not moments: its ``--weights int8|int4`` are the builder's formats
(:meth:`~edgebnn.exporters._graph.Builder.weight`). ``shared`` codebook draws read the packed indices through
:func:`.base.unpack_codes` too.
Adding a storage encoding is one module here (a :class:`.base.Store` registered by op type) plus its test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from edgebnn.exporters import STORE_CHOICES
from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store, finish_stores
from edgebnn.ir.encodings import Encoding

__all__ = ["STORES", "STORE_CHOICES", "Store", "compact_names", "decode", "finish_stores", "register_store",
           "store_for", "store_metadata"]

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
    """The store that writes ``enc`` for the ``weights`` choice (:data:`STORE_CHOICES`); the float store where the
    chosen one's decode does not run on every runtime of ``runtimes`` (None: any runtime)."""
    from edgebnn.exporters.stores.float_ import FLOAT
    from edgebnn.exporters.stores.gaussian import RequantStore

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
        from edgebnn.exporters.stores.float_ import FLOAT

        store = FLOAT
    b.min_opset = max(b.min_opset, store.opset)
    b.stored[name] = store.op_type
    out: str = getattr(store, what)(b, enc, name)
    return out


def store_metadata(b: Builder) -> dict[str, Any]:
    """The export metadata of the builder's stores: ``stores`` (store -> tensors it decodes), left out when every
    tensor is plain fp32 (the bytes exporters always wrote). The decoded tensors are fp32: the runtime's weight
    precision stays fp32, so ``weights`` (baked members' storage) is not set."""
    if set(b.stored.values()) <= {"float"}:
        return {}
    counts: dict[str, int] = {}
    for store in b.stored.values():
        counts[store] = counts.get(store, 0) + 1
    return {"stores": dict(sorted(counts.items()))}


def compact_names(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with identical initializers merged and every internal value (not a graph input or output) named
    by a short counter: a compact export's graph, not its codes, is most of a small model's file (the names of
    its decode values appear twice each). The graph computes the same; its value names no longer say what."""
    graph = proto.graph
    keep = {v.name for v in graph.input} | {v.name for v in graph.output}
    alias: dict[str, str] = {}
    first: dict[bytes, str] = {}
    unique = []
    for t in graph.initializer:
        body = onnx.TensorProto()
        body.CopyFrom(t)
        body.name = ""
        key = body.SerializeToString(deterministic=True)
        if key in first and t.name not in keep:
            alias[t.name] = first[key]
        else:
            first.setdefault(key, t.name)
            unique.append(t)
    del graph.initializer[:]
    graph.initializer.extend(unique)
    names: dict[str, str] = {}
    taken: set[str] = set()

    def short(name: str) -> str:
        name = alias.get(name, name)
        if not name or name in keep:
            return name
        if name not in names:  # the next counter that is no kept name (a graph input called "x")
            count = len(names)
            while (short_name := np.base_repr(count, 36).lower()) in keep or short_name in taken:
                count += 1
            names[name] = short_name
            taken.add(short_name)
        return names[name]

    for t in graph.initializer:
        t.name = short(t.name)
    for node in graph.node:
        node.name = ""
        node.input[:] = [short(x) for x in node.input]
        node.output[:] = [short(x) for x in node.output]
    del graph.value_info[:]
    return proto


# registers the stores (families: the lowered SWAG / Laplace kinds; members: a lowered deep ensemble's baked members)
from edgebnn.exporters.stores import binary, codebook, families, members, quantized  # noqa: E402,F401
