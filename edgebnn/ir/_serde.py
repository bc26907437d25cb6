"""Reading and writing ``.ebnn`` files: parse only (protobuf, never pickle), verify, atomic write.

Same model, same bytes: serialization is deterministic (``SerializeToString(deterministic=True)``).
:func:`save` and :func:`serialized_size` produce and count those bytes piece by piece (the model's other
fields, then one initializer at a time), so neither holds a serialized copy of the whole model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

import onnx
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError, Message

from edgebnn import _io
from edgebnn.errors import InvalidArtifactError
from edgebnn.ir._model import MANIFEST_KEY, BNNModel, Manifest, copy_field
from edgebnn.ir._verify import verify

MAX_FILE_BYTES = 2 * 1024**3  # protobuf's own limit


_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number


def to_bytes(model: BNNModel) -> bytes:
    """Serialize deterministically with the manifest written into ``metadata_props``."""
    return _with_manifest(model).SerializeToString(deterministic=True)


def serialized_size(model: BNNModel) -> int:
    """``len(to_bytes(model))``, counted without serializing more than one initializer at a time."""
    layout = _Layout.of(_with_manifest(model))
    return layout.size if layout is not None else int(model.proto.ByteSize())


def save(model: BNNModel, path: str | os.PathLike[str]) -> Path:
    """Verify ``model`` and write :func:`to_bytes`'s bytes atomically to ``path``, one initializer at a time."""
    verify(model)
    proto = _with_manifest(model)
    layout = _Layout.of(proto)
    if layout is None:
        return _io.atomic_write(path, lambda f: f.write(proto.SerializeToString(deterministic=True)))
    return _io.atomic_write(path, layout.write)


def _with_manifest(model: BNNModel) -> onnx.ModelProto:
    """``model.proto`` with the manifest (re)written as the last ``metadata_props`` entry."""
    proto = model.proto
    props = [p for p in proto.metadata_props if p.key != MANIFEST_KEY]
    del proto.metadata_props[:]
    proto.metadata_props.extend(props)
    entry = proto.metadata_props.add()
    entry.key, entry.value = MANIFEST_KEY, model.manifest.to_json()
    return proto


class _Layout:
    """A model's deterministic serialization as ``head + (key, length, tensor) per initializer + tail``.

    Protobuf writes a message's fields in field-number order, so the model's fields before ``graph``, the
    graph's key and length and the graph's fields before ``initializer`` make the head; the graph's fields
    after it and the model's fields after ``graph`` make the tail.
    """

    def __init__(self, proto: onnx.ModelProto) -> None:
        graph = proto.graph
        self.tensors = list(graph.initializer)
        self.sizes = [t.ByteSize() for t in self.tensors]  # each serialized (and freed) on its own
        tensors = sum(len(_key(_INITIALIZER)) + len(_varint(n)) + n for n in self.sizes)
        graph_head, graph_tail = _fields(graph, _INITIALIZER, onnx.GraphProto)
        model_head, model_tail = _fields(proto, _GRAPH, onnx.ModelProto)
        self.head = model_head + _key(_GRAPH) + _varint(len(graph_head) + tensors + len(graph_tail)) + graph_head
        self.tail = graph_tail + model_tail
        self.size = len(self.head) + tensors + len(self.tail)

    @classmethod
    def of(cls, proto: onnx.ModelProto) -> _Layout | None:
        """The layout, or None where splitting could change the bytes (fields protobuf does not know, no graph)."""
        if not proto.HasField("graph") or unknown_fields.UnknownFieldSet(proto) or unknown_fields.UnknownFieldSet(
                proto.graph):
            return None
        return cls(proto)

    def write(self, f: IO[bytes]) -> None:
        f.write(self.head)
        for t, n in zip(self.tensors, self.sizes, strict=True):
            f.write(_key(_INITIALIZER) + _varint(n))
            f.write(t.SerializeToString(deterministic=True))
        f.write(self.tail)


def _fields(src: Message, split: int, kind: type[Message]) -> tuple[bytes, bytes]:
    """``src``'s set fields numbered below ``split`` and above it, each serialized as a ``kind`` message."""
    head, tail = kind(), kind()
    for fd, _ in src.ListFields():
        if fd.number != split:
            copy_field(src, head if fd.number < split else tail, fd.name)
    return head.SerializeToString(deterministic=True), tail.SerializeToString(deterministic=True)


def _key(number: int) -> bytes:
    """The key of a length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def from_bytes(data: bytes, where: str) -> BNNModel:
    return _model_of(_parse(data, where), where)


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise InvalidArtifactError(f"{where}: file is empty")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidArtifactError(f"{where}: not an .ebnn/ONNX file (protobuf parse failed)") from e
    return proto


def _model_of(proto: onnx.ModelProto, where: str) -> BNNModel:
    if not proto.graph.node:
        raise InvalidArtifactError(f"{where}: not an .ebnn file (no graph)")
    props = {p.key: p.value for p in proto.metadata_props}
    if MANIFEST_KEY not in props:
        raise InvalidArtifactError(f"{where}: no edgebnn manifest; is this a plain ONNX model, not an .ebnn?")
    model = BNNModel(proto, Manifest.from_json(props[MANIFEST_KEY], where), where)
    verify(model)
    return model


def load(path: str | os.PathLike[str]) -> BNNModel:
    """Read and verify an ``.ebnn`` file; every failure is an :class:`InvalidArtifactError` naming it."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InvalidArtifactError(f"{p}: {size} bytes is over the 2 GiB protobuf limit")
        data = p.read_bytes()
    except FileNotFoundError as e:
        raise InvalidArtifactError(f"{p}: no such file") from e
    except IsADirectoryError as e:
        raise InvalidArtifactError(f"{p}: is a directory, not an .ebnn file") from e
    except OSError as e:
        raise InvalidArtifactError(f"{p}: cannot read ({e.strerror or e})") from e
    proto = _parse(data, str(p))
    del data  # the parsed model holds its own copy: do not keep the file's bytes through verification
    return _model_of(proto, str(p))
