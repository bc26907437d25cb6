"""A sampled weight into MatMul through a view (:mod:`edgebnn.exporters.matmul`): torch's Linear on [B, T, in],
``Transpose(W) -> MatMul -> Add(b)``, and a weight stored flat and Reshaped first, in baked and noise mode, against
the reference runtime (the same draws) and the layer's moments (local noise)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgebnn.errors import UnsupportedLayerError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.matmul import VIEW, fuse_weight_views, steps
from edgebnn.ir import DOMAIN, BNNModel, GaussianWeight, Manifest, make_encoding_node
from edgebnn.metrics import predictive_from_logits
from edgebnn.runtime.reference import sample_logits

ROUNDOFF = 1e-5  # float32 in another op order (a broadcast MatMul over the members)
T, K, N_OUT = 3, 4, 5


def _model(view: str = "transpose", bias: bool = True, bias_sigma: float = 0.3) -> BNNModel:
    """input [B, T, K] -> view(W) -> MatMul [B, T, N] (+ b) -> Flatten -> logits [B, T·N].

    ``transpose``: W [N, K] (torch's layout), Transpose; ``reshape``: W stored flat [N·K], Reshape [N, K], Transpose;
    ``shared``: the Transpose's output also feeds a second, deterministic reader (not a view of one layer)."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph([], view, [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", T, K])],
                              [])

    def gaussian(name: str, shape: tuple[int, ...], sigma: float) -> None:
        mu = rng.normal(0, 0.5, shape).astype(np.float32)
        sd = (sigma * rng.uniform(0.5, 1.5, shape)).astype(np.float32)
        graph.node.append(make_encoding_node(graph, name, "layer", GaussianWeight(mu, sd)))

    gaussian("layer.weight", (N_OUT * K,) if view == "reshape" else (N_OUT, K), 0.3)
    if bias:
        gaussian("layer.bias", (N_OUT,), bias_sigma)
    w = "layer.weight"
    if view == "reshape":
        graph.initializer.append(onnx.numpy_helper.from_array(np.array([N_OUT, K], np.int64), "w_shape"))
        graph.node.append(helper.make_node("Reshape", [w, "w_shape"], ["w2"]))
        w = "w2"
    graph.node.append(helper.make_node("Transpose", [w], ["wt"], perm=[1, 0]))
    graph.node.append(helper.make_node("MatMul", ["input", "wt"], ["xw"]))
    y = "xw"
    if bias:
        graph.node.append(helper.make_node("Add", ["xw", "layer.bias"], ["y"]))
        y = "y"
    if view == "shared":
        graph.node.append(helper.make_node("ReduceSum", ["wt"], ["wsum"], keepdims=0))
        graph.node.append(helper.make_node("Add", [y, "wsum"], ["y2"]))
        y = "y2"
    graph.node.append(helper.make_node("Flatten", [y], ["logits"]))
    graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", T * N_OUT]))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    manifest = Manifest(source_library="synthetic", input_name="input", input_shape=[1, T, K],
                        num_classes=T * N_OUT)
    return BNNModel(proto, manifest, view)


def _x() -> np.ndarray:
    return np.random.default_rng(7).normal(size=(2, T, K)).astype(np.float32)


def _run(proto: onnx.ModelProto, x: np.ndarray, **noise: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x, **noise})


@pytest.mark.parametrize("view", ["transpose", "reshape"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("hoist", ["off", "auto"])
def test_baked_and_weight_noise_are_the_reference_ensemble(view, bias, hoist):
    """(The layer reads the graph input: baked hands it the input shared by the members, which it folds.)"""
    model, x = _model(view, bias), _x()
    ref = predictive_from_logits(sample_logits(model, x, 4, seed=2))
    probs, entropy, mi = _run(export_model(model, ExportConfig(4, mode="baked", seed=2, hoist=hoist)).proto, x)
    np.testing.assert_allclose(probs, ref.probs, atol=ROUNDOFF)
    np.testing.assert_allclose(entropy, ref.entropy, atol=ROUNDOFF)
    np.testing.assert_allclose(mi, ref.mutual_info, atol=ROUNDOFF)
    eps = {f"noise/{w.name}": np.random.default_rng([2, i]).standard_normal((4, *w.encoding.shape), dtype=np.float32)
           for i, w in enumerate(model.encoded_weights())}
    proto = export_model(model, ExportConfig(4, mode="noise", noise="auto", rng="host")).proto
    assert sorted(i.name for i in proto.graph.input[1:]) == sorted(eps)  # auto draws the weights: not exact locally
    np.testing.assert_allclose(_run(proto, x, **eps)[0], ref.probs, atol=ROUNDOFF)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_local_noise_propagates_each_positions_moments():
    """``--noise local``: each row and token draws mean + √var ⊙ ε, mean = x·μᵀ + μ_b, var = x²·(σ²)ᵀ + σ_b²."""
    model, x = _model(), _x()
    enc = {w.name: w.encoding for w in model.encoded_weights()}
    w, b = enc["layer.weight"], enc["layer.bias"]
    mean = (x @ w.mean().T + b.mean()).reshape(len(x), -1)
    var = (x**2 @ (w.stddev() ** 2).T + b.stddev() ** 2).reshape(len(x), -1)
    proto = export_model(model, ExportConfig(2, mode="noise", noise="local", rng="host")).proto
    assert [d.dim_value for d in proto.graph.input[1].type.tensor_type.shape.dim][1:] == [T, N_OUT]
    got = _run(proto, x, **{"noise/layer.weight": np.ones((len(x) * 2, T, N_OUT), np.float32)})[0]
    np.testing.assert_allclose(got, _softmax(mean + np.sqrt(var)), atol=ROUNDOFF)


@pytest.mark.parametrize(("mode", "kw"), [("baked", {}), ("baked", {"weights": "int8"}), ("noise", {}),
                                          ("noise", {"noise": "local"}), ("noise", {"noise": "flipout"})])
def test_every_initializer_is_used_and_the_graph_checks(mode, kw):
    proto = export_model(_model("reshape"), ExportConfig(4, mode=mode, **{"rng": "host", **kw})).proto
    onnx.checker.check_model(proto, full_check=True)
    used = {x for node in proto.graph.node for x in node.input}
    assert [t.name for t in proto.graph.initializer if t.name not in used] == []
    assert not any(a.name == VIEW for n in proto.graph.node for a in n.attribute)  # the fused node stays inside


def test_fusion_records_the_view_and_a_layer_samples_whole():
    """The chain becomes one MatMul(x, W, b) whose steps replay the view; a quiet weight with a noisy bias samples
    (both leave the quiet set, as weight and bias of one node do)."""
    model = _model("reshape")
    nodes = [n for n in model.proto.graph.node if n.domain != DOMAIN]
    shapes = {"layer.weight": [N_OUT * K], "w2": [N_OUT, K], "wt": [K, N_OUT], "xw": [1, T, N_OUT],
              "layer.bias": [N_OUT]}
    quiet = {"layer.weight"}
    out = fuse_weight_views(nodes, {"layer.weight", "layer.bias"}, quiet, shapes)
    (mm,) = [n for n in out if n.op_type == "MatMul"]
    assert list(mm.input) == ["input", "layer.weight", "layer.bias"] and list(mm.output) == ["y"]
    assert steps(mm) == [("Reshape", (N_OUT, K)), ("Transpose", (1, 0))]
    assert [n.op_type for n in out] == ["MatMul", "Flatten"] and quiet == set()
    assert fuse_weight_views(nodes, {"layer.weight", "layer.bias"}, {"layer.weight", "layer.bias"}, shapes) == nodes


def test_a_view_with_another_reader_is_refused_naming_the_layer():
    with pytest.raises(UnsupportedLayerError, match="layer 'layer': a sampled weight feeds Transpose"):
        export_model(_model("shared"), ExportConfig(4, mode="baked"))


@pytest.mark.parametrize("mode", ["baked", "noise"])
def test_a_weight_that_does_not_fit_its_input_is_one_line_naming_the_layer_node_shapes_and_file(mode, tmp_path,
                                                                                                monkeypatch):
    """A MatMul weight of K + 1 inputs on an input of K features: shape inference leaves the output unshaped; the
    message names the layer, the node, both shapes and (the command line) the file, not 'got None'."""
    import sys

    from click.testing import CliRunner

    from edgebnn import ir
    from edgebnn.cli import main

    monkeypatch.setattr(sys.modules[__name__], "K", K + 1)  # the layer as _model builds it for K + 1 inputs
    malformed = _model(bias=False)
    monkeypatch.undo()
    malformed.proto.graph.input[0].type.tensor_type.shape.dim[2].dim_value = K  # on an input of K features
    malformed.manifest.input_shape[2] = K
    want = (rf"layer 'layer': MatMul 'xw' needs a static feature shape .*input \[1, {T}, {K}\], weight viewed as "
            rf"\[{K + 1}, {N_OUT}\]\): the input's last axis \({K}\) must equal the weight's first \({K + 1}\)")
    with pytest.raises(UnsupportedLayerError, match=want):
        export_model(malformed, ExportConfig(4, mode=mode))
    path = ir.save(malformed, tmp_path / "bad.ebnn")
    r = CliRunner().invoke(main, ["export", str(path), "--mode", mode, "-S", "4", "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 2, r.output
    line = " ".join(r.output.split())
    assert line.startswith(f"error: {path}: layer 'layer': MatMul 'xw'") and "got None" not in line, line
