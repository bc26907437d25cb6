"""Rewriting the IR's graph around its sampled layers: the sample fold, hoisting, the predictive head.

Every mode that samples (``baked``, ``noise``, ``shared``) copies the deterministic nodes and hands each
sampled layer to a :data:`LayerRewrite` (its strategy); the sample axis is folded into the batch,
batch-major (row b·S + s), so deterministic ops run once on B·S rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.exporters._graph import Builder, P, renamed_input, static_shapes
from edgebnn.exporters.layers import (
    LAYERS,
    LayerKind,
    SampledLayer,
    bias_name,
    integer_kernel,
    layer_kind,
    run_wide,
    sink_wide_outputs,
)
from edgebnn.exporters.matmul import fuse_weight_views
from edgebnn.exporters.recurrent import MOVES_BATCH, batch_axes, fold_on_axis
from edgebnn.exporters.stores import decode
from edgebnn.exporters.stores.constants import constant
from edgebnn.ir import BNNModel, EncodedWeight
from edgebnn.ir.encodings import draw_weight
from edgebnn.tasks import sampled_head

# A layer rewrite: (builder, node, its layer kind, its weight, static shapes, shared input) -> nodes added to the
# builder. ``shared``: ``node.input[0]`` is [B, ...], the same for every sample (see ``rewrite_sampled_layers``).
LayerRewrite = Callable[[Builder, onnx.NodeProto, LayerKind, EncodedWeight, dict[str, list[int]], bool], None]
# Whether a strategy emits this layer from an input shared by every sample (else the input is folded first).
TakesShared = Callable[[LayerKind, EncodedWeight], bool]


def quiet_weights(model: BNNModel, hoist: str | float) -> set[str]:
    """Encoded weights whose posterior noise is below the hoisting threshold.

    ``hoist="auto"``: max σ at most the encoding's quantization step (float storage: σ = 0 only);
    a number: max σ at most that value; ``"off"``: none but σ ≡ 0 weights, which are deterministic under any
    threshold (an MC-dropout model's plain layers: no S identical copies). A weight drawn jointly with others (a
    deep ensemble's members, SWAG) is never quiet.
    """
    if hoist not in ("off", "auto") and (not isinstance(hoist, (int, float)) or hoist < 0):
        raise InvalidOptionError(f"--hoist {hoist}: use auto, off or a non-negative sigma")
    out = set()
    for w in model.iter_encoded_weights():  # one layer decoded at a time
        if w.encoding.joint_group() is not None:  # drawn with its group (an ensemble's mean is no member)
            continue
        limit = 0.0 if hoist == "off" else w.encoding.step() if hoist == "auto" else float(hoist)
        if float(w.encoding.stddev().max(initial=0.0)) <= limit:
            out.add(w.name)
    names = set(model.encoded_weight_names())
    for node in model.proto.graph.node:  # a layer samples as a whole: a quiet weight with a noisy bias samples
        own = [x for x in node.input if x in names]
        if any(x not in out for x in own):
            out.difference_update(own)
    return out


def baked_layers(model: BNNModel, samples: int, seed: int, weights: str = "fp32",
                 window: tuple[int, int] | None = None) -> LayerRewrite:
    """The ``baked`` strategy: S members drawn at export from the reference runtime's streams ``[seed, i]``
    (weight ``i`` in graph order, jointly with its group: :func:`~edgebnn.ir.encodings.draw_weight`), emitted
    as constants in the layer kind's batched form, in the ``weights`` format (exact on the encoding's sample
    grid). ``window=(first, total)``: the members are draws ``first .. first + S - 1`` of ``total`` (one chunk of
    an anytime ensemble, :mod:`.anytime`)."""
    index = {name: i for i, name in enumerate(model.encoded_weight_names())}

    def draw(w: EncodedWeight) -> np.ndarray:
        if window is not None:
            first, total = window
            return draw_weight(w.encoding, seed, index[w.name], total)[first:first + samples]
        return draw_weight(w.encoding, seed, index[w.name], samples)  # jointly with its group, if any

    def bias_samples(b: Builder, node: onnx.NodeProto, out_dim: int) -> np.ndarray | None:
        """Bias as [S, out]: drawn if Bayesian, the deterministic bias repeated otherwise."""
        name = bias_name(node)
        if name is None:
            return None
        if name in index:
            return draw(model.encoded_weight(name))
        fixed = next((t for t in b.inits if t.name == name), None)
        if fixed is None:
            raise UnsupportedLayerError(f"{node.name}: bias {name!r} is not a constant")
        return np.broadcast_to(numpy_helper.to_array(fixed).reshape(1, out_dim), (samples, out_dim))

    def rewrite(b: Builder, node: onnx.NodeProto, kind: LayerKind, w: EncodedWeight,
                shapes: dict[str, list[int]], shared: bool) -> None:
        shape = w.encoding.shape
        bias = bias_samples(b, node, kind.out_dim(node, shape))
        # members on a grid: the store's codes where it writes them (a lowered deep ensemble), fp32 members only
        layer = SampledLayer(node, f"{P}{w.name}/", samples, shape, shapes, f"layer {w.layer!r}", weights,
                             w.encoding.sample_grid(), shared, source=w.encoding if weights == "fp32" else None)
        kind.batched(b, layer, draw(w), bias)

    return rewrite


def rewrite_sampled_layers(model: BNNModel, samples: int, rewrite: LayerRewrite, b: Builder,
                           hoist: str | float = "off", weights: str = "fp32", takes_shared: TakesShared | None = None,
                           progress: Callable[[int, int], None] | None = None, wide: bool = False,
                           ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """Copy deterministic nodes, let ``rewrite`` emit each sampled layer (a registered layer kind), add the
    predictive head.

    Shared input: a sampled layer whose data input is computed before the sample axis starts (the graph input,
    or a hoisted layer's output: the same for every sample) is handed that input on B rows, unfolded, with
    ``shared=True``, where ``takes_shared(kind, weight)`` says the strategy emits it so (the layer kind's wide
    form: S members side by side, no S copies of the input); otherwise the input is folded first.

    Hoisting: layers whose weights are quiet (:func:`quiet_weights`) run once with their mean (stored in the
    ``weights`` format their layer kind takes, on the encoding's grid when it has one), and every
    node before the first sampled layer runs on the B input rows; the sample axis starts there. Values
    computed before that point and used after it are folded to B·S rows then; ``Shape`` nodes read the
    folded input so batch arithmetic sees B·S.

    ``wide``: per-channel work between batched Convs stays on their wide output (:func:`.layers.run_wide`).

    Returns the float skeleton (for its graph input, opsets and output) and ``{"sampled", "hoisted"}`` layer
    names for the export report.
    """
    run = _Sampling(model, b, samples, quiet_weights(model, hoist))
    run.nodes = fuse_weight_views(run.nodes, run.encoded, run.quiet, run.shapes)  # Linear on [B, T, in]: MatMul
    for name in (n for n in model.encoded_weight_names() if n in run.quiet):  # hoisted layers run once: their mean
        _hoisted_weight(b, run.nodes, model.encoded_weight(name), weights)
    run.locate()
    run.emit(rewrite, takes_shared, progress)
    logits = run.base.graph.output[0].name
    if logits in run.pre_data:
        logits = run.fold(logits)  # every layer was hoisted: S identical members
    _stay_sample_major(b)
    sink_wide_outputs(b, run.shapes, ELEMENTWISE)
    if wide:
        run_wide(b, samples, ELEMENTWISE, frozenset({logits}))
    sampled_head(b, logits, samples, model.manifest.num_classes, model.manifest.task_spec(model.where))
    layer_of, quiet = run.layer_of, run.quiet
    sampled = {layer_of[n] for n in run.encoded if n not in quiet}
    return run.base, {"sampled": sorted(sampled), "hoisted": sorted({layer_of[n] for n in quiet} - sampled)}


class _Sampling:
    """One rewrite of the IR's skeleton around its sampled layers (:func:`rewrite_sampled_layers`): where the
    sample axis starts, which values were computed before it (on B rows), their folds to B·S rows."""

    def __init__(self, model: BNNModel, b: Builder, samples: int, quiet: set[str]) -> None:
        self.model, self.b, self.samples, self.quiet = model, b, samples, quiet
        self.encoded = set(model.encoded_weight_names())  # decoded one layer at a time, when its node is reached
        self.layer_of = {n.output[0]: next((a.s.decode() for a in n.attribute if a.name == "layer"), n.output[0])
                         for n in model.proto.graph.node if n.output and n.output[0] in self.encoded}
        self.base = model.weights_as_inputs()  # the skeleton with shapes only: no posterior is copied
        self.shapes = static_shapes(self.base)
        self.in_name = model.manifest.input_name
        del self.base.graph.input[1:]  # the weights were inputs only for shape inference
        b.adopt(self.base.graph.initializer)
        self.nodes = list(self.base.graph.node)
        self.folded: dict[str, str] = {}
        self.axes: dict[str, int] = {}  # batch axis of values computed before the fold (sequence-major: recurrent)
        self.pre_data = {self.in_name}  # data values computed on B rows, before the sample axis starts
        self.shape_vals: set[str] = set()  # values computed from Shape(...): batch arithmetic

    def locate(self) -> None:
        """The sampled layers' positions and where the sample axis starts (after hoisting rewrote the nodes)."""
        self.sampled_at = {i for i, n in enumerate(self.nodes)
                           if any(x in self.encoded and x not in self.quiet for x in n.input)}
        self.start = _fold_point(self.nodes, self.in_name, self.sampled_at)
        self.moved = any(n.op_type in MOVES_BATCH for n in self.nodes[:self.start])

    def fold(self, value: str) -> str:
        """``value`` [B, ...] as [B·S, ...] (once per value; on its batch axis, :mod:`.recurrent`)."""
        if value in self.folded:
            return self.folded[value]
        where, in_name, b, samples = self.model.where, self.in_name, self.b, self.samples
        dims = self.shapes.get(value)
        if dims is None:
            raise UnsupportedLayerError(f"{where}: hoisting needs a static shape for {value!r}; export with "
                                        "--hoist off")
        prefix = P if value == in_name else f"{P}fold/{value}/"
        axis: int | None = 0
        if value != in_name and self.moved:  # only a graph that moves axes before the fold needs to look
            self.axes.update(self.axes or batch_axes(self.model.weights_as_inputs()))
            axis = self.axes.get(value)
        if axis is None:
            raise UnsupportedLayerError(f"{where}: cannot tell the batch axis of {value!r} to fold the samples into it")
        self.folded[value] = (fold_on_axis(b, value, prefix + "out", samples, dims, axis, prefix) if axis else
                              b.fold_samples(value, prefix + "input" if value == in_name else prefix + "out",
                                             samples, dims[1:], prefix))
        self.shapes[self.folded[value]] = dims
        return self.folded[value]

    def emit(self, rewrite: LayerRewrite, takes_shared: TakesShared | None,
             progress: Callable[[int, int], None] | None) -> None:
        """Copy every node (its inputs folded where it runs on B·S rows); ``rewrite`` each sampled layer."""
        model, encoded = self.model, self.encoded
        emitted = 0  # sampled layers rewritten so far
        for i, node in enumerate(self.nodes):
            kind = layer_kind(node) if i in self.sampled_at else None
            shared = (kind is not None and takes_shared is not None and node.input[0] in self.pre_data
                      and node.input[1] in encoded and takes_shared(kind, model.encoded_weight(node.input[1])))
            node = self._on_rows(i, node, shared)
            if i not in self.sampled_at:
                self.b.nodes.append(node)
                continue
            hit = [x for x in node.input if x in encoded and x not in self.quiet]
            if kind is None or node.input[1] not in hit:
                raise UnsupportedLayerError(
                    f"{model.where}: layer {self.layer_of[hit[0]]!r}: a sampled weight feeds {node.op_type} "
                    f"({node.name or node.output[0]}); ensembles handle {' and '.join(LAYERS)} weights"
                )
            rewrite(self.b, node, kind, model.encoded_weight(node.input[1]), self.shapes, shared)
            emitted += 1
            if progress is not None:  # one step per sampled layer (a progress bar)
                progress(emitted, len(self.sampled_at))

    def _on_rows(self, i: int, node: onnx.NodeProto, shared: bool) -> onnx.NodeProto:
        """Node ``i`` as it runs: before the fold point on B rows (its outputs recorded), after it on B·S rows (its
        B-row inputs folded, but a shared input); ``Shape`` reads the folded input (batch arithmetic sees B·S)."""
        uses_shape = any(x in self.shape_vals for x in node.input)
        uses_data = any(x in self.pre_data for x in node.input)
        if node.op_type == "Shape" and uses_data:
            node = renamed_input(node, node.input[0], self.fold(node.input[0]))
            self.shape_vals.update(node.output)
        elif uses_shape and not uses_data:
            self.shape_vals.update(node.output)
        elif i < self.start and uses_data:
            self.pre_data.update(node.output)
        elif i >= self.start:
            keep = {node.input[0]} if shared else set()
            for x in set(node.input) & self.pre_data - keep:
                node = renamed_input(node, x, self.fold(x))
        return node


def _fold_point(nodes: list[onnx.NodeProto], in_name: str, sampled_at: set[int]) -> int:
    """Index of the first node that must see B·S rows: a sampled layer, or a data op that uses the batch size
    (e.g. the Reshape of a flatten computed from ``Shape``): hoisted nodes run on B rows before it."""
    data, shape_vals = {in_name}, set()
    for i, node in enumerate(nodes):
        uses_data = any(x in data for x in node.input)
        uses_shape = any(x in shape_vals for x in node.input)
        if i in sampled_at or (uses_data and uses_shape and node.op_type != "Shape"):
            return i
        if (node.op_type == "Shape" and uses_data) or (uses_shape and not uses_data):
            shape_vals.update(node.output)
        elif uses_data:
            data.update(node.output)
    return len(nodes)


def _hoisted_weight(b: Builder, nodes: list[onnx.NodeProto], w: EncodedWeight, weights: str) -> None:
    """A quiet weight's mean as a constant: a layer's weight takes ``weights`` (its kind's rule), a bias fp32; fp32
    means (biases included) are written by the builder's store (the IR's codes by default, decoded in the graph)."""
    user = next((n for n in nodes if len(n.input) > 1 and n.input[1] == w.name), None)
    kind = layer_kind(user) if user is not None else None
    if user is None or kind is None:
        if b.fmt.weights != "fp32":
            decode(b, w.encoding, "mean", w.name)
        else:
            constant(b, w.name, w.encoding.mean())
        return
    fmt = kind.weight_format(user, w.encoding.shape, weights, False)
    if kind.has_integer_plain and integer_kernel(b, w.encoding.mean(), fmt):
        # the layer itself becomes its integer form (MCQ counts: one scale per layer after the integer MAC)
        first = len(b.nodes)
        kind.integer_plain(b, user, w.encoding.mean(), w.encoding.mean_grid(), f"{P}{w.name}/", fmt)
        at = nodes.index(user)
        nodes[at:at + 1] = b.nodes[first:]
        del b.nodes[first:]
        return
    if fmt == "fp32" and b.fmt.weights != "fp32":  # the IR's codes, decoded in the graph (exporters.stores)
        decode(b, w.encoding, "mean", w.name)
        return
    constant(b, w.name, w.encoding.mean(), fmt, w.encoding.mean_grid())


ELEMENTWISE = frozenset({"Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "Softplus"})


def _stay_sample_major(b: Builder) -> None:
    """Between two sample-major layers (the batched Gemm, :mod:`.layers`) joined by a unary elementwise op, drop
    the round trip to batch-major and back::

        Transpose[1,0,2] -> Reshape[-1, n] -> Relu -> Reshape[-1, S, n] -> Transpose[1,0,2]   ==   Relu

    (both sides [S, B, n]; each removed value feeds only the next node of the chain). LeNet-5: 8 nodes fewer.
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in b.nodes:
        for x in node.input:
            consumers.setdefault(x, []).append(node)
    producer = {o: node for node in b.nodes for o in node.output}
    consts = {t.name: numpy_helper.to_array(t) for t in b.inits if t.data_type == onnx.TensorProto.INT64}

    def only(value: str, op: str) -> onnx.NodeProto | None:
        users = consumers.get(value, [])
        return users[0] if len(users) == 1 and users[0].op_type == op else None

    def swap(node: onnx.NodeProto | None) -> bool:
        return node is not None and [a.ints for a in node.attribute if a.name == "perm"] == [[1, 0, 2]]

    dropped: set[int] = set()
    for act in [n for n in b.nodes if n.op_type in ELEMENTWISE]:
        flat = producer.get(act.input[0])
        back = producer.get(flat.input[0]) if flat is not None and flat.op_type == "Reshape" else None
        split = only(act.output[0], "Reshape")
        fwd = only(split.output[0], "Transpose") if split is not None else None
        if flat is None or back is None or split is None or fwd is None or not (swap(back) and swap(fwd)):
            continue
        if len(consumers[flat.output[0]]) != 1 or len(consumers[back.output[0]]) != 1:
            continue
        flat_shape, split_shape = consts.get(flat.input[1]), consts.get(split.input[1])
        if (flat_shape is None or split_shape is None or len(flat_shape) != 2 or len(split_shape) != 3
                or flat_shape[0] != -1 or split_shape[0] != -1 or flat_shape[-1] != split_shape[-1]):
            continue
        act.input[0] = back.input[0]
        for user in consumers.get(fwd.output[0], []):
            for i, x in enumerate(user.input):
                if x == fwd.output[0]:
                    user.input[i] = act.output[0]
        dropped.update(id(n) for n in (back, flat, split, fwd))
    b.nodes[:] = [n for n in b.nodes if id(n) not in dropped]
