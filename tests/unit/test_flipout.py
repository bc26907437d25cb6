"""Flipout in the ``noise`` graph (``--noise flipout``, and ``auto`` with in-graph noise on large shared-position
weights): one weight-noise draw per call shared by the S samples, random signs per sample.

What must hold (docs/speed.md): each sample's weights are exactly the posterior's marginal, two samples'
perturbations are uncorrelated, and the S-sample predictive is as good an estimate as S independent draws
(within 1.2x their Monte Carlo error)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import read_metadata
from edgebnn.exporters.noise import FLIPOUT_MIN_WEIGHTS, fill_noise
from edgebnn.ir import DOMAIN, BNNModel, GaussianWeight, Manifest, make_encoding_node
from edgebnn.runtime import Session

S = 16


def two_conv(seed: int = 0, sigma: float = 0.5) -> BNNModel:
    """[B, 1, 8, 8] -> Conv 1->8 3x3 -> Relu -> Conv 8->16 3x3 (1152 weights: Flipout in ``auto``) -> Relu ->
    MaxPool 2 -> Flatten -> Gemm 256->4; every weight Gaussian, σ = ``sigma`` x |μ| scale."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph([], "two_conv", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                           ["batch", 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])])
    for name, shape, scale in (("c1.weight", (8, 1, 3, 3), 0.6), ("c1.bias", (8,), 0.1),
                               ("c2.weight", (16, 8, 3, 3), 0.25), ("c2.bias", (16,), 0.1),
                               ("fc.weight", (4, 256), 0.15), ("fc.bias", (4,), 0.1)):
        mu = rng.normal(0, scale, shape).astype(np.float32)
        sd = (sigma * scale * rng.uniform(0.5, 1.5, shape)).astype(np.float32)
        graph.node.append(make_encoding_node(graph, name, name.split(".")[0], GaussianWeight(mu, sd)))
    graph.node.extend([
        helper.make_node("Conv", ["input", "c1.weight", "c1.bias"], ["a"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("Conv", ["ra", "c2.weight", "c2.bias"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["rc"]),
        helper.make_node("MaxPool", ["rc"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], transB=1),
    ])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    return BNNModel(model, Manifest(source_library="synthetic", input_name="input", input_shape=[1, 1, 8, 8],
                                    num_classes=4), "two_conv")


def _session(proto: onnx.ModelProto, outputs: list[str]) -> ort.InferenceSession:
    """onnxruntime on ``proto`` with the inner values ``outputs`` as extra graph outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    out.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(out.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def test_auto_flips_large_shared_position_weights_only_with_in_graph_noise():
    model = two_conv()
    assert 8 * 9 < FLIPOUT_MIN_WEIGHTS <= 16 * 8 * 9
    graph = export_model(model, ExportConfig(S, mode="noise", rng="graph",
                                             weights="fp32")).proto  # fp32: readable names
    names = {o for n in graph.graph.node for o in n.output}
    assert "ens/c2.weight/flipped" in names and "ens/c1.weight/flipped" not in names  # c1: independent draws
    assert [i.name for i in graph.graph.input] == ["input"]  # self-contained: the data is the only input
    normals = sum(int(np.prod(next(a.ints for a in n.attribute if a.name == "shape"))) for n in graph.graph.node
                  if n.op_type == "RandomNormal")
    assert normals == S * (8 * 9 + 8 + 16) + 16 * 8 * 9  # c2's noise drawn once per call, not S times
    host = export_model(model, ExportConfig(S, mode="noise", weights="fp32",
                                            rng="host")).proto  # host noise: independent draws, as before
    assert not any(o.endswith("flipped") for n in host.graph.node for o in n.output)
    assert read_metadata(graph, "g.onnx").noise == "auto"


def test_flipout_builds_mu_plus_one_draw_times_per_sample_signs():
    """Host noise makes the construction checkable: W_s = μ + (σ ⊙ ε) ⊙ c_s with ε the call's one draw (the first
    n numbers of its S rows) and signs c_s [u < 0.5] → -1 along the weight matrix's longer axis."""
    model = two_conv()
    proto = export_model(model, ExportConfig(S, mode="noise", noise="flipout", weights="fp32", rng="host")).proto
    meta = read_metadata(proto, "h.onnx")
    x = np.random.default_rng(0).normal(size=(2, 1, 8, 8)).astype(np.float32)
    feed = fill_noise(list(meta.noise_inputs), 2, S, np.random.default_rng(1))
    ws = _session(proto, ["ens/c2.weight/W_s"]).run(["ens/c2.weight/W_s"], {"input": x, **feed})[0]
    enc = model.encoded_weight("c2.weight").encoding
    eps = feed["noise/c2.weight"].reshape(-1)[: enc.size].reshape(16, 72)
    c = np.where(feed["noise/c2.weight.flip"] < 0.5, -1.0, 1.0)  # [S, 72]: the longer axis (72 > 16)
    want = enc.mean().reshape(16, 72) + enc.stddev().reshape(16, 72) * eps * c[:, None, :]
    np.testing.assert_allclose(ws.reshape(S, 16, 72), want, rtol=1e-6, atol=1e-6)


def test_each_samples_weights_are_the_posterior_and_two_samples_are_uncorrelated():
    """In-graph noise, R calls: z = (W_s - μ)/σ is standard normal for every sample s (mean 0 and variance 1 over
    the n = 1152 weights x R calls, within 4 standard errors: 4/√(nR) and 4·√(2/(nR))), and samples 0 and 1 are
    uncorrelated: mean(z_0 z_1) = mean(ε² t_j), t_j = ±1 one sign product per column j of the [16, 72] matrix, so
    its standard error is √(J·E[X²]/R)/n with X = Σ_o ε²_oj ~ χ²_16 (E[X²] = 16² + 2·16). Their squares are not
    independent (the shared |ε|: z_0² = z_1²)."""
    model = two_conv()
    enc = model.encoded_weight("c2.weight").encoding
    sess = _session(export_model(model, ExportConfig(S, mode="noise", rng="graph", weights="fp32")).proto,
                    ["ens/c2.weight/W_s"])
    x = np.zeros((1, 1, 8, 8), np.float32)
    calls, d0, cols = 200, 16, 72
    z = np.stack([(sess.run(["ens/c2.weight/W_s"], {"input": x})[0] - enc.mean()) / enc.stddev()
                  for _ in range(calls)]).reshape(calls, S, -1)
    n = z.shape[0] * z.shape[2]
    assert np.abs(z.mean(axis=(0, 2))).max() < 4 / np.sqrt(n)
    assert np.abs(z.var(axis=(0, 2)) - 1).max() < 4 * np.sqrt(2 / n)
    corr = np.mean(z[:, 0] * z[:, 1])
    assert abs(corr) < 4 * np.sqrt(cols * (d0**2 + 2 * d0) / calls) / (d0 * cols)
    np.testing.assert_allclose(z[:, 0] ** 2, z[:, 1] ** 2, rtol=1e-4, atol=1e-5)


def _mc_error_ratio(model: BNNModel, x: np.ndarray, noise: str, calls: int) -> tuple[float, float]:
    """RMS error of the S-sample predictive of ``noise`` against independent draws (``weight``), both around a
    reference from ``calls`` further independent calls; the reference's own error (variance v/calls, v the
    independent sampler's) is taken out of both. Returns (ratio, its standard error from the spread of the
    per-call squared errors, delta method)."""
    def run(variant: str, seed: int) -> np.ndarray:
        sess = Session(export_model(model, ExportConfig(S, mode="noise", rng="graph", noise=variant, seed=seed)).proto,
                       threads=1)
        return np.stack([sess.predict(x).probs for _ in range(calls)])

    ref = run("weight", 2).mean(axis=0)
    err_ind = ((run("weight", 1) - ref) ** 2).mean(axis=(1, 2))
    err = ((run(noise, 3) - ref) ** 2).mean(axis=(1, 2))
    own = err_ind.mean() / calls
    ratio = float(np.sqrt((err.mean() - own) / (err_ind.mean() - own)))
    rel = np.sqrt(err.var() / err.mean() ** 2 / calls + err_ind.var() / err_ind.mean() ** 2 / calls)
    return ratio, float(0.5 * ratio * rel)


def test_default_in_graph_sampler_is_as_good_as_independent_draws():
    """The issue's bar: the S = 16 predictive within 1.2x the Monte Carlo error of independent draws. The
    estimate's standard error must be small enough that 1.2 is 4 of them above 1.0 (so a sampler as good as
    independent draws fails with probability < 1e-4); measured 0.95-1.05 here, 0.99 on a trained LeNet-5."""
    x = np.random.default_rng(5).normal(size=(64, 1, 8, 8)).astype(np.float32)
    ratio, se = _mc_error_ratio(two_conv(), x, "auto", calls=120)
    assert se < 0.05
    assert ratio < 1.2
