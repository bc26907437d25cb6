"""Weight encodings of the IR, one file per encoding, registered by ONNX op type (domain ai.edgebnn)."""

from __future__ import annotations

from edgebnn.ir.encodings.base import ENCODINGS, Encoding, register_encoding
from edgebnn.ir.encodings.gaussian import GaussianWeight

__all__ = ["ENCODINGS", "Encoding", "GaussianWeight", "register_encoding"]
