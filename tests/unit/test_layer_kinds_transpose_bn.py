"""ConvTranspose (rank 1-3, grouped) and the Bayesian batch norm's affine node as layer kinds, in every export mode,
against the reference runtime (baked and weight noise: the same draws) and against their moments (local noise,
analytic)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebnn.exporters.analytic import quadrature_points
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.ir import DOMAIN, BNNModel, GaussianWeight, Manifest, make_encoding_node
from edgebnn.metrics import predictive_from_logits
from edgebnn.runtime.reference import sample_logits

# float32 arithmetic in another op order (grouped ConvTranspose, Mul on a view): round-off only
ROUNDOFF = 1e-5
SPATIAL = {1: [5], 2: [3, 4], 3: [2, 3, 3]}
C_IN = 4
EPS = 1e-5


def _model(rank: int, kind: str, group: int = 1, bias: bool = True) -> BNNModel:
    """input [B, 4, *SPATIAL[rank]] -> the layer -> Flatten -> logits (the layer's outputs are the logits).

    ``convT``: ConvTranspose(GaussianWeight [4, 8/group, 3, ...], stride 2, pad 1, output_padding 1);
    ``bn``: the importers' Bayesian batch norm, BatchNormalization(running stats) -> BatchNormalization(x̂,
    Gaussian scale, Gaussian shift, 0, 1, epsilon 0)."""
    rng = np.random.default_rng(rank + 10 * group)
    sp = SPATIAL[rank]
    graph = helper.make_graph([], f"{kind}{rank}d", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                                   ["batch", C_IN, *sp])], [])

    def gaussian(name: str, shape: tuple[int, ...]) -> None:
        mu = rng.normal(0, 0.5, shape).astype(np.float32)
        sd = (0.3 * rng.uniform(0.5, 1.5, shape)).astype(np.float32)
        graph.node.append(make_encoding_node(graph, name, "layer", GaussianWeight(mu, sd)))

    def const(name: str, value: np.ndarray) -> None:
        graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), name))

    if kind == "convT":
        gaussian("layer.weight", (C_IN, 8 // group, *[3] * rank))
        if bias:
            gaussian("layer.bias", (8,))
        graph.node.append(helper.make_node("ConvTranspose", ["input", "layer.weight", *(["layer.bias"] * bias)],
                                           ["y"], kernel_shape=[3] * rank, strides=[2] * rank, pads=[1] * 2 * rank,
                                           output_padding=[1] * rank, group=group))
        n = 8 * math.prod(2 * s for s in sp)
    else:
        gaussian("layer.weight", (C_IN,))
        gaussian("layer.bias", (C_IN,))
        const("ones", np.ones(C_IN))
        const("zeros", np.zeros(C_IN))
        const("rm", rng.normal(0, 1, C_IN))
        const("rv", rng.uniform(0.5, 2, C_IN))
        graph.node.extend([
            helper.make_node("BatchNormalization", ["input", "ones", "zeros", "rm", "rv"], ["xhat"], epsilon=EPS),
            helper.make_node("BatchNormalization", ["xhat", "layer.weight", "layer.bias", "zeros", "ones"], ["y"],
                             epsilon=0.0),
        ])
        n = C_IN * math.prod(sp)
    graph.node.append(helper.make_node("Flatten", ["y"], ["logits"]))
    graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n]))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    manifest = Manifest(source_library="synthetic", input_name="input", input_shape=[1, C_IN, *sp], num_classes=n)
    return BNNModel(proto, manifest, f"{kind}{rank}d")


def _x(rank: int) -> np.ndarray:
    return np.random.default_rng(7).normal(size=(3, C_IN, *SPATIAL[rank])).astype(np.float32)


def _run(proto: onnx.ModelProto, x: np.ndarray, **noise: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x, **noise})


CASES = [(1, "convT", 1, True), (2, "convT", 2, False), (3, "convT", 1, True), (2, "convT", 4, True),
         (1, "bn", 1, True), (2, "bn", 1, True), (3, "bn", 1, True)]


@pytest.mark.parametrize(("rank", "kind", "group", "bias"), CASES)
def test_baked_and_weight_noise_are_the_reference_ensemble(rank, kind, group, bias):
    model, x = _model(rank, kind, group, bias), _x(rank)
    ref = predictive_from_logits(sample_logits(model, x, 4, seed=2))
    probs, entropy, mi = _run(export_model(model, ExportConfig(4, mode="baked", seed=2)).proto, x)
    np.testing.assert_allclose(probs, ref.probs, atol=ROUNDOFF)
    np.testing.assert_allclose(entropy, ref.entropy, atol=ROUNDOFF)
    np.testing.assert_allclose(mi, ref.mutual_info, atol=ROUNDOFF)
    # noise --noise weight draws W_s = mu + sigma ⊙ ε in the graph: fed the reference's ε, it is its ensemble
    eps = {f"noise/{w.name}": np.random.default_rng([2, i]).standard_normal((4, *w.encoding.shape), dtype=np.float32)
           for i, w in enumerate(model.encoded_weights())}
    got = _run(export_model(model, ExportConfig(4, mode="noise", noise="weight", rng="host")).proto, x, **eps)[0]
    np.testing.assert_allclose(got, ref.probs, atol=ROUNDOFF)


def _moments(model: BNNModel, kind: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the layer's outputs given x (weights independent Gaussians)."""
    encs = {w.name: w.encoding for w in model.encoded_weights()}
    mean = _run(model.float_model(), x)[0]
    if kind == "convT":  # linear in the weight: Var = op(x², σ²) + σ_b²
        var = _run(model.float_model({n: e.stddev() ** 2 for n, e in encs.items()}), x * x)[0]
        return mean, var
    inits = {t.name: numpy_helper.to_array(t) for t in model.proto.graph.initializer}
    shape = (1, -1, *[1] * (x.ndim - 2))
    xhat = (x - inits["rm"].reshape(shape)) / np.sqrt(inits["rv"].reshape(shape) + EPS)
    s2w, s2b = (encs[f"layer.{r}"].stddev().reshape(shape) ** 2 for r in ("weight", "bias"))
    return mean, (xhat**2 * s2w + s2b).reshape(len(x), -1)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize(("rank", "kind", "group", "bias"), [c for c in CASES if c[0] == 2 or c[1] == "convT"])
def test_local_noise_and_analytic_propagate_the_moments(rank, kind, group, bias):
    """(The analytic bias variance broadcasts on [B, C, H, W] for a batch norm: the libraries' Bayesian batch norms
    are 2-D; ranks 1 and 3 are left out for it.)"""
    model, x = _model(rank, kind, group, bias), _x(rank)
    mean, var = _moments(model, kind, x)
    # local: every row draws mean + √var ⊙ ε; ε = 1 everywhere makes each member mean + √var
    local = export_model(model, ExportConfig(2, mode="noise", noise="local", rng="host")).proto
    shape = [d.dim_value for d in local.graph.input[1].type.tensor_type.shape.dim][1:]
    got = _run(local, x, **{"noise/layer.weight": np.ones((len(x) * 2, *shape), np.float32)})[0]
    np.testing.assert_allclose(got, _softmax(mean + np.sqrt(var)), atol=ROUNDOFF)
    z = quadrature_points(16, mean.shape[1])
    want = _softmax(mean[:, None] + np.sqrt(var)[:, None] * z[None]).mean(1)
    np.testing.assert_allclose(_run(export_model(model, ExportConfig(16, mode="analytic")).proto, x)[0], want,
                               atol=ROUNDOFF)


@pytest.mark.parametrize(("rank", "kind"), [(2, "convT"), (2, "bn")])
@pytest.mark.parametrize(("mode", "kw"), [("baked", {}), ("baked", {"weights": "int8"}), ("noise", {}),
                                          ("noise", {"noise": "local"}), ("noise", {"noise": "weight"}),
                                          ("analytic", {})])
def test_every_initializer_is_used_and_the_graph_checks(rank, kind, mode, kw):
    proto = export_model(_model(rank, kind), ExportConfig(4, mode=mode, **{"rng": "host", **kw})).proto
    onnx.checker.check_model(proto, full_check=True)
    used = {x for node in proto.graph.node for x in node.input}
    assert [t.name for t in proto.graph.initializer if t.name not in used] == []


def _emit(kind_node: onnx.NodeProto, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
          shapes: dict[str, list[int]], shared: bool) -> np.ndarray:
    """One layer kind's batched form alone in a graph: input ``x`` ([B, ...] when ``shared``, else [B·S, ...])."""
    from edgebnn.exporters._graph import Builder
    from edgebnn.exporters.layers import SampledLayer, layer_kind

    b = Builder()
    kind = layer_kind(kind_node)
    assert kind is not None
    kind.batched(b, SampledLayer(kind_node, "k/", len(w), w.shape[1:], dict(shapes), "test", shared=shared), w, bias)
    graph = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info(kind_node.output[0], TensorProto.FLOAT, None)],
                              b.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 10
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("which", ["convT", "bn", "dropout"])
def test_a_shared_input_gives_what_its_folded_copy_gives(which):
    """``shared=True`` (the input [B, ...] is the same for every sample; baked hands the first sampled layer so):
    equal to the batched form on the input folded to [B·S, ...] by hand."""
    rng = np.random.default_rng(5)
    s, batch = 3, 2
    x = rng.normal(size=(batch, 4, 3, 3)).astype(np.float32)
    bias = None
    if which == "convT":
        node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                pads=[1, 1, 1, 1], output_padding=[1, 1])
        w, bias = rng.normal(size=(s, 4, 5, 3, 3)).astype(np.float32), rng.normal(size=(s, 5)).astype(np.float32)
        shapes = {"x": [1, 4, 3, 3], "y": [1, 5, 6, 6]}
    elif which == "bn":
        node = helper.make_node("BatchNormalization", ["x", "w", "b", "zeros", "ones"], ["y"], epsilon=0.0)
        w, bias = rng.normal(size=(s, 4)).astype(np.float32), rng.normal(size=(s, 4)).astype(np.float32)
        shapes = {"x": [1, 4, 3, 3], "y": [1, 4, 3, 3]}
    else:
        node = helper.make_node("Mul", ["x", "d.dropout_mask"], ["y"])
        w = (rng.random((s, 4, 1, 1)) > 0.3).astype(np.float32) / 0.7
        shapes = {"x": [1, 4, 3, 3], "y": [1, 4, 3, 3]}
    folded = np.repeat(x, s, axis=0)  # row b·S + s
    np.testing.assert_allclose(_emit(node, x, w, bias, shapes, True), _emit(node, folded, w, bias, shapes, False),
                               atol=ROUNDOFF)
