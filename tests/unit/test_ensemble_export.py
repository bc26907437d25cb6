"""Baked ONNX ensemble export on a synthetic IR, checked with onnxruntime against the reference runtime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from synthetic import synthetic_cnn

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import float_bnn, float_deterministic, save_onnx
from edgebnn.exporters.export import export_model
from edgebnn.metrics import predictive_from_logits
from edgebnn.runtime.reference import sample_logits

# float32 arithmetic in a different op order (grouped conv / batched MatMul vs plain ops):
# probabilities agree to round-off, far below any Monte Carlo effect.
ROUNDOFF = 1e-5


def _run(proto, x):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})


@pytest.fixture
def x():
    return np.random.default_rng(1).normal(size=(7, 1, 6, 6)).astype(np.float32)


@pytest.mark.parametrize("samples", [1, 4, 16])
def test_baked_matches_reference_for_same_seed(cnn_ir, x, samples):
    probs, entropy, mi = _run(export_model(cnn_ir, ExportConfig(samples, mode="baked", seed=11)).proto, x)
    ref = predictive_from_logits(sample_logits(cnn_ir, x, samples, seed=11))
    np.testing.assert_allclose(probs, ref.probs, atol=ROUNDOFF)
    np.testing.assert_allclose(entropy, ref.entropy, atol=ROUNDOFF)
    np.testing.assert_allclose(mi, ref.mutual_info, atol=ROUNDOFF)
    assert probs.shape == (7, 3) and entropy.shape == (7,) and mi.shape == (7,)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=ROUNDOFF)
    if samples == 1:
        np.testing.assert_allclose(mi, 0.0, atol=ROUNDOFF)  # one member has no disagreement


def test_batch_rows_are_independent(cnn_ir, x):
    proto = export_model(cnn_ir, ExportConfig(8, mode="baked", seed=0)).proto
    full = _run(proto, x)[0]
    one = _run(proto, x[3:4])[0]
    np.testing.assert_allclose(one[0], full[3], atol=ROUNDOFF)


def test_graph_is_batched_not_unrolled_and_has_no_random_ops(cnn_ir):
    proto = export_model(cnn_ir, ExportConfig(16, mode="baked")).proto
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Conv") == 1 and ops.count("MatMul") == 1  # one op per layer, not 16 copies
    assert not [o for o in ops if o.startswith("Random")]
    assert all(o.domain in ("", "ai.onnx") for o in proto.opset_import)
    assert proto.ir_version <= 10
    assert 17 <= next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) <= 20
    # the first sampled layer reads the input shared by every sample: one wide Conv, the 16 members side by side
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    assert next(a.i for a in conv.attribute if a.name == "group") == 1
    assert conv.input[0] == "input"
    width = next(t for t in proto.graph.initializer if t.name == conv.input[1]).dims[0]
    assert width == 16 * 4  # 4 output channels per member
    assert [o.name for o in proto.graph.output] == ["probs", "entropy", "mutual_info"]


def test_seed_is_reproducible_and_matters(cnn_ir, tmp_path):
    a, b, c = (tmp_path / f"{n}.onnx" for n in "abc")
    save_onnx(export_model(cnn_ir, ExportConfig(4, mode="baked", seed=3)).proto, a)
    save_onnx(export_model(synthetic_cnn(), ExportConfig(4, mode="baked", seed=3)).proto, b)
    save_onnx(export_model(cnn_ir, ExportConfig(4, mode="baked", seed=4)).proto, c)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_more_samples_approach_the_predictive(x):
    # Monte Carlo: the S-sample mean probability converges to the predictive at rate 1/sqrt(S).
    # The gap from a 4096-sample reference, averaged over rows and classes, must shrink as S grows
    # (S=4 vs S=256: expected ratio 8; we ask for 2 to stay clear of sampling luck with a fixed seed).
    model = synthetic_cnn(sigma=0.5)
    ref = predictive_from_logits(sample_logits(model, x, 4096, seed=99)).probs
    gap = {s: np.abs(_run(export_model(model, ExportConfig(s, mode="baked", seed=1)).proto,
                          x)[0] - ref).mean() for s in (4, 256)}
    assert gap[256] * 2 < gap[4]


def test_float_baselines(cnn_ir, x):
    det = _run(float_deterministic(cnn_ir), x)[0]
    assert det.shape == (7, 3)
    # float_deterministic uses the posterior mean: it equals a zero-noise model.
    zero = cnn_ir.copy()
    for t in zero.proto.graph.initializer:
        if t.name.endswith(".sigma"):
            t.CopyFrom(onnx.numpy_helper.from_array(np.zeros(tuple(t.dims), np.float32), t.name))
    np.testing.assert_allclose(det, predictive_from_logits(sample_logits(zero, x, 1)).probs, atol=ROUNDOFF)
    bnn = float_bnn(cnn_ir)
    assert [n.op_type for n in bnn.graph.node].count("RandomNormal") == 3
    sess = ort.InferenceSession(bnn.SerializeToString(), providers=["CPUExecutionProvider"])
    first, second = (sess.run(None, {"input": x})[0] for _ in range(2))
    assert not np.allclose(first, second)  # fresh weights every run, as bayesian-torch samples


@pytest.mark.parametrize("samples", [0, -3, 10**6])
def test_bad_sample_counts(cnn_ir, samples):
    with pytest.raises(InvalidOptionError, match="--samples"):
        export_model(cnn_ir, ExportConfig(samples, mode="baked"))


def test_unknown_mode(cnn_ir):
    with pytest.raises(InvalidOptionError, match="--mode magic"):
        export_model(cnn_ir, ExportConfig(4, mode="magic", rng="host"))


def test_int8_weights_follow_tensorrt_rules_and_stay_within_a_rounding_step(cnn_ir, x):
    from edgebnn.exporters.trt_compat import check_trt_compat, has_errors

    fp32, int8 = (export_model(cnn_ir, ExportConfig(4, mode="baked", seed=2,
                                                    weights=w)).proto for w in ("fp32", "int8"))
    assert not has_errors(check_trt_compat(int8))
    dq = [n for n in int8.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dq) == 2  # one per sampled layer
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in int8.graph.initializer}
    for n in dq:
        assert inits[n.input[0]].dtype == np.int8 and not inits[n.input[2]].any()  # symmetric: zero point 0
        assert inits[n.input[1]].ndim == 1  # one scale per slice of axis 0
    # Each weight moves by at most half a step (max|slice|/254), so the int8 ensemble stays close to fp32;
    # the bound on probabilities is loose but would catch a wrong scale axis or sign.
    p32, p8 = _run(fp32, x)[0], _run(int8, x)[0]
    assert np.abs(p32 - p8).max() < 0.02
    w32 = sum(len(t.raw_data) for t in fp32.graph.initializer if t.name.endswith("/W"))
    w8 = sum(len(t.raw_data) for t in int8.graph.initializer if t.name.endswith("/W.q"))
    assert w8 * 4 == w32  # the sampled weights take a quarter of the bytes


def test_int8_moments_export_in_noise_and_analytic_too(cnn_ir):
    """No longer baked-only: μ and σ are stored as int8 codes and decoded in the graph (tests/unit/stores/)."""
    from edgebnn.exporters.metadata import read_metadata

    big = sum(w.encoding.size >= 16 for w in cnn_ir.encoded_weights())  # fewer numbers stay fp32 (stores.SMALL)
    for mode in ("noise", "analytic"):
        proto = export_model(cnn_ir, ExportConfig(4, mode=mode, weights="int8", rng="host")).proto
        assert read_metadata(proto, "x.onnx").stores["int8"] == 2 * big  # μ and σ of every weight


def _quiet_conv(model):
    """The synthetic CNN with its conv posterior collapsed to the mean (sigma = 0)."""
    for t in model.proto.graph.initializer:
        if t.name.startswith("conv") and t.name.endswith(".sigma"):
            t.CopyFrom(onnx.numpy_helper.from_array(np.zeros(tuple(t.dims), np.float32), t.name))
    return model


def test_hoisting_runs_quiet_layers_once_and_keeps_the_predictive(x):
    model = _quiet_conv(synthetic_cnn())
    hoisted, plain = (export_model(model, ExportConfig(8, mode="baked", seed=5,
                                                       hoist=h)).proto for h in ("auto", "off"))
    conv = next(n for n in hoisted.graph.node if n.op_type == "Conv")
    assert all(a.i == 1 for a in conv.attribute if a.name == "group")  # one pass on B rows, not S·B
    meta = json.loads(hoisted.metadata_props[0].value)
    assert meta["layers"] == {"sampled": ["fc"], "hoisted": ["conv"]}
    ref = predictive_from_logits(sample_logits(model, x, 8, seed=5))
    for proto in (hoisted, plain):
        np.testing.assert_allclose(_run(proto, x)[0], ref.probs, atol=ROUNDOFF)


def test_hoisting_threshold(cnn_ir):
    meta = json.loads(export_model(cnn_ir, ExportConfig(4, mode="baked", hoist=10.0)).proto.metadata_props[0].value)
    assert meta["layers"] == {"sampled": [], "hoisted": ["conv", "fc"]}  # every sigma below 10
    _, _, mi = _run(export_model(cnn_ir, ExportConfig(4, mode="baked", hoist=10.0)).proto, np.ones((2, 1, 6, 6),
                                                                                                   np.float32))
    np.testing.assert_allclose(mi, 0.0, atol=ROUNDOFF)  # S identical members
    with pytest.raises(InvalidOptionError, match="--hoist"):
        export_model(cnn_ir, ExportConfig(4, mode="baked", hoist=-1.0))


def test_quiet_weight_with_a_sampled_bias_samples_as_a_layer(x):
    model = synthetic_cnn()
    for t in model.proto.graph.initializer:
        if t.name == "conv.weight.sigma":  # the weight is quiet, its bias still samples
            t.CopyFrom(onnx.numpy_helper.from_array(np.zeros(tuple(t.dims), np.float32), t.name))
    proto = export_model(model, ExportConfig(4, mode="baked", seed=1)).proto
    assert json.loads(proto.metadata_props[0].value)["layers"]["sampled"] == ["conv", "fc"]
    ref = predictive_from_logits(sample_logits(model, x, 4, seed=1))
    np.testing.assert_allclose(_run(proto, x)[0], ref.probs, atol=ROUNDOFF)


def test_int4_gemm_weights_are_blockwise_and_odd_outputs_fall_back_to_int8():
    from synthetic import synthetic_linear

    from edgebnn.exporters.trt_compat import check_trt_compat, has_errors

    even, odd = synthetic_linear(n_in=64, classes=4), synthetic_linear(n_in=64, classes=3)
    xl = np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32)
    for model, dtype in ((even, onnx.TensorProto.INT4), (odd, onnx.TensorProto.INT8)):
        proto = export_model(model, ExportConfig(4, mode="baked", seed=1, weights="int4")).proto
        opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        assert opset == (21 if dtype == onnx.TensorProto.INT4 else 18)  # int4 DequantizeLinear needs opset 21
        dq = next(n for n in proto.graph.node if n.op_type == "DequantizeLinear")
        q = next(t for t in proto.graph.initializer if t.name == dq.input[0])
        assert q.data_type == dtype
        if dtype == onnx.TensorProto.INT4:
            assert next(a.i for a in dq.attribute if a.name == "block_size") == 32
        assert not has_errors(check_trt_compat(proto, tensorrt="11"))
        # int4 rounds each weight by at most half a step, max|block|/14: a coarse but bounded change
        fp32 = predictive_from_logits(sample_logits(model, xl, 4, seed=1)).probs
        got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"input": xl})[0]
        assert np.abs(got - fp32).max() < 0.1


@pytest.mark.parametrize("mode", ["baked", "noise", "analytic"])
def test_progress_reaches_its_total_once_per_step(mode):
    calls: list[tuple[int, int]] = []
    export_model(synthetic_cnn(), ExportConfig(2, mode=mode, rng="host"),
                 progress=lambda done, total: calls.append((done, total)))
    total = calls[-1][1]
    # baked/noise: one step per sampled layer (the CNN's Conv and Gemm); analytic: one per node of the graph
    assert calls == [(i, total) for i in range(1, total + 1)]
    assert total == 2 if mode != "analytic" else total > 2
