"""The IR verifier: invariants every pass must keep (docs/design.md).

- the manifest parses and its format is one this edgebnn reads;
- ir_version <= 10 and the default opset in 17-20, so onnxruntime and TensorRT 10.3 load exports;
- exactly one graph input, named as the manifest says, with the manifest's non-batch dims;
- every encoding node decodes: its tensors have the declared shape, finite values, sigmas >= 0,
  indices < K, bits within range, scales finite and > 0 (each encoding's ``from_fields`` checks its own);
- each encoded weight is consumed, and no initializer dangles;
- ``onnx.checker`` accepts the graph;
- shapes fit (ONNX shape inference on the float skeleton, no weight copied): each encoded Conv/Gemm weight
  and bias fits the tensor it is applied to, and the first output has the manifest's class count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx
from onnx import helper, shape_inference

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir._model import DOMAIN, MAX_IR_VERSION, OPSET_RANGE, BNNModel, attrs_of, copy_field

Shape = list[int | None]


@dataclass(frozen=True)
class _Weight:
    """What the checks after decoding need of an encoded weight (its arrays are dropped layer by layer)."""

    name: str
    layer: str
    shape: tuple[int, ...]
    inputs: tuple[str, ...]


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

    encoded = []
    for decoded in model.iter_encoded_weights():  # decodes and validates each, one layer alive at a time
        encoded.append(_Weight(decoded.name, decoded.layer, decoded.encoding.shape, tuple(decoded.node.input)))
        del decoded
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
        onnx.checker.check_model(_checker_view(proto, encoded))
    except UnicodeDecodeError as e:  # the checker's own message quotes a name that is not UTF-8
        raise InvalidArtifactError(f"{where}: ONNX check failed: a name or text field is not UTF-8") from e
    except (onnx.checker.ValidationError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InvalidArtifactError(f"{where}: ONNX check failed: {first}") from e
    _check_shapes(model, encoded)


def _checker_view(proto: onnx.ModelProto, encoded: list[_Weight]) -> onnx.ModelProto:
    """``proto`` for ``onnx.checker``, with the encoded weights' tensors as typed graph inputs instead of data.

    The checker serializes the model and parses it again (two more copies of every weight); the encoding
    tensors need neither, as each encoding has already checked its own (dtype, shape, size, values).
    Deterministic initializers stay, so the checker still compares their bytes with their shapes.
    """
    enc_inputs = {i for w in encoded for i in w.inputs}
    view = onnx.ModelProto()
    _copy_fields(proto, view, skip="graph")
    graph = proto.graph
    _copy_fields(graph, view.graph, skip="initializer")
    view.graph.initializer.extend(t for t in graph.initializer if t.name not in enc_inputs)
    view.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                            for t in graph.initializer if t.name in enc_inputs)
    return view


def _copy_fields(src: onnx.ModelProto | onnx.GraphProto, dst: onnx.ModelProto | onnx.GraphProto, skip: str) -> None:
    for fd, _ in src.ListFields():
        if fd.name != skip:
            copy_field(src, dst, fd.name)


def _check_shapes(model: BNNModel, encoded: list[_Weight]) -> None:
    """Conv/Gemm weights and biases against the shapes flowing into them; output classes vs the manifest."""
    where = model.where
    graph = model.proto.graph
    weights = {w.name: w for w in encoded}
    shapes = _infer_shapes(model, encoded)
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Conv", "Gemm"):
            continue
        if len(node.input) < 2 or node.input[1] not in weights:
            continue
        w = weights[node.input[1]]
        at = f"{where}: layer {w.layer!r} ({node.op_type} {node.name or node.output[0]!r}): weight {w.name!r}"
        wshape = list(w.shape)
        attrs = attrs_of(node)
        x = shapes.get(node.input[0])
        bias = shapes.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if node.op_type == "Gemm":
            if len(wshape) != 2:
                raise InvalidArtifactError(f"{at} has shape {tuple(wshape)}; Gemm needs a 2-D weight")
            k, n = (wshape[1], wshape[0]) if attrs.get("transB", 0) else (wshape[0], wshape[1])
            if x is not None and len(x) == 2:
                kx = x[0] if attrs.get("transA", 0) else x[1]
                if kx is not None and kx != k:
                    raise InvalidArtifactError(
                        f"{at} has shape {tuple(wshape)} (K={k}) but its input has {kx} features"
                    )
            if bias is not None and (len(bias) > 2 or (bias and bias[-1] not in (None, 1, n))):
                raise InvalidArtifactError(f"{at}: bias of shape {tuple(bias)} does not broadcast to {n} outputs")
            continue
        if len(wshape) < 3:
            raise InvalidArtifactError(f"{at} has shape {tuple(wshape)}; Conv needs [out, in/groups, *kernel]")
        group = int(attrs.get("group", 1))
        if x is not None and len(x) != len(wshape):
            raise InvalidArtifactError(f"{at} has rank {len(wshape)} but its input has rank {len(x)}")
        if x is not None and x[1] is not None and x[1] != wshape[1] * group:
            raise InvalidArtifactError(
                f"{at} has shape {tuple(wshape)} ({wshape[1]} x {group} group(s) input channels) but its input "
                f"has {x[1]} channels"
            )
        kernel = attrs.get("kernel_shape")
        if kernel is not None and list(kernel) != wshape[2:]:
            raise InvalidArtifactError(f"{at} has kernel {tuple(wshape[2:])} but the node says {tuple(kernel)}")
        if bias is not None and bias != [wshape[0]]:
            raise InvalidArtifactError(f"{at}: bias of shape {tuple(bias)} does not match {wshape[0]} output channels")
    out = shapes.get(graph.output[0].name)
    classes = model.manifest.num_classes
    model.manifest.task_spec(where).check_output(out, classes, graph.output[0].name, where)


def _infer_shapes(model: BNNModel, encoded: list[_Weight]) -> dict[str, Shape]:
    """Shapes of every value ONNX can infer, on a skeleton that carries shapes instead of weights.

    Encoded weights and float initializers become typed graph inputs (no tensor is copied); integer
    initializers (shape constants that Reshape reads) are kept for data propagation.
    """
    proto = model.proto
    graph = proto.graph
    enc_inputs = {i for w in encoded for i in w.inputs}
    inputs = list(graph.input)
    inputs += [helper.make_tensor_value_info(w.name, onnx.TensorProto.FLOAT, list(w.shape)) for w in encoded]
    inits = []
    for t in graph.initializer:
        if t.name in enc_inputs:
            continue
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and math.prod(t.dims) <= 64:
            inits.append(t)
        else:
            inputs.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    skeleton = helper.make_model(
        helper.make_graph([n for n in graph.node if n.domain != DOMAIN], "skeleton", inputs, list(graph.output), inits),
        opset_imports=[o for o in proto.opset_import if o.domain != DOMAIN],
    )
    skeleton.ir_version = proto.ir_version
    try:
        inferred = shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False, data_prop=True)
    except (shape_inference.InferenceError, onnx.checker.ValidationError, ValueError) as e:
        text = "" if isinstance(e, UnicodeError) else str(e).strip()
        first = text.splitlines()[0] if text else type(e).__name__
        raise InvalidArtifactError(f"{model.where}: shape inference failed: {first}") from e
    out: dict[str, Shape] = {w.name: list(w.shape) for w in encoded}
    for t in graph.initializer:
        if t.name not in enc_inputs:
            out[t.name] = [int(d) for d in t.dims]
    g = inferred.graph
    for vi in (*g.value_info, *g.input, *g.output):
        tt = vi.type.tensor_type
        if vi.name not in out and tt.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return out
