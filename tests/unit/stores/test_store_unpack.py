"""The in-graph bit unpacking every store shares: the IR's little-endian bit stream at every width, exactly."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores import finish_stores
from edgebnn.exporters.stores.base import unpack_codes
from edgebnn.ir.encodings.packing import pack_int, pack_uint


def _run(b: Builder, outs: list[str], sizes: list[int], signed: bool) -> list[np.ndarray]:
    finish_stores(b)
    elem = TensorProto.FLOAT if signed else TensorProto.INT32
    graph = helper.make_graph(b.nodes, "unpack", [], [helper.make_tensor_value_info(o, elem, [n])
                                                      for o, n in zip(outs, sizes, strict=True)], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {})


@pytest.mark.parametrize("signed", [False, True])
def test_every_width_unpacks_exactly_and_tensors_of_a_width_share_one_stream(signed):
    rng = np.random.default_rng(0)
    b = Builder()
    want, outs = [], []
    for bits in range(1 if not signed else 2, 17):
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        for n in (1, 13, 101):  # lengths that end mid-byte
            values = rng.integers(lo, hi + 1, n)
            values[0] = lo if n > 1 else hi  # the extremes: the sign bit, the top code
            values[-1] = hi
            packed = pack_int(values, bits) if signed else pack_uint(values, bits)
            outs.append(unpack_codes(b, packed, bits, n, f"t{bits}_{n}", signed=signed))
            want.append(values)
    got = _run(b, outs, [len(w) for w in want], signed)
    for name, w, g in zip(outs, want, got, strict=True):
        np.testing.assert_array_equal(g, w.astype(g.dtype), err_msg=name)
        assert g.dtype == (np.float32 if signed else np.int32)  # integer means are cast once; indices stay int
    # one unpack (or one Cast for 8- and 16-bit codes) and one Split per width, not one per tensor
    assert sum(n.op_type == "Split" for n in b.nodes) == len({o.split("_")[0] for o in outs})
    assert sum(n.op_type == "Range" for n in b.nodes) == sum(1 for bits in range(2 if signed else 1, 8))
