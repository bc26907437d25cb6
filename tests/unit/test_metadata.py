"""The ``edgebnn.export`` metadata: one writer, one reader, and what the reader refuses."""

from __future__ import annotations

import dataclasses
import json

import onnx
import pytest
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn import ir
from edgebnn.errors import InvalidArtifactError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import float_bnn, float_deterministic
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import EXPORT_KEY, ExportMetadata, read_metadata, write_metadata
from edgebnn.passes import lower

FORMS = [("baked", {}), ("baked", {"weights": "int8", "hoist": "auto"}), ("noise", {"noise": "local"}),
         ("analytic", {})]


def _entry(proto: onnx.ModelProto) -> str:
    (text,) = [p.value for p in proto.metadata_props if p.key == EXPORT_KEY]
    return text


@pytest.mark.parametrize(("mode", "kw"), FORMS, ids=[f"{m}-{','.join(kw)}" for m, kw in FORMS])
def test_every_export_reads_back_to_the_bytes_written(mode, kw) -> None:
    proto = export_model(synthetic_cnn(), ExportConfig(4, mode=mode, seed=5, **{"rng": "host", **kw})).proto
    meta = read_metadata(proto, "m.onnx")
    assert [p.key for p in proto.metadata_props] == [EXPORT_KEY]  # the IR manifest is not carried over
    assert meta.to_json() == _entry(proto) == json.dumps(json.loads(_entry(proto)), sort_keys=True)
    assert meta.mode == mode and meta.samples == 4 and meta.input_shape == (1, 1, 6, 6)
    assert meta.outputs == ("probs", "entropy", "mutual_info") and not meta.is_baseline
    assert (meta.seed == 5) == (mode == "baked")
    assert (meta.noise_inputs is not None) == (mode == "noise")
    assert (meta.quadrature is not None) == (mode == "analytic")


def test_shared_mode_and_baselines_read_back() -> None:
    big = synthetic_linear(n_in=128, classes=8, sigma=0.2)  # big enough to cluster
    codebook = lower(big, "codebook", sampling="shared").model
    shared = read_metadata(export_model(codebook, ExportConfig(2, mode="shared", rng="host")).proto, "s.onnx")
    assert shared.mode == "shared" and shared.noise == "shared" and shared.scheme == "codebook"
    for build in (float_deterministic, float_bnn):
        meta = read_metadata(build(synthetic_cnn()), "f.onnx")
        assert meta.is_baseline and meta.outputs == ("probs",) and meta.samples == 1


def test_writer_replaces_in_place_and_keeps_other_entries() -> None:
    proto = export_model(synthetic_cnn(), ExportConfig(2, mode="baked")).proto
    meta = read_metadata(proto, "m.onnx")
    first = proto.metadata_props.add()
    first.key, first.value = "onnx.quant.pre_process", "onnxruntime"
    proto.metadata_props.add().key = ir.MANIFEST_KEY
    calibrated = dataclasses.replace(meta, precision="int8", calibration={"method": "entropy"})
    write_metadata(proto, calibrated)
    assert [(p.key, p.value) for p in proto.metadata_props] == [
        (EXPORT_KEY, calibrated.to_json()), ("onnx.quant.pre_process", "onnxruntime")]
    assert read_metadata(proto, "m.onnx") == calibrated


def _tampered(edit) -> onnx.ModelProto:
    proto = export_model(synthetic_cnn(), ExportConfig(2, mode="baked")).proto
    raw = json.loads(_entry(proto))
    out = edit(raw)
    proto.metadata_props[0].value = out if isinstance(out, str) else json.dumps(raw if out is None else out)
    return proto


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: [m], "must be a JSON object, got a list"),
        (lambda m: "null", "must be a JSON object, got null"),
        (lambda m: m.pop("input_shape") and None, "has no input_shape"),
        (lambda m: m.pop("outputs") and None, "has no outputs"),
        (lambda m: m.update(samples=True), "samples true is not a positive integer"),
        (lambda m: m.update(samples=0), "samples 0 is not a positive integer"),
        (lambda m: m.update(seed="0"), 'seed "0" is not null or a non-negative integer'),
        (lambda m: m.update(input_shape=[1, 1, 6, -6]), "is not a list of at least 2 positive integers"),
        (lambda m: m.update(input_shape=[1, 1, 6, 7]), "input_shape [1, 1, 6, 7] does not fit the graph input"),
        (lambda m: m.update(num_classes=2.5), "num_classes 2.5 is not a positive integer"),
        (lambda m: m.update(scheme=""), 'scheme "" is not a non-empty string'),
        (lambda m: m.update(weights=None) or m.update(layers={"sampled": ["conv"]}), "layers"),
        (lambda m: m.update(outputs=["probs"]), "outputs ['probs'] of a baked graph must be"),
        (lambda m: m.update(outputs=["probs", "entropy", "mi"]), "are not all graph outputs"),
        (lambda m: m.update(noise="loud"), 'noise "loud" is not one of auto'),
        (lambda m: m.update(weights="int3"), 'weights "int3" is not one of fp32, int8, int4'),
        (lambda m: m.update(calibration={"method": 3}), "calibration"),
        (lambda m: m.update(noise_inputs=[{"name": "n", "shape": [-1, 2], "per": "pixel"}]), "noise_inputs"),
        (lambda m: json.dumps(m)[:-1] + ', "seed": 1}', "has the key 'seed' twice"),
        (lambda m: json.dumps(m)[:10], "is not valid JSON"),
        (lambda m: '{"samples": ' + "9" * 5000 + "}", "is not valid JSON"),
    ],
)
def test_reader_refuses_tampered_metadata_naming_the_file(edit, needle) -> None:
    with pytest.raises(InvalidArtifactError) as e:
        read_metadata(_tampered(edit), "bad.onnx")
    assert str(e.value).startswith("bad.onnx: ") and needle in str(e.value) and "\n" not in str(e.value)


def test_reader_needs_exactly_one_entry() -> None:
    proto = export_model(synthetic_cnn(), ExportConfig(2, mode="baked")).proto
    proto.metadata_props.add().CopyFrom(proto.metadata_props[0])
    with pytest.raises(InvalidArtifactError, match=r"bad\.onnx: 2 edgebnn\.export metadata entries"):
        read_metadata(proto, "bad.onnx")
    del proto.metadata_props[:]
    with pytest.raises(InvalidArtifactError, match=r"bad.onnx: not exported by edgebnn \(no edgebnn.export"):
        read_metadata(proto, "bad.onnx")


def test_describe_matches_the_manifest() -> None:
    model = synthetic_cnn()
    meta = ExportMetadata.describe(model, mode="float_bnn", samples=1, seed=None)
    m = model.manifest
    assert (meta.scheme, meta.source_library, meta.input_name, list(meta.input_shape), meta.num_classes) == (
        m.scheme, m.source_library, m.input_name, m.input_shape, m.num_classes)
    assert "weights" not in meta.to_dict() and meta.to_dict()["seed"] is None  # unset optionals are left out
