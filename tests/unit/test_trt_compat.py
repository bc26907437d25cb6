"""TensorRT-compatibility check: one small ONNX graph per rule, and a clean graph with no findings."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.trt_compat import (
    Finding,
    check_trt_compat,
    format_findings,
    has_errors,
    opset_range,
)

F = TensorProto.FLOAT


def make_model(nodes, inputs, outputs, initializers=(), opset=17, functions=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], functions=list(functions))
    model.ir_version = 10
    return model


def vi(name: str, shape, elem=F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def const(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def single(op: str, inputs, *, attrs=None, initializers=(), opset=17, in_shape=(1, 4), domain="", **kw):
    node = helper.make_node(op, list(inputs), ["y"], name="n0", domain=domain, **(attrs or {}))
    graph_inputs = [vi(i, list(in_shape)) for i in inputs if i and i not in {t.name for t in initializers}]
    return make_model([node], graph_inputs, [vi("y", None)], initializers, opset=opset, **kw)


def messages(findings: list[Finding], severity: str | None = None) -> list[str]:
    return [f.message for f in findings if severity is None or f.severity == severity]


def clean_bnn_model() -> onnx.ModelProto:
    """A Q/DQ LeNet-ish ensemble head using most ops the exporters emit; dynamic batch only."""
    rng = np.random.default_rng(0)
    inits = [
        const("x_scale", np.float32(0.02)),
        const("x_zp", np.int8(0)),
        const("w_q", rng.integers(-127, 128, (4, 3, 3, 3), dtype=np.int8)),
        const("w_scale", np.full(4, 0.01, np.float32)),
        const("w_zp", np.zeros(4, np.int8)),
        const("b", np.zeros(4, np.float32)),
        const("fc_w", rng.standard_normal((4, 10)).astype(np.float32)),
        const("axes0", np.array([0], np.int64)),
        const("eps", np.float32(1e-6)),
        const("shape", np.array([-1, 10], np.int64)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xdq"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], name="dq_w", axis=0),
        helper.make_node("Conv", ["xdq", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fc_w"], ["logits"], name="fc"),
        helper.make_node("Add", ["logits", "noise"], ["noisy"], name="add_noise"),
        helper.make_node("Softmax", ["noisy"], ["probs"], name="softmax", axis=-1),
        helper.make_node("Unsqueeze", ["probs", "axes0"], ["u"], name="unsqueeze"),
        helper.make_node("ReduceMean", ["u"], ["mean"], name="mean", axes=[0], keepdims=0),
        helper.make_node("Add", ["mean", "eps"], ["m_eps"], name="add_eps"),
        helper.make_node("Log", ["m_eps"], ["logp"], name="log"),
        helper.make_node("Reshape", ["logp", "shape"], ["out"], name="reshape"),
    ]
    inputs = [vi("x", ["batch", 3, 8, 8]), vi("noise", ["batch", 10])]
    return make_model(nodes, inputs, [vi("out", ["batch", 10])], inits)


def test_clean_model_has_no_findings() -> None:
    model = clean_bnn_model()
    onnx.checker.check_model(model, full_check=True)
    assert check_trt_compat(model, tensorrt="10.3") == []
    assert check_trt_compat(model, tensorrt="11") == []
    assert format_findings([]) == "TensorRT compatibility: no findings"


# --- opset ------------------------------------------------------------------------------------------


def test_opset_ranges() -> None:
    assert opset_range("10.3") == (9, 20, True)
    assert opset_range("10.3.0.30") == (9, 20, True)
    assert opset_range("10.7") == (9, 20, False)
    assert opset_range("10.15") == (9, 24, True)
    assert opset_range("11") == (9, 24, False)
    for bad in ("8.6", "ten", ""):
        with pytest.raises(InvalidOptionError):
            opset_range(bad)


def test_opset_below_range_is_error_above_is_warning() -> None:
    old = single("Relu", ["x"], opset=8)
    assert messages(check_trt_compat(old), "error") == ["opset 8 is below 9, the oldest TensorRT parses; re-export"]
    new = single("Relu", ["x"], opset=21)
    (finding,) = check_trt_compat(new, tensorrt="10.3")
    assert finding.severity == "warning" and "above the 9-20 documented for TensorRT 10.3" in finding.message
    assert check_trt_compat(new, tensorrt="10.15") == []
    (assumed,) = check_trt_compat(single("Relu", ["x"], opset=25), tensorrt="11")
    assert "9-24 assumed" in assumed.message


# --- ops ----------------------------------------------------------------------------------------------


RANDOM_WARNING = ("TensorRT imports random ops as a Fill layer that ignores seed: draws are not reproducible "
                  "(--rng host keeps them so)")


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
def test_random_like_ops_warn(op: str) -> None:
    """TensorRT-RTX parses and builds them, saying the seed is ignored (tests/integration/test_tensorrt_rtx.py)."""
    (finding,) = check_trt_compat(single(op, ["x"]))
    assert finding == Finding("warning", "n0", op, RANDOM_WARNING)


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
def test_random_like_of_a_constant_warns_too(op: str) -> None:
    """TensorRT-RTX builds it (FACTS.md said the *Like forms reject a constant input: not so for RTX)."""
    model = single(op, ["c"], initializers=[const("c", np.zeros((2, 3), np.float32))])
    assert messages(check_trt_compat(model), "warning") == [RANDOM_WARNING]


@pytest.mark.parametrize("op", ["RandomNormal", "RandomUniform"])
def test_random_ops_warn_and_leave_dla(op: str) -> None:
    model = single(op, [], attrs={"shape": [2, 3], "seed": 1.0})
    assert [f.severity for f in check_trt_compat(model)] == ["warning"]
    on_dla = check_trt_compat(model, dla=True)
    assert [f.severity for f in on_dla] == ["warning", "warning"]
    assert on_dla[1].message == "does not run on DLA: falls back to the GPU"


def test_gather_warns_only_on_dla() -> None:
    model = single("Gather", ["x", "idx"], initializers=[const("idx", np.array([0, 2], np.int64))])
    assert check_trt_compat(model) == []
    assert messages(check_trt_compat(model, dla=True), "warning") == ["does not run on DLA: falls back to the GPU"]


def test_unsupported_and_unknown_ops() -> None:
    assert messages(check_trt_compat(single("Unique", ["x"])), "error") == ["not supported by the TensorRT ONNX parser"]
    assert messages(check_trt_compat(single("QLinearMatMul", ["x"])), "error")
    (unknown,) = check_trt_compat(single("Celu", ["x"]))
    assert unknown.severity == "warning" and "not in edgebnn's table" in unknown.message


def test_custom_domains_are_errors() -> None:
    ours = single("GaussianLinear", ["x"], domain="ai.edgebnn")
    extra = [helper.make_opsetid("ai.edgebnn", 1)]
    ours.opset_import.extend(extra)
    (finding,) = check_trt_compat(ours)
    assert finding.severity == "error" and "edgebnn IR op reached the TensorRT export" in finding.message
    nbits = single("MatMulNBits", ["x"], domain="com.microsoft")
    assert messages(check_trt_compat(nbits), "error") == ["custom domain 'com.microsoft' has no TensorRT importer"]


def test_constant_string_value_and_maxpool_indices() -> None:
    c = make_model([helper.make_node("Constant", [], ["y"], name="c", value_string="abc")], [], [vi("y", None)])
    assert messages(check_trt_compat(c), "error") == ["attribute value_string is not supported by TensorRT"]
    pool = make_model(
        [helper.make_node("MaxPool", ["x"], ["y", "idx"], name="pool", kernel_shape=[2, 2])],
        [vi("x", [1, 1, 4, 4])],
        [vi("y", None), vi("idx", None, TensorProto.INT64)],
    )
    assert messages(check_trt_compat(pool), "error") == ["the Indices output is not supported by TensorRT"]


def test_axes_must_be_constant() -> None:
    dynamic_axes = make_model(
        [helper.make_node("Unsqueeze", ["x", "axes"], ["y"], name="u")],
        [vi("x", [1, 4]), vi("axes", [1], TensorProto.INT64)],
        [vi("y", None)],
    )
    assert messages(check_trt_compat(dynamic_axes), "error") == [
        "axes must be a constant (initializer or Constant) for TensorRT"
    ]


def test_dynamic_shapes_except_batch_warn() -> None:
    batch_only = single("Relu", ["x"], in_shape=("N", 4))
    assert check_trt_compat(batch_only) == []
    (finding,) = check_trt_compat(single("Relu", ["x"], in_shape=("N", "C", 8, "W")))
    assert finding.severity == "warning" and finding.op == "input" and finding.node == "x"
    assert finding.message.startswith("dynamic dimension(s) 1, 3:")


def test_random_op_inside_subgraph_and_local_function() -> None:
    rand = helper.make_node("RandomNormalLike", ["x"], ["y"], name="rand")
    branch = helper.make_graph([rand], "then", [], [vi("y", [1, 4])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["y2"], name="id")], "else", [], [vi("y2", [1, 4])])
    if_node = helper.make_node("If", ["cond"], ["out"], name="if", then_branch=branch, else_branch=other)
    model = make_model([if_node], [vi("cond", [], TensorProto.BOOL), vi("x", [1, 4])], [vi("out", [1, 4])])
    (finding,) = check_trt_compat(model)
    assert finding.node == "rand" and finding.severity == "warning"

    body = [helper.make_node("RandomUniformLike", ["a"], ["b"])]
    fn = helper.make_function("local", "Sample", ["a"], ["b"], body, [helper.make_opsetid("", 17)])
    call = helper.make_node("Sample", ["x"], ["y"], name="call", domain="local")
    with_fn = make_model([call], [vi("x", [1, 4])], [vi("y", [1, 4])], functions=[fn])
    with_fn.opset_import.append(helper.make_opsetid("local", 1))
    (finding,) = check_trt_compat(with_fn)
    assert finding.node == "call/RandomUniformLike#0" and finding.op == "RandomUniformLike"


# --- Q/DQ ---------------------------------------------------------------------------------------------


def qdq(op: str, data: str, scale, zero=None, *, attrs=None, data_init=None, opset=17, in_shape=(1, 4)):
    inits = [const("s", np.asarray(scale, np.float32))]
    inputs = [data, "s"]
    if zero is not None:
        inits.append(const("z", zero))
        inputs.append("z")
    if data_init is not None:
        inits.append(data_init)
    return single(op, inputs, attrs=attrs, initializers=inits, opset=opset, in_shape=in_shape)


def test_nonzero_zero_point_is_error() -> None:
    model = qdq("QuantizeLinear", "x", 0.1, np.int8(3))
    assert messages(check_trt_compat(model), "error") == [
        "zero point must be 0: TensorRT supports symmetric quantization only"
    ]


def test_uint8_is_error_and_missing_zero_point_warns() -> None:
    uint8 = qdq("QuantizeLinear", "x", 0.1, np.uint8(0))
    assert messages(check_trt_compat(uint8), "error") == ["UINT8 quantization: TensorRT needs signed, symmetric types"]
    (finding,) = check_trt_compat(qdq("QuantizeLinear", "x", 0.1))
    assert finding.severity == "warning" and "onnxruntime quantizes to UINT8 but TensorRT to INT8" in finding.message
    dq_uint8 = qdq("DequantizeLinear", "w", 0.1, data_init=const("w", np.zeros((2, 2), np.uint8)))
    assert messages(check_trt_compat(dq_uint8), "error") == [
        "UINT8 quantization: TensorRT needs signed, symmetric types"
    ]


def test_non_positive_scale_is_error() -> None:
    model = qdq(
        "DequantizeLinear",
        "w",
        [0.1, -0.2],
        np.zeros(2, np.int8),
        attrs={"axis": 0},
        data_init=const("w", np.zeros((2, 3), np.int8)),
    )
    assert messages(check_trt_compat(model), "error") == ["scales must all be positive"]


def test_per_channel_scales_only_on_constant_weights_with_axis_length() -> None:
    on_activation = qdq("QuantizeLinear", "x", [0.1] * 4, np.zeros(4, np.int8), attrs={"axis": 1})
    assert messages(check_trt_compat(on_activation), "error") == [
        "per-channel scales are only supported on constant weights"
    ]
    wrong_len = qdq(
        "DequantizeLinear",
        "w",
        [0.1] * 3,
        np.zeros(3, np.int8),
        attrs={"axis": 0},
        data_init=const("w", np.zeros((4, 2), np.int8)),
    )
    assert messages(check_trt_compat(wrong_len), "error") == ["3 per-channel scales for axis 0 of size 4"]
    good = qdq(
        "DequantizeLinear",
        "w",
        [0.1] * 4,
        np.zeros(4, np.int8),
        attrs={"axis": 0},
        data_init=const("w", np.zeros((4, 2), np.int8)),
    )
    assert check_trt_compat(good) == []


def test_per_channel_on_weights_quantized_in_graph_is_fine() -> None:
    inits = [
        const("w", np.ones((4, 2), np.float32)),
        const("s", np.full(4, 0.1, np.float32)),
        const("z", np.zeros(4, np.int8)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"], name="q", axis=0),
        helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["y"], name="dq", axis=0),
    ]
    assert check_trt_compat(make_model(nodes, [], [vi("y", None)], inits)) == []


def int4(name: str, shape) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT4, shape, np.zeros(int(np.prod(shape)), np.int8).tolist())


def test_int4_is_weight_only_with_even_last_dim() -> None:
    odd = single(
        "DequantizeLinear",
        ["w", "s"],
        initializers=[int4("w", [4, 5]), const("s", np.float32(0.1))],
        opset=21,
    )
    assert messages(check_trt_compat(odd, tensorrt="10.15"), "error") == [
        "INT4 weights need an even last dimension, got 5"
    ]
    zero4 = helper.make_tensor("z", TensorProto.INT4, [], [0])
    on_activation = single(
        "QuantizeLinear", ["x", "s", "z"], initializers=[const("s", np.float32(0.1)), zero4], opset=21
    )
    assert messages(check_trt_compat(on_activation, tensorrt="10.15"), "error") == [
        "INT4 is weight-only in TensorRT: quantize constant weights only"
    ]


def test_block_wise_rules() -> None:
    def block(w_shape, s_shape, block_size=2):
        return single(
            "DequantizeLinear",
            ["w", "s"],
            attrs={"axis": len(w_shape) - 1, "block_size": block_size},
            initializers=[int4("w", w_shape), const("s", np.full(s_shape, 0.1, np.float32))],
            opset=21,
        )

    assert check_trt_compat(block([8, 64], [8, 2], 32), tensorrt="10.15") == []
    assert messages(check_trt_compat(block([8, 64], [4, 2]), tensorrt="10.15"), "error") == [
        "block-wise scales need exactly one blocked axis, found 2"
    ]
    assert messages(check_trt_compat(block([8, 4, 6], [4, 4, 6]), tensorrt="10.15"), "error") == [
        "blocked axis 0 must be the last or second-to-last"
    ]
    assert messages(check_trt_compat(block([8, 6], [8, 4]), tensorrt="10.15"), "error") == [
        "axis 1 of size 6 is not a multiple of 4 blocks"
    ]
    activations = single(
        "QuantizeLinear",
        ["x", "s", "z"],
        attrs={"axis": 1, "block_size": 2},
        initializers=[const("s", np.full((1, 2), 0.1, np.float32)), const("z", np.zeros((1, 2), np.int8))],
        opset=21,
    )
    assert messages(check_trt_compat(activations, tensorrt="10.15"), "error") == [
        "block-wise scales are only supported on constant weights"
    ]


def test_partially_quantized_matmul_warns() -> None:
    inits = [
        const("w_q", np.zeros((4, 2), np.int8)),
        const("s", np.float32(0.1)),
        const("z", np.int8(0)),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "s", "z"], ["w"], name="dq"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
    ]
    (finding,) = check_trt_compat(make_model(nodes, [vi("x", [1, 4])], [vi("y", None)], inits))
    assert finding.severity == "warning" and finding.node == "mm"


def test_format_findings_and_has_errors() -> None:
    findings = check_trt_compat(single("Unique", ["x"], in_shape=(1, "C")), dla=True)
    text = format_findings(findings)
    assert text.splitlines()[0] == "TensorRT compatibility: 1 error(s), 1 warning(s)"
    assert "  error   Unique 'n0': not supported by the TensorRT ONNX parser" in text
    assert "  warning input 'x': dynamic dimension(s) 1" in text
    assert has_errors(findings) and not has_errors([f for f in findings if f.severity == "warning"])
