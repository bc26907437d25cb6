"""Reading and writing ``.ebnn`` files: parse only (protobuf, never pickle), verify, atomic write.

Same model, same bytes: serialization is deterministic (``SerializeToString(deterministic=True)``).
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from edgebnn._io import atomic_write_bytes
from edgebnn.errors import InvalidArtifactError
from edgebnn.ir._model import MANIFEST_KEY, BNNModel, Manifest
from edgebnn.ir._verify import verify

MAX_FILE_BYTES = 2 * 1024**3  # protobuf's own limit


def to_bytes(model: BNNModel) -> bytes:
    """Serialize deterministically with the manifest written into ``metadata_props``."""
    proto = model.proto
    props = [p for p in proto.metadata_props if p.key != MANIFEST_KEY]
    del proto.metadata_props[:]
    proto.metadata_props.extend(props)
    entry = proto.metadata_props.add()
    entry.key, entry.value = MANIFEST_KEY, model.manifest.to_json()
    return proto.SerializeToString(deterministic=True)


def save(model: BNNModel, path: str | os.PathLike[str]) -> Path:
    """Verify ``model`` and write it atomically to ``path``."""
    verify(model)
    return atomic_write_bytes(path, to_bytes(model))


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
