"""Speed forms: low-bit weight forms (qdq, folded, integer: MatMulInteger, int4 MatMulNBits) run in onnxruntime and
compute the fp32 form's predictive within their stated tolerances; the device picks the form and refuses formats it
cannot run; thin convs split into S convs; the noise pool; the ``mixed`` noise variant samples the posterior."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import quantize
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.forms import DEVICE_FORMATS, INTEGER_MIN_BYTES, FormChoice, choose_form
from edgebnn.exporters.quantize import dequantize_blocks, nbits_weight
from edgebnn.ir import gaussian_mlp
from edgebnn.passes import lower

ROUNDOFF = 1e-5  # float32 arithmetic in another op order


def _run(proto: onnx.ModelProto, x: np.ndarray, optimize: bool = True) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {proto.graph.input[0].name: x})


def _meta(proto: onnx.ModelProto) -> dict:
    return json.loads(proto.metadata_props[0].value)


def _mlp(seed: int = 0):
    rng = np.random.default_rng(seed)

    def layer(n_out: int, n_in: int):
        return (rng.normal(0, 0.5, (n_out, n_in)).astype(np.float32), np.full((n_out, n_in), 0.1, np.float32),
                rng.normal(0, 0.1, n_out).astype(np.float32), np.full(n_out, 0.05, np.float32))

    return gaussian_mlp([layer(16, 8), layer(12, 16), layer(4, 12)])


@pytest.mark.parametrize("weights", ["int8", "int4"])
@pytest.mark.parametrize("make", [synthetic_cnn, _mlp])
def test_folded_form_stores_the_qdq_values_as_fp32(make, weights):
    model = lower(make(), "fixed", seed=0).model
    x = np.random.default_rng(1).normal(size=(5, *model.manifest.input_shape[1:])).astype(np.float32)
    qdq = export_model(model, ExportConfig(8, mode="baked", seed=2, weights=weights, form="qdq")).proto
    folded = export_model(model, ExportConfig(8, mode="baked", seed=2, weights=weights, form="folded")).proto
    assert "DequantizeLinear" in {n.op_type for n in qdq.graph.node}
    assert "DequantizeLinear" not in {n.op_type for n in folded.graph.node}
    assert all(t.data_type == onnx.TensorProto.FLOAT for t in folded.graph.initializer
               if t.name.endswith("/W") or t.name.endswith("/W_wide"))
    # the same weight values (float32(q) * scale) through the same ops: only round-off apart (as written:
    # onnxruntime's optimizer would fuse an int4 DequantizeLinear into MatMulNBits, which rounds activations too)
    for got, want in zip(_run(folded, x, False), _run(qdq, x, False), strict=True):
        np.testing.assert_allclose(got, want, atol=ROUNDOFF)
    assert _meta(folded)["form"] == "folded" and _meta(qdq)["form"] == "qdq"


def test_integer_form_is_within_one_activation_step_of_the_fp32_form():
    """One Gemm on the input (the wide layer): exact int8 weights (the fixed grid), so the only change is the
    activation's uint8 rounding, at most s_x / 2 with s_x = (max(x, 0) - min(x, 0)) / 255 per call. A logit
    moves by at most δ = max_{s,o} Σ_i |W_s[o, i]| · s_x / 2, and a softmax probability by at most δ / 2
    (Σ_j |∂p_k/∂z_j| = 2 p_k (1 - p_k) <= 1/2); the mean over members keeps the bound."""
    model = lower(synthetic_linear(n_in=64, classes=4), "fixed", seed=0).model
    x = np.random.default_rng(3).normal(size=(6, 64)).astype(np.float32)
    fp32 = export_model(model, ExportConfig(8, mode="baked", seed=2)).proto
    integer = export_model(model, ExportConfig(8, mode="baked", seed=2, weights="int8", form="integer")).proto
    ops = {n.op_type for n in integer.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops and "DequantizeLinear" not in ops
    w = numpy_helper.to_array(next(t for t in fp32.graph.initializer if t.name == "ens/fc.weight/W"))  # [S·out, in]
    s_x = (max(x.max(), 0) - min(x.min(), 0)) / 255
    delta = float(np.abs(w).sum(axis=1).max()) * s_x / 2
    got, want = _run(integer, x)[0], _run(fp32, x)[0]
    assert 0 < np.abs(got - want).max() <= delta / 2 + ROUNDOFF  # not bit-equal: the activation is rounded


def test_integer_form_runs_sample_major_gemms_and_folds_convs():
    """Deeper layers (sample-major MatMulInteger) and Conv (folded): close to fp32 within the int8 steps."""
    for make in (_mlp, synthetic_cnn):
        model = lower(make(), "fixed", seed=0).model
        x = np.random.default_rng(1).normal(size=(5, *model.manifest.input_shape[1:])).astype(np.float32)
        integer = export_model(model, ExportConfig(8, mode="baked", seed=2, weights="int8", form="integer")).proto
        ops = [n.op_type for n in integer.graph.node]
        assert "MatMulInteger" in ops and "ConvInteger" not in ops and "DequantizeLinear" not in ops
        # weights exact on the grid; uint8 activations move each logit by a few percent of its range at most
        fp32 = export_model(model, ExportConfig(8, mode="baked", seed=2)).proto
        np.testing.assert_allclose(_run(integer, x)[0], _run(fp32, x)[0], atol=0.02)


def _nbits_model(w: np.ndarray, accuracy_level: int) -> onnx.ModelProto:
    """One MatMulNBits on x [b, K] with the int4 blocks of ``w`` [K, N] (nbits_weight's packing)."""
    packed, scales = nbits_weight(w)
    node = helper.make_node("MatMulNBits", ["x", "B", "scales"], ["y"], domain="com.microsoft", K=w.shape[0],
                            N=w.shape[1], bits=4, block_size=32, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                               ["b", w.shape[0]])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["b", w.shape[1]])],
                              [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "scales")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("k", [64, 100])  # 100: the last block of 32 is padded
def test_nbits_packing_is_what_matmulnbits_computes_with(k):
    """At accuracy_level 0 (fp32 arithmetic) MatMulNBits on nbits_weight's bytes is x @ the folded form's int4
    values (dequantize_blocks of quantize.blocks) to float32 round-off: |error| <= K · 2^-24 · (|x| @ |w|) <= 1e-5
    · (|x| @ |w|) for K <= 100. At level 4 the activation is rounded to int8 per block of 32 (scale max|block| /
    127): each output moves by at most Σ_blocks max|x_block| / 254 · Σ_block |w|, and by more than round-off."""
    rng = np.random.default_rng(k)
    w = rng.normal(size=(k, 6)).astype(np.float32)
    x = rng.normal(size=(5, k)).astype(np.float32)
    values = dequantize_blocks(*quantize.blocks(w)).astype(np.float64)
    want = x @ values
    got = _run(_nbits_model(w, 0), x)[0]
    assert np.all(np.abs(got - want) <= 1e-5 * (np.abs(x) @ np.abs(values)))
    blocks = -(-k // 32)
    x_max = np.pad(np.abs(x), ((0, 0), (0, blocks * 32 - k))).reshape(5, blocks, 32).max(axis=2)
    w_sum = np.pad(np.abs(values), ((0, blocks * 32 - k), (0, 0))).reshape(blocks, 32, 6).sum(axis=1)
    err = np.abs(_run(_nbits_model(w, 4), x)[0] - want)
    assert np.all(err <= x_max / 254 @ w_sum) and err.max() > 1e-3


def test_int4_integer_form_runs_matmulnbits_on_the_folded_forms_values(monkeypatch):
    """int4 integer form: the wide first layer as one MatMulNBits, the deeper ones as S MatMulNBits between Split
    and Concat. With the activation kept fp32 (accuracy_level 0) it is the folded form to round-off (same weight
    values); at the shipped level 4 each layer's activation is rounded to int8 per block of 32 (a relative step
    of 1/254 of the block's max), which moves these probabilities by < 0.02 (as the int8 form's uint8 step)."""
    from edgebnn.exporters.stores import constants

    model = lower(_mlp(), "fixed", seed=0).model
    x = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    folded = _run(export_model(model, ExportConfig(8, mode="baked", seed=2, weights="int4", form="folded")).proto, x)[0]
    proto = export_model(model, ExportConfig(8, mode="baked", seed=2, weights="int4", form="integer")).proto
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("MatMulNBits") == 1 + 2 * 8 and ops.count("Split") == 2 and "DequantizeLinear" not in ops
    assert {a.i for n in proto.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
            if a.name == "accuracy_level"} == {4}
    assert _meta(proto)["form"] == "integer"
    got = _run(proto, x)[0]
    assert 0 < np.abs(got - folded).max() < 0.02
    monkeypatch.setattr(constants, "NBITS_ACCURACY_LEVEL", 0)
    np.testing.assert_allclose(_run(export_model(model, ExportConfig(8, mode="baked", seed=2, weights="int4",
                                                                     form="integer")).proto, x)[0], folded,
                               atol=ROUNDOFF)


def test_int4_integer_wide_layer_is_within_one_activation_block_step_of_the_folded_form():
    """One Gemm on the input (the members side by side, one MatMulNBits): the only change from the folded form
    is the activation's int8 rounding per block of 32 inputs of a row, at most max|x_block| / 254 per input. A
    logit moves by at most δ = Σ_blocks max|x_block| / 254 · Σ_block |W|, a probability by at most δ / 2."""
    model = lower(synthetic_linear(n_in=64, classes=4, trans_b=False), "fixed", seed=0).model
    x = np.random.default_rng(3).normal(size=(6, 64)).astype(np.float32)
    folded = export_model(model, ExportConfig(8, mode="baked", seed=2, weights="int4", form="folded")).proto
    proto = export_model(model, ExportConfig(8, mode="baked", seed=2, weights="int4", form="integer")).proto
    assert [n.op_type for n in proto.graph.node].count("MatMulNBits") == 1
    w = numpy_helper.to_array(next(t for t in folded.graph.initializer if t.name == "ens/fc.weight/W"))  # [in, S·4]
    x_max = np.abs(x).reshape(6, 2, 32).max(axis=2)
    delta = (x_max / 254 @ np.abs(w).reshape(2, 32, -1).sum(axis=1)).max(axis=1)  # per row
    err = np.abs(_run(proto, x)[0] - _run(folded, x)[0]).max(axis=1)
    assert np.all(err <= delta / 2 + ROUNDOFF) and err.max() > 0


def test_a_hoisted_int4_layer_is_one_matmulnbits_on_the_folded_values(monkeypatch):
    """A hoisted int4 Gemm (its mean, one 2-D weight) in the integer form is one MatMulNBits; with fp32
    activations (accuracy_level 0) it computes the folded form's predictive to round-off."""
    from edgebnn.exporters.stores import constants

    model = lower(synthetic_linear(n_in=64, classes=4, trans_b=False), "fixed", seed=0).model
    x = np.random.default_rng(3).normal(size=(6, 64)).astype(np.float32)
    monkeypatch.setattr(constants, "NBITS_ACCURACY_LEVEL", 0)
    proto = export_model(model, ExportConfig(4, mode="baked", seed=2, weights="int4", form="integer", hoist=1e9)).proto
    assert _meta(proto)["layers"]["sampled"] == []
    assert [n.op_type for n in proto.graph.node].count("MatMulNBits") == 1
    folded = export_model(model, ExportConfig(4, mode="baked", seed=2, weights="int4", form="folded", hoist=1e9)).proto
    np.testing.assert_allclose(_run(proto, x)[0], _run(folded, x)[0], atol=ROUNDOFF)


def test_the_device_picks_the_form():
    cpu = choose_form("cpu", "int8")
    assert (cpu.form, cpu.integer_min_bytes) == ("integer", INTEGER_MIN_BYTES)  # large dense layers only
    int4 = choose_form("arm64", "int4")  # MatMulNBits above the same threshold (was: folded everywhere)
    assert (int4.form, int4.integer_min_bytes) == ("integer", INTEGER_MIN_BYTES) and "MatMulNBits" in int4.reason
    assert choose_form("rtx", "int8").form == "qdq"
    assert choose_form(None, "int8").form == "qdq"  # no device: the portable form, as before
    assert choose_form("cpu", "fp32").form == "fp32"
    assert choose_form("cpu", "int8", "integer") == FormChoice("integer", "asked for (--form)", 0)
    # the synthetic CNN's layers are far below the threshold: every weight folded, no integer kernel
    proto = export_model(synthetic_cnn(), ExportConfig(4, mode="baked", weights="int8", device="cpu")).proto
    meta = _meta(proto)
    assert meta["form"] == "integer" and meta["integer_min_bytes"] == INTEGER_MIN_BYTES
    assert "DequantizeLinear" in meta["form_reason"]
    ops = {n.op_type for n in proto.graph.node}
    assert "MatMulInteger" not in ops and "DequantizeLinear" not in ops


def test_auto_on_cpu_runs_only_dense_layers_above_the_threshold_in_integer_kernels(monkeypatch):
    from edgebnn.exporters import forms

    model = lower(_mlp(), "fixed", seed=0).model  # members at S=8: 8·16·8·4 = 4 KiB, 6 KiB, 1.5 KiB of fp32
    monkeypatch.setattr(forms, "INTEGER_MIN_BYTES", 2048)
    proto = export_model(model, ExportConfig(8, mode="baked", seed=2, weights="int8", device="cpu")).proto
    assert [n.op_type for n in proto.graph.node].count("MatMulInteger") == 1 + 8  # fc1 (wide), fc2 (S ops); fc3 folded
    proto = export_model(model, ExportConfig(8, mode="baked", seed=2, weights="int4", device="cpu")).proto
    assert [n.op_type for n in proto.graph.node].count("MatMulNBits") == 1 + 8  # fc1 (wide), fc2 (S ops); fc3 folded


def test_a_format_the_device_cannot_run_is_one_line_naming_the_device():
    with pytest.raises(InvalidOptionError, match=r"^--weights int4: jetson-orin-nano \(TensorRT 10.3\) takes "
                                                 r"--weights fp32 or int8$"):
        export_model(synthetic_cnn(), ExportConfig(4, mode="baked", weights="int4", device="jetson-orin-nano"))
    with pytest.raises(InvalidOptionError, match="--device tpu: choose one of"):
        choose_form("tpu", "int8")
    with pytest.raises(InvalidOptionError, match="--form fast: choose one of"):
        choose_form("cpu", "int8", "fast")
    assert all(formats for _, formats in DEVICE_FORMATS.values())


def test_thin_convs_run_as_s_convs_and_match_the_grouped_form(monkeypatch):
    """A sampled Conv after the first (its input differs per sample) with fewer than SPLIT_BELOW channels per
    group runs as Split -> S Convs -> Concat; the same members as the grouped Conv, to round-off."""
    from test_layer_kinds import conv_ir  # Conv with group 2 (2 channels): folded input, thin groups

    from edgebnn.exporters import layers

    model = conv_ir(2, group=2)
    x = np.random.default_rng(4).normal(size=(3, 2, 4, 4)).astype(np.float32)
    split = export_model(model, ExportConfig(4, mode="baked", seed=1)).proto
    assert [n.op_type for n in split.graph.node].count("Conv") == 4 and "Split" in {n.op_type for n in split.graph.node}
    monkeypatch.setattr(layers, "SPLIT_BELOW", 0)
    grouped = export_model(model, ExportConfig(4, mode="baked", seed=1)).proto
    assert [n.op_type for n in grouped.graph.node].count("Conv") == 1
    for got, want in zip(_run(split, x), _run(grouped, x), strict=True):
        np.testing.assert_allclose(got, want, atol=ROUNDOFF)


def test_noise_pool_is_iid_within_a_call_and_its_correlation_across_calls_is_bounded():
    """Within a call the pool's numbers are distinct standard-normal draws; across calls the per-position
    correlation is 1/P in expectation (the same offset), so the sample correlation over n positions x T pairs of
    consecutive calls stays within 1/P + 4 standard errors (1/√(nT)) of zero."""
    from edgebnn.exporters.noise import NoisePool

    records = [{"name": "a", "shape": [4, 3, 5], "per": "sample"}, {"name": "b", "shape": [-1, 7], "per": "row"}]
    pool = NoisePool(records, samples=4, rng=np.random.default_rng(0))
    calls = [np.concatenate([v.ravel() for v in pool.fill(2).values()]) for _ in range(400)]
    n, size = calls[0].size, pool._sizes["normal"]
    assert n == 4 * 3 * 5 + 2 * 4 * 7 and size == 16 * n
    assert len(np.unique(calls[0])) == n  # one window: no number used twice in a call
    z = np.stack(calls)
    assert abs(z.mean()) < 4 / np.sqrt(z.size) and abs(z.std() - 1) < 4 / np.sqrt(2 * z.size)  # N(0, 1)
    corr = float(np.mean(z[1:] * z[:-1]))  # unit variance, zero mean: E[z_t z_{t+1}] is the correlation
    assert abs(corr) <= 1 / size + 4 / np.sqrt(n * (len(calls) - 1))
    assert pool.fill(3)["b"].shape == (12, 7)  # a larger batch regrows the pool


def test_mixed_noise_bakes_convs_runs_gemms_locally_and_samples_the_posterior():
    """One call with S = 1024 (conv members baked, Gemm pre-activations drawn per row) against 4096 reference
    draws: each probability's sd is at most 0.5/√n; 4 sd of the difference over the 15 entries bounds the max."""
    from edgebnn.metrics import predictive_from_logits
    from edgebnn.runtime import Session
    from edgebnn.runtime.reference import sample_logits

    model = synthetic_cnn(sigma=0.3)
    x = np.random.default_rng(1).normal(size=(5, 1, 6, 6)).astype(np.float32)
    proto = export_model(model, ExportConfig(1024, mode="noise", noise="mixed", seed=3, rng="host")).proto
    assert {i.name for i in proto.graph.input} == {"input", "noise/fc.weight"}  # conv baked, fc local
    assert _meta(proto)["seed"] == 3
    ref = predictive_from_logits(sample_logits(model, x, 4096, seed=5)).probs
    got = Session(proto, seed=0).predict(x).probs
    assert np.abs(got - ref).max() < 4 * 0.5 * np.sqrt(1 / 1024 + 1 / 4096)


def _dynamic_quantize(x: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """ONNX DynamicQuantizeLinear: uint8, range widened to include 0, zero point rounded half to even.
    Returns (x_q - zero_point as int32, scale)."""
    lo, hi = np.float32(min(x.min(), 0)), np.float32(max(x.max(), 0))
    scale = np.float32((hi - lo) / np.float32(255))
    zero = np.clip(np.rint(-lo / scale), 0, 255)
    q = np.clip(np.rint(x / scale) + zero, 0, 255)
    return (q - zero).astype(np.int32), scale


def test_mcq_integer_network_equals_its_dequantized_float_counterpart():
    """MCQ counts (8 bits) x one scale per layer after the integer MAC: every layer hoisted (the posterior-mean
    network), integer form. Against float arithmetic on the same quantized activations and the dequantized
    counts (float32(x_q) · s_x @ (counts · s)): equal up to float32 round-off (the int32 sums are exact)."""
    model = lower(_mlp(), "mcq", seed=0, bits=8).model
    proto = export_model(model, ExportConfig(4, mode="baked", weights="int8", hoist=1e9, form="integer")).proto
    assert _meta(proto)["layers"]["sampled"] == []
    mm = [n for n in proto.graph.node if n.op_type == "MatMulInteger"]
    assert len(mm) == 3
    scales = [numpy_helper.to_array(t) for t in proto.graph.initializer if t.name.endswith("/w_scale")]
    assert all(s.shape == (1,) for s in scales)  # one scale per layer
    x = np.random.default_rng(5).normal(size=(6, 8)).astype(np.float32)
    h = x
    for i in (1, 2, 3):
        enc = model.encoded_weight(f"W{i}").encoding
        q, s_x = _dynamic_quantize(h)
        h = ((q.astype(np.float32) * s_x) @ enc.mean().T + model.encoded_weight(f"b{i}").encoding.mean())
        if i < 3:
            h = np.maximum(h, 0)
    z = np.exp(h - h.max(axis=1, keepdims=True))
    np.testing.assert_allclose(_run(proto, x)[0], z / z.sum(axis=1, keepdims=True), atol=ROUNDOFF)


def test_a_calibrated_qdq_artifact_folds_its_weights_and_keeps_its_predictive():
    """edgebnn calibrate's Q/DQ artifact (activations and weights): its weight DequantizeLinear nodes become fp32
    constants holding exactly what they computed; activation Q/DQ stays, so the outputs agree to round-off."""
    from edgebnn.calib.int8 import Int8Config, quantize_int8
    from edgebnn.calib.readers import BatchReader
    from edgebnn.exporters.forms import fold_constant_dequantize

    x = np.random.default_rng(2).normal(size=(16, 1, 6, 6)).astype(np.float32)
    calibrated = quantize_int8(export_model(synthetic_cnn(), ExportConfig(4, mode="baked", seed=1)).proto,
                               BatchReader(x, "input", batch=8),
                               Int8Config(method="minmax"))
    folded = fold_constant_dequantize(calibrated)
    consts = {t.name for t in folded.graph.initializer}
    dq = [n for n in folded.graph.node if n.op_type == "DequantizeLinear"]
    assert dq and not [n for n in dq if all(i in consts for i in n.input if i)]  # only activation DQs remain
    assert len(dq) < len([n for n in calibrated.graph.node if n.op_type == "DequantizeLinear"])
    # unoptimized: onnxruntime would fuse the unfolded graph's Q/DQ pairs into integer kernels whose requantization
    # rounds differently by CPU (1e-4 here on an AVX2-only machine); folding must not change what the graph computes
    for got, want in zip(_run(folded, x[:5], optimize=False), _run(calibrated, x[:5], optimize=False), strict=True):
        np.testing.assert_allclose(got, want, atol=ROUNDOFF)


def test_consecutive_sample_major_gemms_skip_the_round_trip_to_batch_major():
    """Gemm -> Relu -> Gemm stays [S, B, n] between the two MatMuls (no Transpose/Reshape pair around the Relu)
    and computes the reference runtime's predictive to round-off."""
    from edgebnn.metrics import predictive_from_logits
    from edgebnn.runtime.reference import sample_logits

    model = _mlp()
    x = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    proto = export_model(model, ExportConfig(4, mode="baked", seed=2)).proto
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Transpose") == 2  # fc2 in and fc3 out only; fc1 is the wide layer
    ref = predictive_from_logits(sample_logits(model, x, 4, seed=2))
    for got, want in zip(_run(proto, x), (ref.probs, ref.entropy, ref.mutual_info), strict=True):
        np.testing.assert_allclose(got, want, atol=ROUNDOFF)


def test_sample_major_integer_members_quantize_each_members_activation_on_its_own():
    """int8 sampled Gemm members run as Split -> one MatMulInteger per member on a 2-D weight (the only kind
    onnxruntime pre-packs) -> Concat. Each member's activation is quantized with its own uint8 range, so member
    s computes (x_q,s · s_x,s) @ (q_s · scale_s) whatever the other members hold: equal to that float arithmetic up
    to float32 round-off (the int32 sums are exact), on onnxruntime's fused graph."""
    samples = 4
    model = lower(_mlp(), "fixed", seed=0).model
    proto = export_model(model, ExportConfig(samples, mode="baked", seed=2, weights="int8", form="integer")).proto
    consts = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    mm = [n for n in proto.graph.node if n.op_type == "MatMulInteger"]
    assert len(mm) == 1 + 2 * samples  # fc1 (wide, one op), fc2 and fc3 (one op per member)
    assert all(consts[n.input[1]].ndim == 2 for n in mm)
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    probe.graph.output.extend(helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, None)
                              for v in ("ens/W2/x_t", "ens/W2/xw"))
    x = np.random.default_rng(4).normal(size=(5, 8)).astype(np.float32)
    x_t, xw = _run(probe, x)[-2:]  # [S, B, 16], [S, B, 12]
    assert xw.shape == (samples, 5, 12)
    for s in range(samples):
        q, s_x = _dynamic_quantize(x_t[s])
        w = (consts[f"ens/W2/m{s}/Wq"].astype(np.int32) - 128) * consts[f"ens/W2/m{s}/w_scale"].astype(np.float64)
        want = (q.astype(np.float64) * s_x) @ w
        np.testing.assert_allclose(xw[s], want, atol=ROUNDOFF * max(1.0, np.abs(want).max()))


def test_baked_per_channel_work_between_batched_convs_runs_on_the_wide_layout():
    """ResNet-20 baked: BatchNormalization (statistics tiled S times), Relu and the residual Adds between batched
    Convs run on the Convs' wide outputs [B, S·O, H, W] (none reads the [B·S, O, H, W] Reshape; onnxruntime then
    folds and fuses them into the Convs), and the predictive is the reference runtime's to round-off."""
    import torch

    from edgebnn.importers import import_model
    from edgebnn.metrics import predictive_from_logits
    from edgebnn.models import FACTORIES, synthetic_posterior
    from edgebnn.runtime.reference import sample_logits

    torch.manual_seed(0)
    model = import_model(synthetic_posterior(FACTORIES["resnet20"](), 0.2), (1, 3, 32, 32), where="resnet20")
    proto = export_model(model, ExportConfig(3, mode="baked", seed=2)).proto
    producer = {o: n for n in proto.graph.node for o in n.output}
    per_channel = [n for n in proto.graph.node if n.op_type in ("BatchNormalization", "Add", "Relu")
                   and producer.get(n.input[0]) is not None]
    assert len(per_channel) > 40
    assert not [n for n in per_channel if any(producer[x].op_type == "Reshape" for x in n.input if x in producer)]
    x = np.random.default_rng(1).random((2, 3, 32, 32), dtype=np.float32)
    ref = predictive_from_logits(sample_logits(model, x, 3, seed=2))
    for got, want in zip(_run(proto, x), (ref.probs, ref.entropy, ref.mutual_info), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)  # float32 round-off through 20 layers (fp64 reference)
