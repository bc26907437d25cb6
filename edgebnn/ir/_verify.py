"""The IR verifier: invariants every pass must keep (ARCHITECTURE.md §3).

- the manifest parses and its format is one this edgebnn reads;
- ir_version <= 10 and the default opset in 17-20, so onnxruntime and TensorRT 10.3 load exports;
- exactly one graph input, named as the manifest says, with the manifest's non-batch dims;
- every encoding node decodes: its tensors have the declared shape, finite values, sigmas >= 0,
  indices < K, bits within range, scales finite and > 0 (each encoding's ``from_fields`` checks its own);
- each encoded weight is consumed, and no initializer dangles;
- ``onnx.checker`` accepts the graph.
"""

from __future__ import annotations

import onnx

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir._model import DOMAIN, MAX_IR_VERSION, OPSET_RANGE, BNNModel


def verify(model: BNNModel) -> None:
    """Raise :class:`InvalidArtifactError` naming the first broken invariant."""
    where = model.where
    proto = model.proto
    if proto.ir_version > MAX_IR_VERSION:
        raise InvalidArtifactError(f"{where}: ir_version {proto.ir_version} > {MAX_IR_VERSION}")
    default_opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if default_opset is None or not OPSET_RANGE[0] <= default_opset <= OPSET_RANGE[1]:
        raise InvalidArtifactError(f"{where}: default opset {default_opset} outside {OPSET_RANGE[0]}-{OPSET_RANGE[1]}")
    graph = proto.graph
    if len(graph.input) != 1 or graph.input[0].name != model.manifest.input_name:
        names = [i.name for i in graph.input]
        raise InvalidArtifactError(
            f"{where}: graph inputs {names} do not match the manifest input {model.manifest.input_name!r}"
        )
    dims = graph.input[0].type.tensor_type.shape.dim
    declared = [d.dim_value if d.HasField("dim_value") else None for d in dims][1:]
    if declared != model.manifest.input_shape[1:]:
        raise InvalidArtifactError(
            f"{where}: graph input shape {declared} differs from manifest {model.manifest.input_shape[1:]}"
        )
    if len(graph.output) < 1:
        raise InvalidArtifactError(f"{where}: graph has no output")

    encoded = model.encoded_weights()  # decodes and validates every encoding
    consumed = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for w in encoded:
        if w.name not in consumed:
            raise InvalidArtifactError(f"{where}: layer {w.layer!r}: encoded weight {w.name!r} is never used")
    for t in graph.initializer:
        if t.name not in consumed:
            raise InvalidArtifactError(f"{where}: initializer {t.name!r} is not used by any node")
    names = [n.output[0] for n in graph.node if n.domain == DOMAIN]
    if len(names) != len(set(names)):
        raise InvalidArtifactError(f"{where}: two encoding nodes produce the same weight")
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InvalidArtifactError(f"{where}: ONNX check failed: {first}") from e
