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
depend on the batch and becomes an initializer. A data ``Reshape`` whose computed target depends on the batch
(``view(x.size(0), -1)``) gets the constant target of its probed output shape with -1 in the one entry that
differs between the probes, which is exact at any batch size and lets shape inference see every size on a
batch-1 probe. Other batch-dependent values keep their computation.
Nodes left without a consumer are dropped. A graph onnxruntime
cannot run is left unfolded (the importer's static-shape check then names the layer it cannot lay out).

Recurrent layers: ``torch.zeros(x.size(0), H)`` (an initial hidden state, nn.LSTM's or a hand-written loop's)
is exported as ``Shape -> Squeeze -> Reshape [1] -> Concat -> Expand``; the scalar round trip
``Squeeze -> Reshape`` of a one-element shape is dropped first, because ONNX's data propagation stops at it
(the state's shape would stay ``[?, H]`` at batch 1). A zero initial state of an ``LSTM``/``GRU``/``RNN`` node
(``initial_h``, ``initial_c``: all zeros at both probe batches) is removed: the op's default is zeros of the
batch its input has, which keeps the state right when the exporters fold S samples into the batch
(torch bakes the traced batch into it otherwise).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

_PROBE_BATCHES = (2, 3)  # two sizes > 1, so broadcasting of a size-1 batch cannot hide a dependence
_SOURCES = ("Constant", "Shape", "Size")
_RANDOM = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli")
_STATES = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,)}  # input positions of optional initial states


def _drop_scalar_round_trips(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``Reshape(Squeeze(s), [1])`` -> ``s`` where ``s`` is a one-element 1-D tensor (a sliced ``Shape``)."""
    graph = proto.graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name in ("value", "value_ints"):
            value = helper.get_attribute_value(n.attribute[0])
            consts[n.output[0]] = numpy_helper.to_array(value) if n.attribute[0].name == "value" else np.array(value)
    producer = {o: n for n in graph.node for o in n.output}
    renames: dict[str, str] = {}
    for node in graph.node:
        squeeze = producer.get(node.input[0]) if node.op_type == "Reshape" else None
        if squeeze is None or squeeze.op_type != "Squeeze":
            continue
        target, source = consts.get(node.input[1]), producer.get(squeeze.input[0])
        if target is None or source is None or source.op_type != "Shape" or target.tolist() not in ([1], [-1]):
            continue
        attrs = {a.name: a.i for a in source.attribute}
        if "end" in attrs and attrs["end"] - attrs.get("start", 0) == 1 and attrs.get("start", 0) >= 0:
            renames[node.output[0]] = squeeze.input[0]
    if not renames:
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for node in out.graph.node:
        for i, x in enumerate(node.input):
            node.input[i] = renames.get(x, x)
    return out


def fold_shape_computations(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its batch-independent shape computations replaced by initializers (a new model)."""
    proto = _drop_scalar_round_trips(proto)
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
    reshapes = [  # data Reshapes whose target is computed: their output shapes are probed too
        n.output[0] for i, n in enumerate(graph.node)
        if i not in shape_nodes and n.op_type == "Reshape" and n.input[1] in frontier
    ]
    try:
        values = [_evaluate(proto, frontier + reshapes, batch) for batch in _PROBE_BATCHES]
    except Exception:  # onnxruntime cannot run this graph: leave it as is; the static-shape check names the layer
        return proto
    folded = {
        name: first for name, first, second in zip(frontier, values[0], values[1], strict=False)  # then reshapes
        if first.shape == second.shape and np.array_equal(first, second)
    }
    zero_states = {name for name, first, second in zip(frontier, values[0], values[1], strict=False)
                   if first.dtype.kind == "f" and not first.any() and not second.any()}
    targets = {}
    for k, name in enumerate(reshapes, start=len(frontier)):
        target = _batch_as_minus_one(values[0][k].shape, values[1][k].shape)
        if target is not None:
            targets[name] = target
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    kept = [n for n in graph.node if not set(n.output) & set(folded)]
    for node in kept:
        for i in _STATES.get(node.op_type, ()):
            if len(node.input) > i and node.input[i] in zero_states:
                node.input[i] = ""  # the op's default: zeros of its input's batch

        if node.op_type == "Reshape" and node.output[0] in targets and node.input[1] not in folded:
            node.input[1] = f"{node.output[0]}__target"
            folded[node.input[1]] = targets[node.output[0]]
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in folded.items())
    del graph.node[:]
    graph.node.extend(_live(kept, {o.name for o in graph.output}))
    used = {x for n in graph.node for x in n.input} | {o.name for o in graph.output}
    dead = [t for t in graph.initializer if t.name not in used]
    for t in dead:
        graph.initializer.remove(t)
    return out


def _batch_as_minus_one(first: tuple[int, ...], second: tuple[int, ...]) -> np.ndarray | None:
    """The Reshape target for output shapes ``first``/``second`` (the two probe batches) that differ in one entry.

    With every other entry fixed, the element count determines that entry, so -1 there reproduces the output
    at any batch size: ``view(x.size(0), -1)`` on ``[B, 64, 1, 1]`` becomes the constant target ``[-1, 64]``.
    """
    if len(first) != len(second) or 0 in first:  # no 0 entries: the target means the same with allowzero on or off
        return None
    differ = [k for k, (a, b) in enumerate(zip(first, second, strict=True)) if a != b]
    if len(differ) != 1:
        return None
    target = np.array(first, dtype=np.int64)
    target[differ[0]] = -1
    return target


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
