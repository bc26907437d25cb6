"""Shared by the store tests: run a store's in-graph decode on its own (a graph with no inputs whose outputs are the
decoded tensors) and compare it with the encoding's numpy decode."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores import Store, finish_stores
from edgebnn.ir.encodings import Encoding

WHATS = ("mean", "stddev", "variance")


def decode_graph(enc: Encoding, store: Store, whats: tuple[str, ...] = WHATS) -> tuple[onnx.ModelProto,
                                                                                         dict[str, np.ndarray]]:
    """The model that decodes ``enc`` with ``store``, checked, and what onnxruntime computes from it: with graph
    optimizations off (the decode ops themselves run; with them on, onnxruntime folds the same ops at load)."""
    b = Builder()
    outs = [getattr(store, what)(b, enc, f"w/{what}") for what in whats]
    finish_stores(b)
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(enc.shape)) for o in outs]
    graph = helper.make_graph(b.nodes, "store", [], outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", max(17, store.opset))], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 2
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return model, dict(zip(whats, sess.run(None, {}), strict=True))


def assert_decodes_exactly(enc: Encoding, got: dict[str, np.ndarray]) -> None:
    """The graph's tensors are the encoding's numpy decode, bit for bit (same float32 operations)."""
    np.testing.assert_array_equal(got["mean"], enc.mean())
    np.testing.assert_array_equal(got["stddev"], enc.stddev())
    np.testing.assert_array_equal(got["variance"], enc.moments()[1])


def float_bytes(enc: Encoding) -> int:
    """Bytes of the same decode graph with the float store (μ, σ, σ² as fp32): what the compact store replaces."""
    from edgebnn.exporters.stores.float_ import FLOAT

    return decode_graph(enc, FLOAT)[0].ByteSize()
