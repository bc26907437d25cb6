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
from edgebnn.exporters.export import ExportResult, export_model
from edgebnn.exporters.metadata import read_metadata
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


# ---- every op against Monte Carlo of the op: one Gaussian layer (units independent), the op, then a regression
# head that reads the output's mean and variance off. N_MC draws of the layer's weights; the sample mean's standard
# error is sd/sqrt(N_MC), the sample variance's sqrt((mu4 - var^2)/N_MC) (mu4 the sample's fourth central moment:
# a skewed output, GELU near its minimum, has a much noisier variance than a Gaussian's sqrt(2/N_MC)). An exact rule
# is within 5 standard errors of both on every unit (48 units per test at most: a 5-sigma miss by chance ~3e-5).
N_MC = 40_000
MC_SE = 5


def _mc_model(tail: list, inits: list, width: int, first: str = "gemm", units: int = 12) -> tuple[BNNModel, bytes]:
    """input [B, 5] -> a Gaussian layer [units, 5] (Gemm, or Transpose + MatMul as torch writes a Linear on a 3-D
    input) -> ``tail`` (from ``h``) -> ``out`` [B, width], a regression head; and the tail alone on ``h``."""
    mu, sd = MU_U[:units], SD_U[:units]
    values = [numpy_helper.from_array(np.asarray(v), n) for n, v in inits]
    first_nodes = ([helper.make_node("Gemm", ["input", "fc.weight"], ["h"], transB=1)] if first == "gemm" else
                   [helper.make_node("Transpose", ["fc.weight"], ["w_t"], perm=[1, 0]),
                    helper.make_node("MatMul", ["input", "w_t"], ["h"])])
    graph = helper.make_graph([], "ops", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 5])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", width])], values)
    graph.node.append(make_encoding_node(graph, "fc.weight", "fc", GaussianWeight(mu, sd)))
    graph.node.extend([*first_nodes, *tail])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    manifest = Manifest(source_library="synthetic", input_name="input", input_shape=[1, 5], num_classes=width,
                        task="regression", task_options={"head": "mean", "dims": width, "noise_var": None})
    alone = helper.make_graph(tail, "tail", [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["n", units])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], values)
    tail_model = helper.make_model(alone, opset_imports=[helper.make_opsetid("", 18)])
    tail_model.ir_version = 10
    return BNNModel(proto, manifest, "ops"), tail_model.SerializeToString()


MU_U = RNG.normal(0, 0.5, (24, 5)).astype(np.float32)
SD_U = RNG.uniform(0.1, 0.6, (24, 5)).astype(np.float32)


def _moments(model: BNNModel) -> tuple[np.ndarray, np.ndarray, ExportResult]:
    result = export_model(model, ExportConfig(Q, mode="analytic"))
    sess = ort.InferenceSession(result.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(None, {"input": X}), strict=True))
    return out["mean"], out["epistemic"], result


def _monte_carlo(tail: bytes, units: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    w = MU_U[:units] + SD_U[:units] * rng.standard_normal((N_MC, units, 5)).astype(np.float32)
    h = np.einsum("bi,nui->nbu", X, w).reshape(-1, units).astype(np.float32)
    sess = ort.InferenceSession(tail, providers=["CPUExecutionProvider"])
    y = sess.run(None, {"h": h})[0].reshape(N_MC, len(X), -1).astype(np.float64)
    dev2 = (y - y.mean(0)) ** 2
    return y.mean(0), dev2.mean(0), np.sqrt(np.maximum((dev2**2).mean(0) - dev2.mean(0) ** 2, 0) / N_MC)


def _errors(tail: list, inits: list, width: int, rel: float = 0.0, **kw) -> tuple[float, float, ExportResult]:
    """The analytic moments' largest error against Monte Carlo in MC standard errors: of the mean, and of the
    variance beyond ``rel`` of it (an approximate rule's stated relative error)."""
    model, alone = _mc_model(tail, inits, width, **kw)
    m, v, result = _moments(model)
    mc_m, mc_v, se_v = _monte_carlo(alone, kw.get("units", 12))
    mean_err = float(np.max(np.abs(m - mc_m) / np.sqrt(mc_v / N_MC + 1e-12)))
    var_err = float(np.max(np.maximum(np.abs(v - mc_v) - rel * mc_v, 0) / (se_v + 1e-9 * mc_v.max())))
    return mean_err, var_err, result


IMAGE = [helper.make_node("Reshape", ["h", "img_shape"], ["img"])]  # [B, 24] -> [B, 2, 3, 4]
IMAGE_INITS = [("img_shape", np.array([-1, 2, 3, 4]))]
FLAT = [helper.make_node("Flatten", ["y"], ["out"])]


def _exact(tail: list, inits: list, width: int, **kw) -> ExportResult:
    mean_err, var_err, result = _errors(tail, inits, width, **kw)
    assert mean_err < MC_SE, mean_err
    assert var_err < MC_SE, var_err
    return result


def test_concat_with_a_deterministic_operand_is_exact():
    tail = [*IMAGE, helper.make_node("Shape", ["img"], ["shp"]), helper.make_node("Expand", ["c", "shp"], ["ce"]),
            helper.make_node("Concat", ["img", "ce"], ["y"], axis=1), *FLAT]
    result = _exact(tail, [*IMAGE_INITS, ("c", np.ones((1, 1, 3, 4), np.float32))], 48, units=24)
    assert not read_metadata(result.proto, 'ops').approximations


def test_split_gather_transpose_and_average_pool_are_exact():
    tail = [*IMAGE, helper.make_node("Split", ["img", "split"], ["s0", "s1"], axis=3),
            helper.make_node("Gather", ["s1", "idx"], ["g"], axis=2),
            helper.make_node("Transpose", ["s0"], ["t"], perm=[0, 1, 3, 2]),
            helper.make_node("AveragePool", ["t"], ["ap"], kernel_shape=[1, 3]),
            helper.make_node("GlobalAveragePool", ["g"], ["gp"]),
            helper.make_node("Flatten", ["ap"], ["f1"]), helper.make_node("Flatten", ["gp"], ["f2"]),
            helper.make_node("Concat", ["f1", "f2"], ["out"], axis=1)]
    _exact(tail, [*IMAGE_INITS, ("split", np.array([3, 1])), ("idx", np.array([2, 0]))], 6, units=24)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_maps_the_variance_through_the_squared_weights(mode):
    """nearest copies a unit, linear/cubic weight a fixed few: Var Σ a_k x_k = Σ a_k² v_k for independent units."""
    tail = [*IMAGE, helper.make_node("Resize", ["img", "", "scales"], ["y"], mode=mode), *FLAT]
    _exact(tail, [*IMAGE_INITS, ("scales", np.array([1, 1, 2, 2], np.float32))], 96, units=24)


def test_resize_linear_to_odd_sizes_with_align_corners():
    tail = [*IMAGE, helper.make_node("Resize", ["img", "", "scales"], ["y"], mode="linear",
                                     coordinate_transformation_mode="align_corners"), *FLAT]
    _exact(tail, [*IMAGE_INITS, ("scales", np.array([1, 1, 2, 1.75], np.float32))], 84, units=24)


def test_residual_add_of_two_independent_branches_is_exact():
    """Add of two uncertain values: the variances add (independent branches: here disjoint units)."""
    tail = [helper.make_node("Slice", ["h", "z", "six", "one"], ["a"]),
            helper.make_node("Slice", ["h", "six", "twelve", "one"], ["b"]),
            helper.make_node("Relu", ["b"], ["rb"]), helper.make_node("Add", ["a", "rb"], ["out"])]
    _exact(tail, [("z", np.array([0])), ("six", np.array([6])), ("twelve", np.array([12])), ("one", np.array([1]))],
           6)


def test_scaling_by_constants_is_exact():
    tail = [helper.make_node("Mul", ["h", "c"], ["a"]), helper.make_node("Div", ["a", "d"], ["n"]),
            helper.make_node("Neg", ["n"], ["out"])]
    _exact(tail, [("c", RNG.normal(size=12).astype(np.float32)), ("d", np.array(3.0, np.float32))], 12)


def test_a_sampled_weight_into_matmul_through_a_transpose_is_the_gemm():
    """torch writes a Linear on a 3-D input as Transpose(W) + MatMul: the same moments as the Gemm."""
    got = _moments(_mc_model([helper.make_node("Identity", ["h"], ["out"])], [], 12, first="matmul")[0])
    want = _moments(_mc_model([helper.make_node("Identity", ["h"], ["out"])], [], 12)[0])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


SQRT2 = np.array(np.sqrt(2), np.float32)
HALF, ONE = np.array(0.5, np.float32), np.array(1.0, np.float32)
SMOOTH_TAILS = {  # as torch.onnx writes them (dynamo, opset 18)
    "gelu": ([helper.make_node("Div", ["h", "sqrt2"], ["hs"]), helper.make_node("Erf", ["hs"], ["e"]),
              helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h", "e1"], ["he"]),
              helper.make_node("Mul", ["he", "half"], ["out"])], [("sqrt2", SQRT2), ("one", ONE), ("half", HALF)]),
    "silu": ([helper.make_node("Sigmoid", ["h"], ["s"]), helper.make_node("Mul", ["h", "s"], ["out"])], []),
    "sigmoid": ([helper.make_node("Sigmoid", ["h"], ["out"])], []),
    "tanh": ([helper.make_node("Tanh", ["h"], ["out"])], []),
}


@pytest.mark.parametrize("name", sorted(SMOOTH_TAILS))
def test_smooth_activations_take_gauss_hermite_moments(name):
    """GELU, SiLU, Sigmoid, Tanh (however decomposed): the input sd here is <= 1.3, where 16 Gauss-Hermite points
    err by < 0.5% of the variance (docs/uncertainty.md); the export records the approximation."""
    tail, inits = SMOOTH_TAILS[name]
    mean_err, var_err, result = _errors(tail, inits, 12, rel=0.005)
    assert mean_err < MC_SE, mean_err
    assert var_err < MC_SE, var_err
    assert any("Gauss-Hermite" in a for a in read_metadata(result.proto, 'ops').approximations or ())


def test_layer_norm_is_a_stated_approximation():
    """Units spread by ~3 around their means, input sd <= 1.3 (<= 0.4x the spread): the stated 3% of the variance
    (the delta method); the mean's error is the normaliser's bias (E[d/σ] against d/√E[σ²]): measured 5% of the
    output sd, asserted within 6%."""
    tail = [helper.make_node("Add", ["h", "spread"], ["hs"]),
            helper.make_node("LayerNormalization", ["hs", "gamma", "beta"], ["out"], axis=-1)]
    inits = [("spread", np.linspace(-5, 5, 12).astype(np.float32)),
             ("gamma", RNG.uniform(0.5, 1.5, 12).astype(np.float32)), ("beta", RNG.normal(size=12).astype(np.float32))]
    mean_err, var_err, result = _errors(tail, inits, 12, rel=0.03)
    assert mean_err < MC_SE + 0.06 * np.sqrt(N_MC), mean_err
    assert var_err < MC_SE, var_err
    assert any("LayerNormalization" in a for a in read_metadata(result.proto, 'ops').approximations or ())


def test_a_product_of_two_uncertain_values_is_refused():
    tail = [helper.make_node("Slice", ["h", "z", "six", "one"], ["a"]),
            helper.make_node("Slice", ["h", "six", "twelve", "one"], ["b"]),
            helper.make_node("Mul", ["a", "b"], ["out"])]
    inits = [("z", np.array([0])), ("six", np.array([6])), ("twelve", np.array([12])), ("one", np.array([1]))]
    with pytest.raises(UnsupportedLayerError, match=r"Mul of two uncertain values"):
        export_model(_mc_model(tail, inits, 6)[0], ExportConfig(Q, mode="analytic"))
