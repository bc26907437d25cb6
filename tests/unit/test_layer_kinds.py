"""Layer kinds in every export mode: Conv of rank 1 and 3 (and 2 through the synthetic CNN) against the reference
runtime, exported graphs with no unused initializers, and the exporters' import layering."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn.exporters.analytic import quadrature_points
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.ir import DOMAIN, BNNModel, GaussianWeight, Manifest, make_encoding_node
from edgebnn.metrics import predictive_from_logits
from edgebnn.runtime.reference import sample_logits

# float32 arithmetic in another op order (grouped conv, batched MatMul): round-off, far below Monte Carlo effects
ROUNDOFF = 1e-5
SPATIAL = {1: [6], 2: [4, 4], 3: [3, 3, 3]}


def conv_ir(rank: int, *, bias: bool = True, head: bool = True, group: int = 1, sigma: float = 0.2) -> BNNModel:
    """input [B, 2, *SPATIAL[rank]] -> Conv(GaussianWeight [4, 2/group, 3, ...], optional Gaussian bias, pad 1)
    -> (Relu -> Flatten -> Gemm(GaussianWeight [3, n], fixed bias) | Flatten) -> logits."""
    rng = np.random.default_rng(rank)
    sp = SPATIAL[rank]
    n = 4 * math.prod(sp)
    classes = 3 if head else n
    graph = helper.make_graph([], f"conv{rank}d", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                                 ["batch", 2, *sp])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])])

    def gaussian(name: str, shape: tuple[int, ...], layer: str) -> None:
        mu = rng.normal(0, 0.5, shape).astype(np.float32)
        sd = (sigma * rng.uniform(0.5, 1.5, shape)).astype(np.float32)
        graph.node.append(make_encoding_node(graph, name, layer, GaussianWeight(mu, sd)))

    gaussian("conv.weight", (4, 2 // group, *[3] * rank), "conv")
    if bias:
        gaussian("conv.bias", (4,), "conv")
    graph.node.append(helper.make_node("Conv", ["input", "conv.weight", *(["conv.bias"] if bias else [])], ["c"],
                                       pads=[1] * 2 * rank, kernel_shape=[3] * rank, group=group))
    if head:
        gaussian("fc.weight", (classes, n), "fc")
        graph.initializer.append(numpy_helper.from_array(rng.normal(0, 0.1, classes).astype(np.float32), "fc.bias"))
        graph.node.extend([helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
                           helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], transB=1)])
    else:
        graph.node.append(helper.make_node("Flatten", ["c"], ["logits"]))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    manifest = Manifest(source_library="synthetic", input_name="input", input_shape=[1, 2, *sp], num_classes=classes)
    return BNNModel(proto, manifest, f"conv{rank}d")


def _run(proto: onnx.ModelProto, x: np.ndarray, **noise: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x, **noise})


def _x(rank: int, batch: int = 3) -> np.ndarray:
    return np.random.default_rng(7).normal(size=(batch, 2, *SPATIAL[rank])).astype(np.float32)


@pytest.mark.parametrize(("rank", "bias", "group"), [(1, True, 1), (1, False, 2), (3, True, 1), (3, False, 1)])
def test_baked_conv_of_any_rank_matches_the_reference(rank, bias, group):
    model, x = conv_ir(rank, bias=bias, group=group), _x(rank)
    probs, entropy, mi = _run(export_model(model, ExportConfig(4, mode="baked", seed=2)).proto, x)
    ref = predictive_from_logits(sample_logits(model, x, 4, seed=2))
    np.testing.assert_allclose(probs, ref.probs, atol=ROUNDOFF)
    np.testing.assert_allclose(entropy, ref.entropy, atol=ROUNDOFF)
    np.testing.assert_allclose(mi, ref.mutual_info, atol=ROUNDOFF)


def _reference_noise(model: BNNModel, samples: int, seed: int) -> dict[str, np.ndarray]:
    """The standard normals the reference runtime draws Gaussian weight ``i`` from (stream ``[seed, i]``)."""
    return {f"noise/{w.name}": np.random.default_rng([seed, i]).standard_normal((samples, *w.encoding.shape),
                                                                                  dtype=np.float32)
            for i, w in enumerate(model.encoded_weights())}


@pytest.mark.parametrize("rank", [1, 3])
def test_weight_noise_fed_the_reference_normals_is_the_reference_ensemble(rank):
    """noise --noise weight draws W_s = mu + sigma ⊙ ε in the graph: fed the reference's ε, it is its ensemble."""
    model, x = conv_ir(rank), _x(rank)
    probs = _run(export_model(model, ExportConfig(4, mode="noise", noise="weight", rng="host")).proto, x,
                 **_reference_noise(model, 4, seed=2))[0]
    np.testing.assert_allclose(probs, predictive_from_logits(sample_logits(model, x, 4, seed=2)).probs, atol=ROUNDOFF)


def _conv_moments(model: BNNModel, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of a one-Conv network's logits given x: Conv(x, mu) + b_mu, Conv(x², σ²) + b_σ²."""
    encs = {w.name: w.encoding for w in model.encoded_weights()}
    var_model = model.float_model({n: e.stddev() ** 2 for n, e in encs.items()})
    mean = _run(model.float_model(), x)[0]
    return mean, _run(var_model, x * x)[0]


@pytest.mark.parametrize("rank", [1, 3])
def test_local_noise_and_analytic_propagate_conv_moments_of_any_rank(rank):
    model, x = conv_ir(rank, head=False), _x(rank)
    mean, var = _conv_moments(model, x)
    k = mean.shape[1]

    def softmax(z: np.ndarray) -> np.ndarray:
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    # local: every row draws mean + √var ⊙ ε; ε = 1 everywhere makes each member mean + √var
    local = export_model(model, ExportConfig(2, mode="noise", noise="local", rng="host")).proto
    got = _run(local, x, **{"noise/conv.weight": np.ones((len(x) * 2, 4, *SPATIAL[rank]), np.float32)})[0]
    np.testing.assert_allclose(got, softmax(mean + np.sqrt(var)), atol=ROUNDOFF)
    # analytic: the quadrature head over N(mean, var) logits
    z = quadrature_points(16, k)
    want = softmax(mean[:, None] + np.sqrt(var)[:, None] * z[None]).mean(1)
    np.testing.assert_allclose(_run(export_model(model, ExportConfig(16, mode="analytic")).proto, x)[0], want,
                               atol=ROUNDOFF)


def _codebook_model(sampling: str = "independent") -> BNNModel:
    from edgebnn.passes import lower

    return lower(synthetic_linear(n_in=128, classes=8, sigma=0.2), "codebook", seed=0, sampling=sampling).model


FORMS = [("baked", {}), ("baked", {"weights": "int8"}), ("baked", {"weights": "int4"}),
         ("baked", {"weights": "int8", "hoist": 10.0}), ("noise", {"noise": "auto"}), ("noise", {"noise": "local"}),
         ("noise", {"noise": "weight"}), ("noise", {"hoist": 10.0}), ("analytic", {})]


@pytest.mark.parametrize(("which", "mode", "kw"), [(m, *form) for m in ("cnn", "conv3d_no_bias") for form in FORMS]
                         + [("codebook_shared", "shared", {}), ("codebook_shared", "noise", {"noise": "weight"}),
                            ("codebook", "noise", {"noise": "weight"}), ("codebook", "noise", {"noise": "auto"})])
def test_every_initializer_is_used_and_the_graph_checks(which, mode, kw):
    model = {"cnn": synthetic_cnn, "conv3d_no_bias": lambda: conv_ir(3, bias=False),
             "codebook": _codebook_model, "codebook_shared": lambda: _codebook_model("shared")}[which]()
    proto = export_model(model, ExportConfig(4, mode=mode, **{"rng": "host", **kw})).proto
    onnx.checker.check_model(proto, full_check=True)
    used = {x for node in proto.graph.node for x in node.input}
    assert [t.name for t in proto.graph.initializer if t.name not in used] == []


@pytest.mark.parametrize("mode", ["baked", "mixed"])
def test_relu_and_pool_run_on_the_wide_conv_output_and_the_ensemble_is_the_reference(mode):
    """LeNet-5 (shared conv1, thin conv2 as S Convs), baked and ``noise --noise mixed`` (baked convs): each Conv's
    Relu reads the Conv (Concat) output itself and its MaxPool comes before the Reshape to rows
    (sink_wide_outputs); the baked predictive of a batch of 3 is the reference ensemble of the same seed."""
    import torch

    from edgebnn.importers import import_model
    from edgebnn.models import lenet5, synthetic_posterior

    torch.manual_seed(0)
    model = import_model(synthetic_posterior(lenet5(), 0.2), (1, 1, 28, 28), where="lenet5")
    x = np.random.default_rng(3).random((3, 1, 28, 28), dtype=np.float32)
    config = ExportConfig(4, seed=2, **({"mode": "noise", "noise": "mixed",
                                         "rng": "host"} if mode == "mixed" else {"mode": "baked"}))
    proto = export_model(model, config).proto
    producer = {o: n for n in proto.graph.node for o in n.output}
    relus = [n for n in proto.graph.node if n.op_type == "Relu"][:2]
    assert [producer[r.input[0]].op_type for r in relus] == ["Conv", "Concat"]  # conv1 wide, conv2 split
    pools = [n for n in proto.graph.node if n.op_type == "MaxPool"]
    assert [producer[p.input[0]].op_type for p in pools] == ["Relu", "Relu"]
    if mode == "baked":
        ref = predictive_from_logits(sample_logits(model, x, 4, seed=2))
        for got, want in zip(_run(proto, x), (ref.probs, ref.entropy, ref.mutual_info), strict=True):
            np.testing.assert_allclose(got, want, atol=ROUNDOFF)
