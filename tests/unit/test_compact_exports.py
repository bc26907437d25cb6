"""Every export mode with compact stores (tests/unit/stores/ tests each store): lowered models exported with the
IR's own encoding compute what their fp32-store twins compute, sample the reference runtime's predictive, load
in onnxruntime with no warning, and are smaller."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import read_metadata
from edgebnn.metrics import predictive_from_logits
from edgebnn.passes import lower
from edgebnn.runtime import Session
from edgebnn.runtime.reference import sample_logits

REF_SAMPLES = 4096


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(1).normal(size=(5, 1, 6, 6)).astype(np.float32)


def _load_quietly(proto: onnx.ModelProto, capfd: pytest.CaptureFixture[str]) -> ort.InferenceSession:
    """onnx.checker (full) and an onnxruntime session that logs no warning."""
    onnx.checker.check_model(proto, full_check=True)
    capfd.readouterr()
    opts = ort.SessionOptions()
    opts.log_severity_level = 2  # warnings and errors
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    assert "W:" not in capfd.readouterr().err
    return sess


@pytest.mark.parametrize("scheme", ["fixed", "ternary", "mcq", "prune+fixed", "codebook"])
@pytest.mark.parametrize("mode", ["noise", "analytic"])
def test_the_irs_encoding_computes_what_fp32_moments_compute(scheme, mode, x, capfd):
    """Same noise (Session seed), same predictive: the decode is exact (σ² as the same float32 product). analytic's
    s² + μ² is float32 in the graph (float64 then rounded in the fp32 store): float32 round-off of a sum."""
    model = lower(synthetic_cnn(sigma=0.3), scheme, seed=0).model
    compact, fp32 = (export_model(model, ExportConfig(8, mode=mode, weights=w,
                                                      rng="host")).proto for w in ("ir", "fp32"))
    _load_quietly(compact, capfd)
    stores = read_metadata(compact, "compact.onnx").stores
    assert stores and set(stores) <= {w.encoding.op_type for w in model.encoded_weights()} | {"float"}
    a, b = (Session(p, seed=3).predict(x) for p in (compact, fp32))
    np.testing.assert_allclose(a.probs, b.probs, atol=1e-6 if mode == "noise" else 1e-5)
    assert compact.ByteSize() < fp32.ByteSize()


def _mc_bound(n_draws: int, entries: int) -> float:
    # a probability from n independent draws has sd <= 0.5/sqrt(n); two estimates compared over ``entries``
    # (row, class) pairs: 4 standard deviations of the difference (x sqrt(entries / 15) beyond 15 entries)
    return 4 * 0.5 * np.sqrt(2 / n_draws) * max(1.0, np.sqrt(entries / 15))


def test_in_graph_noise_runs_on_the_data_alone_and_samples_the_reference(x, capfd):
    model = lower(synthetic_cnn(sigma=0.3), "fixed", seed=0).model
    ref = predictive_from_logits(sample_logits(model, x, REF_SAMPLES, seed=5)).probs
    proto = export_model(model, ExportConfig(64, mode="noise", rng="graph", seed=11)).proto
    sess = _load_quietly(proto, capfd)
    assert [i.name for i in sess.get_inputs()] == ["input"]  # one graph input: the data
    assert read_metadata(proto, "g.onnx").rng == "graph"
    calls = [sess.run(["probs"], {"input": x})[0] for _ in range(64)]
    assert not np.array_equal(calls[0], calls[1])  # fresh noise every call (the generator advances)
    assert np.abs(np.mean(calls, axis=0) - ref).max() < _mc_bound(min(64 * 64, REF_SAMPLES), ref.size)
    # Session runs it as any export (no noise inputs to fill)
    assert Session(proto).predict(x).probs.shape == ref.shape


def test_in_graph_noise_local_and_weight_draws_and_compact_stores_together(x):
    """auto draws Conv weights per sample (RandomNormal [S, *w]) and Gemm pre-activations per row
    (RandomNormalLike): both kinds present, one graph input, codes in the file."""
    model = lower(synthetic_cnn(sigma=0.3), "fixed", seed=0).model
    proto = export_model(model, ExportConfig(16, mode="noise", rng="graph")).proto
    ops = {n.op_type for n in proto.graph.node}
    assert {"RandomNormal", "RandomNormalLike"} <= ops and len(proto.graph.input) == 1


def test_tensorrt_devices_default_to_host_noise_and_rtx_takes_the_codes():
    """TensorRT ignores random ops' seeds: auto is host noise there (--rng graph builds, unseeded: see
    tests/integration/test_tensorrt_rtx.py). TensorRT-RTX builds the stores' decodes, so rtx gets the IR's codes;
    Jetson's TensorRT 10.3 (unverified) the float store."""
    model = lower(synthetic_cnn(), "fixed", seed=0).model
    for device in ("rtx", "jetson"):
        proto = export_model(model, ExportConfig(4, mode="noise", rng="auto", device=device)).proto
        assert not [n for n in proto.graph.node if n.op_type.startswith("Random")]
    assert read_metadata(export_model(model, ExportConfig(4, mode="noise", device="jetson", rng="host")).proto,
                         "t.onnx").stores is None
    assert "FixedPointWeight" in (read_metadata(export_model(model, ExportConfig(4, mode="noise", device="rtx",
                                                                                 rng="host")).proto, "t.onnx").stores
                                  or {})
    assert export_model(model, ExportConfig(4, mode="noise", rng="graph", device="jetson")).proto.graph.input[1:] == []
    assert export_model(model, ExportConfig(4, mode="noise",
                                            rng="auto")).proto.graph.input[1:] == []  # no device: in the graph


def test_baked_int4_on_onnxruntime_is_about_the_fp32_posteriors_size_and_exact_on_a_grid(capfd):
    """16 members x 4 bits = μ + σ x 32 bits: the file is within 5% of the fp32 posterior's bytes (scales per
    output channel shared by the members, int8 member biases, the graph). Binary draws (±a, a 2-bit grid) are
    stored exactly: the int4 graph's probabilities equal the fp32 members' to float32 round-off of the biases'
    int8 step (the biases are fixed point with noise: no grid)."""
    model = lower(synthetic_linear(n_in=256, classes=32), "binary", seed=0).model
    posterior = sum(w.encoding.size for w in model.encoded_weights()) * 8
    int4 = export_model(model, ExportConfig(16, mode="baked", weights="int4", form="qdq", device="cpu")).proto
    _load_quietly(int4, capfd)
    assert int4.ByteSize() <= 1.05 * posterior
    assert read_metadata(int4, "b.onnx").weights == "int4"
    xl = np.random.default_rng(0).normal(size=(6, 256)).astype(np.float32)
    fp32 = export_model(model, ExportConfig(16, mode="baked")).proto
    p4, p32 = (Session(p).predict(xl).probs for p in (int4, fp32))
    # each bias moves by at most max|b| / 254 (int8, one scale per channel): logits move by that much
    np.testing.assert_allclose(p4, p32, atol=0.01)


def test_a_folded_baked_export_names_its_compact_alternative():
    model = lower(synthetic_cnn(), "fixed", seed=0).model
    meta = read_metadata(export_model(model, ExportConfig(4, mode="baked", weights="int8", device="cpu")).proto,
                         "f.onnx")
    assert meta.form in ("folded", "integer") and meta.compact is not None and "--form qdq" in meta.compact


def test_shared_codebook_draws_read_the_packed_indices():
    """--mode shared (2DGBNN): the indices are the IR's B-bit stream unpacked in the graph (uint8 per weight
    with --weights fp32): the same draws from the same noise, in fewer bytes, and in-graph noise works too."""
    model = lower(synthetic_linear(n_in=128, classes=8, sigma=0.2), "codebook", seed=0, sampling="shared").model
    xl = np.random.default_rng(4).normal(size=(6, 128)).astype(np.float32)
    compact, fp32 = (export_model(model, ExportConfig(8, mode="shared", weights=w,
                                                      rng="host")).proto for w in ("ir", "fp32"))
    np.testing.assert_array_equal(Session(compact, seed=3).predict(xl).probs, Session(fp32, seed=3).predict(xl).probs)
    assert compact.ByteSize() < fp32.ByteSize()
    assert "CodebookWeight" in (read_metadata(compact, "s.onnx").stores or {})
    graph_rng = export_model(model, ExportConfig(8, mode="shared", rng="graph")).proto
    assert len(graph_rng.graph.input) == 1 and Session(graph_rng).predict(xl).probs.shape == (6, 8)


def test_one_device_table_answers_formats_decodes_and_random_ops():
    """edgebnn.devices is the table: forms.DEVICE_FORMATS is a view of it (they disagreed about int4 on Orin)."""
    from edgebnn.devices import export_device
    from edgebnn.exporters.forms import DEVICE_FORMATS

    for name, (runtime, formats) in DEVICE_FORMATS.items():
        profile = export_device(name)
        assert (runtime, formats) == (profile.runtime, profile.weight_formats)
        assert profile.random_ops == (not profile.on_tensorrt)
        assert profile.decodes == (profile.builder != "tensorrt")  # onnxruntime, and TensorRT-RTX (built here)
    assert "int4" not in DEVICE_FORMATS["jetson-agx-orin"][1]  # TensorRT 10.3 does not parse int4 DequantizeLinear
    assert export_device("arm64").name == "cpu"
    model = lower(synthetic_cnn(), "fixed", seed=0).model
    with pytest.raises(InvalidOptionError, match="--weights int4: jetson-orin-nx"):
        export_model(model, ExportConfig(4, mode="baked", weights="int4", device="jetson-orin-nx"))
    with pytest.raises(InvalidOptionError, match="--device tpu"):
        export_model(model, ExportConfig(4, mode="noise", device="tpu", rng="host"))


def test_hoisted_means_of_a_baked_export_are_the_irs_codes():
    """--hoist: a quiet layer runs once with its mean, decoded from the IR's codes (fp32 with --weights fp32)."""
    model = lower(synthetic_linear(n_in=256, classes=32), "fixed", seed=0).model
    xl = np.random.default_rng(0).normal(size=(3, 256)).astype(np.float32)
    compact, fp32 = (export_model(model, ExportConfig(4, mode="baked", seed=2, hoist=10.0,
                                                      weights=w)).proto for w in ("ir", "fp32"))
    assert read_metadata(compact, "h.onnx").layers == {"sampled": [], "hoisted": ["fc"]}
    assert "FixedPointWeight" in (read_metadata(compact, "h.onnx").stores or {})
    np.testing.assert_array_equal(Session(compact).predict(xl).probs, Session(fp32).predict(xl).probs)
    assert compact.ByteSize() < fp32.ByteSize() / 3


def test_the_analytic_quadrature_is_built_in_the_graph_exactly():
    """The [2K, Q·K] quadrature matrix (mostly the identity's zeros) comes from its Q·K points in the graph: the
    same float32 values, signs of zero included."""
    from onnx import TensorProto, helper

    from edgebnn.exporters._graph import Builder
    from edgebnn.exporters.analytic import quadrature_matrix, quadrature_points
    from edgebnn.tasks.classification import _quadrature_in_graph

    for q, k in ((16, 10), (8, 3)):  # Sobol points come in powers of 2
        b = Builder()
        out = _quadrature_in_graph(b, quadrature_points(q, k))
        graph = helper.make_graph(b.nodes, "q", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                                                    [2 * k, q * k])], b.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
        onnx.checker.check_model(model, full_check=True)
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]
        want = quadrature_matrix(q, k)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        if k == 10:  # 12.8 KB of fp32 matrix against the identity, the points and a few shapes
            assert sum(t.ByteSize() for t in b.inits) < want.nbytes / 8


@pytest.mark.parametrize("scheme", ["fixed", "binary", "codebook"])
def test_the_torch_runner_runs_the_decodes(scheme, x):
    """``profile --runtime torch`` interprets exported graphs op by op: the decode ops (integer Div/Mod, Range,
    Split, ScatterElements, Tile) compute what onnxruntime computes."""
    pytest.importorskip("torch")
    from edgebnn.targets.runners import OrtRunner, TorchRunner

    model = lower(synthetic_cnn(), scheme, seed=0).model
    for config in (ExportConfig(4, mode="analytic"), ExportConfig(4, mode="baked", hoist=10.0)):
        proto = export_model(model, config).proto
        want, got = OrtRunner(proto, threads=1).run(x), TorchRunner(proto).run(x)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)  # float32 round-off of the same ops
