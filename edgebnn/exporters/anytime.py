"""Anytime ensembles (``edgebnn export --samples auto``): one graph that draws samples in chunks and stops each input
when its predictive has settled (the rule: :mod:`edgebnn.stopping`; docs/anytime.md).

The graph is a rewrite of what the fixed export writes for one chunk (the mode handlers of :mod:`.export` at
S = c), so every mode, weight store, form and device rule of the fixed export holds unchanged inside it::

    fixed chunk graph (S = c)             anytime graph
    ─────────────────────────             ──────────────────────────────────────────────────────────────
    decodes, constants, input fold   ->   outside the chunks, once per call (they do not change per chunk)
    draws, sampled layers -> logits  ->   chunk i: its c members -> softmax -> chunk mean, M2, E[Σ p log p],
    head (mean over S)               ->   merged into per-row running statistics (rows still drawing only);
                                          the rule (r_k² = a_i · M2_k < ε², intervals disjoint) settles rows;
                                          the next chunk runs while any row is drawing, S_max / c chunks at most
                                          head on the running statistics; ``samples`` [B]: members each row used

Two forms of "the next chunk", by what changes between chunks:

- nothing but random draws (``noise`` / ``shared`` with ``--rng graph``): one ``Loop`` over one body, whose random
  ops draw afresh each iteration (onnxruntime: checked in tests/unit/test_anytime.py; a TensorRT Fill layer on a
  GPU: unverified, docs/tensorrt.md);
- constants or inputs (``baked``, ``--noise mixed``'s baked kernels: chunk i is the fixed export of members
  ``i·c .. i·c + c - 1`` of the S_max draw, a :class:`~.config.GraphSpec` with ``window=(i·c, S_max)``;
  ``--rng host``: chunk i slices those members from noise inputs that keep the S_max fixed export's shapes, which
  :class:`edgebnn.runtime.Session` fills): chunk 0 inline, then one ``If`` per chunk holding its own constants and
  slicing its noise at constant offsets (a Loop would copy each chunk's members per call, and TensorRT-RTX 1.7's
  builder fails on noise sliced by the iteration number). Random ops in chunk i's copy draw with seed +
  i·:data:`SEED_STEP`.

With the rule off (``epsilon = 0``) every row runs S_max / c chunks: the same members (baked) or the same noise
(host) as the fixed export at S_max, whose predictive it then equals to float round-off (tested).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgebnn.errors import UnsupportedLayerError
from edgebnn.exporters.metadata import ExportMetadata
from edgebnn.stopping import StoppingRule

RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})
A = "at/"  # prefix of every value this rewrite adds (short: a chunk copy repeats it on every value)
S = A + "state/"  # the Loop body's inputs and outputs: iteration, condition, running statistics
SAMPLES_OUTPUT = "samples"


def anytime_metadata(meta: ExportMetadata, rule: StoppingRule) -> ExportMetadata:
    """The anytime graph's record from its first chunk's ``meta``: S is the largest count, the outputs end with
    ``samples``, the rule is recorded, and host noise inputs keep the S_max fixed export's shapes."""
    total = rule.max_samples
    records = [dict(r, shape=[r["shape"][0] if r["per"] == "row" else total, *r["shape"][1:]])
               for r in meta.noise_inputs or ()]
    return dataclasses.replace(meta, samples=total, outputs=(*meta.outputs, SAMPLES_OUTPUT), anytime=rule.to_dict(),
                               noise_inputs=tuple(records) if meta.noise_inputs is not None else None)


def differs(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """Whether two chunk graphs hold different constants (their nodes must be the same)."""
    if [n.SerializeToString() for n in a.graph.node] != [n.SerializeToString() for n in b.graph.node]:
        raise UnsupportedLayerError("--samples auto: two chunks of the export have different graphs; export with "
                                    "--samples N")
    return {t.name: t.SerializeToString() for t in a.graph.initializer} != \
        {t.name: t.SerializeToString() for t in b.graph.initializer}


def member_logits(graph: onnx.GraphProto) -> str:
    """The value [B, S, K] of per-member logits the classification head reads: ``probs = ReduceMean(Softmax(it))``
    (found by structure: compact exports rename every value)."""
    producer = {o: n for n in graph.node for o in n.output}
    mean = producer.get("probs")
    soft = producer.get(mean.input[0]) if mean is not None and mean.op_type == "ReduceMean" else None
    if soft is None or soft.op_type != "Softmax":
        raise UnsupportedLayerError("--samples auto: the export's head is not the classification head "
                                    "(probs = mean of softmax)")
    return soft.input[0]


class _Graph:
    """Nodes and initializers of one graph (the graph around the chunks, a Loop body, an If branch)."""

    def __init__(self, opset: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.opset = opset

    def add(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.array(value, order="C"), name))  # 0-d stays 0-d
        return name

    def i64(self, name: str, *values: int) -> str:
        return self.const(name, np.array(values, np.int64))

    def f32(self, name: str, value: float) -> str:
        return self.const(name, np.array(value, np.float32))

    def reduce(self, op: str, x: str, axis: int, out: str, keepdims: int = 0) -> str:
        """``op`` over one axis (axes as an input from opset 18, ReduceSum from 13; an attribute before)."""
        if self.opset >= 18 or (op == "ReduceSum" and self.opset >= 13):
            return self.add(op, [x, self.i64(out + "/axes", axis)], out, keepdims=keepdims)
        return self.add(op, [x], out, axes=[axis], keepdims=keepdims)


STATE = ("n", "active", "mean", "m2", "neg_h")  # per row: members seen, still drawing (1/0), mean p, M2, E[Σ p log p]


def _state_info(names: list[str], classes: int) -> list[onnx.ValueInfoProto]:
    dims: dict[str, list[str | int | None]] = {"mean": ["batch", classes], "m2": ["batch", classes]}
    return [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims.get(key, ["batch"]))
            for key, name in zip(STATE, names, strict=True)]


def _update(g: _Graph, p: str, logits3: str, c: int, old: list[str], new: list[str], coef: str, thresh: str) -> None:
    """Merge one chunk of member logits ``logits3`` [B, c, K] into the running statistics ``old`` (names in
    :data:`STATE` order) of the rows still drawing, apply the rule (``coef``: a_i, ``thresh``: ε² or never) and write
    ``new``. Chan et al.'s pairwise update: n' = n + c, w = c / n', mean' = mean + d·w, M2' = M2 + M2_c + d²·n·w,
    E' = E + (E_c - E)·w with d = chunk mean - mean."""
    n, active, mean, m2, neg_h = old
    ps = g.add("Softmax", [logits3], p + "p_s", axis=-1)
    logps = g.add("LogSoftmax", [logits3], p + "logp_s", axis=-1)
    ax1 = g.i64(p + "ax1", 1)
    cmean = g.reduce("ReduceMean", ps, 1, p + "chunk_mean")
    dev = g.add("Sub", [ps, g.add("Unsqueeze", [cmean, ax1], p + "chunk_mean3")], p + "dev")
    cm2 = g.reduce("ReduceSum", g.add("Mul", [dev, dev], p + "dev2"), 1, p + "chunk_m2")
    plogp = g.reduce("ReduceSum", g.add("Mul", [ps, logps], p + "plogp_s"), -1, p + "neg_h_s")
    cneg = g.reduce("ReduceMean", plogp, 1, p + "chunk_neg_h")
    c_f = g.f32(p + "c", float(c))
    n_new = g.add("Add", [n, c_f], p + "n_new")
    w = g.add("Div", [c_f, n_new], p + "w")
    d = g.add("Sub", [cmean, mean], p + "d")
    mean_new = g.add("Add", [mean, g.add("Mul", [d, g.add("Unsqueeze", [w, ax1], p + "w2d")], p + "dw")],
                     p + "mean_new")
    nw = g.add("Unsqueeze", [g.add("Mul", [n, w], p + "nw"), ax1], p + "nw2d")
    m2_new = g.add("Add", [g.add("Add", [m2, cm2], p + "m2_sum"),
                           g.add("Mul", [g.add("Mul", [d, d], p + "d2"), nw], p + "d2nw")], p + "m2_new")
    neg_new = g.add("Add", [neg_h, g.add("Mul", [g.add("Sub", [cneg, neg_h], p + "dneg"), w], p + "dneg_w")],
                    p + "neg_new")
    on = g.add("Cast", [active], p + "on", to=TensorProto.BOOL)  # a settled row keeps its statistics
    on2 = g.add("Unsqueeze", [on, ax1], p + "on2d")
    g.add("Where", [on, n_new, n], new[0])
    mean_out = g.add("Where", [on2, mean_new, mean], new[2])
    m2_out = g.add("Where", [on2, m2_new, m2], new[3])
    g.add("Where", [on, neg_new, neg_h], new[4])
    # the rule (edgebnn.stopping): r² = a_i·M2 < ε² for every class, and the top class's interval alone
    r2 = g.add("Mul", [m2_out, coef], p + "r2")
    r = g.add("Sqrt", [r2], p + "r")
    close = g.add("Less", [g.reduce("ReduceMax", r2, -1, p + "r2_max"), thresh], p + "close")
    best_low = g.reduce("ReduceMax", g.add("Sub", [mean_out, r], p + "low"), -1, p + "best_low", keepdims=1)
    reach = g.add("Cast", [g.add("GreaterOrEqual", [g.add("Add", [mean_out, r], p + "high"), best_low],
                                 p + "reaches")], p + "reaches_f", to=TensorProto.FLOAT)
    alone = g.add("Less", [g.reduce("ReduceSum", reach, -1, p + "n_reach"), g.f32(p + "one_half", 1.5)],
                  p + "alone")
    settled = g.add("Cast", [g.add("And", [close, alone], p + "settled_b")], p + "settled", to=TensorProto.FLOAT)
    g.add("Mul", [active, g.add("Sub", [g.f32(p + "one", 1.0), settled], p + "unsettled")], new[1])


def _any(g: _Graph, active: str, out: str) -> str:
    """Whether any row is still drawing (a bool scalar: a Loop's or an If's condition)."""
    return g.add("Greater", [g.reduce("ReduceMax", active, 0, out + "/max"), g.f32(out + "/zero", 0.0)], out)


def _copy(node: onnx.NodeProto, rename: dict[str, str], prefix: str | None, seed_offset: float) -> onnx.NodeProto:
    """``node`` reading ``rename``d inputs; with a ``prefix``, its outputs renamed too (recorded in ``rename``); a
    random op's seed moved by ``seed_offset`` (so another copy draws other numbers)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for k, x in enumerate(copy.input):
        copy.input[k] = rename.get(x, x)
    if prefix is not None:
        for k, x in enumerate(copy.output):
            rename[x] = copy.output[k] = prefix + x
    if seed_offset and node.op_type in RANDOM_OPS:
        for a in copy.attribute:
            if a.name == "seed":
                a.f += seed_offset
    return copy


def anytime_graph(chunks: list[onnx.ModelProto], rule: StoppingRule, classes: int, per_row: set[str],
                  ) -> onnx.ModelProto:
    """The graph of the module docstring from the fixed export of each chunk under ``rule``: a Loop over one body
    when every chunk is the same graph (noise drawn per iteration), else an If per chunk holding that chunk's
    constants (baked members: no copy per call); ``per_row``: the host noise inputs with one row per (input,
    member) (the others have one per member). The metadata is the caller's."""
    graph = chunks[0].graph
    outer = _Graph(next(o.version for o in chunks[0].opset_import if o.domain in ("", "ai.onnx")))
    logits3 = member_logits(graph)
    noise_inputs = {i.name: i for i in graph.input[1:]}
    differing = _differing(chunks)
    drawn = _split_nodes(graph, logits3, differing | set(noise_inputs), outer)
    # the batch B of the data: the initial state's shape, and the host noise rows B·S_max are cut by
    batch = outer.add("Slice", [outer.add("Shape", [graph.input[0].name], A + "x_shape"), outer.i64(A + "s0", 0),
                                outer.i64(A + "s1", 1)], A + "batch")
    coef, thresh = rule.constants(classes)
    ch = _Chunking(drawn, logits3, rule, classes, coef, thresh, _noise_slicer(noise_inputs, per_row, batch, rule))
    state = _initial_state(outer, batch, classes)
    if len(chunks) == 1 and not noise_inputs:  # one body, drawn afresh each iteration
        state = _loop(outer, graph, state, ch)
    else:  # chunk i's constants, or its slice of the host noise, in its own branch (TensorRT-RTX 1.7's builder
        # fails an internal check on a Loop body that slices a graph input by the iteration number)
        state = _chain(outer, chunks if len(chunks) > 1 else chunks * rule.chunks, differing, state, ch)
    _head(outer, state)
    return _assemble(chunks[0], outer, differing, per_row, rule, classes)


def _differing(chunks: list[onnx.ModelProto]) -> set[str]:
    """The initializers whose values differ between the chunk graphs (baked members)."""
    if len(chunks) == 1:
        return set()
    others = [{t.name: t.SerializeToString() for t in ch.graph.initializer} for ch in chunks[1:]]
    return {t.name for t in chunks[0].graph.initializer
            if any(t.SerializeToString() != other[t.name] for other in others)}


def _split_nodes(graph: onnx.GraphProto, logits3: str, varying: set[str], outer: _Graph) -> list[int]:
    """The nodes the member logits are computed from, split: those that change per chunk (random ops and what reads
    ``varying`` values, transitively) by position, returned; the others (decodes, constants, the input fold: once
    per call) appended to ``outer``."""
    producer = {o: n for n in graph.node for o in n.output}
    needed: set[int] = set()
    stack = [logits3]
    while stack:
        node = producer.get(stack.pop())
        if node is None or id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(node.input)
    varying = set(varying)
    drawn: list[int] = []
    for k, node in enumerate(graph.node):  # graph order is topological
        if id(node) not in needed:
            continue
        if node.op_type in RANDOM_OPS or any(x in varying for x in node.input):
            varying.update(node.output)
            drawn.append(k)
        else:
            outer.nodes.append(node)
    return drawn


def _noise_slicer(noise_inputs: dict[str, onnx.ValueInfoProto], per_row: set[str], batch: str,
                  rule: StoppingRule) -> Slicer:
    """How a chunk reads its members of each host noise input (the S_max fixed export's shapes)."""
    total = rule.max_samples

    def slices(g: _Graph, p: str, bounds: Callable[[], tuple[str, str]], rename: dict[str, str]) -> None:
        """The chunk's members ``start .. end`` (``bounds()``: 1-D int64 values) of each host noise input, as
        ``rename`` says. Shapes are static but for B, taken from the data (TensorRT-RTX 1.7's builder fails an
        internal check on rows reshaped by -1)."""
        start, end = bounds() if noise_inputs else ("", "")
        for name in sorted(noise_inputs):
            local = p + "noise/" + name
            dims = [d.dim_value for d in noise_inputs[name].type.tensor_type.shape.dim[1:]]
            if name in per_row:  # [B·S_max, *dims] -> [B, S_max, *dims] -> members start.. -> [B·c, *dims]
                split = g.add("Concat", [batch, g.i64(local + "/s_dims", total, *dims)], local + "/split", axis=0)
                rows = g.add("Reshape", [name, split], local + "/rows")
                part = g.add("Slice", [rows, start, end, g.i64(local + "/axis", 1)], local + "/part")
                bc = g.add("Mul", [batch, g.i64(local + "/c", rule.chunk)], local + "/bc")
                flat = g.add("Concat", [bc, g.i64(local + "/dims", *dims)], local + "/flat", axis=0)
                g.add("Reshape", [part, flat], local)
            else:  # [S_max, *dims] -> [c, *dims] (a static shape: TensorRT takes no dynamic Conv weights)
                part = g.add("Slice", [name, start, end, g.i64(local + "/axis", 0)], local + "/part")
                g.add("Reshape", [part, g.i64(local + "/shape", rule.chunk, *dims)], local)
            rename[name] = local

    return slices


def _initial_state(outer: _Graph, batch: str, classes: int) -> list[str]:
    """The running statistics before the first chunk (:data:`STATE` order): zeros [B] / [B, K], every row drawing."""
    rows_k = outer.add("Concat", [batch, outer.i64(A + "k", classes)], A + "batch_k", axis=0)

    def fill(shape: str, value: float, out: str) -> str:
        return outer.add("ConstantOfShape", [shape], out, value=numpy_helper.from_array(np.full(1, value, np.float32)))

    zeros_b, zeros_bk = fill(batch, 0.0, A + "zeros_b"), fill(rows_k, 0.0, A + "zeros_bk")
    return [zeros_b, fill(batch, 1.0, A + "ones_b"), zeros_bk, zeros_bk, zeros_b]


def _head(outer: _Graph, state: list[str]) -> None:
    """The head on the final running statistics (the fixed head's formulas: tasks.classification) and ``samples``."""
    n, _, mean, _, neg_h_state = state
    probs = outer.add("Identity", [mean], "probs")
    logp = outer.add("Log", [outer.add("Max", [probs, outer.f32(A + "eps", 1e-12)], A + "probs_eps")], A + "logprobs")
    neg_h = outer.reduce("ReduceSum", outer.add("Mul", [probs, logp], A + "plogp"), -1, A + "neg_entropy")
    outer.add("Neg", [neg_h], "entropy")
    mi = outer.add("Neg", [outer.add("Sub", [neg_h, neg_h_state], A + "neg_mi")], A + "mi_raw")
    outer.add("Max", [mi, outer.f32(A + "mi_floor", 0.0)], "mutual_info")
    outer.add("Cast", [n], SAMPLES_OUTPUT, to=TensorProto.INT64)


def _assemble(base: onnx.ModelProto, outer: _Graph, differing: set[str], per_row: set[str], rule: StoppingRule,
              classes: int) -> onnx.ModelProto:
    """The anytime model: ``outer``'s nodes, the first chunk's initializers they read (but the per-chunk ones),
    the data and the S_max fixed export's noise inputs, the head's outputs."""
    graph = base.graph
    used = set()
    for node in outer.nodes:
        used.update(node.input)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                used.update(x for sub in a.g.node for x in sub.input)
    kept = [t for t in graph.initializer if t.name in used and t.name not in differing]
    vi = helper.make_tensor_value_info
    inputs = [graph.input[0]]
    for noise in sorted(graph.input[1:], key=lambda i: i.name):  # the S_max fixed export's noise shapes
        dims = [d.dim_param or d.dim_value for d in noise.type.tensor_type.shape.dim]
        dims[0] = dims[0] if noise.name in per_row else rule.max_samples
        inputs.append(vi(noise.name, TensorProto.FLOAT, dims))
    outputs = [vi("probs", TensorProto.FLOAT, ["batch", classes]), vi("entropy", TensorProto.FLOAT, ["batch"]),
               vi("mutual_info", TensorProto.FLOAT, ["batch"]), vi(SAMPLES_OUTPUT, TensorProto.INT64, ["batch"])]
    out_graph = helper.make_graph(outer.nodes, f"edgebnn_anytime_{graph.name}", inputs, outputs, kept + outer.inits)
    out = helper.make_model(out_graph, opset_imports=list(base.opset_import), producer_name="edgebnn")
    out.ir_version = base.ir_version
    return out


Slicer = Callable[[_Graph, str, Callable[[], tuple[str, str]], dict[str, str]], None]


@dataclass(frozen=True)
class _Chunking:
    """What every chunk's copy reads: the positions (in graph order) of the nodes that change per chunk, the member
    logits [B, c, K], the rule and its per-iteration constants (:meth:`StoppingRule.constants`), and how a chunk
    slices the host noise."""

    drawn: list[int]
    logits3: str
    rule: StoppingRule
    classes: int
    coef: np.ndarray
    thresh: np.ndarray
    slices: Slicer


def _loop(outer: _Graph, graph: onnx.GraphProto, state: list[str], ch: _Chunking) -> list[str]:
    """A Loop of at most S_max / c iterations over one chunk body; iteration i reads its members' noise and the
    rule's constants at i. Returns the final state's names."""
    drawn, logits3, rule, classes, coef, thresh, slices = (ch.drawn, ch.logits3, ch.rule, ch.classes, ch.coef,
                                                           ch.thresh, ch.slices)
    body = _Graph(outer.opset)
    it, cond = S + "i", S + "cond"

    def bounds() -> tuple[str, str]:  # i·c .. i·c + c
        start = body.add("Unsqueeze", [body.add("Mul", [it, body.const(A + "chunk_i", np.array(rule.chunk, np.int64))],
                                                A + "start0"), body.i64(A + "ax0", 0)], A + "start")
        return start, body.add("Add", [start, body.i64(A + "chunk_1", rule.chunk)], A + "end")

    rename: dict[str, str] = {}
    slices(body, A, bounds, rename)
    body.nodes.extend(_copy(graph.node[k], rename, None, 0.0) for k in drawn)
    a_i = body.add("Gather", [outer.const(A + "coef", coef), it], A + "a_i", axis=0)
    t_i = body.add("Gather", [outer.const(A + "thresh", thresh), it], A + "t_i", axis=0)
    old, new = [S + k for k in STATE], [S + k + "_out" for k in STATE]
    _update(body, A, logits3, rule.chunk, old, new, a_i, t_i)
    _any(body, new[1], S + "cond_out")
    body_graph = helper.make_graph(
        body.nodes, "anytime_chunk",
        [helper.make_tensor_value_info(it, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond, TensorProto.BOOL, []), *_state_info(old, classes)],
        [helper.make_tensor_value_info(S + "cond_out", TensorProto.BOOL, []), *_state_info(new, classes)],
        body.inits)
    final = [A + "final/" + k for k in STATE]
    trips = outer.const(A + "chunks", np.array(rule.chunks, np.int64))
    outer.nodes.append(helper.make_node("Loop", [trips, outer.const(A + "go", np.array(True)), *state], final,
                                        body=body_graph))
    return final


SEED_STEP = 1000.0  # chunk i's copy of a random op draws with seed + i·SEED_STEP (If chain)


def _chain(outer: _Graph, chunks: list[onnx.ModelProto], differing: set[str], state: list[str],
           ch: _Chunking) -> list[str]:
    """Chunk 0 inline, then one If per further chunk, run while any row is drawing, its constants inside its then
    branch (the else branch passes the state on). Returns the final state's names."""
    drawn, logits3, rule, classes, coef, thresh, slices = (ch.drawn, ch.logits3, ch.rule, ch.classes, ch.coef,
                                                           ch.thresh, ch.slices)
    c = rule.chunk
    for i, chunk in enumerate(chunks):
        p = f"at{i}/"
        g = outer if i == 0 else _Graph(outer.opset)
        rename: dict[str, str] = {}

        def bounds(g: _Graph = g, p: str = p, i: int = i) -> tuple[str, str]:  # members i·c .. i·c + c
            return g.i64(p + "start", i * c), g.i64(p + "end", i * c + c)

        slices(g, p, bounds, rename)
        for t in chunk.graph.initializer:
            if t.name in differing:
                copy = onnx.TensorProto()
                copy.CopyFrom(t)
                copy.name = rename[t.name] = p + "const/" + t.name
                g.inits.append(copy)
        g.nodes.extend(_copy(chunk.graph.node[k], rename, p + "g/", i * SEED_STEP) for k in drawn)
        new = [p + k for k in STATE]
        _update(g, p, rename[logits3], c, state, new, g.f32(p + "coef", float(coef[i])),
                g.f32(p + "thresh", float(thresh[i])))
        if i > 0:
            keep = [p + "keep/" + k for k in STATE]
            then = helper.make_graph(g.nodes, f"anytime_chunk{i}", [], _state_info(new, classes), g.inits)
            other = helper.make_graph([helper.make_node("Identity", [x], [y])
                                       for x, y in zip(state, keep, strict=True)],
                                      f"anytime_done{i}", [], _state_info(keep, classes))
            new = [p + "state/" + k for k in STATE]
            outer.nodes.append(helper.make_node("If", [_any(outer, state[1], p + "drawing")], new, then_branch=then,
                                                else_branch=other))
        state = new
    return state
