"""Fold the shape computations torch.onnx leaves in an exported graph, keeping the batch axis dynamic.

``torch.onnx.export`` (with ``optimize=False``, so that no BatchNorm is folded into a Bayesian weight) keeps
index and shape arithmetic as nodes: ``Constant -> Cast -> Reshape`` for slice bounds, ``Shape -> Gather ->
Concat`` for the sizes of ``view``/``pad``. ONNX shape inference cannot see through most of it, so the
shapes around the layers after an option-A ResNet shortcut (``F.pad(x[:, :, ::2, ::2], ...)``) stay unknown
and no exporter can lay out an ensemble there.

:func:`fold_shape_computations` evaluates that arithmetic instead. The *shape values* are the outputs of
``Constant`` and ``Shape`` nodes, integer initializers, and every output of a node whose inputs are all shape
values (float weights never are: nothing that reads a weight is folded). Each shape value that a
non-shape node reads is computed by onnxruntime at two batch sizes; where both runs agree it does not
depend on the batch and becomes an initializer, otherwise (e.g. the batch entry of a flatten's target
shape) its computation stays in the graph. Nodes left without a consumer are dropped. A graph onnxruntime
cannot run is left unfolded (the importer's static-shape check then names the layer it cannot lay out).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

_PROBE_BATCHES = (2, 3)  # two sizes > 1, so broadcasting of a size-1 batch cannot hide a dependence
_SOURCES = ("Constant", "Shape", "Size")
_RANDOM = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli")


def fold_shape_computations(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its batch-independent shape computations replaced by initializers (a new model)."""
    graph = proto.graph
    shape_values = {t.name for t in graph.initializer if t.data_type in (TensorProto.INT64, TensorProto.INT32)}
    shape_nodes: set[int] = set()
    for i, node in enumerate(graph.node):
        if node.op_type in _RANDOM or node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in _SOURCES or (node.input and all(x in shape_values for x in node.input if x)):
            shape_values.update(node.output)
            shape_nodes.add(i)
    inits = {t.name for t in graph.initializer}
    frontier = sorted({
        x for i, node in enumerate(graph.node) if i not in shape_nodes for x in node.input
        if x in shape_values and x not in inits
    } | {o.name for o in graph.output if o.name in shape_values})
    if not frontier:
        return proto
    try:
        values = [_evaluate(proto, frontier, batch) for batch in _PROBE_BATCHES]
    except Exception:  # onnxruntime cannot run this graph: leave it as is; the static-shape check names the layer
        return proto
    folded = {
        name: first for name, first, second in zip(frontier, values[0], values[1], strict=True)
        if first.shape == second.shape and np.array_equal(first, second)
    }
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    kept = [n for n in graph.node if not set(n.output) & set(folded)]
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in folded.items())
    del graph.node[:]
    graph.node.extend(_live(kept, {o.name for o in graph.output}))
    used = {x for n in graph.node for x in n.input} | {o.name for o in graph.output}
    dead = [t for t in graph.initializer if t.name not in used]
    for t in dead:
        graph.initializer.remove(t)
    return out


def _live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` without those whose outputs nothing reads (walking back from the graph outputs)."""
    needed = set(outputs)
    live = []
    for node in reversed(nodes):
        if set(node.output) & needed:
            live.append(node)
            needed.update(node.input)
    return live[::-1]


def _evaluate(proto: onnx.ModelProto, names: list[str], batch: int) -> list[np.ndarray]:
    """The values ``names`` take when the graph runs on a random input of ``batch`` rows."""
    import onnxruntime as ort

    typed = shape_inference.infer_shapes(proto, strict_mode=False)
    types = {vi.name: vi.type for vi in typed.graph.value_info}
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    del probe.graph.output[:]
    for name in names:
        vi = helper.make_empty_tensor_value_info(name)
        if name in types:
            vi.type.CopyFrom(types[name])
        probe.graph.output.append(vi)
    inp = proto.graph.input[0]
    dims = [d.dim_value if d.HasField("dim_value") else batch for d in inp.type.tensor_type.shape.dim]
    dims[0] = batch
    elem = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
    x = np.random.default_rng(0).standard_normal(dims).astype(elem)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(names, {inp.name: x})]


def static_feature_shapes(proto: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Every value's inferred shape with the batch set to 1 (``None`` where a dim is unknown)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    dim = probe.graph.input[0].type.tensor_type.shape.dim[0]
    dim.Clear()
    dim.dim_value = 1
    inferred = shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    out: dict[str, list[int | None]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        if vi.type.tensor_type.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
    for t in inferred.graph.initializer:
        out[t.name] = list(t.dims)
    return out
