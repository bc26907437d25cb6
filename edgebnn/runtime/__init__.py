"""Runtimes: :class:`Session` runs an exported ensemble in user code; :mod:`.reference` is the numpy +
onnxruntime reference every exporter is checked against."""

from __future__ import annotations

from edgebnn.runtime.session import Session

__all__ = ["Session"]
