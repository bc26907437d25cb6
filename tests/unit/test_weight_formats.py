"""Weight formats wherever a weight is emitted: hoisted layers take --weights, and weights on an encoding's
integer grid (quantized means, binary draws) are stored exactly instead of re-quantized by max|w| / 127."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.stores.constants import constant
from edgebnn.exporters.trt_compat import check_trt_compat, has_errors
from edgebnn.ir.encodings import Grid
from edgebnn.passes import lower


def _dequantized(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every DequantizeLinear output of constant data, as onnxruntime computes it."""
    inits = {t.name: t for t in proto.graph.initializer}
    out = {}
    for node in proto.graph.node:
        if node.op_type == "DequantizeLinear":
            graph = onnx.helper.make_graph([node], "dq", [], [onnx.helper.make_tensor_value_info(
                node.output[0], onnx.TensorProto.FLOAT, None)], [inits[x] for x in node.input])
            model = onnx.helper.make_model(graph, opset_imports=list(proto.opset_import))
            model.ir_version = proto.ir_version
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            out[node.output[0]] = sess.run(None, {})[0]
    return out


def _consts(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


@pytest.mark.parametrize("scheme", ["fixed", "ternary"])
def test_hoisted_layers_take_the_weight_format_and_quantized_means_stay_exact(scheme):
    model = lower(synthetic_cnn(), scheme, seed=0).model
    proto = export_model(model, ExportConfig(4, mode="baked", weights="int8",
                                             hoist=10.0)).proto  # every σ is below 10: every layer hoisted
    assert not has_errors(check_trt_compat(proto))
    got = _dequantized(proto)
    for w in model.encoded_weights():
        if w.name.endswith(".weight"):
            assert w.name in got, w.name  # stored as int8 + DequantizeLinear, not fp32
            np.testing.assert_array_equal(got[w.name], w.encoding.mean())  # lossless: q · step
            scale = _consts(proto)[w.name + ".scale"]
            np.testing.assert_array_equal(scale, np.float32(w.encoding.step()))


def test_binary_draws_are_stored_exactly_in_int8_and_int4():
    model = lower(synthetic_linear(n_in=64, classes=4), "binary", seed=0).model
    fp32 = _consts(export_model(model, ExportConfig(4, mode="baked", seed=1)).proto)["ens/fc.weight/W"]
    for weights in ("int8", "int4"):
        proto = export_model(model, ExportConfig(4, mode="baked", seed=1, weights=weights)).proto
        assert not has_errors(check_trt_compat(proto, tensorrt="11"))
        got = _dequantized(proto)["ens/fc.weight/W"]
        # the wide first layer stores [S·out, in] (transB); int4 blocks along the reduction axis: [in, S·out]
        np.testing.assert_array_equal(got.T if weights == "int4" else got, fp32)  # ±a is q = ±1 times a


def test_int4_hoisted_gemm_is_blockwise_only_along_its_reduction_axis():
    xl = np.random.default_rng(0).normal(size=(3, 64)).astype(np.float32)
    for trans_b, dtype in ((False, onnx.TensorProto.INT4), (True, onnx.TensorProto.INT8)):
        model = lower(synthetic_linear(n_in=64, classes=4, trans_b=trans_b), "ternary", seed=0).model
        proto = export_model(model, ExportConfig(4, mode="baked", weights="int4", hoist=10.0)).proto
        q = next(t for t in proto.graph.initializer if t.name == "fc.weight.q")
        assert q.data_type == dtype  # [in, out] blocks along in; [out, in] would block the outputs: int8
        assert not has_errors(check_trt_compat(proto, tensorrt="11"))
        mean = model.encoded_weight("fc.weight").encoding.mean()
        np.testing.assert_array_equal(_dequantized(proto)["fc.weight"], mean)
        # the graph computes what the fp32 export computes (onnxruntime's optimizer would fuse the int4 weight into
        # a MatMulNBits kernel that rounds activations too: run the graph as written)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        run = [ort.InferenceSession(p.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(
            None, {"input": xl})[0] for p in (proto, export_model(model, ExportConfig(4, mode="baked",
                                                                                      hoist=10.0)).proto)]
        np.testing.assert_allclose(run[0], run[1], atol=1e-6)  # float32 round-off only: the weights are equal


def test_a_grid_wider_than_the_format_is_requantized():
    values = (np.arange(-300, 300, dtype=np.float32) * np.float32(0.01)).reshape(2, -1)  # q up to 300: 10 bits
    b = Builder()
    constant(b, "w", values, "int8", Grid(0.01, 10))
    scale = _consts_of(b)["w.scale"]
    np.testing.assert_allclose(scale, np.abs(values).max(axis=1) / 127, rtol=1e-6)  # the amax rule, not 0.01
    constant(b, "v", values[:, :254], "int8", Grid(0.01, 9))
    assert _consts_of(b)["v.scale"][0] != np.float32(0.01)


def _consts_of(b: Builder) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in b.inits}
