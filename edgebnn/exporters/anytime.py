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


SEED_STEP = 1000.0  # chunk i's copy of a random op draws with seed + i·SEED_STEP


def _copy(node: onnx.NodeProto, rename: dict[str, str], prefix: str | None, seed_offset: float) -> onnx.NodeProto:
    """``node`` reading ``rename``d inputs; with a ``prefix``, its outputs renamed too (recorded in ``rename``); a
    random op's seed moved by ``seed_offset`` (so another copy draws other numbers)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for k, x in enumerate(copy.input):
        copy.input[k] = rename.get(x, x)
    if prefix is not None:
        copy.name = prefix + copy.name if copy.name else ""
        for k, x in enumerate(copy.output):
            rename[x] = copy.output[k] = prefix + x
    if seed_offset and node.op_type in RANDOM_OPS:
        for a in copy.attribute:
            if a.name == "seed":
                a.f += seed_offset
    return copy


@dataclass(frozen=True)
class _Plan:
    """What every chunk's copy reads: the chunk graphs (one, or one per chunk: baked members), the initializers that
    differ between them, the positions (graph order) of the nodes that change per chunk (``drawn``) and of the
    once-per-call nodes that read the data (``fold``: re-run on a compressed batch), the member logits [B, c, K],
    the rule and its per-chunk constants (:meth:`StoppingRule.constants`), the host noise inputs and which of them
    have a row per (input, member)."""

    chunks: list[onnx.ModelProto]
    differing: set[str]
    drawn: list[int]
    fold: list[int]
    logits3: str
    rule: StoppingRule
    coef: np.ndarray
    thresh: np.ndarray
    noise: dict[str, onnx.ValueInfoProto]
    per_row: set[str]
    classes: int

    def graph(self, i: int) -> onnx.GraphProto:
        return self.chunks[i if len(self.chunks) > 1 else 0].graph


@dataclass(frozen=True)
class _Rows:
    """The rows a chunk runs on, in the graph being built: their batch ([1] int64), the names the chunk graph's data
    and fold values have for them (``values``), the per-row host noise as [rows, S_max, ...], and the running
    statistics (mean, M2, E[Σ p log p]) of their members so far (None before the first chunk)."""

    batch: str
    values: dict[str, str]
    noise: dict[str, str]
    state: tuple[str, str, str] | None


def anytime_graph(chunks: list[onnx.ModelProto], rule: StoppingRule, classes: int, per_row: set[str], *,
                  compress: bool = True) -> onnx.ModelProto:
    """The graph of the module docstring from the fixed export of each chunk under ``rule`` (one graph when every
    chunk is the same: in-graph draws or host noise; one per chunk: baked members); ``per_row``: the host noise
    inputs with one row per (input, member) (the others have one per member). The metadata is the caller's."""
    graph = chunks[0].graph
    outer = _Graph(next(o.version for o in chunks[0].opset_import if o.domain in ("", "ai.onnx")))
    logits3 = member_logits(graph)
    noise = {i.name: i for i in graph.input[1:]}
    differing = _differing(chunks)
    drawn, fold = _split_nodes(graph, logits3, differing | set(noise), outer)
    coef, thresh = rule.constants(classes)
    plan = _Plan(chunks, differing, drawn, fold, logits3, rule, coef, thresh, noise, per_row, classes)
    x = graph.input[0].name
    batch = outer.add("Slice", [outer.add("Shape", [x], A + "x_shape"), outer.i64(A + "s0", 0), outer.i64(A + "s1", 1)],
                      A + "batch")
    rows_noise = {}
    for name in sorted(per_row & set(noise)):  # [B·S_max, *dims] -> [B, S_max, *dims]: rows leave by Gather
        dims = [d.dim_value for d in noise[name].type.tensor_type.shape.dim[1:]]
        split = outer.add("Concat", [batch, outer.i64(A + name + "/s_dims", rule.max_samples, *dims)],
                          A + name + "/split", axis=0)
        rows_noise[name] = outer.add("Reshape", [name, split], A + name + "/rows")
    rows = _Rows(batch, {}, rows_noise, None)
    n, mean, neg_h = _chunk(outer, plan, 0, rows) if compress else _chain(outer, plan, rows)
    _head(outer, n, mean, neg_h)
    return _assemble(chunks[0], outer, differing, per_row, rule, classes)


def _differing(chunks: list[onnx.ModelProto]) -> set[str]:
    """The initializers whose values differ between the chunk graphs (baked members)."""
    if len(chunks) == 1:
        return set()
    others = [{t.name: t.SerializeToString() for t in ch.graph.initializer} for ch in chunks[1:]]
    return {t.name for t in chunks[0].graph.initializer
            if any(t.SerializeToString() != other[t.name] for other in others)}


def _split_nodes(graph: onnx.GraphProto, logits3: str, varying: set[str], outer: _Graph) -> tuple[list[int], list[int]]:
    """The nodes the member logits are computed from, split: those that change per chunk (random ops and what reads
    ``varying`` values, transitively) by position, returned first; the others (decodes, constants, the input fold:
    once per call) appended to ``outer``, the positions of those that read the data (transitively) returned
    second."""
    producer = {o: n for n in graph.node for o in n.output}
    needed: set[int] = set()
    stack = [logits3]
    while stack:
        node = producer.get(stack.pop())
        if node is None or id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(node.input)
    varying, data = set(varying), {graph.input[0].name}
    drawn: list[int] = []
    fold: list[int] = []
    for k, node in enumerate(graph.node):  # graph order is topological
        if id(node) not in needed:
            continue
        if node.op_type in RANDOM_OPS or any(x in varying for x in node.input):
            varying.update(node.output)
            drawn.append(k)
            continue
        outer.nodes.append(node)
        if any(x in data for x in node.input):
            data.update(node.output)
            fold.append(k)
    return drawn, fold


def _draw(g: _Graph, plan: _Plan, i: int, rows: _Rows) -> tuple[str, str, str]:
    """Chunk ``i`` on ``rows`` in ``g`` (its members of the host noise, its baked constants, its copy of the drawn
    nodes), merged into the rows' statistics: returns (mean, M2, E)."""
    p, c = f"at{i}/", plan.rule.chunk
    rename = dict(rows.values)
    for name in sorted(plan.noise):  # the chunk's members i·c .. i·c + c - 1 of each host noise input
        local = p + "noise/" + name
        dims = [d.dim_value for d in plan.noise[name].type.tensor_type.shape.dim[1:]]
        start, end = g.i64(local + "/start", i * c), g.i64(local + "/end", i * c + c)
        if name in plan.per_row:  # [R, S_max, *dims] -> [R, c, *dims] -> [R·c, *dims] (static but for R)
            part = g.add("Slice", [rows.noise[name], start, end, g.i64(local + "/axis", 1)], local + "/part")
            rc = g.add("Mul", [rows.batch, g.i64(local + "/c", c)], local + "/rc")
            flat = g.add("Concat", [rc, g.i64(local + "/dims", *dims)], local + "/flat", axis=0)
        else:  # [S_max, *dims] -> [c, *dims] (a static shape: TensorRT takes no dynamic Conv weights)
            part = g.add("Slice", [name, start, end, g.i64(local + "/axis", 0)], local + "/part")
            flat = g.i64(local + "/shape", c, *dims)
        rename[name] = g.add("Reshape", [part, flat], local)
    graph = plan.graph(i)
    for t in graph.initializer:
        if t.name in plan.differing:
            copy = onnx.TensorProto()
            copy.CopyFrom(t)
            copy.name = rename[t.name] = p + "const/" + t.name
            g.inits.append(copy)
    g.nodes.extend(_copy(graph.node[k], rename, p + "g/", i * SEED_STEP) for k in plan.drawn)
    return _merge(g, p, rename[plan.logits3], i, c, rows.state)


def _chunk(g: _Graph, plan: _Plan, i: int, rows: _Rows) -> tuple[str, str, str]:
    """Chunk ``i`` on ``rows`` in ``g``, then the rule; the rows that go on run the next chunks, compressed to
    those rows, inside an ``If`` taken only when one does (:func:`_rest`). Returns the rows' final (samples, mean,
    E[Σ p log p]) names."""
    p, c = f"at{i}/", plan.rule.chunk
    mean, m2, neg_h = _draw(g, plan, i, rows)
    n_here = g.add("ConstantOfShape", [rows.batch], p + "n", value=numpy_helper.from_array(
        np.full(1, (i + 1) * c, np.int64)))
    if i == plan.rule.chunks - 1:
        return n_here, mean, neg_h
    if plan.thresh[i] < 0:  # not a look (or the rule off): every row goes on, in this graph
        return _chunk(g, plan, i + 1, dataclasses.replace(rows, state=(mean, m2, neg_h)))
    margin = _margin(g, p, mean, m2, float(plan.coef[i]), float(plan.thresh[i]), plan.classes)
    return _rest(g, plan, i, rows, margin, (n_here, mean, m2, neg_h))


def _chain(g: _Graph, plan: _Plan, rows: _Rows) -> tuple[str, str, str]:
    """For TensorRT (whose RTX parser has no NonZero and whose builder fails on nested conditionals): chunk 0
    inline, then one ``If`` per further chunk in sequence, taken while any row is drawing, on every row; a row
    that settled keeps its statistics (``Where``). Returns the final (samples, mean, E) names."""
    c = plan.rule.chunk
    mean, m2, neg_h = _draw(g, plan, 0, rows)
    ones = g.add("ConstantOfShape", [rows.batch], A + "ones", value=numpy_helper.from_array(np.ones(1, np.float32)))
    going = g.add("Unsqueeze", [ones, g.i64(A + "ax12", 1, 2)], A + "going0")  # [R, 1, 1], 1 = drawing
    n = g.add("ConstantOfShape", [rows.batch], A + "n0", value=numpy_helper.from_array(np.full(1, c, np.int64)))
    state = (n, mean, m2, neg_h, going)
    for i in range(1, plan.rule.chunks):
        p = f"at{i}/"
        n, mean, m2, neg_h, going = state
        if plan.thresh[i - 1] >= 0:  # the look after chunk i - 1
            margin = _margin(g, f"at{i - 1}/", mean, m2, float(plan.coef[i - 1]), float(plan.thresh[i - 1]),
                             plan.classes)
            going = g.add("Mul", [going, g.add("Cast", [g.add("GreaterOrEqual", [margin, g.f32(p + "zero", 0.0)],
                                                              p + "go_b")], p + "go_f", to=TensorProto.FLOAT)],
                          p + "going")
        b = _Graph(g.opset)
        new = _draw(b, plan, i, dataclasses.replace(rows, state=(mean, m2, neg_h)))
        on3 = b.add("Cast", [going], p + "on3", to=TensorProto.BOOL)
        on = b.add("Squeeze", [on3, b.i64(p + "ax12", 1, 2)], p + "on")
        n_next = b.add("Add", [n, b.i64(p + "c", c)], p + "n_next")
        outs = [b.add("Where", [cond, a, old], p + "out/" + k) for k, cond, a, old in
                zip(("n", "mean", "m2", "neg_h"), (on, on3, on3, on), (n_next, *new), (n, mean, m2, neg_h),
                    strict=True)]
        kinds = [(TensorProto.INT64, 1), (TensorProto.FLOAT, 3), (TensorProto.FLOAT, 3), (TensorProto.FLOAT, 1)]
        info = [helper.make_tensor_value_info(v, t, [None] * r) for v, (t, r) in zip(outs, kinds, strict=True)]
        keep = [p + "keep/" + k for k in ("n", "mean", "m2", "neg_h")]
        then = helper.make_graph(b.nodes, f"anytime_chunk{i}", [], info, b.inits)
        other = helper.make_graph([helper.make_node("Identity", [v], [k]) for v, k in
                                   zip((n, mean, m2, neg_h), keep, strict=True)], f"anytime_done{i}", [],
                                  [helper.make_tensor_value_info(k, t, [None] * r) for k, (t, r) in
                                   zip(keep, kinds, strict=True)])
        result = [p + "state/" + k for k in ("n", "mean", "m2", "neg_h")]
        cond = g.add("Greater", [g.add("ReduceMax", [going], p + "any_f", keepdims=0), g.f32(p + "half", 0.5)],
                     p + "drawing")
        g.nodes.append(helper.make_node("If", [cond], result, then_branch=then, else_branch=other))
        state = (result[0], result[1], result[2], result[3], going)
    return state[0], state[1], state[3]


def _merge(g: _Graph, p: str, logits3: str, i: int, c: int, state: tuple[str, str, str] | None,
           ) -> tuple[str, str, str]:
    """Merge chunk ``i``'s member logits ``logits3`` [R, c, K] into the running statistics ``state`` (mean and M2
    [R, 1, K], E [R]) of rows that have seen n = i·c members (Chan et al.'s pairwise update: w = c / (n + c),
    mean' = mean + d·w, M2' = M2 + M2_c + d²·n·w, E' = E + (E_c - E)·w with d = chunk mean - mean; w and n·w are
    constants, every row having seen the chunk's n)."""
    ps = g.add("Softmax", [logits3], p + "p_s", axis=-1)
    logps = g.add("LogSoftmax", [logits3], p + "logp_s", axis=-1)
    cmean = g.reduce("ReduceMean", ps, 1, p + "chunk_mean", keepdims=1)
    cm2 = g.reduce("ReduceSumSquare", g.add("Sub", [ps, cmean], p + "dev"), 1, p + "chunk_m2", keepdims=1)
    plogp = g.reduce("ReduceSum", g.add("Mul", [ps, logps], p + "plogp_s"), -1, p + "neg_h_s")
    cneg = g.reduce("ReduceMean", plogp, 1, p + "chunk_neg_h")
    if state is None:
        return cmean, cm2, cneg
    mean, m2, neg_h = state
    w, nw = g.f32(p + "w", 1.0 / (i + 1)), g.f32(p + "nw", i * c / (i + 1))
    d = g.add("Sub", [cmean, mean], p + "d")
    mean_new = g.add("Add", [mean, g.add("Mul", [d, w], p + "dw")], p + "mean_new")
    m2_new = g.add("Add", [g.add("Add", [m2, cm2], p + "m2_sum"),
                           g.add("Mul", [g.add("Mul", [d, d], p + "d2"), nw], p + "d2nw")], p + "m2_new")
    neg_new = g.add("Add", [neg_h, g.add("Mul", [g.add("Sub", [cneg, neg_h], p + "dneg"), w], p + "dneg_w")],
                    p + "neg_new")
    return mean_new, m2_new, neg_new


def _margin(g: _Graph, p: str, mean: str, m2: str, coef: float, thresh: float, classes: int) -> str:
    """Per row [R, 1, 1], a value >= 0 where the row draws on: the larger of max_k r_k² - ε² (r² = a_i·M2) and the
    second-highest upper end minus the highest lower end (>= 0: another class's interval reaches the top class's),
    :meth:`StoppingRule.settled`'s test."""
    r2 = g.add("Mul", [m2, g.f32(p + "coef", coef)], p + "r2")
    wide = g.add("Sub", [g.reduce("ReduceMax", r2, -1, p + "r2_max", keepdims=1), g.f32(p + "thresh", thresh)],
                 p + "wide")
    if classes < 2:
        return wide
    r = g.add("Sqrt", [r2], p + "r")
    best_low = g.reduce("ReduceMax", g.add("Sub", [mean, r], p + "low"), -1, p + "best_low", keepdims=1)
    top2 = p + "top2"
    g.nodes.append(helper.make_node("TopK", [g.add("Add", [mean, r], p + "high"), g.i64(p + "two", 2)],
                                    [top2, p + "top2_idx"], axis=-1))
    second = g.add("Slice", [top2, g.i64(p + "one", 1), g.i64(p + "two_end", 2), g.i64(p + "last", -1)],
                   p + "second")
    return g.add("Max", [wide, g.add("Sub", [second, best_low], p + "overlap")], p + "margin")


def _rest(g: _Graph, plan: _Plan, i: int, rows: _Rows, margin: str, here: tuple[str, str, str, str],
          ) -> tuple[str, str, str]:
    """After chunk ``i``'s look: an ``If`` taken when some row goes on (its ``margin`` >= 0), whose branch runs
    chunk i + 1 on those rows and writes their final statistics over ``here`` (samples, mean, M2, E of every row);
    the other branch passes ``here`` on. The rows leave the batch (:func:`_compressed`)."""
    p = f"at{i}/rest/"
    n_here, mean, _, neg_h = here
    zero = g.f32(p + "zero", 0.0)
    cond = g.add("GreaterOrEqual", [g.add("ReduceMax", [margin], p + "worst", keepdims=0), zero], p + "any")
    b = _Graph(g.opset)
    going = b.add("GreaterOrEqual", [margin, zero], p + "going")  # [R, 1, 1]
    outs = _compressed(b, plan, i, rows, going, here)
    keep = [p + "keep/" + k for k in ("n", "mean", "neg_h")]
    then = helper.make_graph(b.nodes, f"anytime_rest{i + 1}", [], _info(outs), b.inits)
    other = helper.make_graph([helper.make_node("Identity", [v], [k]) for v, k in zip((n_here, mean, neg_h), keep,
                                                                                       strict=True)],
                              f"anytime_done{i + 1}", [], _info(keep))
    result = [p + "state/" + k for k in ("n", "mean", "neg_h")]
    g.nodes.append(helper.make_node("If", [cond], result, then_branch=then, else_branch=other))
    return result[0], result[1], result[2]


def _compressed(b: _Graph, plan: _Plan, i: int, rows: _Rows, going: str, here: tuple[str, str, str, str],
                ) -> list[str]:
    """In ``b``: the rows ``going`` gathered (their data, fold values, per-row noise and statistics), chunk i + 1
    and the next on them, their final (samples, mean, E) scattered back over ``here``'s."""
    p = f"at{i}/rest/"
    n_here, mean, m2, neg_h = here
    idx = b.add("Gather", [b.add("NonZero", [going], p + "nz"), b.const(p + "row", np.array(0, np.int64))], p + "idx",
                axis=0)  # the rows' indices [R']
    at = b.add("Unsqueeze", [idx, b.i64(p + "ax1", 1)], p + "idx2")

    def take(v: str, name: str) -> str:
        return b.add("Gather", [v, idx], p + "take/" + name, axis=0)

    graph = plan.graph(i + 1)
    x = graph.input[0].name
    values = {x: take(rows.values.get(x, x), "x")}
    b.nodes.extend(_copy(graph.node[k], values, p + "fold/", 0.0) for k in plan.fold)
    sub = _Rows(b.add("Shape", [idx], p + "batch"), values,
                {k: take(v, "noise/" + k) for k, v in rows.noise.items()},
                (take(mean, "mean"), take(m2, "m2"), take(neg_h, "neg_h")))
    finals = _chunk(b, plan, i + 1, sub)
    return [b.add("ScatterND", [full, at, part], p + "out/" + k)
            for k, full, part in zip(("n", "mean", "neg_h"), (n_here, mean, neg_h), finals, strict=True)]


def _info(names: list[str]) -> list[onnx.ValueInfoProto]:
    """Value infos of a branch's (samples [R], mean [R, 1, K], E [R]) outputs."""
    return [helper.make_tensor_value_info(v, t, [None] * r) for v, t, r in
            zip(names, (TensorProto.INT64, TensorProto.FLOAT, TensorProto.FLOAT), (1, 3, 1), strict=True)]


def _head(outer: _Graph, n: str, mean: str, neg_h_state: str) -> None:
    """The head on the final running statistics (the fixed head's formulas: tasks.classification) and ``samples``."""
    probs = outer.add("Squeeze", [mean, outer.i64(A + "ax1", 1)], "probs")
    logp = outer.add("Log", [outer.add("Max", [probs, outer.f32(A + "eps", 1e-12)], A + "probs_eps")], A + "logprobs")
    neg_h = outer.reduce("ReduceSum", outer.add("Mul", [probs, logp], A + "plogp"), -1, A + "neg_entropy")
    entropy = outer.add("Neg", [neg_h], "entropy")
    mi = outer.add("Add", [entropy, neg_h_state], A + "mi_raw")
    outer.add("Max", [mi, outer.f32(A + "mi_floor", 0.0)], "mutual_info")
    outer.add("Identity", [n], SAMPLES_OUTPUT)


def _names_read(nodes: list[onnx.NodeProto]) -> set[str]:
    """Every value ``nodes`` and their subgraphs (at any depth) read."""
    used: set[str] = set()
    for node in nodes:
        used.update(node.input)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                used |= _names_read(list(a.g.node))
    return used


def _assemble(base: onnx.ModelProto, outer: _Graph, differing: set[str], per_row: set[str], rule: StoppingRule,
              classes: int) -> onnx.ModelProto:
    """The anytime model: ``outer``'s nodes, the first chunk's initializers they read (but the per-chunk ones),
    the data and the S_max fixed export's noise inputs, the head's outputs."""
    graph = base.graph
    used = _names_read(outer.nodes)
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
