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
    Cast/CastLike (float types):           the same cast of v; any op on deterministic values passes through
    MatMul of two activations (attention): m' = m_a m_b, v' = v_a m_b² + m_a² v_b + v_a v_b (operands taken as
                                           independent: approximate)
    Softmax inside the network:            s = softmax(m), v'_i = s_i² ((1 − 2 s_i) v_i + Σ_j s_j² v_j) (first order)

The head (the task's, :mod:`edgebnn.tasks`) turns Gaussian logits (m, v) into the predictive with a fixed quasi-Monte
Carlo quadrature (S scrambled-Sobol standard-normal points moment-matched to mean 0 and covariance I,
:func:`quadrature_points`): logits_q = m + √v ⊙ z_q (a classifier's as one MatMul of [m, √v] by
:func:`quadrature_matrix`, built in the graph for compact exports), then the same head as the sampling modes, so
``mutual_info`` is the logit-level epistemic spread; a regression head reads mean and variance off (m, v). No
random ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                         onnx.TensorProto.BFLOAT16})
VAR_FLOOR = 1e-12  # keeps √v finite where a unit has no variance
SMOOTH = frozenset({"Sigmoid", "Tanh", "Erf", "Softplus", "Gelu", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu",
                    "Softsign", "Mish", "Exp"})
"""Elementwise nonlinearities a region of elementwise ops (:func:`_elementwise_regions`) starts at."""
ELEMENTWISE = SMOOTH | {"Add", "Sub", "Mul", "Div", "Neg", "Relu", "Abs", "Clip", "LeakyRelu"}
GH_POINTS = 16  # Gauss-Hermite points of an elementwise region's moments
ELEMENTWISE_NOTE = (f"elementwise functions of one value (GELU, SiLU, Sigmoid, Tanh, ...): {GH_POINTS}-point "
                    "Gauss-Hermite moments of a Gaussian input; measured variance error <= 0.1% where the input sd "
                    "<= 1, <= 5% where <= 2, <= 13% where <= 3 (docs/uncertainty.md)")
PRODUCT_NOTE = ("MatMul of two uncertain activations (attention): the operands taken as independent (they derive from "
                "the same tokens, so their correlation is dropped)")
SOFTMAX_NOTE = "Softmax inside the network (attention): variance to first order (delta method at the mean)"
LAYER_NORM_NOTE = ("LayerNormalization: variance to first order in the input's deviations (delta method at the mean, "
                   "the expected spread in the normaliser); measured against Monte Carlo within 3% of the variance "
                   "where the input sd <= 0.3x the units' spread, 9% at 1x over 12 units; the mean within 5% of "
                   "the output sd (docs/uncertainty.md)")


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
    if moments.regions:  # a region's nodes are emitted at its first node, before some of their constants
        b.nodes[:] = _stable_topological(b.nodes)
    out = b.model(base, list(base.graph.input), f"edgebnn_analytic_Q{samples}")
    if moments.fits:
        moments.notes.add(_separable_note(moments.fits))
    notes = {"approximations": tuple(sorted(moments.notes))} if moments.notes else {}
    set_metadata(out, model, mode="analytic", samples=samples, seed=None, quadrature="sobol", quadrature_seed=0,
                 **store_metadata(b), **notes)
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
        self.skip: set[str] = set()  # MaxPools emitted before their ReLU, nodes of a region emitted at its first
        self.consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in self.base.graph.node
                       if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR}
        self.views = _weight_views(self.base.graph, set(self.encoded) | set(self.fixed))
        self.regions = _elementwise_regions(self.base.graph, model.manifest.input_name, self.constant)
        self.notes: set[str] = set()  # the approximations the graph makes (the export metadata)
        self.variance = spec.variance
        self.fits: dict[str, float] = {}  # variance="separable": layer -> the fit's relative error

    def where(self, node: onnx.NodeProto) -> str:
        return f"{self.model.where}: {node.op_type} node {node.name or node.output[0]!r}"

    def moments(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name in self.encoded:
            return self.encoded[name].encoding.moments()
        if name in self.fixed:
            return self.fixed[name], np.zeros_like(self.fixed[name])
        raise UnsupportedLayerError(f"{self.model.where}: weight {name!r} is not a constant; analytic mode needs one")

    def stored(self, name: str, p: str, variance: bool = True) -> tuple[Operand, Operand | None]:
        """The mean and variance operands of a weight: decoded by its store, or numpy (float store, fixed);
        ``variance=False``: the mean alone (no decode of the variance)."""
        if name in self.encoded:
            enc = self.encoded[name].encoding
            if store_for(enc, self.weights, self.runtimes) is not FLOAT:
                return (decode(self.b, enc, "mean", p + "_mu"),
                        decode(self.b, enc, "variance", p + "_s2") if variance else None)
            self.b.stored[name] = FLOAT.op_type
        return self.moments(name)

    def _layer(self, node: onnx.NodeProto, kind: LayerKind, p: str) -> None:
        """m' = op(m, mu) + b_mu,  v' = op(m², s²) + op(v, s² + mu²) + s_b² (writes the mean, records the variance).

        :meth:`moments` gives the numpy moments (which terms exist), :meth:`stored` the operands the graph reads:
        the same numpy arrays (float store: written as fp32 constants here), or the values a store decodes in the
        graph, in which case the concatenations and ``s² + mu²`` are ops on those values (folded at session
        creation). ``variance="separable"``: a k×k Conv's variance by :func:`_separable_variance` instead."""
        b, var, where = self.b, self.var, self.where(node)
        x, out = node.input[0], node.output[0]
        if node.input[1] in var:
            raise UnsupportedLayerError(f"{where}: weights computed from the input are not supported")
        kind.attrs(node, where)
        mu_np, s2_np = self.moments(node.input[1])
        separable = self.variance == "separable" and _separable_applies(node, mu_np.shape) and (
            s2_np.any() or var[x] is not None)
        mu_w, s2_w = self.stored(node.input[1], p + "w", variance=not separable)
        bias = bias_name(node)
        s2_b_np = self.moments(bias)[1] if bias else None
        mu_b, s2_b = self.stored(bias, p + "b") if bias else (None, None)
        t = _Terms(mu_np, s2_np, mu_w, s2_np if s2_w is None else s2_w, mu_b, s2_b,
                   has_b=bool(s2_b_np is not None and s2_b_np.any()))
        if not separable and var[x] is None and s2_np.any() and node.op_type == "Conv" and _concatenable(node):
            var[out] = _fused_conv(b, node, kind, t, p)
            return
        mean_in = [x, _const(b, t.mu_w, p + "mu_w") if node.input[1] in self.encoded else node.input[1]]
        if bias:
            mean_in.append(_const(b, t.mu_b, p + "mu_b") if bias in self.encoded and t.mu_b is not None else bias)
        kind.plain(b, node, mean_in, out)
        if separable:
            var[out], self.fits[node.name or out] = _separable_variance(b, node, t, var[x], p)
        else:
            var[out] = _layer_variance(b, node, kind, t, var[x], p)

    def visit(self, node: onnx.NodeProto) -> None:
        """Rewrite one node of the posterior-mean network (graph order)."""
        if node.output[0] in self.skip or node.output[0] in self.views:  # emitted already, or a weight's view
            return
        if node.output[0] in self.regions:
            self._region(self.regions[node.output[0]])
            return
        if not any(i in self.var for i in node.input) or node.op_type == "Shape":
            self.b.nodes.append(node)
            return
        p = f"{P}{node.output[0]}/"
        kind = layer_kind(node)
        if kind is not None:
            self._layer(node, kind, p)
            return
        op = node.op_type
        rule = _Moments._log_softmax_head if op == "LogSoftmax" and node.output[0] == self.logits else _RULES.get(op)
        if rule is None and not any(self.var.get(i) is not None or i in self.encoded for i in node.input):
            self._deterministic(node)  # any op on deterministic values (e.g. attention's scale from a shape)
            return
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

    def _cast(self, node: onnx.NodeProto, p: str) -> None:
        """Cast, CastLike between float types: the same cast of the variance. A constant cast to an uncertain
        value's type (CastLike's target) stays deterministic; an uncertain value cast to an integer is refused."""
        vx = self.var.get(node.input[0])
        if vx is None:
            self._deterministic(node)
            return
        if not self._casts_to_float(node):
            raise UnsupportedLayerError(f"{self.where(node)}: casts an uncertain value to a non-float type, which "
                                        "analytic mode cannot carry its variance through; use --mode baked or noise")
        self.b.nodes.append(node)
        self.var[node.output[0]] = self.b.add(node.op_type, [vx, *node.input[1:]], p + "v", **attrs_of(node))

    def _casts_to_float(self, node: onnx.NodeProto) -> bool:
        if node.op_type == "Cast":
            return onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "to")) in FLOAT_TYPES
        like = node.input[1]
        if like in self.var:  # an activation: float
            return True
        const = self.fixed.get(like, self.consts.get(like))
        return const is not None and np.issubdtype(const.dtype, np.floating)

    def _add(self, node: onnx.NodeProto, p: str) -> None:
        """Add, Sub of independent operands (two uncertain branches, e.g. a residual: taken as uncorrelated): the
        variances add. An encoded operand (a Linear's bias after its MatMul) adds its mean and its variance."""
        b, inputs, extra = self.b, list(node.input), []
        for k, i in enumerate(inputs):
            if i in self.encoded:
                mu, s2 = self.weight_moments(i, node)
                inputs[k] = b.f32(f"{p}mu{k}", mu)
                if s2.any():
                    extra.append(b.f32(f"{p}s2_{k}", s2))
        b.nodes.append(onnx.helper.make_node(node.op_type, inputs, list(node.output), name=node.name))
        self.var[node.output[0]] = _sum(b, [v for i in node.input if (v := self.var.get(i))] + extra, p)

    def _reduce_max(self, node: onnx.NodeProto, p: str) -> None:
        self.b.nodes.append(node)
        vx = self.var[node.input[0]]
        self.var[node.output[0]] = None if vx is None else _reduce_max_variance(self.b, node, vx, p)

    def _zero_or_var(self, x: str, p: str) -> str:
        """The variance value of ``x``: its own, or zeros of its shape."""
        v = self.var.get(x)
        if v is not None:
            return v
        return self.b.add("ConstantOfShape", [self.b.add("Shape", [x], p + "shape")], p + "zeros",
                          value=onnx.helper.make_tensor("zero", onnx.TensorProto.FLOAT, [1], [0.0]))

    def _concat(self, node: onnx.NodeProto, p: str) -> None:
        """Concat (exact): the variances concatenated as the means are, zeros for a deterministic operand."""
        self.b.nodes.append(node)
        parts = [self._zero_or_var(x, f"{p}{i}/") for i, x in enumerate(node.input)]
        self.var[node.output[0]] = self.b.add("Concat", parts, p + "v", **attrs_of(node))

    def _split(self, node: onnx.NodeProto, p: str) -> None:
        """Split (exact): the same split of the variance."""
        if self.var[node.input[0]] is None:
            self.b.nodes.append(node)
            self.var.update(dict.fromkeys(node.output))
            return
        self.b.nodes.append(node)
        vs = [p + f"v{i}" for i in range(len(node.output))]
        self.b.nodes.append(onnx.helper.make_node("Split", [self.var[node.input[0]] or "", *node.input[1:]], vs,
                                                  **attrs_of(node)))
        self.var.update(zip(node.output, vs, strict=True))

    def _gather(self, node: onnx.NodeProto, p: str) -> None:
        """Gather on indices that do not depend on the input (exact): the same gather of the variance."""
        data, indices = node.input[:2]
        if self.var.get(indices) is None and self.var.get(data) is None and data not in self.encoded:
            self._deterministic(node)  # e.g. an embedding table at the input's token ids
            return
        if indices in self.var:
            raise UnsupportedLayerError(f"{self.where(node)}: analytic mode gathers at constant indices only")
        self.b.nodes.append(node)
        self.var[node.output[0]] = self.b.add("Gather", [self.var[node.input[0]] or "", node.input[1]], p + "v",
                                              **attrs_of(node))

    def _scale(self, node: onnx.NodeProto, p: str) -> None:
        """Mul / Div by a value that does not depend on the input, Neg (exact): v' = c² v (v / c², v). The product
        of two uncertain values is a region of elementwise functions of one input (:meth:`_region`) or refused."""
        b, op = self.b, node.op_type
        uncertain = [i for i in node.input if self.var.get(i) is not None]
        if not uncertain:
            self._deterministic(node)
            return
        if len(uncertain) > 1 or (op == "Div" and node.input[1] in uncertain):
            raise UnsupportedLayerError(f"{self.where(node)}: analytic mode cannot propagate variance through {op} "
                                        "of two uncertain values (their correlation is unknown); use --mode baked or "
                                        "noise")
        b.nodes.append(node)
        vx = self.var[uncertain[0]]
        assert vx is not None
        if op == "Neg":
            self.var[node.output[0]] = vx
        else:
            c = next(i for i in node.input if i != uncertain[0])
            self.var[node.output[0]] = b.add(op, [vx, b.add("Mul", [c, c], p + "c2")], p + "v")

    def _resize(self, node: onnx.NodeProto, p: str) -> None:
        """Resize. ``nearest`` copies one input unit to each output unit: the same Resize of v (exact). ``linear`` and
        ``cubic`` give each output unit a fixed weighted sum Σ a_k x_k of input units (separable per axis): its
        variance Σ a_k² v_k under the mode's independent units, applied as the squared per-axis interpolation
        matrices (a MatMul per resized axis; exact for independent inputs)."""
        b, x, out = self.b, node.input[0], node.output[0]
        b.nodes.append(node)
        vx = self.var[x]
        if vx is None:
            self.var[out] = None
            return
        attrs = attrs_of(node)
        mode = attrs.get("mode", b"nearest")
        if (mode.decode() if isinstance(mode, bytes) else mode) == "nearest":
            self.var[out] = b.add("Resize", [vx, *node.input[1:]], p + "v", **attrs)
            return
        rank = len(self.shapes.get(x, []))
        v = vx
        for axis, a in _resize_matrices(node, self.shapes.get(x), self.constant, self.where(node)):
            a2 = (a.astype(np.float64) ** 2).astype(np.float32)
            v = (b.add("MatMul", [v, b.f32(f"{p}a2_{axis}_t", a2.T)], f"{p}v{axis}") if axis == rank - 1
                 else b.add("MatMul", [b.f32(f"{p}a2_{axis}", a2), v], f"{p}v{axis}"))
        self.var[out] = v

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or a Constant node's output; None for anything else (or no input)."""
        return self.fixed.get(name, self.consts.get(name)) if name else None

    def _layer_norm(self, node: onnx.NodeProto, p: str) -> None:
        """LayerNormalization (a stated approximation, :data:`LAYER_NORM_NOTE`): over the n normalised units,
        d = m − mean(m), σ̂² = mean(d²) + (1 − 1/n) mean(v) (a draw's expected spread over the units), r = 1/√(σ̂² + ε);
        m' = γ d r + β; v' = γ² Σ_j g_j² v_j with g the gradient of y = (x − x̄) r(x) at the mean (the delta method,
        units independent): γ² r² [(1 − 2/n) v + mean(v)/n − (2r²/n) d (dv − mean(dv)) + (r⁴/n) d² mean(d²v)]."""
        b, x, out = self.b, node.input[0], node.output[0]
        vx = self.var[x]
        if vx is None:
            self._deterministic(node)
            return
        if x not in self.shapes or len([o for o in node.output if o]) > 1:
            raise UnsupportedLayerError(f"{self.where(node)}: analytic mode needs a static shape and one output "
                                        "around LayerNormalization")
        attrs, shape = attrs_of(node), self.shapes[x]
        axis = int(attrs.get("axis", -1)) % len(shape)
        n = math.prod(shape[axis:])
        axes = b.i64(p + "axes", *range(axis, len(shape)))
        d = b.add("Sub", [x, b.add("ReduceMean", [x, axes], p + "mean", keepdims=1)], p + "d")
        v_mean = b.add("ReduceMean", [vx, axes], p + "v_mean", keepdims=1)
        spread = b.add("Add", [b.add("ReduceMean", [b.add("Mul", [d, d], p + "d2"), axes], p + "d2_mean", keepdims=1),
                               b.add("Mul", [v_mean, b.f32(p + "keep", 1 - 1 / n)], p + "v_spread")], p + "spread")
        r2 = b.add("Reciprocal", [b.add("Add", [spread, b.f32(p + "eps", attrs.get("epsilon", 1e-5))], p + "s2")],
                   p + "r2")
        gamma = node.input[1]
        normed = b.add("Mul", [b.add("Mul", [d, b.add("Sqrt", [r2], p + "r")], p + "dr"), gamma], p + "g_dr")
        if len(node.input) > 2 and node.input[2]:
            b.nodes.append(onnx.helper.make_node("Add", [normed, node.input[2]], [out]))
        else:
            b.nodes.append(onnx.helper.make_node("Identity", [normed], [out]))
        centred = b.add("Add", [b.add("Mul", [vx, b.f32(p + "c1", 1 - 2 / n)], p + "v_c1"),
                                b.add("Mul", [v_mean, b.f32(p + "c2", 1 / n)], p + "v_c2")], p + "v_centred")
        dv = b.add("Mul", [d, vx], p + "dv")  # the normaliser's first-order terms (the docstring's last two)
        cross = b.add("Mul", [b.add("Mul", [d, b.add("Sub", [dv, b.add("ReduceMean", [dv, axes], p + "dv_mean",
                                                                        keepdims=1)], p + "dv_c")], p + "d_dv"),
                              b.add("Mul", [r2, b.f32(p + "m2n", -2 / n)], p + "r2_2n")], p + "cross")
        d2 = p + "d2"
        d2v_mean = b.add("ReduceMean", [b.add("Mul", [d2, vx], p + "d2v"), axes], p + "d2v_mean", keepdims=1)
        spread_t = b.add("Mul", [b.add("Mul", [d2, d2v_mean], p + "d2_d2v"),
                                 b.add("Mul", [b.add("Mul", [r2, r2], p + "r4"), b.f32(p + "inv_n", 1 / n)],
                                       p + "r4n")], p + "spread_t")
        total = b.add("Add", [b.add("Add", [centred, cross], p + "v_cross"), spread_t], p + "v_lin")
        scale = b.add("Mul", [r2, b.add("Mul", [gamma, gamma], p + "g2")], p + "g2r2")
        self.var[out] = b.add("Mul", [total, scale], p + "v")
        self.notes.add(LAYER_NORM_NOTE)

    def _product(self, node: onnx.NodeProto, p: str) -> None:
        """MatMul of two activations (attention's Q·Kᵀ and P·V), taken as independent (a stated approximation:
        both derive from the same tokens): m' = m_a m_b, v' = v_a v_b + v_a m_b² + m_a² v_b, each a MatMul."""
        b, (x, y), out = self.b, node.input, node.output[0]
        vx, vy = self.var[x], self.var[y]
        b.nodes.append(node)
        if vx is None and vy is None:
            self.var[out] = None
            return
        sq = {i: b.add("Mul", [i, i], f"{p}sq{k}") for k, i in enumerate((x, y))}
        terms = ([b.add("MatMul", [vx, sq[y]], p + "vx_my2")] if vx else []) + \
            ([b.add("MatMul", [sq[x], vy], p + "mx2_vy")] if vy else []) + \
            ([b.add("MatMul", [vx, vy], p + "vx_vy")] if vx and vy else [])
        self.var[out] = _sum(b, terms, p)
        self.notes.add(PRODUCT_NOTE)

    def _softmax(self, node: onnx.NodeProto, p: str) -> None:
        """Softmax inside the network (attention weights), to first order: s = softmax(m), v'_i = Σ_j J_ij² v_j with
        J = diag(s) − s sᵀ, i.e. s_i² ((1 − 2 s_i) v_i + Σ_j s_j² v_j) (a stated approximation)."""
        b, x, out = self.b, node.input[0], node.output[0]
        vx = self.var[x]
        if out == self.logits:
            raise UnsupportedLayerError(f"{self.where(node)}: analytic mode takes the logits (or a LogSoftmax head), "
                                        "not a Softmax output; use --mode baked or noise")
        b.nodes.append(node)
        if vx is None:
            self.var[out] = None
            return
        axis = int(onnx.helper.get_attribute_value(node.attribute[0])) if node.attribute else -1
        s2 = b.add("Mul", [out, out], p + "s2")
        pooled = b.add("ReduceSum", [b.add("Mul", [s2, vx], p + "s2v"), b.i64(p + "axis", axis)], p + "pooled",
                       keepdims=1)
        own = b.add("Mul", [b.add("Sub", [b.f32(p + "one", 1.0),
                                          b.add("Mul", [out, b.f32(p + "two", 2.0)], p + "2s")], p + "1m2s"),
                            vx], p + "own")
        self.var[out] = b.add("Mul", [s2, b.add("Add", [own, pooled], p + "inner")], p + "v")
        self.notes.add(SOFTMAX_NOTE)

    def _matmul(self, node: onnx.NodeProto, p: str) -> None:
        """MatMul of the input by a weight (an encoded weight or a constant, through Transpose/Reshape views: a
        Linear on a 3-D input): the layer rule, m' = m W_mu, v' = [m², v] [s²; s² + mu²] (one MatMul)."""
        b, (x, w), out = self.b, node.input, node.output[0]
        if w in self.var and x in self.var:
            self._product(node, p)
            return
        if w in self.var or x not in self.var:
            raise UnsupportedLayerError(f"{self.where(node)}: analytic mode takes MatMul of the input by a weight only "
                                        "(a product of two uncertain values has no propagated correlation); use "
                                        "--mode baked or noise")
        mu, s2 = self.weight_moments(w, node)
        vx = self.var[x]
        b.nodes.append(onnx.helper.make_node("MatMul", [x, w if w in self.fixed else b.f32(p + "mu", mu)], [out]))
        terms = ([(b.add("Mul", [x, x], p + "m2"), s2)] if s2.any() else []) + \
            ([(vx, s2 + mu.astype(np.float64) ** 2)] if vx else [])
        if not terms:
            self.var[out] = None
            return
        both = terms[0][0] if len(terms) == 1 else b.add("Concat", [terms[0][0], terms[1][0]], p + "m2_v", axis=-1)
        w2 = np.concatenate([t[1] for t in terms], axis=-2).astype(np.float32)
        self.var[out] = b.add("MatMul", [both, b.f32(p + "s2_w", w2)], p + "v")

    def weight_moments(self, w: str, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray]:
        """A weight's (mu, s²) in numpy: an encoded weight or constant, through its Transpose/Reshape views."""
        chain: list[onnx.NodeProto] = []
        while w in self.views:
            chain.append(self.views[w])
            w = self.views[w].input[0]
        if w not in self.encoded and w not in self.fixed:
            raise UnsupportedLayerError(f"{self.where(node)}: analytic mode needs a constant weight (got {w!r})")
        mu, s2 = (np.asarray(a, np.float32) for a in self.moments(w))
        for view in reversed(chain):
            mu, s2 = (_view(view, a, self.constant) for a in (mu, s2))
        return mu, s2

    def _region(self, region: _Region) -> None:
        """Elementwise functions y = f(x) of one uncertain value x ~ N(m, v) (GELU, SiLU, Sigmoid, ... however the
        exporter decomposed them): the region's nodes evaluated at the Gauss-Hermite points x_k = m + √(2v) t_k,
        E[y] = Σ w_k y_k, Var[y] = Σ w_k (y_k − E[y])² (w_k summing to 1; exact for polynomials of degree
        < 2 · GH_POINTS, an approximation for the rest: :data:`ELEMENTWISE_NOTE`)."""
        b, outputs = self.b, [o for n in region.nodes for o in n.output]
        self.skip.update(outputs)
        vx = self.var.get(region.root)
        if vx is None:
            b.nodes.extend(region.nodes)
            self.var.update(dict.fromkeys(outputs))
            return
        p = f"{P}{region.nodes[0].output[0]}/gh"
        s = b.add("Sqrt", [b.add("Max", [vx, b.f32(p + "floor", VAR_FLOOR)], p + "vf")], p + "s")
        t, w = np.polynomial.hermite.hermgauss(GH_POINTS)
        at: dict[str, list[str]] = {e: [] for e in region.escapes}
        for k, tk in enumerate(t):
            names = {region.root: b.add("Add", [region.root, b.add("Mul", [s, b.f32(f"{p}{k}/c", math.sqrt(2) * tk)],
                                                                   f"{p}{k}/sc")], f"{p}{k}/x")}
            for n in region.nodes:
                clone = onnx.NodeProto()
                clone.CopyFrom(n)
                clone.name = ""
                clone.input[:] = [names.get(i, i) for i in n.input]
                clone.output[:] = [names.setdefault(o, f"{p}{k}/{o}") for o in n.output]
                b.nodes.append(clone)
            for e in region.escapes:
                at[e].append(names[e])
        weights = [b.f32(f"{p}w{k}", wk / math.sqrt(math.pi)) for k, wk in enumerate(w)]
        for e, ys in at.items():
            b.add("Sum", [b.add("Mul", [y, wk], f"{y}/w") for y, wk in zip(ys, weights, strict=True)], e)
            devs = [b.add("Sub", [y, e], f"{y}/dev") for y in ys]
            self.var[e] = b.add("Sum", [b.add("Mul", [b.add("Mul", [d, d], f"{d}2"), wk], f"{d}2w")
                                        for d, wk in zip(devs, weights, strict=True)], f"{p}/{e}/v")
        self.notes.add(ELEMENTWISE_NOTE)

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
    "Concat": _Moments._concat, "Split": _Moments._split, "Gather": _Moments._gather, "Resize": _Moments._resize,
    "Mul": _Moments._scale, "Div": _Moments._scale, "Neg": _Moments._scale,
    "LayerNormalization": _Moments._layer_norm, "MatMul": _Moments._matmul,
    "Cast": _Moments._cast, "CastLike": _Moments._cast, "Softmax": _Moments._softmax,
}
"""Op type -> how the analytic pass rewrites it (a layer kind's node: :func:`_layer_moments`)."""


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


def _separable_applies(node: onnx.NodeProto, wshape: tuple[int, ...]) -> bool:
    """Whether ``variance="separable"`` rewrites this layer: a Conv of one group with more than one tap."""
    return node.op_type == "Conv" and _concatenable(node) and math.prod(wshape[2:]) > 1


def separable_fit(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """A nonnegative Conv weight w [O, J, *k] as a[o, j] g[j, t]: per input channel j, one spatial profile g (the
    leading right singular vector of its taps over the output channels, nonnegative by Perron-Frobenius, summing to
    1) and a the window's weight sums (a[o, j] = Σ_t w[o, j, t], so Σ_t a g = Σ_t w). Returns g as a depthwise
    weight [J, 1, *k], a as a 1×1 weight [O, J, 1, ...] and the fit's relative Frobenius error
    ‖w − a g‖ / ‖w‖ (0 where each channel's taps share one profile)."""
    o, j, kernel = w.shape[0], w.shape[1], w.shape[2:]
    m = w.reshape(o, j, -1).astype(np.float64)
    _, vecs = np.linalg.eigh(np.einsum("ojk,ojl->jkl", m, m))
    g = np.abs(vecs[:, :, -1])
    g /= g.sum(axis=1, keepdims=True)
    a = m.sum(axis=2)
    size = float(np.linalg.norm(m))
    err = float(np.linalg.norm(m - a[:, :, None] * g[None])) / size if size > 0 else 0.0
    return (g.reshape(j, 1, *kernel).astype(np.float32), a.reshape(o, j, *[1] * len(kernel)).astype(np.float32),
            err)


def _separable_variance(b: Builder, node: onnx.NodeProto, t: _Terms, vx: str | None, p: str) -> tuple[str, float]:
    """``variance="separable"``: v' = op([m², v], [s², s² + mu²]) + s_b² with the weight fitted by
    :func:`separable_fit`, as a depthwise Conv (the node's strides, pads, dilations) and a 1×1 Conv: for a k×k
    kernel 2·C_in·k² + 2·C_in·C_out multiply-adds per output pixel instead of 2·C_in·k²·C_out. Exact where m² and v
    are constant over each window (away from the padding: the window sums are kept) or where each input channel's
    taps share one profile across the output channels (freshly initialised σ: s² constant). Returns the variance
    and the fit's relative error."""
    x = node.input[0]
    inputs, weights = [], []
    if t.s2_np.any():
        inputs.append(b.add("Mul", [x, x], p + "m2"))
        weights.append(t.s2_np.astype(np.float64))
    if vx:
        inputs.append(vx)
        weights.append(t.s2_np + t.mu_np.astype(np.float64) ** 2)
    g, a, err = separable_fit(np.concatenate(weights, axis=1))
    both = inputs[0] if len(inputs) == 1 else b.add("Concat", inputs, p + "m2_v", axis=1)
    taps = b.add("Conv", [both, b.f32(p + "sep_g", g)], p + "v_taps", **{**attrs_of(node), "group": len(g)})
    bias_in = [_const(b, t.s2_b, p + "s2_b")] if t.has_b and t.s2_b is not None else []
    return b.add("Conv", [taps, b.f32(p + "sep_a", a), *bias_in], p + "v"), err


def _separable_note(fits: dict[str, float]) -> str:
    """The approximation note of ``variance="separable"``, with the fitted errors measured at export."""
    worst = max(fits, key=fits.__getitem__)
    return (f"variance separable: every k×k Conv's variance as a per-channel k×k filter and a 1×1 mix keeping each "
            "window's weight sums (exact where m² and v are constant over a window or a channel's taps share one "
            f"profile); fitted weights' relative error max {fits[worst]:.3g} ({worst}), median "
            f"{float(np.median(list(fits.values()))):.3g} over {len(fits)} layers (docs/uncertainty.md)")


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


@dataclass(frozen=True)
class _Region:
    """Elementwise nodes (graph order) computing functions of one value ``root``; ``escapes``: their outputs read
    outside the region."""

    root: str
    nodes: list[onnx.NodeProto]
    escapes: list[str]


def _elementwise_regions(graph: onnx.GraphProto, input_name: str,
                         constant: Callable[[str], np.ndarray | None]) -> dict[str, _Region]:
    """First node's output -> the region of elementwise ops around each smooth nonlinearity (:data:`SMOOTH`): its
    input traced back through Mul/Div by a scalar constant to the root x, then every elementwise node whose data
    inputs are x or the region's values (x · sigmoid(x), x · Φ(x) as an exporter writes them)."""
    data, producer = {input_name}, dict[str, onnx.NodeProto]()
    for n in graph.node:
        producer.update((o, n) for o in n.output)
        if any(i in data for i in n.input):
            data.update(n.output)
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    outputs, taken, regions = {o.name for o in graph.output}, set[str](), dict[str, _Region]()
    nodes = list(graph.node)
    for n in nodes:
        if n.op_type not in SMOOTH or n.output[0] in taken or not n.input or n.input[0] not in data:
            continue
        root = n.input[0]
        while (q := producer.get(root)) is not None and q.op_type in ("Mul", "Div") and q.output[0] not in taken \
                and _by_scalar(q, data, constant):
            root = q.input[0]
        start = nodes.index(producer[root]) + 1 if root in producer else 0
        members: list[onnx.NodeProto] = []
        values = {root}
        for m in nodes[start:]:
            if m.op_type in ELEMENTWISE and m.output[0] not in taken and any(i in values for i in m.input) \
                    and all(i in values or i not in data for i in m.input if i):
                members.append(m)
                values.update(m.output)
        inside = {id(m) for m in members}
        escapes = [o for m in members for o in m.output
                   if o in outputs or any(id(u) not in inside for u in users.get(o, []))]
        regions[members[0].output[0]] = _Region(root, members, escapes)
        taken.update(o for m in members for o in m.output)
    return regions


def _by_scalar(node: onnx.NodeProto, data: set[str], constant: Callable[[str], np.ndarray | None]) -> bool:
    """A Mul / Div of a data value (first) by a scalar constant."""
    c = constant(node.input[1]) if len(node.input) == 2 else None
    return node.input[0] in data and node.input[1] not in data and c is not None and c.size == 1


def _weight_views(graph: onnx.GraphProto, weights: set[str]) -> dict[str, onnx.NodeProto]:
    """Output -> the Transpose / Reshape / Identity of a weight (or of such a view) that only MatMuls read as
    their second input (or further views): :meth:`_Moments._matmul` reads the weight's moments through them."""
    views: dict[str, onnx.NodeProto] = {}
    for n in graph.node:
        if n.op_type in ("Transpose", "Reshape", "Identity") and (n.input[0] in weights or n.input[0] in views):
            views[n.output[0]] = n
    changed = True
    while changed:
        readers = [(i, n) for n in graph.node for k, i in enumerate(n.input)
                   if i in views and not (n.op_type == "MatMul" and k == 1) and n.output[0] not in views]
        outputs = {o.name for o in graph.output}
        drop = {i for i, _ in readers} | (set(views) & outputs)
        drop |= {o for o, n in views.items() if n.input[0] in drop}
        changed = bool(drop)
        for o in drop:
            views.pop(o, None)
    return views


def _stable_topological(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes in an order where every value is produced before it is read, the given order where it is one."""
    import heapq

    made = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    needs = [{made[i] for i in n.input if i in made and made[i] != k} for k, n in enumerate(nodes)]
    readers: dict[int, list[int]] = {}
    for k, deps in enumerate(needs):
        for j in deps:
            readers.setdefault(j, []).append(k)
    waiting = [len(d) for d in needs]
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[onnx.NodeProto] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(nodes[k])
        for u in readers.get(k, []):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    return order


def _view(node: onnx.NodeProto, a: np.ndarray, constant: Callable[[str], np.ndarray | None]) -> np.ndarray:
    """A Transpose / Reshape / Identity of a weight, in numpy."""
    if node.op_type == "Transpose":
        perm = attrs_of(node).get("perm")
        return np.transpose(a, None if perm is None else [int(i) for i in perm])
    if node.op_type == "Reshape":
        shape = constant(node.input[1])
        if shape is None:
            raise UnsupportedLayerError(f"Reshape node {node.name or node.output[0]!r}: analytic mode needs a constant "
                                        "shape on a weight")
        dims = [a.shape[i] if d == 0 else int(d) for i, d in enumerate(shape.tolist())]
        return a.reshape(dims)
    return a


def _resize_matrices(node: onnx.NodeProto, shape: list[int] | None, constant: Callable[[str], np.ndarray | None],
                     where: str) -> list[tuple[int, np.ndarray]]:
    """(axis, A [out, in]) for every axis a linear/cubic Resize changes: output = A applied along that axis (the
    op is separable), read off onnx's reference Resize applied to the identity along that axis alone."""
    from onnx.reference import ReferenceEvaluator

    attrs = attrs_of(node)
    scales, sizes = (constant(node.input[i]) if len(node.input) > i else None for i in (2, 3))
    ctm = attrs.get("coordinate_transformation_mode", b"half_pixel")
    given = scales if scales is not None and scales.size else sizes if sizes is not None and sizes.size else None
    if shape is None or given is None or len(given) != len(shape) or "axes" in attrs \
            or (ctm.decode() if isinstance(ctm, bytes) else ctm) == "tf_crop_and_resize":
        raise UnsupportedLayerError(f"{where}: analytic mode needs a static input shape and constant scales or "
                                    "sizes on every axis around a linear Resize (no axes, no tf_crop_and_resize)")
    rank, use_scales = len(shape), given is scales
    target = [math.floor(d * float(given[i])) if use_scales else int(given[i]) for i, d in enumerate(shape)]
    out: list[tuple[int, np.ndarray]] = []
    for axis in (i for i in range(rank) if target[i] != shape[i] or (use_scales and float(given[i]) != 1.0)):
        if axis < max(2, rank - 2):
            raise UnsupportedLayerError(f"{where}: analytic mode resizes the last two axes only (axis {axis} changes)")
        n = shape[axis]
        probe_shape = [n, *([1] * (rank - 1))]
        probe_shape[axis] = n
        eye = np.eye(n, dtype=np.float32).reshape(probe_shape)
        factors = np.ones(rank, np.float32)
        sized = list(probe_shape)
        if use_scales:
            factors[axis] = given[axis]
        sized[axis] = target[axis]
        graph = onnx.helper.make_graph(
            [onnx.helper.make_node("Resize", ["x", "", "scales" if use_scales else "", "" if use_scales else "sizes"],
                                   ["y"], **attrs)], "probe",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, probe_shape)],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
            [numpy_helper.from_array(factors, "scales"), numpy_helper.from_array(np.array(sized, np.int64), "sizes")])
        probe = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 19)])
        y = np.asarray(next(iter(ReferenceEvaluator(probe).run(None, {"x": eye}))))
        if y.shape[axis] != target[axis]:
            raise UnsupportedLayerError(f"{where}: analytic mode could not read the Resize's weights on axis {axis} "
                                        f"(size {y.shape[axis]}, expected {target[axis]})")
        out.append((axis, np.moveaxis(y.reshape([n, *y.shape[1:]]), axis, 1).reshape(n, -1).T.copy()))
    return out


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
