"""IR container, verifier and .ebnn serialization."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from synthetic import synthetic_cnn

from edgebnn import ir
from edgebnn.errors import ArtifactWriteError, InvalidArtifactError


def test_encoded_weights_decode_in_graph_order(cnn_ir):
    names = [w.name for w in cnn_ir.encoded_weights()]
    assert names == ["conv.weight", "conv.bias", "fc.weight"]
    w = cnn_ir.encoded_weights()[0]
    assert w.layer == "conv" and w.encoding.shape == (4, 1, 3, 3)


def test_save_load_round_trip_is_byte_identical(cnn_ir, tmp_path):
    a, b = tmp_path / "a.ebnn", tmp_path / "b.ebnn"
    ir.save(cnn_ir, a)
    loaded = ir.load(a)
    ir.save(loaded, b)
    assert a.read_bytes() == b.read_bytes()
    assert loaded.manifest == cnn_ir.manifest
    for x, y in zip(loaded.encoded_weights(), cnn_ir.encoded_weights(), strict=True):
        np.testing.assert_array_equal(x.encoding.mean(), y.encoding.mean())
        np.testing.assert_array_equal(x.encoding.stddev(), y.encoding.stddev())


def test_piecewise_save_and_size_match_protobuf(cnn_ir, tmp_path):
    cnn_ir.proto.doc_string = "fields before and after the graph"
    cnn_ir.proto.graph.doc_string = "fields before and after the initializers"
    path = ir.save(cnn_ir, tmp_path / "m.ebnn")
    assert path.read_bytes() == ir.to_bytes(cnn_ir) == cnn_ir.proto.SerializeToString(deterministic=True)
    assert ir.serialized_size(cnn_ir) == path.stat().st_size


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (field number < 16: a one-byte key)."""
    length = bytearray()
    n = len(payload)
    while n >= 0x80:
        length.append(n & 0x7F | 0x80)
        n >>= 7
    length.append(n)
    return bytes([number << 3 | 2]) + bytes(length) + payload


def test_piecewise_load_parses_as_protobuf_does(cnn_ir, tmp_path):
    # a file edgebnn would not write: the graph in two fields (merged), the model's other fields first, and a
    # field protobuf does not know (kept): loading it piece by piece gives what parsing it whole gives
    data = ir.to_bytes(cnn_ir)
    model = onnx.ModelProto.FromString(data)
    graph = model.graph
    first, second = onnx.GraphProto(), onnx.GraphProto()
    first.name = graph.name
    first.node.extend(graph.node)
    first.initializer.extend(graph.initializer[:2])
    second.initializer.extend(graph.initializer[2:])
    second.input.extend(graph.input)
    second.output.extend(graph.output)
    model.ClearField("graph")
    unknown = _field(15, b"from a future onnx")
    mixed = (model.SerializeToString() + _field(7, first.SerializeToString()) + unknown
             + _field(7, second.SerializeToString()))
    path = tmp_path / "mixed.ebnn"
    path.write_bytes(mixed)
    loaded = ir.load(path)
    assert loaded.proto.SerializeToString() == onnx.ModelProto.FromString(mixed).SerializeToString()
    assert [t.name for t in loaded.proto.graph.initializer] == [t.name for t in cnn_ir.proto.graph.initializer]


def test_same_model_gives_same_bytes():
    assert ir.to_bytes(synthetic_cnn(seed=1)) == ir.to_bytes(synthetic_cnn(seed=1))
    assert ir.to_bytes(synthetic_cnn(seed=1)) != ir.to_bytes(synthetic_cnn(seed=2))


def test_manifest_records_versions(cnn_ir, tmp_path):
    ir.save(cnn_ir, tmp_path / "m.ebnn")
    proto = onnx.load(str(tmp_path / "m.ebnn"))
    manifest = json.loads({p.key: p.value for p in proto.metadata_props}[ir.MANIFEST_KEY])
    assert manifest["format_version"] == ir.FORMAT_VERSION
    assert manifest["edgebnn_version"]
    assert proto.ir_version <= 10


def _with_initializer(model, name, value):
    for t in model.proto.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(value, name))
            return model
    raise KeyError(name)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: _with_initializer(m, "conv.weight.sigma", np.full((4, 1, 3, 3), np.nan, np.float32)), "NaN"),
        (lambda m: _with_initializer(m, "conv.weight.sigma", np.full((4, 1, 3, 3), -1.0, np.float32)), "negative"),
        (lambda m: _with_initializer(m, "fc.weight.mu", np.zeros((3, 35), np.float32)), "shape"),
        (lambda m: _with_initializer(m, "conv.bias.mu", np.full(4, np.inf, np.float32)), "NaN or inf"),
    ],
)
def test_verifier_names_the_layer(cnn_ir, mutate, message):
    with pytest.raises(InvalidArtifactError, match=message) as e:
        ir.verify(mutate(cnn_ir))
    assert "layer '" in str(e.value)


def test_verifier_rejects_dangling_initializer(cnn_ir):
    cnn_ir.proto.graph.initializer.append(numpy_helper.from_array(np.zeros(3, np.float32), "orphan"))
    with pytest.raises(InvalidArtifactError, match="orphan"):
        ir.verify(cnn_ir)


def test_verifier_rejects_unknown_encoding(cnn_ir):
    cnn_ir.proto.graph.node[0].op_type = "MysteryWeight"
    with pytest.raises(InvalidArtifactError, match="unknown encoding 'MysteryWeight'"):
        ir.verify(cnn_ir)


def test_verifier_rejects_new_ir_version(cnn_ir):
    cnn_ir.proto.ir_version = 14
    with pytest.raises(InvalidArtifactError, match="ir_version 14"):
        ir.verify(cnn_ir)


def test_future_format_version_is_refused(cnn_ir):
    data = ir.to_bytes(cnn_ir)
    proto = onnx.load_from_string(data)
    for p in proto.metadata_props:
        if p.key == ir.MANIFEST_KEY:
            man = json.loads(p.value)
            man["format_version"] = ir.FORMAT_VERSION + 1
            p.value = json.dumps(man)
    with pytest.raises(InvalidArtifactError, match="newer edgebnn"):
        ir.from_bytes(proto.SerializeToString(), "future.ebnn")


def test_declared_size_larger_than_data_is_refused_before_decoding(cnn_ir):
    proto = onnx.load_from_string(ir.to_bytes(cnn_ir))
    t = next(t for t in proto.graph.initializer if t.name == "fc.weight.mu")
    del t.dims[:]
    t.dims.extend([1 << 20, 1 << 20])  # claims 4 TiB, stores 432 bytes
    with pytest.raises(InvalidArtifactError, match="declares"):
        ir.from_bytes(proto.SerializeToString(), "huge.ebnn")


def test_external_data_is_never_followed(cnn_ir):
    proto = onnx.load_from_string(ir.to_bytes(cnn_ir))
    t = next(t for t in proto.graph.initializer if t.name == "fc.weight.mu")
    t.ClearField("raw_data")
    t.data_location = onnx.TensorProto.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", "/etc/passwd"
    with pytest.raises(InvalidArtifactError, match="external data"):
        ir.from_bytes(proto.SerializeToString(), "ext.ebnn")


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "empty"), (b"\x00\x01garbage\xff" * 10, "not an .ebnn"), (None, "no such file")],
)
def test_load_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.ebnn"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InvalidArtifactError, match=message) as e:
        ir.load(path)
    assert str(path) in str(e.value)


def test_truncated_file_is_refused(cnn_ir, tmp_path):
    data = ir.to_bytes(cnn_ir)
    path = tmp_path / "trunc.ebnn"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidArtifactError):
        ir.load(path)


def test_failed_write_keeps_previous_artifact(cnn_ir, tmp_path, monkeypatch):
    path = tmp_path / "m.ebnn"
    ir.save(cnn_ir, path)
    before = path.read_bytes()

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(ArtifactWriteError, match="No space left"):
        ir.save(synthetic_cnn(seed=5), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.ebnn"]  # no temp file left behind


def test_missing_output_directory(cnn_ir, tmp_path):
    with pytest.raises(ArtifactWriteError, match="does not exist"):
        ir.save(cnn_ir, tmp_path / "nope" / "m.ebnn")
