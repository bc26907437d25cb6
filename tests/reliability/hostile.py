"""Builders of broken and hostile inputs for the reliability tests (torch-free).

Models come from ``tests/synthetic.py`` (or are built the same way with onnx.helper); a hostile file is a
valid model's protobuf with one thing broken, written with plain bytes so nothing re-verifies it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from synthetic import synthetic_cnn

from edgebnn import _io, ir
from edgebnn.exporters.metadata import EXPORT_KEY
from edgebnn.ir import DOMAIN, BNNModel, GaussianWeight, Manifest, make_encoding_node
from edgebnn.ir.encodings import CodebookWeight


def digits_shaped(seed: int = 0, sigma: float = 0.05) -> BNNModel:
    """input [batch, 1, 8, 8] -> Flatten -> Gemm(GaussianWeight [10, 64], GaussianWeight bias) -> logits [batch, 10].

    Takes sklearn digits, so ``edgebnn eval`` gets past its data-shape check.
    """
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [], "digits_shaped",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
    )
    for name, shape in (("fc.weight", (10, 64)), ("fc.bias", (10,))):
        mu = rng.normal(0, 0.2, shape).astype(np.float32)
        graph.node.append(make_encoding_node(graph, name, "fc", GaussianWeight(mu, np.full(shape, sigma, np.float32))))
    graph.node.extend([
        helper.make_node("Flatten", ["input"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1),
    ])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    manifest = Manifest(source_library="synthetic", input_name="input", input_shape=[1, 1, 8, 8], num_classes=10)
    return BNNModel(proto, manifest, "digits_shaped")


def codebook_cnn() -> BNNModel:
    """``synthetic_cnn`` whose fc.weight [3, 36] is a CodebookWeight: K = 3 entries at 2 bits, one outlier
    (weight 5) and one weight blended over entries 0 and 1 (weight 7)."""
    model = synthetic_cnn()
    weight = next(w for w in model.encoded_weights() if w.name == "fc.weight")
    codebook = np.array([[-0.3, 0.05], [0.0, 0.02], [0.3, 0.05]], np.float32)
    enc = CodebookWeight(
        (3, 36), np.arange(108) % 3, codebook,
        np.array([5], np.uint16), np.array([0.9], np.float32), np.array([0.05], np.float32),
        np.array([7], np.uint16), np.array([[0, 1]], np.uint8), np.array([[1, 1]], np.uint8),
        bits=2,
    )
    model.replace_encoding(weight, enc)
    ir.verify(model)
    return model


# -- editing a model's protobuf --------------------------------------------------------------------------


def proto_of(model: BNNModel) -> onnx.ModelProto:
    """A fresh protobuf of ``model`` with its manifest written in (what ``ir.save`` would write)."""
    proto = onnx.ModelProto()
    proto.ParseFromString(ir.to_bytes(model))
    return proto


def initializer(proto: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(t for t in proto.graph.initializer if t.name == name)


def set_initializer(proto: onnx.ModelProto, name: str, value: np.ndarray) -> onnx.ModelProto:
    initializer(proto, name).CopyFrom(numpy_helper.from_array(np.asarray(value), name))
    return proto


def encoding_node(proto: onnx.ModelProto, weight: str) -> onnx.NodeProto:
    return next(n for n in proto.graph.node if n.domain == DOMAIN and n.output[0] == weight)


def set_attribute(proto: onnx.ModelProto, weight: str, name: str, value: Any) -> onnx.ModelProto:
    node = encoding_node(proto, weight)
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])
    return proto


def set_manifest_text(proto: onnx.ModelProto, text: str) -> onnx.ModelProto:
    entry = next(p for p in proto.metadata_props if p.key == ir.MANIFEST_KEY)
    entry.value = text
    return proto


def edit_manifest(proto: onnx.ModelProto, edit: Callable[[dict[str, Any]], None]) -> onnx.ModelProto:
    entry = next(p for p in proto.metadata_props if p.key == ir.MANIFEST_KEY)
    manifest = json.loads(entry.value)
    edit(manifest)
    entry.value = json.dumps(manifest)
    return proto


def edit_export_metadata(proto: onnx.ModelProto, edit: Callable[[str], str]) -> onnx.ModelProto:
    """Replace the text of an exported model's ``edgebnn.export`` entry with ``edit(text)``."""
    entry = next(p for p in proto.metadata_props if p.key == EXPORT_KEY)
    entry.value = edit(entry.value)
    return proto


def write(path: Path, content: onnx.ModelProto | bytes) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else content.SerializeToString())
    return path


# -- the file system -------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden temp files included) with the sha256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def break_writer(monkeypatch: Any, exc: BaseException) -> None:
    """Make every atomic write fail after a partial write: ``exc`` is raised inside the writer callback."""
    real = _io.atomic_write

    def atomic_write(path: Any, write: Callable[[Any], None]) -> Path:
        def partial(f: Any) -> None:
            f.write(b"half an artifact")
            raise exc

        return real(path, partial)

    monkeypatch.setattr(_io, "atomic_write", atomic_write)


def zero_byte_codebook() -> BNNModel:
    """``synthetic_cnn`` whose fc.weight is a one-entry CodebookWeight at 0 bits: its weights take no bytes."""
    model = synthetic_cnn()
    weight = next(w for w in model.encoded_weights() if w.name == "fc.weight")
    empty_idx, empty_f = np.zeros(0, np.uint16), np.zeros(0, np.float32)
    enc = CodebookWeight(
        (3, 36), np.zeros(108, np.uint8), np.array([[0.0, 0.1]], np.float32), empty_idx, empty_f, empty_f,
        empty_idx, np.zeros((0, 1), np.uint8), np.zeros((0, 1), np.uint8), bits=0,
    )
    model.replace_encoding(weight, enc)
    ir.verify(model)
    return model


def varint(value: int) -> bytes:
    """Protobuf base-128 varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
