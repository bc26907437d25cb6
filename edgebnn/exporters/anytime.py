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

from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
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


def member_logits(graph: onnx.GraphProto, task: str = "classification") -> str:
    """The value [B, S, ...] of per-member outputs the task's head reads (found by structure: compact exports
    rename every value): a classifier's or a segmentation's logits (``probs = ReduceMean(Softmax(it))``), a
    regression's outputs (``mean = ReduceMean(it)``, or of a Slice of it: the means of a log-variance head)."""
    producer = {o: n for n in graph.node for o in n.output}
    if task == "regression":
        mean = producer.get("mean")
        src = producer.get(mean.input[0]) if mean is not None and mean.op_type == "ReduceMean" else None
        if mean is None or mean.op_type != "ReduceMean":
            raise UnsupportedLayerError("--samples auto: the export's head is not the regression head (mean = mean "
                                        "of the members' means)")
        return src.input[0] if src is not None and src.op_type == "Slice" else mean.input[0]
    mean = producer.get("probs")
    soft = producer.get(mean.input[0]) if mean is not None and mean.op_type == "ReduceMean" else None
    if soft is None or soft.op_type != "Softmax":
        raise UnsupportedLayerError("--samples auto: the export's head is not the classification head "
                                    "(probs = mean of softmax)")
    return soft.input[0]


@dataclass(frozen=True)
class Kind:
    """What the rule bounds, by task (docs/anytime.md): ``classification`` (class probabilities, and the class),
    ``segmentation`` (every pixel's class probabilities) or ``regression`` (the predictive mean, to a share ε of
    the predictive std); ``width``: K classes or D dims (the rule's Bonferroni count per look); ``rank``: of the
    per-member values [B, S, ...]; a regression's head (``mean_logvar``: log-variances follow the means) and its
    stated noise variance."""

    task: str
    width: int
    rank: int = 3
    logvar: bool = False
    noise_var: float = 0.0

    @classmethod
    def of(cls, task: Any, classes: int) -> Kind:
        """The kind of a task (:class:`edgebnn.tasks.Task`); a task the rule has no statement for is refused."""
        if task.name == "classification":
            return cls("classification", classes)
        if task.name == "segmentation":
            return cls("segmentation", int(task.shape[0]), rank=len(task.shape) + 2)
        if task.name == "regression":
            return cls("regression", int(task.dims), logvar=task.head == "mean_logvar",
                       noise_var=float(task.noise_var or 0.0))
        raise InvalidOptionError(f"--samples auto: the stopping rule has no statement for a {task.name} model "
                                 "(classification, segmentation and regression have one): give --samples N")


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

    def reduce(self, op: str, x: str, axis: int | tuple[int, ...], out: str, keepdims: int = 0) -> str:
        """``op`` over one axis or several (axes as an input from opset 18, ReduceSum from 13; an attribute
        before)."""
        axes = [axis] if isinstance(axis, int) else list(axis)
        if self.opset >= 18 or (op == "ReduceSum" and self.opset >= 13):
            return self.add(op, [x, self.i64(out + "/axes", *axes)], out, keepdims=keepdims)
        return self.add(op, [x], out, axes=axes, keepdims=keepdims)


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
    kind: Kind

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


def anytime_graph(chunks: list[onnx.ModelProto], rule: StoppingRule, kind: Kind, per_row: set[str], *,
                  compress: bool = True) -> onnx.ModelProto:
    """The graph of the module docstring from the fixed export of each chunk under ``rule`` (one graph when every
    chunk is the same: in-graph draws or host noise; one per chunk: baked members); ``per_row``: the host noise
    inputs with one row per (input, member) (the others have one per member). The metadata is the caller's."""
    graph = chunks[0].graph
    outer = _Graph(next(o.version for o in chunks[0].opset_import if o.domain in ("", "ai.onnx")))
    logits3 = member_logits(graph, kind.task)
    noise = {i.name: i for i in graph.input[1:]}
    differing = _differing(chunks)
    drawn, fold = _split_nodes(graph, logits3, differing | set(noise), outer)
    coef, thresh = rule.constants(kind.width)
    plan = _Plan(chunks, differing, drawn, fold, logits3, rule, coef, thresh, noise, per_row, kind)
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
    final = _chunk(outer, plan, 0, rows) if compress else _chain(outer, plan, rows)
    _head(outer, kind, final)
    return _assemble(chunks[0], outer, differing, per_row, rule)


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
    return _merge(g, p, plan.kind, rename[plan.logits3], (i, c), rows.state)


def _chunk(g: _Graph, plan: _Plan, i: int, rows: _Rows) -> State:
    """Chunk ``i`` on ``rows`` in ``g``, then the rule; the rows that go on run the next chunks, compressed to
    those rows, inside an ``If`` taken only when one does (:func:`_rest`). Returns the rows' final (samples, mean,
    M2, E) names."""
    p, c = f"at{i}/", plan.rule.chunk
    mean, m2, extra = _draw(g, plan, i, rows)
    n_here = g.add("ConstantOfShape", [rows.batch], p + "n", value=numpy_helper.from_array(
        np.full(1, (i + 1) * c, np.int64)))
    here = (n_here, mean, m2, extra)
    if i == plan.rule.chunks - 1:
        return here
    if plan.thresh[i] < 0:  # not a look (or the rule off): every row goes on, in this graph
        return _chunk(g, plan, i + 1, dataclasses.replace(rows, state=(mean, m2, extra)))
    return _rest(g, plan, i, rows, _margin(g, p, plan, i, (mean, m2, extra)), here)


def _chain(g: _Graph, plan: _Plan, rows: _Rows) -> State:
    """For TensorRT (whose RTX parser has no NonZero and whose builder fails on nested conditionals): chunk 0
    inline, then one ``If`` per further chunk in sequence, taken while any row is drawing, on every row; a row
    that settled keeps its statistics (``Where``). Returns the final (samples, mean, M2, E) names."""
    c, rank = plan.rule.chunk, plan.kind.rank
    stats = _draw(g, plan, 0, rows)
    ones = g.add("ConstantOfShape", [rows.batch], A + "ones", value=numpy_helper.from_array(np.ones(1, np.float32)))
    going = g.add("Unsqueeze", [ones, g.i64(A + "ax_rest", *range(1, rank))], A + "going0")  # [R, 1, ...]: drawing
    n = g.add("ConstantOfShape", [rows.batch], A + "n0", value=numpy_helper.from_array(np.full(1, c, np.int64)))
    state: State = (n, *stats)
    kinds = [(TensorProto.INT64, 1)] + [(TensorProto.FLOAT, rank)] * 3
    for i in range(1, plan.rule.chunks):
        p = f"at{i}/"
        if plan.thresh[i - 1] >= 0:  # the look after chunk i - 1
            margin = _margin(g, f"at{i - 1}/", plan, i - 1, state[1:])
            going = g.add("Mul", [going, g.add("Cast", [g.add("GreaterOrEqual", [margin, g.f32(p + "zero", 0.0)],
                                                              p + "go_b")], p + "go_f", to=TensorProto.FLOAT)],
                          p + "going")
        b = _Graph(g.opset)
        new = _draw(b, plan, i, dataclasses.replace(rows, state=state[1:]))
        on_all = b.add("Cast", [going], p + "on_all", to=TensorProto.BOOL)
        on = b.add("Squeeze", [on_all, b.i64(p + "ax_rest", *range(1, rank))], p + "on")
        n_next = b.add("Add", [state[0], b.i64(p + "c", c)], p + "n_next")
        outs = [b.add("Where", [cond, a, old], p + "out/" + k) for k, cond, a, old in
                zip(STATE, (on, on_all, on_all, on_all), (n_next, *new), state, strict=True)]
        info = [helper.make_tensor_value_info(v, t, [None] * r) for v, (t, r) in zip(outs, kinds, strict=True)]
        keep = [p + "keep/" + k for k in STATE]
        then = helper.make_graph(b.nodes, f"anytime_chunk{i}", [], info, b.inits)
        other = helper.make_graph([helper.make_node("Identity", [v], [k]) for v, k in zip(state, keep, strict=True)],
                                  f"anytime_done{i}", [], [helper.make_tensor_value_info(k, t, [None] * r) for k, (t, r)
                                                          in zip(keep, kinds, strict=True)])
        result = [p + "state/" + k for k in STATE]
        cond = g.add("Greater", [g.add("ReduceMax", [going], p + "any_f", keepdims=0), g.f32(p + "half", 0.5)],
                     p + "drawing")
        g.nodes.append(helper.make_node("If", [cond], result, then_branch=then, else_branch=other))
        state = (result[0], result[1], result[2], result[3])
    return state


STATE = ("n", "mean", "m2", "extra")  # per row: members drawn, mean and M2 of the values, the mean of the extra term
State = tuple[str, str, str, str]


def _merge(g: _Graph, p: str, kind: Kind, x3: str, at: tuple[int, int], state: tuple[str, str, str] | None,
           ) -> tuple[str, str, str]:
    """Merge chunk i's member outputs ``x3`` [R, c, ...] (``at``: (i, c)) into the running statistics ``state``
    of rows that have seen n = i·c members: the mean and M2 of the bounded values (class probabilities, or a
    regression's means) and the mean of the extra term (Σ p log p over the classes; a log-variance head's
    variance), each [R, 1, ...]. Chan et al.'s pairwise update: w = c / (n + c), mean' = mean + d·w,
    M2' = M2 + M2_c + d²·n·w, E' = E + (E_c - E)·w with d = chunk mean - mean; w and n·w are constants, every row
    having seen the chunk's n."""
    i, c = at
    if kind.task == "regression":
        d = kind.width
        vs = _slice(g, x3, 0, d, p + "mu_s") if kind.logvar else x3
        extra_s = g.add("Exp", [_slice(g, x3, d, 2 * d, p + "logvar_s")], p + "var_s") if kind.logvar else vs
    else:  # the class axis: 2 of [R, c, K] and of [R, c, C, *sp]
        vs = g.add("Softmax", [x3], p + "p_s", axis=2)
        logps = g.add("LogSoftmax", [x3], p + "logp_s", axis=2)
        extra_s = g.reduce("ReduceSum", g.add("Mul", [vs, logps], p + "plogp_s"), 2, p + "neg_h_s", keepdims=1)
    cmean = g.reduce("ReduceMean", vs, 1, p + "chunk_mean", keepdims=1)
    cm2 = g.reduce("ReduceSumSquare", g.add("Sub", [vs, cmean], p + "dev"), 1, p + "chunk_m2", keepdims=1)
    cextra = g.reduce("ReduceMean", extra_s, 1, p + "chunk_extra", keepdims=1)
    if state is None:
        return cmean, cm2, cextra
    mean, m2, extra = state
    w, nw = g.f32(p + "w", 1.0 / (i + 1)), g.f32(p + "nw", i * c / (i + 1))
    d_ = g.add("Sub", [cmean, mean], p + "d")
    mean_new = g.add("Add", [mean, g.add("Mul", [d_, w], p + "dw")], p + "mean_new")
    m2_new = g.add("Add", [g.add("Add", [m2, cm2], p + "m2_sum"),
                           g.add("Mul", [g.add("Mul", [d_, d_], p + "d2"), nw], p + "d2nw")], p + "m2_new")
    extra_new = g.add("Add", [extra, g.add("Mul", [g.add("Sub", [cextra, extra], p + "dextra"), w], p + "dextra_w")],
                      p + "extra_new")
    return mean_new, m2_new, extra_new


def _slice(g: _Graph, x: str, start: int, end: int, out: str) -> str:
    """``x[:, :, start:end]``."""
    return g.add("Slice", [x, g.i64(out + "/start", start), g.i64(out + "/end", end), g.i64(out + "/axis", 2)], out)


def _margin(g: _Graph, p: str, plan: _Plan, i: int, stats: tuple[str, str, str]) -> str:
    """Per row [R, 1, ...], a value >= 0 where the row draws on after chunk ``i`` (:meth:`StoppingRule.settled`'s
    test): the largest r² - ε² (r² = a_i·M2; a regression's threshold is ε²·(its predictive variance)), and for a
    classifier also the second-highest upper end minus the highest lower end (>= 0: another class's interval
    reaches the top class's)."""
    kind, (mean, m2, extra) = plan.kind, stats
    coef, thresh = float(plan.coef[i]), float(plan.thresh[i])
    r2 = g.add("Mul", [m2, g.f32(p + "coef", coef)], p + "r2")
    rest = tuple(range(1, kind.rank))
    if kind.task == "regression":  # ε² · (aleatoric + M2 / n): the predictive variance at n = (i + 1)·c
        n = (i + 1) * plan.rule.chunk
        aleatoric = extra if kind.logvar else g.f32(p + "noise_var", kind.noise_var)
        var = g.add("Add", [aleatoric, g.add("Mul", [m2, g.f32(p + "inv_n", 1.0 / n)], p + "epistemic")], p + "var")
        excess = g.add("Sub", [r2, g.add("Mul", [var, g.f32(p + "eps2", thresh)], p + "bound")], p + "excess")
        return g.reduce("ReduceMax", excess, rest, p + "margin", keepdims=1)
    wide = g.add("Sub", [g.reduce("ReduceMax", r2, rest, p + "r2_max", keepdims=1), g.f32(p + "thresh", thresh)],
                 p + "wide")
    if kind.task == "segmentation" or kind.width < 2:
        return wide
    r = g.add("Sqrt", [r2], p + "r")
    best_low = g.reduce("ReduceMax", g.add("Sub", [mean, r], p + "low"), -1, p + "best_low", keepdims=1)
    top2 = p + "top2"
    g.nodes.append(helper.make_node("TopK", [g.add("Add", [mean, r], p + "high"), g.i64(p + "two", 2)],
                                    [top2, p + "top2_idx"], axis=-1))
    second = g.add("Slice", [top2, g.i64(p + "one", 1), g.i64(p + "two_end", 2), g.i64(p + "last", -1)],
                   p + "second")
    return g.add("Max", [wide, g.add("Sub", [second, best_low], p + "overlap")], p + "margin")


def _rest(g: _Graph, plan: _Plan, i: int, rows: _Rows, margin: str, here: State) -> State:
    """After chunk ``i``'s look: an ``If`` taken when some row goes on (its ``margin`` >= 0), whose branch runs
    chunk i + 1 on those rows and writes their final statistics over ``here`` (samples, mean, M2, E of every row);
    the other branch passes ``here`` on. The rows leave the batch (:func:`_compressed`)."""
    p = f"at{i}/rest/"
    zero = g.f32(p + "zero", 0.0)
    cond = g.add("GreaterOrEqual", [g.add("ReduceMax", [margin], p + "worst", keepdims=0), zero], p + "any")
    b = _Graph(g.opset)
    going = b.add("GreaterOrEqual", [margin, zero], p + "going")  # [R, 1, ...]
    outs = _compressed(b, plan, i, rows, going, here)
    keep = [p + "keep/" + k for k in STATE]
    then = helper.make_graph(b.nodes, f"anytime_rest{i + 1}", [], _info(outs, plan.kind.rank), b.inits)
    other = helper.make_graph([helper.make_node("Identity", [v], [k]) for v, k in zip(here, keep, strict=True)],
                              f"anytime_done{i + 1}", [], _info(keep, plan.kind.rank))
    result = [p + "state/" + k for k in STATE]
    g.nodes.append(helper.make_node("If", [cond], result, then_branch=then, else_branch=other))
    return result[0], result[1], result[2], result[3]


def _compressed(b: _Graph, plan: _Plan, i: int, rows: _Rows, going: str, here: State) -> list[str]:
    """In ``b``: the rows ``going`` gathered (their data, fold values, per-row noise and statistics), chunk i + 1
    and the next on them, their final (samples, mean, M2, E) scattered back over ``here``'s."""
    p = f"at{i}/rest/"
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
                (take(here[1], "mean"), take(here[2], "m2"), take(here[3], "extra")))
    finals = _chunk(b, plan, i + 1, sub)
    return [b.add("ScatterND", [full, at, part], p + "out/" + k)
            for k, full, part in zip(STATE, here, finals, strict=True)]


def _info(names: list[str], rank: int) -> list[onnx.ValueInfoProto]:
    """Value infos of a branch's (samples [R], mean, M2, E [R, 1, ...]) outputs."""
    return [helper.make_tensor_value_info(v, TensorProto.INT64 if k == 0 else TensorProto.FLOAT,
                                          [None] * (1 if k == 0 else rank)) for k, v in enumerate(names)]


def _head(outer: _Graph, kind: Kind, final: State) -> None:
    """The task's outputs from the final running statistics (the fixed head's formulas: :mod:`edgebnn.tasks`) and
    ``samples``."""
    n, mean, m2, extra = final
    ax1 = outer.i64(A + "ax1", 1)
    outer.add("Identity", [n], SAMPLES_OUTPUT)
    if kind.task == "regression":
        mu = outer.add("Squeeze", [mean, ax1], "mean")
        n_f = outer.add("Unsqueeze", [outer.add("Cast", [n], A + "n_f", to=TensorProto.FLOAT), ax1], A + "n_col")
        epistemic = outer.add("Div", [outer.add("Squeeze", [m2, ax1], A + "m2"), n_f], "epistemic")
        aleatoric = outer.add("Squeeze", [extra, ax1], "aleatoric") if kind.logvar else outer.add(
            "Add", [outer.add("Mul", [mu, outer.f32(A + "zero", 0.0)], A + "zeros"),
                    outer.f32(A + "noise_var", kind.noise_var)], "aleatoric")
        outer.add("Add", [aleatoric, epistemic], "variance")
        return
    probs = outer.add("Squeeze", [mean, ax1], "probs")  # [B, K] or [B, C, *sp]: the classes on axis 1
    logp = outer.add("Log", [outer.add("Max", [probs, outer.f32(A + "eps", 1e-12)], A + "probs_eps")], A + "logprobs")
    neg_h = outer.reduce("ReduceSum", outer.add("Mul", [probs, logp], A + "plogp"), 1, A + "neg_entropy")
    entropy = outer.add("Neg", [neg_h], "entropy")
    mean_neg_h = outer.add("Squeeze", [extra, outer.i64(A + "ax12", 1, 2)], A + "mean_neg_h")
    mi = outer.add("Add", [entropy, mean_neg_h], A + "mi_raw")
    outer.add("Max", [mi, outer.f32(A + "mi_floor", 0.0)], "mutual_info")


def _names_read(nodes: list[onnx.NodeProto]) -> set[str]:
    """Every value ``nodes`` and their subgraphs (at any depth) read."""
    used: set[str] = set()
    for node in nodes:
        used.update(node.input)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                used |= _names_read(list(a.g.node))
    return used


def _assemble(base: onnx.ModelProto, outer: _Graph, differing: set[str], per_row: set[str],
              rule: StoppingRule) -> onnx.ModelProto:
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
    outputs = [*graph.output, vi(SAMPLES_OUTPUT, TensorProto.INT64, ["batch"])]  # the task's, then samples
    out_graph = helper.make_graph(outer.nodes, f"edgebnn_anytime_{graph.name}", inputs, outputs, kept + outer.inits)
    out = helper.make_model(out_graph, opset_imports=list(base.opset_import), producer_name="edgebnn")
    out.ir_version = base.ir_version
    return out
