"""The edgebnn IR: an ONNX model whose Bayesian weights are ``ai.edgebnn`` encoding nodes.

Public surface: :class:`BNNModel` (proto + :class:`Manifest`), :func:`load`, :func:`save`, :func:`verify`,
the encoding registry, and :func:`make_encoding_node` for importers and passes.
"""

from __future__ import annotations

from edgebnn.ir._model import (
    DOMAIN,
    DOMAIN_VERSION,
    FORMAT_VERSION,
    MANIFEST_KEY,
    MAX_IR_VERSION,
    BNNModel,
    EncodedWeight,
    Manifest,
    attrs_of,
    encoding_class,
    make_encoding_node,
    tensor_to_array,
)
from edgebnn.ir._serde import check_text, from_bytes, load, proto_writer, save, serialized_size, to_bytes
from edgebnn.ir._verify import verify
from edgebnn.ir.encodings import ENCODINGS, Encoding, GaussianWeight, register_encoding
from edgebnn.ir.mlp import gaussian_mlp

__all__ = [
    "DOMAIN",
    "DOMAIN_VERSION",
    "ENCODINGS",
    "FORMAT_VERSION",
    "MANIFEST_KEY",
    "MAX_IR_VERSION",
    "BNNModel",
    "EncodedWeight",
    "Encoding",
    "GaussianWeight",
    "Manifest",
    "attrs_of",
    "check_text",
    "encoding_class",
    "from_bytes",
    "gaussian_mlp",
    "load",
    "make_encoding_node",
    "proto_writer",
    "register_encoding",
    "save",
    "serialized_size",
    "tensor_to_array",
    "to_bytes",
    "verify",
]
