"""Anytime ensembles (``edgebnn export --samples auto``): one graph that draws samples in chunks and stops each input
when its predictive has settled (the rule: :mod:`edgebnn.stopping`; docs/anytime.md).

The graph is a rewrite of what the fixed exporter writes for one chunk, ``export_onnx(model, c, ...)``, so every
mode, weight store, form and device rule of the fixed export holds unchanged inside it::

    fixed chunk graph (S = c)             anytime graph
    ─────────────────────────             ──────────────────────────────────────────────────────────────
    decodes, constants, input fold   ->   outside the Loop, once per call (they do not change per chunk)
    draws, sampled layers -> logits  ->   Loop body: chunk i's c members -> softmax -> chunk mean, M2, E[Σ p log p]
    head (mean over S)               ->   merged into per-row running statistics (rows still drawing only);
                                          the rule (r_k² = a_i · M2_k < ε², intervals disjoint) settles rows;
                                          the Loop ends when every row has settled, or after S_max / c chunks
                                          head on the running statistics; ``samples`` [B]: members each row used

What changes between chunks is given to the body by the iteration index ``i``:

- ``noise --rng graph`` / ``shared``: the random ops are in the body and draw afresh each iteration (onnxruntime:
  checked in tests/unit/test_anytime.py; a TensorRT Fill layer on a GPU: unverified, docs/tensorrt.md);
- ``--rng host``: the noise inputs keep the shapes of the S_max fixed export ([S_max, ...] per sample,
  [B·S_max, ...] per row, which :class:`edgebnn.runtime.Session` fills), and the body slices chunk i's
  members ``i·c .. i·c + c - 1`` from them;
- ``baked`` (and ``noise --noise mixed``'s baked kernels): chunk i is the fixed export of members ``i·c ..
  i·c + c - 1`` of the S_max draw (``export_onnx(..., window=(i·c, S_max))``); the constants that differ
  between chunks are stacked [S_max / c, ...] and the body gathers row i.

With the rule off (``epsilon = 0``) every row runs S_max / c chunks: the same members (baked) or the same noise
(host) as the fixed export at S_max, whose predictive it then equals to float round-off (tested).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.exporters.metadata import read_metadata, write_metadata
from edgebnn.stopping import StoppingRule
from edgebnn.tasks import CLASSIFICATION

RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})
A = "anytime/"  # prefix of every value this rewrite adds
S = A + "state/"  # the Loop body's inputs and outputs: iteration, condition, running statistics
SAMPLES_OUTPUT = "samples"


def export_anytime(model: Any, rule: StoppingRule, *, mode: str = "auto", noise: str = "auto",
                   device: str | None = None, progress: Callable[[int, int], None] | None = None,
                   **options: Any) -> tuple[onnx.ModelProto, Any]:
    """The anytime ensemble of ``model`` under ``rule``, and the export choice (mode, noise variant, why).

    ``mode``, ``noise``, ``device`` and ``options`` (``seed``, ``weights``, ``hoist``, ``form``, ``rng``) are the
    fixed export's (:func:`edgebnn.exporters.defaults.export_auto`), applied to each chunk.

    Raises:
        InvalidOptionError: analytic mode (no samples to save), a task other than classification, a rule the model
            cannot take (a deep ensemble's S_max is its M members).
    """
    from edgebnn.exporters.defaults import export_auto
    from edgebnn.exporters.ensemble import export_onnx
    from edgebnn.exporters.families import ensemble_members

    task = model.manifest.task_spec(model.where)
    if mode == "analytic":
        raise InvalidOptionError("--samples auto --mode analytic: analytic mode draws no samples (one pass computes "
                                 "the predictive), so there are none to save; give --samples N")
    if task.name != CLASSIFICATION:
        raise InvalidOptionError(f"{model.where}: --samples auto: the rule bounds class probabilities, so it takes a "
                                 f"classifier; this is a {task.name} model: give --samples N")
    members = ensemble_members(model)
    if members is not None and rule.max_samples != members:
        raise InvalidOptionError(f"{model.where}: --max-samples {rule.max_samples}: a deep ensemble of {members} "
                                 f"members draws each member once (--max-samples {members})")
    total, c = rule.max_samples, rule.chunk
    first, choice = export_auto(model, c, mode=mode, noise=noise, device=device, progress=progress,
                                window=(0, total), **options)
    if choice.mode == "analytic":
        raise InvalidOptionError("--samples auto: analytic mode has no samples to save; give --samples N")
    meta = read_metadata(first, model.where)
    if meta.noise_inputs and any(r["per"] not in ("row", "sample") or (r["per"] == "sample" and r["shape"][0] != c)
                                 for r in meta.noise_inputs):
        raise InvalidOptionError("--samples auto: --noise flipout with --rng host draws once per call; use --rng graph "
                                 "or another --noise")
    chunks = [first]
    if rule.chunks > 1:
        again = dict(options, mode=choice.mode, noise=choice.noise, device=device)
        second = export_onnx(model, c, window=(c, total), **again)
        if _differs(first, second):  # baked members: one graph per chunk, their constants stacked
            chunks += [second] + [export_onnx(model, c, window=(i * c, total), **again)
                                  for i in range(2, rule.chunks)]
    proto = anytime_graph(chunks, rule, model.manifest.num_classes,
                          {str(r["name"]) for r in meta.noise_inputs or () if r["per"] == "row"})
    records = [dict(r, shape=[r["shape"][0] if r["per"] == "row" else total, *r["shape"][1:]])
               for r in meta.noise_inputs or ()]
    write_metadata(proto, dataclasses.replace(
        meta, samples=total, outputs=(*meta.outputs, SAMPLES_OUTPUT), anytime=rule.to_dict(),
        noise_inputs=tuple(records) if meta.noise_inputs is not None else None))
    onnx.checker.check_model(proto)
    return proto, choice


def _differs(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
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
    """Nodes and initializers of one graph (the Loop body, or the graph around it)."""

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


def anytime_graph(chunks: list[onnx.ModelProto], rule: StoppingRule, classes: int, per_row: set[str],
                  ) -> onnx.ModelProto:
    """The Loop graph of the module docstring from the fixed export of each chunk (one graph when every chunk is the
    same graph: noise drawn per iteration), under ``rule``; ``per_row``: the host noise inputs with one row per
    (input, member) (the others have one per member). The metadata is the caller's."""
    base = chunks[0]
    graph = base.graph
    opset = next(o.version for o in base.opset_import if o.domain in ("", "ai.onnx"))
    logits3 = member_logits(graph)
    data = graph.input[0].name
    noise_inputs = {i.name: i for i in graph.input[1:]}
    inits = {t.name: t for t in graph.initializer}
    differing = ({name for name, t in inits.items()
                  if any(t.SerializeToString() != next(u for u in c.graph.initializer if u.name == name)
                         .SerializeToString() for c in chunks[1:])} if len(chunks) > 1 else set())

    producer = {o: n for n in graph.node for o in n.output}
    needed: set[int] = set()
    stack = [logits3]
    while stack:  # the nodes the member logits are computed from
        node = producer.get(stack.pop())
        if node is None or id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(node.input)
    varying = set(differing) | set(noise_inputs)
    body_nodes, outer_nodes = [], []
    for node in graph.node:  # graph order is topological
        if id(node) not in needed:
            continue
        if node.op_type in RANDOM_OPS or any(x in varying for x in node.input):
            varying.update(node.output)
            body_nodes.append(node)
        else:
            outer_nodes.append(node)

    outer, body = _Graph(opset), _Graph(opset)
    c, total, iterations = rule.chunk, rule.max_samples, rule.chunks
    rename: dict[str, str] = {}
    start = body.add("Mul", [S + "i", body.const(A + "chunk_i", np.array(c, np.int64))], A + "start")  # i·c
    start1 = body.add("Unsqueeze", [start, body.i64(A + "ax0", 0)], A + "start1")
    end1 = body.add("Add", [start1, body.i64(A + "chunk_1", c)], A + "end1")
    for name in sorted(noise_inputs):  # chunk i's members of the S_max fixed export's noise
        local = A + "noise/" + name
        dims = [d.dim_value for d in noise_inputs[name].type.tensor_type.shape.dim[1:]]
        if name in per_row:  # [B·S_max, *dims] -> [B, S_max, *dims] -> members i·c.. -> [B·c, *dims]
            rows = body.add("Reshape", [name, body.i64(local + "/split", -1, total, *dims)], local + "/rows")
            part = body.add("Slice", [rows, start1, end1, body.i64(local + "/axis", 1)], local + "/part")
            body.add("Reshape", [part, body.i64(local + "/flat", -1, *dims)], local)
        else:  # [S_max, *dims] -> [c, *dims]
            body.add("Slice", [name, start1, end1, body.i64(local + "/axis", 0)], local)
        rename[name] = local
    for name in sorted(differing):  # chunk i's constants: row i of the stack
        stacked = np.stack([numpy_helper.to_array(next(u for u in ch.graph.initializer if u.name == name))
                            for ch in chunks])
        outer.const(A + "chunks/" + name, stacked)
        body.add("Gather", [A + "chunks/" + name, S + "i"], A + "const/" + name, axis=0)
        rename[name] = A + "const/" + name
    for node in body_nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for k, x in enumerate(copy.input):
            copy.input[k] = rename.get(x, x)
        body.nodes.append(copy)
    outer.nodes.extend(outer_nodes)

    # chunk statistics of the member probabilities p [B, c, K]
    ps = body.add("Softmax", [logits3], A + "p_s", axis=-1)
    logps = body.add("LogSoftmax", [logits3], A + "logp_s", axis=-1)
    cmean = body.reduce("ReduceMean", ps, 1, A + "chunk_mean")
    dev = body.add("Sub", [ps, body.add("Unsqueeze", [cmean, body.i64(A + "ax1", 1)], A + "chunk_mean3")],
                   A + "dev")
    cm2 = body.reduce("ReduceSum", body.add("Mul", [dev, dev], A + "dev2"), 1, A + "chunk_m2")
    plogp = body.reduce("ReduceSum", body.add("Mul", [ps, logps], A + "plogp_s"), -1, A + "neg_h_s")
    cneg = body.reduce("ReduceMean", plogp, 1, A + "chunk_neg_h")
    # merge into the running statistics of the rows still drawing (Chan et al.): n' = n + c, w = c / n',
    # mean' = mean + d·w, M2' = M2 + M2_c + d²·n·w, E' = E + (E_c - E)·w, with d = chunk mean - mean
    n_new = body.add("Add", [S + "n", body.f32(A + "c", float(c))], A + "n_new")
    w = body.add("Div", [A + "c", n_new], A + "w")
    w2 = body.add("Mul", [S + "n", w], A + "nw")
    ax1 = A + "ax1"
    d = body.add("Sub", [cmean, S + "mean"], A + "d")
    mean_new = body.add("Add", [S + "mean", body.add("Mul", [d, body.add("Unsqueeze", [w, ax1], A + "w2d")], A + "dw")],
                        A + "mean_new")
    m2_new = body.add("Add", [body.add("Add", [S + "m2", cm2], A + "m2_sum"),
                              body.add("Mul", [body.add("Mul", [d, d], A + "d2"),
                                               body.add("Unsqueeze", [w2, ax1], A + "nw2d")], A + "d2nw")],
                      A + "m2_new")
    neg_new = body.add("Add", [S + "neg_h", body.add("Mul", [body.add("Sub", [cneg, S + "neg_h"], A + "dneg"), w],
                                                 A + "dneg_w")], A + "neg_new")
    on = body.add("Cast", [S + "active"], A + "on", to=TensorProto.BOOL)
    on2 = body.add("Unsqueeze", [on, ax1], A + "on2d")
    n_out = body.add("Where", [on, n_new, S + "n"], S + "n_out")
    mean_out = body.add("Where", [on2, mean_new, S + "mean"], S + "mean_out")
    m2_out = body.add("Where", [on2, m2_new, S + "m2"], S + "m2_out")
    neg_out = body.add("Where", [on, neg_new, S + "neg_h"], S + "neg_h_out")
    # the rule (edgebnn.stopping): r² = a_i·M2 < ε² for every class, and the top class's interval alone
    coef, thresh = rule.constants(classes)
    a_i = body.add("Gather", [outer.const(A + "coef", coef), S + "i"], A + "a_i", axis=0)
    t_i = body.add("Gather", [outer.const(A + "thresh", thresh), S + "i"], A + "t_i", axis=0)
    r2 = body.add("Mul", [m2_out, a_i], A + "r2")
    r = body.add("Sqrt", [r2], A + "r")
    close = body.add("Less", [body.reduce("ReduceMax", r2, -1, A + "r2_max"), t_i], A + "close")
    best_low = body.reduce("ReduceMax", body.add("Sub", [mean_out, r], A + "low"), -1, A + "best_low", keepdims=1)
    reach = body.add("Cast", [body.add("GreaterOrEqual", [body.add("Add", [mean_out, r], A + "high"), best_low],
                                       A + "reaches")], A + "reaches_f", to=TensorProto.FLOAT)
    alone = body.add("Less", [body.reduce("ReduceSum", reach, -1, A + "n_reach"), body.f32(A + "one_half", 1.5)],
                     A + "alone")
    settled = body.add("Cast", [body.add("And", [close, alone], A + "settled_b")], A + "settled",
                       to=TensorProto.FLOAT)
    active_out = body.add("Mul", [S + "active", body.add("Sub", [body.f32(A + "one", 1.0), settled], A + "unsettled")],
                          S + "active_out")
    body.add("Greater", [body.reduce("ReduceMax", active_out, 0, A + "any_active"), body.f32(A + "zero", 0.0)],
             S + "cond_out")

    def vi(name: str, dtype: int, dims: list[Any]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, dtype, dims)

    state = [("n", ["batch"]), ("active", ["batch"]), ("mean", ["batch", classes]), ("m2", ["batch", classes]),
             ("neg_h", ["batch"])]
    body_graph = helper.make_graph(
        body.nodes, "anytime_chunk",
        [vi(S + "i", TensorProto.INT64, []), vi(S + "cond", TensorProto.BOOL, []),
         *(vi(S + name, TensorProto.FLOAT, dims) for name, dims in state)],
        [vi(S + "cond_out", TensorProto.BOOL, []), *(vi(S + name + "_out", TensorProto.FLOAT, dims) for name, dims in state)],
        body.inits)

    # the initial state: zeros [B] / [B, K], every row active
    batch = outer.add("Slice", [outer.add("Shape", [data], A + "x_shape"), outer.i64(A + "s0", 0),
                                outer.i64(A + "s1", 1)], A + "batch")
    rows_k = outer.add("Concat", [batch, outer.i64(A + "k", classes)], A + "batch_k", axis=0)
    zeros_b = outer.add("ConstantOfShape", [batch], A + "zeros_b",
                        value=numpy_helper.from_array(np.zeros(1, np.float32)))
    ones_b = outer.add("ConstantOfShape", [batch], A + "ones_b", value=numpy_helper.from_array(np.ones(1, np.float32)))
    zeros_bk = outer.add("ConstantOfShape", [rows_k], A + "zeros_bk",
                         value=numpy_helper.from_array(np.zeros(1, np.float32)))
    trips = outer.const(A + "chunks", np.array(iterations, np.int64))
    go = outer.const(A + "go", np.array(True))
    outer.nodes.append(helper.make_node(
        "Loop", [trips, go, zeros_b, ones_b, zeros_bk, zeros_bk, zeros_b],
        [A + "final/n", A + "final/active", A + "final/mean", A + "final/m2", A + "final/neg_h"], body=body_graph))
    # the head on the running statistics (the fixed head's formulas: tasks.classification)
    probs = outer.add("Identity", [A + "final/mean"], "probs")
    logp = outer.add("Log", [outer.add("Max", [probs, outer.f32(A + "eps", 1e-12)], A + "probs_eps")], A + "logprobs")
    neg_h = outer.reduce("ReduceSum", outer.add("Mul", [probs, logp], A + "plogp"), -1, A + "neg_entropy")
    outer.add("Neg", [neg_h], "entropy")
    mi = outer.add("Neg", [outer.add("Sub", [neg_h, A + "final/neg_h"], A + "neg_mi")], A + "mi_raw")
    outer.add("Max", [mi, outer.f32(A + "mi_floor", 0.0)], "mutual_info")
    outer.add("Cast", [A + "final/n"], SAMPLES_OUTPUT, to=TensorProto.INT64)

    used = {x for n in outer.nodes for x in n.input} | {x for n in body.nodes for x in n.input}
    kept = [t for name, t in inits.items() if name in used and name not in differing]
    inputs = [graph.input[0]]
    for name in sorted(noise_inputs):  # the S_max fixed export's noise shapes
        dims = [d.dim_param or d.dim_value for d in noise_inputs[name].type.tensor_type.shape.dim]
        dims[0] = dims[0] if name in per_row else total
        inputs.append(vi(name, TensorProto.FLOAT, dims))
    outputs = [vi("probs", TensorProto.FLOAT, ["batch", classes]), vi("entropy", TensorProto.FLOAT, ["batch"]),
               vi("mutual_info", TensorProto.FLOAT, ["batch"]), vi(SAMPLES_OUTPUT, TensorProto.INT64, ["batch"])]
    out_graph = helper.make_graph(outer.nodes, f"edgebnn_anytime_{graph.name}", inputs, outputs,
                                  kept + outer.inits)
    out = helper.make_model(out_graph, opset_imports=list(base.opset_import), producer_name="edgebnn")
    out.ir_version = base.ir_version
    return out
