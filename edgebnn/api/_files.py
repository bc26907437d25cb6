"""Reading and writing edgebnn files: the IR (``.ebnn``) and an export's metadata."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from edgebnn.errors import InvalidArtifactError

if TYPE_CHECKING:
    from edgebnn.exporters.metadata import ExportMetadata
    from edgebnn.ir import BNNModel

PathLike = str | os.PathLike[str]


def load_ir(path: PathLike) -> BNNModel:
    """Load an .ebnn IR file, verified (an exported .onnx is refused with a pointer to ``Session``).

    Args:
        path: The ``.ebnn`` file (from ``edgebnn lower`` or :func:`save`).

    Returns:
        The IR.

    Raises:
        InvalidArtifactError: Missing, corrupt or unverifiable file, or an exported ``.onnx``.
    """
    from edgebnn import ir

    if Path(path).suffix == ".onnx":
        raise InvalidArtifactError(f"{path}: this takes an .ebnn IR file (from edgebnn lower), not an export; "
                                   "run an export with edgebnn.Session")
    return ir.load(path)


def save(model: BNNModel, path: PathLike) -> Path:
    """Write an IR as an ``.ebnn`` file, atomically; the same model gives the same bytes."""
    from edgebnn import ir

    return ir.save(model, path)


def export_metadata(path: PathLike) -> ExportMetadata:
    """The validated ``edgebnn.export`` metadata of an exported ONNX file (:mod:`edgebnn.exporters.metadata`)."""
    from edgebnn.runtime.session import read_export

    return read_export(path)[1]
