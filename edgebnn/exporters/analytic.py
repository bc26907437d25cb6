"""``analytic`` mode: one pass propagating means and variances (EBP's forward pass, generalised to ReLU
networks), no sampling of weights.

Every value on the data path carries (m, v) under a diagonal-Gaussian assumption (units independent):

    layer kind (Conv of any rank, Gemm; :mod:`.layers`), w ~ (mu, s²) (the encoding's ``moments()``), x ~ (m, v):
                                           m' = op(m, mu) + b_mu
                                           v' = op(m², s²) + op(v, s² + mu²) + s_b²
                                           (Var Σwx = Σ s²(v + m²) + mu² v; deterministic w: s² = 0; both
                                           variance terms are one op on [m², v] concatenated on the reduction
                                           axis, with [s², s² + mu²] and bias s_b², for Gemm and 1-group Conv; a
                                           1-group Conv on a deterministic x computes m' and v' as one Conv on
                                           [x, x²] with block weights [[mu, 0], [0, s²]], then two Slices)
    ReLU (rectified Gaussian), α = m/√v:   m' = m Φ(α) + √v φ(α),  v' = v Φ(α) + m' (m − m')
                                           (= (m² + v) Φ(α) + m √v φ(α) − m'², in fewer nodes)
    ReLU then MaxPool (its only consumer): pooled first (relu(max x) = max(relu x) draw by draw), then the
                                           ReLU's moments on the pooled units: a quarter of them for a 2x2 pool
    BatchNorm (inference, a·x + c):        m' = a m + c,  v' = a² v   (a, c per channel; a² in the graph)
    MaxPool:                               m' = MaxPool(m); v' = v at the arg-max of m
    ReduceMax (approximate, as MaxPool):   m' = ReduceMax(m); v' = v at the arg-max of m
    Slice; Pad:                            the same op on v (padding adds variance 0)
    LogSoftmax over the classes, last op:  the head itself: softmax(log_softmax(z)) = softmax(z) draw by draw,
                                           so the logits' (m, v) pass to the quadrature head unchanged
    AveragePool / ReduceMean over n units: m' = avg(m),  v' = avg(v) / n
    Add (independent operands):            m' = m₁ + m₂, v' = v₁ + v₂
    Flatten/Reshape/Transpose/(Un)Squeeze: the same op on v

The head (the task's, :mod:`edgebnn.tasks`) turns Gaussian logits (m, v) into the predictive with a fixed quasi-Monte
Carlo quadrature (S scrambled-Sobol standard-normal points moment-matched to mean 0 and covariance I,
:func:`quadrature_points`): logits_q = m + √v ⊙ z_q (a classifier's as one MatMul of [m, √v] by
:func:`quadrature_matrix`, built in the graph for compact exports), then the same head as the sampling modes, so
``mutual_info`` is the logit-level epistemic spread; a regression head reads mean and variance off (m, v). No
random ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper
from scipy.stats import norm, qmc

from edgebnn.errors import UnsupportedLayerError
from edgebnn.exporters._graph import Builder, ExportFormat, P, set_metadata, static_shapes
from edgebnn.exporters.config import GraphSpec
from edgebnn.exporters.layers import LayerKind, bias_name, layer_kind
from edgebnn.exporters.recurrent import refuse_recurrent
from edgebnn.exporters.stores import compact_names, decode, finish_stores, store_for, store_metadata
from edgebnn.exporters.stores.base import TRT
from edgebnn.exporters.stores.float_ import FLOAT
from edgebnn.ir import BNNModel, attrs_of
from edgebnn.tasks import analytic_head
from edgebnn.tasks.classification import quadrature_matrix_of

SHAPE_OPS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity"})
VAR_FLOOR = 1e-12  # keeps √v finite where a unit has no variance


def quadrature_points(samples: int, classes: int, seed: int = 0) -> np.ndarray:
    """[samples, classes] standard-normal points: a scrambled Sobol sequence (fixed for a seed), moment-matched.

    The points are centred and whitened so that their mean is exactly 0 and their second moment exactly the
    identity (ZCA: Z ← (Z − z̄) C^(-1/2), C = (Z − z̄)ᵀ(Z − z̄)/Q, the symmetric whitening that moves the points
    least; with Q ≤ K points C is singular, so each column is scaled to unit second moment instead). The
    mutual information is a small difference of two entropies whose leading term is quadratic in the logit
    deviations, ½ Σ_k v_k p_k(1 − p_k): matched points integrate that term exactly, so only the higher-order
    terms carry quadrature error. Raw Sobol points at Q = 16 misstated the MI of a digits CNN by 11% (median
    over inputs), which cost up to 0.016 MI-AUROC against Q = 1024; matched, 7% and at most 0.008
    (docs/uncertainty.md, "analytic mode").
    """
    u = qmc.Sobol(d=classes, scramble=True, seed=seed).random(samples)
    z = norm.ppf(np.clip(u, 1e-6, 1 - 1e-6))
    if samples < 2:
        return z.astype(np.float32)
    z = z - z.mean(axis=0)
    if samples > classes:
        w, u_ = np.linalg.eigh(z.T @ z / samples)
        if w.min() > 1e-9 * w.max():
            return (z @ (u_ / np.sqrt(w)) @ u_.T).astype(np.float32)
    return (z / np.sqrt(np.maximum((z * z).mean(axis=0), 1e-12))).astype(np.float32)


def quadrature_matrix(samples: int, classes: int, seed: int = 0) -> np.ndarray:
    """[2K, Q·K]: [m, s] @ it = (m + s ⊙ z_q for q in 1..Q) on the points of :func:`quadrature_points`."""
    return quadrature_matrix_of(quadrature_points(samples, classes, seed))


def export_analytic(model: BNNModel, spec: GraphSpec) -> onnx.ModelProto:
    """The analytic graph with ``spec.samples`` quadrature points; ``spec.weights``: how the moments are stored
    (:data:`.stores.STORE_CHOICES`, decoded once in the graph; the float store where a decode does not run on
    ``spec.runtimes``)."""
    samples, progress = spec.samples, spec.progress
    refuse_recurrent(model, "analytic")
    moments = _Moments(model, spec)
    nodes = moments.base.graph.node
    for k, node in enumerate(nodes, 1):
        if progress is not None:  # one step per node (a progress bar)
            progress(k, len(nodes))
        moments.visit(node)
    b, base, logits = moments.b, moments.base, moments.logits
    # the task's head (edgebnn.tasks) on the output's moments; classification and segmentation integrate the softmax at
    # the quadrature points
    analytic_head(b, logits, moments.var.get(logits), samples, model.manifest.num_classes,
                  model.manifest.task_spec(model.where), quadrature_points)
    finish_stores(b)
    out = b.model(base, list(base.graph.input), f"edgebnn_analytic_Q{samples}")
    set_metadata(out, model, mode="analytic", samples=samples, seed=None, quadrature="sobol", quadrature_seed=0,
                 **store_metadata(b))
    return out if spec.weights == "fp32" else compact_names(out)


Operand = np.ndarray | str  # a constant not emitted yet (float store, fixed weights) or a decoded graph value


class _Moments:
    """The analytic pass over the posterior-mean network: every data value's variance (``var``: value -> its
    variance value, None for 0), each node rewritten by the rule of its op (the module docstring)."""

    def __init__(self, model: BNNModel, spec: GraphSpec) -> None:
        self.model, self.weights, self.runtimes = model, spec.weights, spec.runtimes
        self.encoded = {w.name: w for w in model.encoded_weights()}
        self.base = model.float_model()
        self.shapes = static_shapes(self.base)
        inits = self.base.graph.initializer
        self.fixed = {t.name: numpy_helper.to_array(t) for t in inits if t.name not in self.encoded}
        self.b = Builder([t for t in inits if t.name not in self.encoded], ExportFormat(spec.weights, spec.runtimes))
        self.var: dict[str, str | None] = {model.manifest.input_name: None}
        self.logits = self.base.graph.output[0].name
        self.pool_of = _relu_then_max_pool(self.base.graph)
        self.skip: set[str] = set()  # MaxPools emitted before their ReLU

    def where(self, node: onnx.NodeProto) -> str:
        return f"{self.model.where}: {node.op_type} node {node.name or node.output[0]!r}"

    def moments(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name in self.encoded:
            return self.encoded[name].encoding.moments()
        if name in self.fixed:
            return self.fixed[name], np.zeros_like(self.fixed[name])
        raise UnsupportedLayerError(f"{self.model.where}: weight {name!r} is not a constant; analytic mode needs one")

    def stored(self, name: str, p: str) -> tuple[Operand, Operand]:
        """The mean and variance operands of a weight: decoded by its store, or numpy (float store, fixed)."""
        if name in self.encoded:
            enc = self.encoded[name].encoding
            if store_for(enc, self.weights, self.runtimes) is not FLOAT:
                return decode(self.b, enc, "mean", p + "_mu"), decode(self.b, enc, "variance", p + "_s2")
            self.b.stored[name] = FLOAT.op_type
        return self.moments(name)

    def visit(self, node: onnx.NodeProto) -> None:
        """Rewrite one node of the posterior-mean network (graph order)."""
        if node.output[0] in self.skip:  # a MaxPool already emitted before its ReLU
            return
        if not any(i in self.var for i in node.input) or node.op_type == "Shape":
            self.b.nodes.append(node)
            return
        p = f"{P}{node.output[0]}/"
        kind = layer_kind(node)
        if kind is not None:
            _layer_moments(self.b, node, kind, self.var, self.moments, self.stored, self.encoded, self.where(node), p)
            return
        op = node.op_type
        rule = _Moments._log_softmax_head if op == "LogSoftmax" and node.output[0] == self.logits else _RULES.get(op)
        if rule is None:
            raise UnsupportedLayerError(f"{self.where(node)}: analytic mode cannot propagate variance through {op}; "
                                        "use --mode baked or noise")
        rule(self, node, p)

    def _deterministic(self, node: onnx.NodeProto) -> None:
        """A node on zero-variance input: itself, its output of zero variance."""
        self.b.nodes.append(node)
        self.var[node.output[0]] = None

    def _relu(self, node: onnx.NodeProto, p: str) -> None:
        b, out = self.b, node.output[0]
        x, vx = node.input[0], self.var[node.input[0]]
        if vx is None:
            self._deterministic(node)
            return
        pool = self.pool_of.get(out)
        if pool is not None:  # max-pool first: relu(max x) = max(relu x) draw by draw, on a quarter of the units
            pre = p + "pooled"
            vx = _max_pool_moments(b, pool, x, vx, pre, p, self.shapes.get(x))
            x, out = pre, pool.output[0]
            self.skip.add(out)
        self.var[out] = _relu_moments(b, x, vx, out, p)

    def _batch_norm(self, node: onnx.NodeProto, p: str) -> None:
        """Inference BN is a per-channel a·x + c: two vectors instead of BN's four (plus a² for the variance)."""
        b, out, vx = self.b, node.output[0], self.var[node.input[0]]
        if vx is None:
            self._deterministic(node)
            return
        scale, shift, mean, rvar = (self.fixed[n].astype(np.float64) for n in node.input[1:5])
        a = scale / np.sqrt(rvar + attrs_of(node).get("epsilon", 1e-5))
        rank = len(self.shapes.get(node.input[0], [0, 0, 0, 0]))  # [B, C, *spatial]: C on axis 1
        axes = (-1, *([1] * (rank - 2)))
        a_name = b.f32(p + "a", a.reshape(axes))
        scaled = b.add("Mul", [node.input[0], a_name], p + "ax")
        b.nodes.append(onnx.helper.make_node("Add", [scaled, b.f32(p + "c", (shift - mean * a).reshape(axes))], [out]))
        self.var[out] = b.add("Mul", [vx, b.add("Mul", [a_name, a_name], p + "a2")], p + "v")

    def _max_pool(self, node: onnx.NodeProto, p: str) -> None:
        vx = self.var[node.input[0]]
        if vx is None:
            self._deterministic(node)
            return
        self.var[node.output[0]] = _max_pool_moments(self.b, node, node.input[0], vx, node.output[0], p,
                                                     self.shapes.get(node.input[0]))

    def _average(self, node: onnx.NodeProto, p: str) -> None:
        """AveragePool, GlobalAveragePool, ReduceMean (e.g. AdaptiveAvgPool2d(1)): the mean of n independent units,
        variance avg(v) / n."""
        b, op, out = self.b, node.op_type, node.output[0]
        b.nodes.append(node)
        vx = self.var[node.input[0]]
        if vx is None:
            self.var[out] = None
            return
        attrs, shapes = attrs_of(node), self.shapes
        if op == "ReduceMean":  # n = elements averaged per output = |input| / |output| (however the axes are given)
            if node.input[0] not in shapes or out not in shapes:
                raise UnsupportedLayerError(f"{self.where(node)}: analytic mode needs static shapes around ReduceMean")
            n = math.prod(shapes[node.input[0]]) // math.prod(shapes[out])
            pooled = b.add("ReduceMean", [vx, *node.input[1:]], p + "v_mean", **attrs)
        else:
            n = math.prod(attrs["kernel_shape"]) if op == "AveragePool" else math.prod(shapes[node.input[0]][2:])
            pooled = b.add(op, [vx], p + "v_pool", **attrs)
        self.var[out] = b.add("Mul", [pooled, b.f32(p + "inv_n", 1.0 / n)], p + "v")

    def _same_on_variance(self, node: onnx.NodeProto, p: str) -> None:
        """Shape ops, Slice and Pad (padding adds variance 0: the constant value dropped): the same op on v."""
        self.b.nodes.append(node)
        vx = self.var[node.input[0]]
        rest = list(node.input[1:]) if node.op_type in SHAPE_OPS else _zero_pad_value(node)
        self.var[node.output[0]] = None if vx is None else self.b.add(node.op_type, [vx, *rest], p + "v",
                                                                      **attrs_of(node))

    def _add(self, node: onnx.NodeProto, p: str) -> None:
        """Add, Sub of independent operands: the variances add."""
        self.b.nodes.append(node)
        self.var[node.output[0]] = _sum(self.b, [v for i in node.input if (v := self.var.get(i))], p)

    def _reduce_max(self, node: onnx.NodeProto, p: str) -> None:
        self.b.nodes.append(node)
        vx = self.var[node.input[0]]
        self.var[node.output[0]] = None if vx is None else _reduce_max_variance(self.b, node, vx, p)

    def _log_softmax_head(self, node: onnx.NodeProto, p: str) -> None:
        """The head: the predictive's softmax of log-softmaxed logits is that of the logits."""
        self.b.nodes.append(node)
        _check_last_axis(node, self.shapes, self.where(node),
                         self.model.manifest.task_spec(self.model.where).softmax_axis)
        self.var[node.output[0]] = self.var[node.input[0]]


_RULES: dict[str, Callable[[_Moments, onnx.NodeProto, str], None]] = {
    "Relu": _Moments._relu, "BatchNormalization": _Moments._batch_norm, "MaxPool": _Moments._max_pool,
    "AveragePool": _Moments._average, "GlobalAveragePool": _Moments._average, "ReduceMean": _Moments._average,
    **dict.fromkeys((*SHAPE_OPS, "Slice", "Pad"), _Moments._same_on_variance),
    "Add": _Moments._add, "Sub": _Moments._add, "ReduceMax": _Moments._reduce_max,
}
"""Op type -> how the analytic pass rewrites it (a layer kind's node: :func:`_layer_moments`)."""


def _layer_moments(b: Builder, node: onnx.NodeProto, kind: LayerKind, var: dict[str, str | None],
                   moments: Callable[[str], tuple[np.ndarray, np.ndarray]],
                   stored: Callable[[str, str], tuple[Operand, Operand]], encoded: Collection[str], where: str,
                   p: str) -> None:
    """m' = op(m, mu) + b_mu,  v' = op(m², s²) + op(v, s² + mu²) + s_b² (writes the mean, records the variance).

    ``moments`` gives the numpy moments (which terms exist), ``stored`` the operands the graph reads: the same
    numpy arrays (float store: written as fp32 constants here), or the values a store decodes in the graph, in
    which case the concatenations and ``s² + mu²`` are ops on those values (folded at session creation)."""
    x, out = node.input[0], node.output[0]
    if node.input[1] in var:
        raise UnsupportedLayerError(f"{where}: weights computed from the input are not supported")
    kind.attrs(node, where)
    mu_np, s2_np = moments(node.input[1])
    mu_w, s2_w = stored(node.input[1], p + "w")
    bias = bias_name(node)
    s2_b_np = moments(bias)[1] if bias else None
    mu_b, s2_b = stored(bias, p + "b") if bias else (None, None)
    t = _Terms(mu_np, s2_np, mu_w, s2_w, mu_b, s2_b, has_b=bool(s2_b_np is not None and s2_b_np.any()))
    if var[x] is None and s2_np.any() and node.op_type == "Conv" and _concatenable(node):
        var[out] = _fused_conv(b, node, kind, t, p)
        return
    mean_in = [x, _const(b, t.mu_w, p + "mu_w") if node.input[1] in encoded else node.input[1]]
    if bias:
        mean_in.append(_const(b, t.mu_b, p + "mu_b") if bias in encoded and t.mu_b is not None else bias)
    kind.plain(b, node, mean_in, out)
    var[out] = _layer_variance(b, node, kind, t, var[x], p)


@dataclass(frozen=True)
class _Terms:
    """A layer's weight moments: numpy (which terms exist) and the operands the graph reads (``has_b``: the bias
    has variance)."""

    mu_np: np.ndarray
    s2_np: np.ndarray
    mu_w: Operand
    s2_w: Operand
    mu_b: Operand | None
    s2_b: Operand | None
    has_b: bool


def _fused_conv(b: Builder, node: onnx.NodeProto, kind: LayerKind, t: _Terms, p: str) -> str:
    """A 1-group Conv on a deterministic input: mean and variance as one Conv on [x, x²] with block weights
    [[mu, 0], [0, s²]], then two Slices; writes the mean, returns the variance."""
    x, out = node.input[0], node.output[0]
    both = b.add("Concat", [x, b.add("Mul", [x, x], p + "m2")], p + "x_m2", axis=1)
    c = len(t.mu_np)
    zero_w = _zeros(b, t.mu_np.shape, p + "zero_w", [t.mu_w, t.s2_w])
    w = _cat(b, [_cat(b, [t.mu_w, zero_w], 1, p + "w_top"), _cat(b, [zero_w, t.s2_w], 1, p + "w_bottom")], 0,
             p + "w_block")
    zero_b = _zeros(b, (c,), p + "zero_b", [v for v in (t.mu_b, t.s2_b, t.mu_w) if v is not None])
    mean_b = zero_b if t.mu_b is None else t.mu_b
    bias_mv = _cat(b, [mean_b, t.s2_b if t.has_b and t.s2_b is not None else zero_b], 0, p + "b_block")
    mv = kind.plain(b, node, [both, _const(b, w, p + "w_block"), _const(b, bias_mv, p + "b_block")], p + "m_v")
    axis1 = b.i64(p + "axis1", 1)  # two Slices, not a Split: the torch runner has no Split
    b.add("Slice", [mv, b.i64(p + "zero", 0), b.i64(p + "c", c), axis1], out)
    return b.add("Slice", [mv, p + "c", b.i64(p + "c2", 2 * c), axis1], p + "v")


def _layer_variance(b: Builder, node: onnx.NodeProto, kind: LayerKind, t: _Terms, vx: str | None,
                    p: str) -> str | None:
    """v' = op(m², s²) + op(v, s² + mu²) + s_b² of a layer on input x (variance ``vx``)."""
    x, out = node.input[0], node.output[0]
    operands: list[tuple[str, Operand]] = []  # (input, weight) pairs of the variance: op(m², s²), op(v, s² + mu²)
    if t.s2_np.any():
        operands.append((b.add("Mul", [x, x], p + "m2"), t.s2_w))
    if vx:
        if isinstance(t.mu_w, np.ndarray) and isinstance(t.s2_w, np.ndarray):
            operands.append((vx, t.s2_w + t.mu_w.astype(np.float64) ** 2))
        else:
            mu_v = _const(b, t.mu_w, p + "mu_w")
            operands.append((vx, b.add("Add", [_const(b, t.s2_w, p + "s2_w"), b.add("Mul", [mu_v, mu_v], p + "mu2")],
                                           p + "s2_mu2")))
    has_b, s2_b = t.has_b, t.s2_b
    v: str | None = None
    if operands and _concatenable(node):
        # one op for both terms: inputs side by side on the reduction axis (channels / features), weights too
        axis = 0 if node.op_type == "Gemm" and not attrs_of(node).get("transB", 0) else 1
        both = (b.add("Concat", [operands[0][0], operands[1][0]], p + "m2_v", axis=1) if len(operands) == 2
                else operands[0][0])
        w2 = _cat(b, [wi for _, wi in operands], axis, p + "s2_w_s2_mu2")
        bias_in = [_const(b, s2_b, p + "s2_b")] if has_b and s2_b is not None else []
        v = kind.plain(b, node, [both, _const(b, w2, p + "s2_w_s2_mu2"), *bias_in], p + "v")
        has_b = False
    else:
        v = _sum(b, [kind.plain(b, node, [xi, _const(b, wi, f"{p}w2_{i}")], f"{p}v_{i}")
                     for i, (xi, wi) in enumerate(operands)], p)
    if has_b and s2_b is not None:
        shape = kind.bias_shape(t.mu_np.shape)
        s2b = (b.f32(p + "s2_b", s2_b.reshape(shape)) if isinstance(s2_b, np.ndarray)
               else b.add("Reshape", [s2_b, b.i64(p + "s2_b_shape", *shape)], p + "s2_b"))
        v = b.add("Add", [v, s2b], p + "v") if v else b.add("Expand", [s2b, b.add("Shape", [out], p + "shp")], p + "v")
    return v


def _const(b: Builder, v: Operand, name: str) -> str:
    """A numpy operand as an fp32 constant named ``name``; a graph value as it is."""
    return b.f32(name, v) if isinstance(v, np.ndarray) else v


def _cat(b: Builder, vs: list[Operand], axis: int, name: str) -> Operand:
    """Operands concatenated: in numpy when all are, else a Concat node."""
    if all(isinstance(v, np.ndarray) for v in vs):
        return np.concatenate(vs, axis=axis)  # type: ignore[arg-type]
    return b.add("Concat", [_const(b, v, f"{name}_{i}") for i, v in enumerate(vs)], name, axis=axis)


def _zeros(b: Builder, shape: tuple[int, ...], name: str, like: list[Operand]) -> Operand:
    """Zeros of ``shape``: numpy when every operand in ``like`` is, else a ConstantOfShape node."""
    if all(isinstance(v, np.ndarray) for v in like):
        return np.zeros(shape, np.float32)
    return b.add("ConstantOfShape", [b.i64(name + "_shape", *shape)], name,
                 value=onnx.helper.make_tensor("zero", onnx.TensorProto.FLOAT, [1], [0.0]))


def _relu_then_max_pool(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """ReLU output -> the MaxPool that is its only consumer (one output, no indices asked for)."""
    uses: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for i in node.input:
            uses.setdefault(i, []).append(node)
    outputs = {o.name for o in graph.output}
    relus = [node.output[0] for node in graph.node if node.op_type == "Relu"]
    return {r: uses[r][0] for r in relus if r not in outputs and len(uses.get(r, [])) == 1
            and uses[r][0].op_type == "MaxPool" and len(uses[r][0].output) == 1}


def _max_pool_moments(b: Builder, node: onnx.NodeProto, m: str, v: str, out: str, p: str,
                      shape: list[int] | None = None) -> str:
    """MaxPool ``node`` on the mean ``m`` (written to ``out``); returns the variance at each arg-max.

    onnxruntime: MaxPool's Indices output and a Gather. TensorRT parses no Indices output (a MaxPool with two
    outputs is refused): there the window taps are strided Slices of m and v, stacked on a new axis, and v is
    read at the arg-max of m's taps (ArgMax, GatherElements): the same values, in ops TensorRT imports."""
    if TRT in (b.fmt.runtimes or ()):
        return _max_pool_taps(b, node, m, v, out, p, shape)
    idx = p + "argmax"
    b.nodes.append(onnx.helper.make_node("MaxPool", [m], [out, idx], **attrs_of(node)))
    flat = b.add("Reshape", [v, b.i64(p + "flat", -1)], p + "v_flat")
    return b.add("Gather", [flat, idx], p + "v_pool", axis=0)


def _max_pool_taps(b: Builder, node: onnx.NodeProto, m: str, v: str, out: str, p: str,
                   shape: list[int] | None) -> str:
    """:func:`_max_pool_moments` without the Indices output (TensorRT)."""
    attrs = attrs_of(node)
    kernel = [int(k) for k in attrs["kernel_shape"]]
    n = len(kernel)
    strides = [int(s) for s in attrs.get("strides", [1] * n)]
    dilations = [int(d) for d in attrs.get("dilations", [1] * n)]
    pads = [int(q) for q in attrs.get("pads", [0] * 2 * n)]
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if shape is None or len(shape) != n + 2 or any(int(d) <= 0 for d in shape[2:]) or auto_pad != "NOTSET" \
            or int(attrs.get("ceil_mode", 0)):
        raise UnsupportedLayerError(f"MaxPool node {node.name or out!r}: analytic mode on TensorRT needs static "
                                    "spatial dims, explicit pads and ceil_mode 0 (TensorRT parses no MaxPool Indices)")
    b.nodes.append(onnx.helper.make_node("MaxPool", [m], [out], **attrs))
    if any(pads):  # MaxPool's padding never wins: pad the means far below any value, the variances with 0
        onnx_pads = b.i64(p + "pads", 0, 0, *pads[:n], 0, 0, *pads[n:])
        m = b.add("Pad", [m, onnx_pads, b.f32(p + "lowest", -3.0e38)], p + "m_pad")
        v = b.add("Pad", [v, onnx_pads, b.f32(p + "zero", 0.0)], p + "v_pad")
    spatial = [int(d) + pads[i] + pads[n + i] for i, d in enumerate(shape[2:])]
    sizes = [(spatial[i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(n)]
    axes = b.i64(p + "axes", *range(2, n + 2))
    steps = b.i64(p + "steps", *strides)
    tap_axis = b.i64(p + "tap_axis", 2)
    taps: dict[str, list[str]] = {m: [], v: []}
    for t, offset in enumerate(np.ndindex(*kernel)):
        starts = [o * d for o, d in zip(offset, dilations, strict=True)]
        ends = [a + (k - 1) * s + 1 for a, k, s in zip(starts, sizes, strides, strict=True)]
        begin, end = b.i64(f"{p}tap{t}/starts", *starts), b.i64(f"{p}tap{t}/ends", *ends)
        for x, tag in ((m, "m"), (v, "v")):
            tap = b.add("Slice", [x, begin, end, axes, steps], f"{p}tap{t}/{tag}")
            taps[x].append(b.add("Unsqueeze", [tap, tap_axis], f"{p}tap{t}/{tag}_1"))
    m_taps = b.add("Concat", taps[m], p + "m_taps", axis=2)
    v_taps = b.add("Concat", taps[v], p + "v_taps", axis=2)
    at = b.add("ArgMax", [m_taps], p + "tap", axis=2, keepdims=1)
    return b.add("Squeeze", [b.add("GatherElements", [v_taps, at], p + "v_at", axis=2), tap_axis], p + "v_pool")


def _concatenable(node: onnx.NodeProto) -> bool:
    """Whether two inputs concatenated on axis 1 reduce as one op (a Conv of one group, or a Gemm)."""
    return node.op_type == "Gemm" or (node.op_type == "Conv" and int(attrs_of(node).get("group", 1)) == 1)


def _zero_pad_value(node: onnx.NodeProto) -> list[str]:
    """Inputs after the data of a Slice (unchanged) or a Pad (its constant value dropped: padding adds no
    variance; edge/reflect padding copies variances as they copy values)."""
    rest = list(node.input[1:])
    if node.op_type == "Pad" and len(rest) > 1:
        rest[1] = ""
    return rest


def _reduce_max_variance(b: Builder, node: onnx.NodeProto, v: str, p: str) -> str:
    """ReduceMax, approximated as MaxPool is: the mean is the max of the means (``node`` itself), the variance
    that of the unit with the largest mean (the largest such variance on ties). The max of Gaussians has no
    closed form; this is exact when one unit dominates and underestimates the spread when several compete."""
    attrs = attrs_of(node)
    keep = b.add("ReduceMax", [node.input[0], *node.input[1:]], p + "m_keep", **{**attrs, "keepdims": 1})
    at_max = b.add("Equal", [node.input[0], keep], p + "at_max")
    v_at = b.add("Where", [at_max, v, b.f32(p + "zero", 0.0)], p + "v_at_max")
    return b.add("ReduceMax", [v_at, *node.input[1:]], p + "v", **attrs)


def _check_last_axis(node: onnx.NodeProto, shapes: dict[str, list[int]], where: str, softmax_axis: int | None,
                     ) -> None:
    """A LogSoftmax head passes the logits' moments through only when it normalises over the axis of the task's
    softmax (:attr:`edgebnn.tasks.Task.softmax_axis`: the last axis of a classifier's logits, axis 1 of per-pixel
    logits; a task whose predictive is no softmax takes none).

    softmax(log_softmax(z)) = softmax(z) for every draw z, so the quadrature head on the logits' (m, v) gives the
    predictive of the log-probabilities; (m, v) are not the log-probabilities' own moments (that would be
    wrong anywhere but before the head)."""
    if softmax_axis is None:
        raise UnsupportedLayerError(f"{where}: analytic mode takes a LogSoftmax head only where the task's predictive "
                                    "is a softmax over its classes; use --mode baked or noise")
    axis = int(attrs_of(node).get("axis", -1))
    rank = len(shapes.get(node.input[0], [0, 0])) or 2
    if not -rank <= axis < rank or axis % rank != softmax_axis % rank:
        raise UnsupportedLayerError(f"{where}: analytic mode takes a LogSoftmax head over the "
                                    f"{'class axis (1)' if softmax_axis == 1 else 'last axis'} only (got axis {axis}); "
                                    "use --mode baked or noise")


def _sum(b: Builder, terms: list[str], p: str) -> str | None:
    if not terms:
        return None
    total = terms[0]
    for i, t in enumerate(terms[1:]):
        total = b.add("Add", [total, t], f"{p}vsum{i}")
    return total


def _relu_moments(b: Builder, m: str, v: str, out: str, p: str) -> str:
    """Mean and variance of max(0, X), X ~ N(m, v); writes the mean to ``out`` and returns the variance.

    With s = √v, a = m/s, r = a/√2: Φ(a) = (1 + erf r)/2 and s φ(a) = s√2 · e^(ln(1/(2√π)) − r²) (the constant
    inside the Exp: no node for it), m' = m Φ(a) + s φ(a); since E[max(0,X)²] = (m² + v) Φ(a) + m s φ(a) =
    v Φ(a) + m m', v' = v Φ(a) + m' (m − m') (no cancellation of large terms where Φ(a) ≈ 1). v' is not clamped:
    its round-off (where Φ(a) ≈ 0, a few ulps of v below 0) only meets linear ops and the floored √ of the next
    ReLU or the head.
    """
    q = b.add("Mul", [b.add("Sqrt", [b.add("Max", [v, b.f32(p + "floor", VAR_FLOOR)], p + "vf")], p + "s"),
                      b.f32(p + "sqrt2", math.sqrt(2))], p + "s_r2")  # s√2
    r = b.add("Div", [m, q], p + "a_r2")  # a/√2
    cdf = b.add("Add", [b.add("Mul", [b.add("Erf", [r], p + "erf"), b.f32(p + "half", 0.5)], p + "erf_h"),
                        b.f32(p + "half_", 0.5)], p + "cdf")
    log_c = b.f32(p + "log_c", -math.log(2 * math.sqrt(math.pi)))
    e = b.add("Exp", [b.add("Sub", [log_c, b.add("Mul", [r, r], p + "r2")], p + "log_e")], p + "e")
    sp = b.add("Mul", [q, e], p + "s_pdf")
    b.add("Add", [b.add("Mul", [m, cdf], p + "m_cdf"), sp], out)
    spread = b.add("Mul", [out, b.add("Sub", [m, out], p + "m_minus")], p + "spread")
    return b.add("Add", [b.add("Mul", [v, cdf], p + "v_cdf"), spread], p + "v")
