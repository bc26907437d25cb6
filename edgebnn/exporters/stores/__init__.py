"""Stores: each encoding's codes written into the exported graph compactly, with their in-graph decode.

Each family gives the stores of its encodings (:attr:`edgebnn.families.Family.stores`, by op type, in the
family's module in :mod:`edgebnn.families`); the contract and the shared decode pieces are in :mod:`.base`, the
factor stores of the correlated families in :mod:`.factors`. Every export mode that reads a posterior's moments
(``noise``, ``shared``, ``analytic``) asks :func:`store_for` for the store of the ``weights`` choice:

``ir`` (the default)   the encoding's own store (its packed codes: fixed point, MCQ, ternary, binary, codebook,
                       the lowered families), the float store where it has none (a Gaussian, a dropout mask);
``fp32``               the float store (:mod:`.float_`): decoded at export, 4 bytes per number;
``int8`` / ``int4``    any posterior re-quantized at export (:mod:`.gaussian`): per-channel integer μ, a
                       log-domain σ code.

A runtime that cannot run a store's decode gets the float store: every store runs on onnxruntime and on
TensorRT-RTX (real builds: tests/integration/test_tensorrt_rtx.py); Jetson's TensorRT 10.3 is unverified
(``edgebnn.devices.DeviceProfile.decodes``), so its exports take float moments. ``baked`` stores drawn members,
not moments: its ``--weights int8|int4`` are the constant store's formats
(:func:`.constants.constant`). ``shared`` codebook draws read the packed indices through
:func:`.base.unpack_codes` too.
Adding a storage encoding is one :class:`.base.Store` in its family's module, named in the family's ``stores``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from edgebnn.exporters import STORE_CHOICES
from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import Store, finish_stores
from edgebnn.exporters.stores.registry import SMALL, decode, own_store, store_for

__all__ = ["SMALL", "STORE_CHOICES", "Store", "compact_names", "decode", "finish_stores", "own_store", "store_for",
           "store_metadata"]


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
