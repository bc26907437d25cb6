"""Reading and writing ``.ebnn`` files: parse only (protobuf, never pickle), verify, atomic write.

Same model, same bytes: serialization is deterministic (``SerializeToString(deterministic=True)``).
:func:`save` and :func:`serialized_size` produce and count those bytes piece by piece (the model's other
fields, then one initializer at a time), so neither holds a serialized copy of the whole model.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Iterator
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
_RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
_RAW_SPLIT_ELEMENTS = 1 << 18


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
    return _io.atomic_write(path, proto_writer(_with_manifest(model))[1])


def proto_writer(proto: onnx.ModelProto, tensor: Callable[[onnx.TensorProto], onnx.TensorProto] | None = None,
                 ) -> tuple[int, Callable[[IO[bytes]], object]]:
    """``(bytes, write)``: ``write(f)`` writes ``proto``'s deterministic serialization to ``f`` one initializer at a
    time (``SerializeToString`` holds the whole model's bytes at once, and refuses past 2 GiB), each initializer as
    ``tensor`` maps it (default: itself, the same bytes; an exporter's external-data stub); ``bytes`` is how many
    it writes."""
    layout = _Layout.of(proto, tensor)
    if layout is None:
        data = proto.SerializeToString(deterministic=True)
        return len(data), lambda f: f.write(data)
    return layout.size, layout.write


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

    def __init__(self, proto: onnx.ModelProto, tensor: Callable[[onnx.TensorProto], onnx.TensorProto] | None) -> None:
        graph = proto.graph
        self.tensors = [tensor(t) for t in graph.initializer] if tensor is not None else list(graph.initializer)
        self.sizes = [_tensor_size(t) for t in self.tensors]
        tensors = sum(len(_key(_INITIALIZER)) + len(_varint(n)) + n for n in self.sizes)
        graph_head, graph_tail = _fields(graph, _INITIALIZER, onnx.GraphProto)
        model_head, model_tail = _fields(proto, _GRAPH, onnx.ModelProto)
        self.head = model_head + _key(_GRAPH) + _varint(len(graph_head) + tensors + len(graph_tail)) + graph_head
        self.tail = graph_tail + model_tail
        self.size = len(self.head) + tensors + len(self.tail)

    @classmethod
    def of(cls, proto: onnx.ModelProto,
           tensor: Callable[[onnx.TensorProto], onnx.TensorProto] | None = None) -> _Layout | None:
        """The layout, or None where splitting could change the bytes (fields protobuf does not know, no graph)."""
        if not proto.HasField("graph") or unknown_fields.UnknownFieldSet(proto) or unknown_fields.UnknownFieldSet(
                proto.graph):
            return None
        return cls(proto, tensor)

    def write(self, f: IO[bytes]) -> None:
        f.write(self.head)
        for t, n in zip(self.tensors, self.sizes, strict=True):
            f.write(_key(_INITIALIZER) + _varint(n))
            if not _split(t):
                f.write(t.SerializeToString(deterministic=True))
                continue
            head, tail = _fields(t, _RAW_DATA, onnx.TensorProto)
            raw = t.raw_data
            f.write(head + _key(_RAW_DATA) + _varint(len(raw)))
            f.write(raw)
            del raw
            f.write(tail)
        f.write(self.tail)


def _split(t: onnx.TensorProto) -> bool:
    """Whether a tensor is written (and sized) as its other fields around its data: a large one, which serializing
    (or ``ByteSize``, which upb computes by serializing) would hold twice while its buffer grows."""
    return t.HasField("raw_data") and math.prod(t.dims) >= _RAW_SPLIT_ELEMENTS


def _tensor_size(t: onnx.TensorProto) -> int:
    """``t.ByteSize()``, holding a large tensor's data once (the bytes object of its ``raw_data``)."""
    if not _split(t):
        return int(t.ByteSize())
    head, tail = _fields(t, _RAW_DATA, onnx.TensorProto)
    n = len(t.raw_data)
    return len(head) + len(_key(_RAW_DATA)) + len(_varint(n)) + n + len(tail)


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


def check_text(proto: Message, where: str) -> None:
    """Refuse a model whose text fields (names, op types, metadata) are not UTF-8.

    Protobuf parses such a field as ``bytes``; onnx's checker and onnxruntime then fail on it with a
    ``UnicodeDecodeError`` of their own (onnxruntime's message quotes the raw bytes), so it is refused here,
    before any native library sees the model.

    Raises:
        InvalidArtifactError: Naming the field, e.g. ``graph.node.input``.
    """
    stack: list[tuple[Message, str]] = [(proto, "")]
    while stack:
        msg, path = stack.pop()
        for fd, value in msg.ListFields():
            if fd.type == fd.TYPE_STRING:
                values = [value] if isinstance(value, (str, bytes)) else value
                if any(isinstance(v, bytes) for v in values):
                    raise InvalidArtifactError(f"{where}: corrupt file: {path}{fd.name} is not UTF-8 text")
            elif fd.type == fd.TYPE_MESSAGE:
                values = [value] if isinstance(value, Message) else value
                stack.extend((v, f"{path}{fd.name}.") for v in values)


def _model_of(proto: onnx.ModelProto, where: str) -> BNNModel:
    check_text(proto, where)
    if not proto.graph.node:
        raise InvalidArtifactError(f"{where}: not an .ebnn file (no graph)")
    props = {p.key: p.value for p in proto.metadata_props}
    if MANIFEST_KEY not in props:
        raise InvalidArtifactError(f"{where}: no edgebnn manifest; is this a plain ONNX model, not an .ebnn?")
    model = BNNModel(proto, Manifest.from_json(props[MANIFEST_KEY], where), where)
    verify(model)
    return model


def load(path: str | os.PathLike[str]) -> BNNModel:
    """Read and verify an ``.ebnn`` file; every failure is an :class:`InvalidArtifactError` naming it.

    The file is parsed field by field (:func:`_parse_streamed`): at most one large tensor's bytes are held
    beside the model, not the whole file's.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InvalidArtifactError(f"{p}: {size} bytes is over the 2 GiB protobuf limit")
        with p.open("rb") as f:
            proto = _parse_streamed(f, size, str(p))
        if proto is None:  # not laid out as edgebnn writes files: parse it whole, as protobuf does
            data = p.read_bytes()
            proto = _parse(data, str(p))
            del data  # the parsed model holds its own copy: do not keep the file's bytes through verification
    except FileNotFoundError as e:
        raise InvalidArtifactError(f"{p}: no such file") from e
    except IsADirectoryError as e:
        raise InvalidArtifactError(f"{p}: is a directory, not an .ebnn file") from e
    except OSError as e:
        raise InvalidArtifactError(f"{p}: cannot read ({e.strerror or e})") from e
    return _model_of(proto, str(p))


_BATCH = 1 << 20  # graph fields up to this size are parsed together; a larger one (a tensor) on its own
_MAX_FIELDS = 1 << 16  # more fields in one message than a real graph has: scanning them in Python would crawl


class _NotPlainError(Exception):
    """The bytes are not plain protobuf fields inside their message (see :func:`_fields_of`)."""


def _parse_streamed(f: io.BufferedReader, size: int, where: str) -> onnx.ModelProto | None:
    """Parse a model from ``f`` the way ``ParseFromString`` would, reading the graph one field at a time.

    Protobuf merges a message that arrives in pieces as if it came whole (repeated fields append in order, a
    scalar's last value wins), so the graph's fields are merged into ``proto.graph`` in batches, each large
    one (a tensor) alone, and the model's other fields at the end. Returns None where the top two levels are
    not plain fields inside ``size`` bytes (groups, a truncated or overlong length): the caller then parses
    the file whole, which raises protobuf's own error for a broken file.
    """
    proto = onnx.ModelProto()
    rest = bytearray()
    try:
        for number, start, end, body in _fields_of(f, 0, size):
            if number != _GRAPH or body is None:
                f.seek(start)
                rest += f.read(end - start)
                continue
            batch = bytearray()
            for _, i_start, i_end, _ in _fields_of(f, body, end):
                if batch and len(batch) + i_end - i_start > _BATCH:
                    proto.graph.MergeFromString(batch)
                    batch = bytearray()
                f.seek(i_start)
                piece = bytearray(i_end - i_start)
                if f.readinto(piece) != len(piece):  # the file shrank under us
                    return None
                if len(piece) > _BATCH:
                    proto.graph.MergeFromString(piece)
                else:
                    batch += piece
                del piece
            if batch:
                proto.graph.MergeFromString(batch)
        if not rest and not proto.HasField("graph"):
            return None  # an empty file
        proto.MergeFromString(rest)
    except _NotPlainError:
        return None
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidArtifactError(f"{where}: not an .ebnn/ONNX file (protobuf parse failed)") from e
    return proto


def _fields_of(f: io.BufferedReader, begin: int, end: int) -> Iterator[tuple[int, int, int, int | None]]:
    """The fields of the message in bytes ``[begin, end)`` of ``f``, one at a time, as ``(number, start, stop,
    payload start)`` (the payload start of a length-delimited field, else None).

    Raises:
        _NotPlainError: A field is not a plain one (a group, a bad key) or does not end by ``end``, or the
            message has more than ``_MAX_FIELDS`` fields (protobuf parses those faster whole).
    """
    pos, count = begin, 0
    while pos < end:
        count += 1
        if count > _MAX_FIELDS:
            raise _NotPlainError
        f.seek(pos)  # the caller reads between fields
        start = pos
        key, pos = _read_varint(f, pos, end)
        if key >> 3 == 0:
            raise _NotPlainError
        wire, payload = key & 7, None
        if wire == 0:
            _, pos = _read_varint(f, pos, end)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            length, pos = _read_varint(f, pos, end)
            payload, pos = pos, pos + length
        else:  # groups: not in ONNX files
            raise _NotPlainError
        if pos > end:
            raise _NotPlainError
        yield key >> 3, start, pos, payload


def _read_varint(f: io.BufferedReader, pos: int, end: int) -> tuple[int, int]:
    """(the varint at ``pos``, the position after it), read from where ``f`` stands (at ``pos``).

    Raises:
        _NotPlainError: It is not a varint of at most 10 bytes that ends by ``end``.
    """
    value = 0
    for shift in range(0, 70, 7):
        byte = f.read(1) if pos < end else b""
        if not byte:
            raise _NotPlainError
        pos += 1
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value, pos
    raise _NotPlainError
