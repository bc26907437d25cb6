"""A small Bayesian CNN built directly as IR with onnx.helper (no torch), for unit tests.

input [batch, 1, 6, 6] -> Conv(GaussianWeight 4x1x3x3, GaussianWeight bias, pad 1) -> BatchNorm (fixed)
-> Relu -> MaxPool 2 -> Flatten -> Gemm(GaussianWeight 3x36, transB=1, fixed bias) -> logits [batch, 3]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgebnn.ir import DOMAIN, BNNModel, GaussianWeight, Manifest, make_encoding_node

INPUT_SHAPE = [1, 1, 6, 6]
NUM_CLASSES = 3


def synthetic_cnn(seed: int = 0, sigma: float = 0.1) -> BNNModel:
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [],
        "synthetic_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 6, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", NUM_CLASSES])],
    )

    def gaussian(name: str, shape: tuple[int, ...], layer: str) -> None:
        mu = rng.normal(0, 0.5, shape).astype(np.float32)
        sd = np.full(shape, sigma, np.float32) * rng.uniform(0.5, 1.5, shape).astype(np.float32)
        graph.node.append(make_encoding_node(graph, name, layer, GaussianWeight(mu, sd)))

    gaussian("conv.weight", (4, 1, 3, 3), "conv")
    gaussian("conv.bias", (4,), "conv")
    gaussian("fc.weight", (NUM_CLASSES, 36), "fc")
    fixed = {
        "bn.scale": rng.uniform(0.5, 1.5, 4),
        "bn.shift": rng.normal(0, 0.1, 4),
        "bn.mean": rng.normal(0, 0.1, 4),
        "bn.var": rng.uniform(0.5, 1.5, 4),
        "fc.bias": rng.normal(0, 0.1, NUM_CLASSES),
    }
    for name, value in fixed.items():
        graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), name))
    graph.node.extend([
        helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c", "bn.scale", "bn.shift", "bn.mean", "bn.var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], transB=1),
    ])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)], producer_name="tests"
    )
    model.ir_version = 10
    manifest = Manifest(source_library="synthetic", input_name="input", input_shape=INPUT_SHAPE,
                        num_classes=NUM_CLASSES)
    return BNNModel(model, manifest, "synthetic_cnn")


def synthetic_linear(seed: int = 0, sigma: float = 0.3, n_in: int = 5, classes: int = 4,
                     trans_b: bool = True) -> BNNModel:
    """input [batch, n_in] -> Gemm(GaussianWeight [classes, n_in], GaussianWeight bias) -> logits.

    ``trans_b=False`` stores the weight as [n_in, classes] with Gemm transB=0 (torch writes transB=1).

    Its logits are exactly Gaussian given x: mean x·mu + b_mu, variance x²·sigma² + b_sigma².
    """
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [], "synthetic_linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
    )
    wshape = (classes, n_in) if trans_b else (n_in, classes)
    for name, shape in (("fc.weight", wshape), ("fc.bias", (classes,))):
        mu = rng.normal(0, 1.0, shape).astype(np.float32)
        sd = (sigma * rng.uniform(0.5, 1.5, shape)).astype(np.float32)
        graph.node.append(make_encoding_node(graph, name, "fc", GaussianWeight(mu, sd)))
    graph.node.append(helper.make_node("Gemm", ["input", "fc.weight", "fc.bias"], ["logits"], transB=int(trans_b)))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    manifest = Manifest(source_library="synthetic", input_name="input", input_shape=[1, n_in], num_classes=classes)
    return BNNModel(model, manifest, "synthetic_linear")


def write_trt_model(path: Path, *, batch: int | str = 1, width: int | str = 8, random: bool = False,
                    unsupported: bool = False) -> Path:
    """A small plain ONNX classifier (Gemm, Relu, Softmax; optionally a RandomNormalLike, which TensorRT builds
    with a warning, or a Unique, which its parser refuses) for the TensorRT exporter: the unit tests and the
    device tests build the same graph."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["probs"], name="softmax", axis=-1),
    ]
    if random:
        nodes.append(helper.make_node("RandomNormalLike", ["probs"], ["eps"], name="noise"))
    if unsupported:
        nodes.append(helper.make_node("Unique", ["probs"], ["uniq"], name="uniq"))
    graph = helper.make_graph(
        nodes,
        "bnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path
