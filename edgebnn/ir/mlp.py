"""Build an IR directly from numpy posteriors: a Gemm/ReLU MLP (benchmarks, tests, quick experiments).

``x [batch, in] -> Gemm(W1, b1, transB=1) -> Relu -> ... -> Gemm(Wn, bn) -> logits``; weight ``i`` (from 1) is
``W{i}`` of layer ``fc{i}``, always a ``GaussianWeight``; its bias ``b{i}`` is a ``GaussianWeight`` when a σ
is given, a deterministic fp32 initializer otherwise, or absent.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgebnn.ir._model import DOMAIN, MAX_IR_VERSION, BNNModel, Manifest, make_encoding_node
from edgebnn.ir.encodings import GaussianWeight

# (weight μ [out, in], weight σ, bias μ [out] or None, bias σ [out] or None)
MLPLayer = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


def gaussian_mlp(layers: Sequence[MLPLayer], *, name: str = "mlp") -> BNNModel:
    """An MLP IR with the given posteriors (not verified: call :func:`edgebnn.ir.verify` if needed)."""
    n_in, n_out = layers[0][0].shape[1], layers[-1][0].shape[0]
    graph = helper.make_graph(
        [], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_out])],
    )
    encodings, ops, prev = [], [], "x"
    for i, (w_mu, w_sigma, b_mu, b_sigma) in enumerate(layers, start=1):
        encodings.append(make_encoding_node(graph, f"W{i}", f"fc{i}", GaussianWeight(w_mu, w_sigma)))
        inputs = [prev, f"W{i}"]
        if b_mu is not None:
            inputs.append(f"b{i}")
            if b_sigma is not None:
                encodings.append(make_encoding_node(graph, f"b{i}", f"fc{i}", GaussianWeight(b_mu, b_sigma)))
            else:
                graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(b_mu, np.float32), f"b{i}"))
        out = "logits" if i == len(layers) else f"h{i}"
        ops.append(helper.make_node("Gemm", inputs, [out], transB=1))
        if out != "logits":
            ops.append(helper.make_node("Relu", [out], [f"r{i}"]))
            prev = f"r{i}"
    graph.node.extend(encodings + ops)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = MAX_IR_VERSION
    manifest = Manifest(source_library="synthetic", input_name="x", input_shape=[1, int(n_in)],
                        num_classes=int(n_out))
    return BNNModel(proto, manifest, f"<{name}>")
