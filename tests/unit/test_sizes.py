"""Deployed bytes (edgebnn.exporters.sizes) of real exports: the breakdown is exact, codes are where the integer
weights are, inputs tell self-contained graphs from host-noise ones, and export/inspect/search report them."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn import ir
from edgebnn.cli import main
from edgebnn.errors import InvalidArtifactError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import save_onnx
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import read_metadata
from edgebnn.exporters.sizes import CATEGORIES, classify, deployed_bytes
from edgebnn.ir.encodings.packing import bits_for
from edgebnn.passes import float_bnn_bytes, lower

S = 4


@pytest.fixture(scope="module")
def models():
    base = synthetic_cnn()
    return {"float": base, "fixed": lower(base, "fixed", seed=0).model}


def n_bayesian(model):
    return sum(w.encoding.size for w in model.encoded_weights())


EXPORTS = [
    ("float", {"mode": "baked"}),
    ("float", {"mode": "noise"}),
    ("float", {"mode": "analytic"}),
    ("fixed", {"mode": "baked", "weights": "int8", "form": "qdq"}),
    ("fixed", {"mode": "baked", "weights": "int8", "form": "integer"}),
    ("fixed", {"mode": "baked", "weights": "int8", "form": "folded"}),
]


@pytest.mark.parametrize(("name", "kw"), EXPORTS, ids=[f"{n}-{'-'.join(kw.values())}" for n, kw in EXPORTS])
def test_breakdown_sums_to_the_file_bytes(models, name, kw, tmp_path):
    proto = export_model(models[name], ExportConfig(S, seed=0, **{"rng": "host", **kw})).proto
    path = save_onnx(proto, tmp_path / "m.onnx")
    size = deployed_bytes(path)
    assert size.file_bytes == path.stat().st_size
    assert sum(size.breakdown.values()) == size.file_bytes
    assert all(size.breakdown[c] >= 0 for c in CATEGORIES)
    # The same split from the model in memory and from the file's bytes.
    assert deployed_bytes(proto).breakdown == size.breakdown == deployed_bytes(path.read_bytes()).breakdown


def test_int8_qdq_stores_codes_and_fp32_stores_none(models):
    n = n_bayesian(models["fixed"])
    qdq = deployed_bytes(export_model(models["fixed"], ExportConfig(S, mode="baked", seed=0, weights="int8",
                                                                    form="qdq")).proto)
    # S int8 members: one byte per member weight at least (plus names and dims), and their per-channel scales.
    assert qdq.codes >= S * n and qdq.tables > 0
    assert qdq.float_weights < 4 * S * n / 4  # only biases and BatchNorm stay float
    fp32 = deployed_bytes(export_model(models["float"], ExportConfig(S, mode="baked", seed=0)).proto)
    assert fp32.codes == 0 and fp32.tables == 0
    assert fp32.float_weights >= 4 * S * n  # S fp32 members: four bytes per member weight
    # Folded int8 is written as fp32 constants: no codes reach the file.
    folded = deployed_bytes(export_model(models["fixed"], ExportConfig(S, mode="baked", seed=0, weights="int8",
                                                                       form="folded")).proto)
    assert folded.codes == 0 and folded.float_weights >= 4 * S * n


def test_integer_form_scale_is_a_table(models):
    proto = export_model(models["fixed"], ExportConfig(S, mode="baked", seed=0, weights="int8", form="integer")).proto
    classes = classify(proto.graph)
    consumers = {x: n.op_type for n in proto.graph.node for x in n.input}
    codes = [name for name, c in classes.items() if c == "codes"]
    assert codes and all(consumers[c] == "MatMulInteger" for c in codes)
    # The per-output-channel weight scale multiplied into the integer product is a table, the bias is not.
    assert any(c == "tables" for c in classes.values())
    assert all(classes[t.name] != "tables" for t in proto.graph.initializer if t.name.endswith("/b"))


def test_inputs_noise_against_analytic(models):
    noise = export_model(models["float"], ExportConfig(S, mode="noise", rng="host")).proto
    size = deployed_bytes(noise)
    meta = read_metadata(noise, "noise")
    assert len(size.inputs) == 1 + len(meta.noise_inputs) > 1
    assert size.data_input == meta.input_name and not size.self_contained
    assert set(size.noise_inputs) == {r["name"] for r in meta.noise_inputs}
    analytic = export_model(models["float"], ExportConfig(S, mode="analytic")).proto
    size = deployed_bytes(analytic)
    assert size.inputs == (meta.input_name,) and size.self_contained
    # Self-contained means it runs on the data alone in a plain onnxruntime session.
    sess = ort.InferenceSession(analytic.SerializeToString(), providers=["CPUExecutionProvider"])
    probs = sess.run(["probs"], {meta.input_name: np.zeros((2, 1, 6, 6), np.float32)})[0]
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)  # fp32 softmax sums to 1 within rounding


def test_ratios_come_from_the_export_metadata(models, tmp_path):
    model = models["fixed"]
    ebnn = ir.save(model, tmp_path / "m.ebnn")
    path = save_onnx(export_model(model, ExportConfig(S, mode="baked", seed=0, weights="int8", form="qdq")).proto,
                     tmp_path / "m.onnx")
    size = deployed_bytes(path)
    assert size.float_bnn_bytes == float_bnn_bytes(model)
    assert size.ebnn_bytes == ebnn.stat().st_size
    assert math.isclose(size.ratio_float_bnn, float_bnn_bytes(model) / path.stat().st_size)
    assert math.isclose(size.ratio_ebnn, ebnn.stat().st_size / path.stat().st_size)


def test_shared_codebook_indices_are_codes_and_the_codebook_a_table():
    model = lower(synthetic_linear(n_in=64, classes=40), "codebook", seed=0, sampling="shared",
                  min_cluster_size=2).model
    proto = export_model(model, ExportConfig(S, mode="shared", seed=0, rng="host")).proto
    size = deployed_bytes(proto)
    classes = classify(proto.graph)
    dtypes = {t.name: t.data_type for t in proto.graph.initializer}
    indices = [n for n, c in classes.items() if c == "codes" and dtypes[n] == onnx.TensorProto.UINT8]
    assert indices, classes
    codebook = next(w for w in model.encoded_weights() if w.encoding.op_type == "CodebookWeight")
    # One index per inlier weight, packed at ceil(log2 K) bits (the codebook store): the codes hold at least that.
    enc = codebook.encoding
    assert size.codes >= enc.indices.size * bits_for(enc.k) // 8 and size.tables > 0
    assert sum(size.breakdown.values()) == size.file_bytes


def test_a_plain_onnx_and_a_file_that_is_not_onnx(models, tmp_path):
    plain = models["float"].float_model()  # no export metadata: no ratios, the split still holds
    size = deployed_bytes(plain)
    assert size.float_bnn_bytes is None and size.ratio_float_bnn is None
    assert sum(size.breakdown.values()) == size.file_bytes == plain.ByteSize()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\xff not a protobuf")
    with pytest.raises(InvalidArtifactError, match=r"bad\.onnx: not an ONNX file"):
        deployed_bytes(bad)
    with pytest.raises(InvalidArtifactError, match="no such file"):
        deployed_bytes(tmp_path / "missing.onnx")


def test_cli_export_and_inspect_print_and_write_deployed(models, tmp_path):
    ebnn = ir.save(models["fixed"], tmp_path / "m.ebnn")
    out, report = tmp_path / "m.onnx", tmp_path / "export.json"
    r = CliRunner().invoke(main, ["export", str(ebnn), "-S", str(S), "--weights", "int8", "--form", "qdq",
                                  "-o", str(out), "--json", str(report)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    for text in ("deployed", "fp32 BNN", ".ebnn", "codes", "scales and tables", "float weights", "self-contained"):
        assert text in r.output
    body = json.loads(report.read_text())
    assert body["schema"] == "edgebnn.export/1" and body["edgebnn_version"]
    deployed = body["deployed"]
    assert deployed["file_bytes"] == out.stat().st_size == sum(deployed["breakdown"].values())
    assert deployed["breakdown"]["codes"] > 0 and deployed["inputs"] == 1 and deployed["self_contained"]
    assert deployed["ebnn_bytes"] == ebnn.stat().st_size
    assert body["export"]["float_bnn_bytes"] == deployed["float_bnn_bytes"] == float_bnn_bytes(models["fixed"])

    r = CliRunner().invoke(main, ["inspect", str(out), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["schema"] == "edgebnn.inspect/1" and info["edgebnn_version"]
    assert info["deployed"] == deployed
    r = CliRunner().invoke(main, ["inspect", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "than the fp32 BNN" in r.output and "scales and tables" in r.output


def test_search_objective_is_the_deployed_file(models, tmp_path):
    from edgebnn.api import export
    from edgebnn.search.objectives import OBJECTIVES
    from edgebnn.search.space import TrialConfig
    from edgebnn.search.trial import TrialJob, evaluate_trial

    model = ir.save(models["float"], tmp_path / "cnn.ebnn")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "val.npz", x=rng.normal(0, 1, (16, 1, 6, 6)).astype(np.float32), y=rng.integers(0, 3, 16))
    config = TrialConfig(scheme="fixed", bits="4", sigma_bits=1, samples=S, mode="baked", weights="int8", hoist="off")
    job = TrialJob(number=0, config=config, model=str(model), data=str(tmp_path / "val.npz"), ood_data=None,
                   seed=3, device="cpu", runs=0)
    result, onnx_bytes = evaluate_trial(job)
    assert result["state"] == "complete", result["error"]
    # The same config exported by the API: the file the trial would deploy, byte for byte.
    lowered = lower(ir.load(model), "fixed", seed=3, bits=4, sigma_bits=1).model
    path = export(lowered, tmp_path / "trial.onnx", samples=S, mode="baked", weights="int8", seed=3, device="cpu")
    assert result["bytes"] == path.stat().st_size == len(onnx_bytes) == OBJECTIVES["bytes"].value(result)
    assert result["ir_bytes"] == OBJECTIVES["ir_bytes"].value(result) != result["bytes"]
    assert result["deployed"]["file_bytes"] == result["bytes"]
    assert math.isclose(result["compression_ratio"], float_bnn_bytes(models["float"]) / result["bytes"])


def test_lower_budget_reports_ir_and_deployed_bytes(models, tmp_path):
    from edgebnn.api import lower as api_lower
    from edgebnn.budget import budget_sizes

    lowered = api_lower(models["float"], "fixed", seed=0)
    sizes = budget_sizes(lowered)
    report = lowered.lowering_report
    assert sizes["ir_bytes"] == report["total_bytes"] and sizes["ebnn_bytes"] == report["ebnn_bytes"]
    # The deployed figure is the file `edgebnn export model.ebnn -o m.onnx` writes (its defaults: S=16, cpu).
    from edgebnn.api import export

    path = export(lowered, tmp_path / "default.onnx", samples=16, device="cpu")
    assert sizes["deployed"]["file_bytes"] == path.stat().st_size
    assert sizes["export"]["samples"] == 16 and sizes["export"]["mode"] == "noise" == read_metadata(
        onnx.load(str(path)), "default").mode


def test_a_store_it_does_not_name_is_classified_by_its_data_flow():
    """Integer counts x a per-row scale, σ levels gathered by uint8 codes, ε drawn in the graph: the stores the
    compact exports write, built by hand (no edgebnn exporter names them)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-7, 8, (4, 8)).astype(np.int8), "counts"),
             numpy_helper.from_array(np.full((4, 1), 0.05, np.float32), "scale"),
             numpy_helper.from_array(rng.integers(0, 4, (4, 8)).astype(np.uint8), "sigma_codes"),
             numpy_helper.from_array(np.array([0.0, 0.01, 0.02, 0.04], np.float32), "sigma_levels"),
             numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "bias")]
    nodes = [helper.make_node("Cast", ["counts"], ["counts_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["counts_f", "scale"], ["mu"]),
             helper.make_node("Cast", ["sigma_codes"], ["idx"], to=TensorProto.INT32),
             helper.make_node("Gather", ["sigma_levels", "idx"], ["sigma"]),
             helper.make_node("RandomNormalLike", ["sigma"], ["eps"], seed=1.0),
             helper.make_node("Mul", ["sigma", "eps"], ["noise"]),
             helper.make_node("Add", ["mu", "noise"], ["w"]),
             helper.make_node("Gemm", ["x", "w", "bias"], ["probs"], transB=1)]
    graph = helper.make_graph(nodes, "store", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 4])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 10
    onnx.checker.check_model(proto)
    ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.ones((1, 8), np.float32)})  # a valid graph that runs on the data alone
    assert classify(proto.graph) == {"counts": "codes", "scale": "tables", "sigma_codes": "codes",
                                     "sigma_levels": "tables", "bias": "float_weights"}
    size = deployed_bytes(proto)
    assert size.self_contained and sum(size.breakdown.values()) == size.file_bytes


@pytest.mark.parametrize("bad", [-1, "12", 1.5, True])
def test_a_tampered_size_in_the_metadata_is_one_line(models, bad):
    from edgebnn.exporters.metadata import EXPORT_KEY

    proto = export_model(models["float"], ExportConfig(S, mode="analytic")).proto
    entry = next(p for p in proto.metadata_props if p.key == EXPORT_KEY)
    entry.value = json.dumps({**json.loads(entry.value), "float_bnn_bytes": bad})
    with pytest.raises(InvalidArtifactError, match=r"float_bnn_bytes .* is not a non-negative integer"):
        read_metadata(proto, "m.onnx")
    # deployed_bytes still measures such a file; it only has no ratio to the fp32 BNN.
    size = deployed_bytes(proto)
    assert size.float_bnn_bytes is None and sum(size.breakdown.values()) == size.file_bytes
