"""Analytic mode through ReLU, MaxPool, Slice, Pad, ReduceMax and a LogSoftmax head: one Gaussian Gemm (exact moments
in numpy), then the op, then the quadrature head, against the same head on the moments computed by hand."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from scipy.stats import norm

from edgebnn.errors import UnsupportedLayerError
from edgebnn.exporters.analytic import quadrature_points
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.ir import DOMAIN, BNNModel, GaussianWeight, Manifest, make_encoding_node

ROUNDOFF = 1e-5
Q = 16
RNG = np.random.default_rng(0)
MU = RNG.normal(0, 0.5, (12, 5)).astype(np.float32)
SD = RNG.uniform(0.1, 0.6, (12, 5)).astype(np.float32)
X = RNG.normal(size=(4, 5)).astype(np.float32)


def _model(tail: list, inits: list, classes: int) -> BNNModel:
    """input [B, 5] -> Gemm(GaussianWeight [12, 5]) -> ``tail`` (from value ``h``) -> logits [B, classes]."""
    graph = helper.make_graph([], "ops", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 5])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    graph.node.append(make_encoding_node(graph, "fc.weight", "fc", GaussianWeight(MU, SD)))
    graph.node.extend([helper.make_node("Gemm", ["input", "fc.weight"], ["h"], transB=1), *tail])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    return BNNModel(proto, Manifest(source_library="synthetic", input_name="input", input_shape=[1, 5],
                                    num_classes=classes), "ops")


def _analytic(model: BNNModel) -> np.ndarray:
    sess = ort.InferenceSession(export_model(model, ExportConfig(Q, mode="analytic")).proto.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": X})[0]


def _head(m: np.ndarray, v: np.ndarray) -> np.ndarray:
    z = m[:, None] + np.sqrt(v)[:, None] * quadrature_points(Q, m.shape[1])[None]
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).mean(1)


M, V = X @ MU.T, (X * X) @ (SD * SD).T  # the Gemm's output moments


def _rectified(m: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of max(0, X), X ~ N(m, v), in the textbook form (float64)."""
    m, s = m.astype(np.float64), np.sqrt(v.astype(np.float64))
    a = m / s
    mean = m * norm.cdf(a) + s * norm.pdf(a)
    return mean, (m * m + s * s) * norm.cdf(a) + m * s * norm.pdf(a) - mean**2


def test_relu_takes_the_rectified_gaussian_moments():
    m, v = _rectified(M, V)
    got = _analytic(_model([helper.make_node("Relu", ["h"], ["logits"])], [], 12))
    np.testing.assert_allclose(got, _head(m, v), atol=ROUNDOFF)


def test_a_relu_before_a_max_pool_is_pooled_first():
    """relu(max x) = max(relu x) draw by draw: the pool takes the unit with the largest pre-activation mean, then
    the ReLU's moments apply to the pooled units (a quarter of them for a 2x2 pool)."""
    tail = [helper.make_node("Reshape", ["h", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["a"]),
            helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Flatten", ["p"], ["logits"])]
    m4, v4 = M.reshape(-1, 3, 4), V.reshape(-1, 3, 4)  # [B, C=3, 2x2 window]
    arg = m4.argmax(-1)[..., None]
    m, v = _rectified(np.take_along_axis(m4, arg, -1)[..., 0], np.take_along_axis(v4, arg, -1)[..., 0])
    got = _analytic(_model(tail, [("shape", np.array([-1, 3, 2, 2]))], 3))
    np.testing.assert_allclose(got, _head(m, v), atol=ROUNDOFF)


def test_slice_and_pad_select_and_zero_pad_the_variance():
    tail = [helper.make_node("Slice", ["h", "starts", "ends", "axes", "steps"], ["s"]),
            helper.make_node("Pad", ["s", "pads", "value"], ["logits"], mode="constant")]
    inits = [("starts", np.array([1])), ("ends", np.array([11])), ("axes", np.array([1])), ("steps", np.array([2])),
             ("pads", np.array([0, 1, 0, 2])), ("value", np.array(0.5, np.float32))]
    m = np.pad(M[:, 1:11:2], ((0, 0), (1, 2)), constant_values=0.5)
    v = np.pad(V[:, 1:11:2], ((0, 0), (1, 2)))
    np.testing.assert_allclose(_analytic(_model(tail, inits, 8)), _head(m, v), atol=ROUNDOFF)


def test_reduce_max_takes_the_variance_at_the_arg_max():
    tail = [helper.make_node("Reshape", ["h", "shape"], ["r"]),
            helper.make_node("ReduceMax", ["r", "axes"], ["logits"], keepdims=0)]
    inits = [("shape", np.array([-1, 3, 4])), ("axes", np.array([2]))]
    m3, v3 = M.reshape(-1, 3, 4), V.reshape(-1, 3, 4)
    arg = m3.argmax(-1)[..., None]
    m, v = np.take_along_axis(m3, arg, -1)[..., 0], np.take_along_axis(v3, arg, -1)[..., 0]
    np.testing.assert_allclose(_analytic(_model(tail, inits, 3)), _head(m, v), atol=ROUNDOFF)


def test_a_log_softmax_head_is_the_logits_head():
    """softmax(log_softmax(z)) = softmax(z) draw by draw: the predictive is that of the logits' moments."""
    got = _analytic(_model([helper.make_node("LogSoftmax", ["h"], ["logits"], axis=1)], [], 12))
    np.testing.assert_allclose(got, _head(M, V), atol=ROUNDOFF)


def test_log_softmax_before_the_head_is_refused():
    tail = [helper.make_node("LogSoftmax", ["h"], ["ls"], axis=1), helper.make_node("Relu", ["ls"], ["logits"])]
    with pytest.raises(UnsupportedLayerError, match=r"^ops: LogSoftmax node 'ls': analytic mode cannot propagate "
                                                    r"variance through LogSoftmax; use --mode baked or noise$"):
        export_model(_model(tail, [], 12), ExportConfig(Q, mode="analytic"))
