"""``analytic`` mode: one pass propagating means and variances (EBP's forward pass, generalised to ReLU
networks), no sampling of weights.

Every value on the data path carries (m, v) under a diagonal-Gaussian assumption (units independent):

    layer kind (Conv of any rank, Gemm; :mod:`.layers`), w ~ (mu, s²) (the encoding's ``moments()``), x ~ (m, v):
                                           m' = op(m, mu) + b_mu
                                           v' = op(m² + v, s²) + op(v, mu²) + s_b²
                                           (Var Σwx = Σ s²(v + m²) + mu² v; deterministic w: s² = 0; both
                                           variance terms are one op on [m² + v, v] concatenated on the
                                           reduction axis, with [s², mu²] and bias s_b², for Gemm and 1-group Conv)
    ReLU (rectified Gaussian), α = m/√v:   m' = m Φ(α) + √v φ(α),  v' = v Φ(α) + m' (m − m')
                                           (= (m² + v) Φ(α) + m √v φ(α) − m'², in fewer nodes)
    BatchNorm (inference, a·x + c):        m' = BN(m),   v' = a² v
    MaxPool:                               m' = MaxPool(m); v' = v at the arg-max of m
    ReduceMax (approximate, as MaxPool):   m' = ReduceMax(m); v' = v at the arg-max of m
    Slice; Pad:                            the same op on v (padding adds variance 0)
    LogSoftmax over the classes, last op:  the head itself: softmax(log_softmax(z)) = softmax(z) draw by draw,
                                           so the logits' (m, v) pass to the quadrature head unchanged
    AveragePool / ReduceMean over n units: m' = avg(m),  v' = avg(v) / n
    Add (independent operands):            m' = m₁ + m₂, v' = v₁ + v₂
    Flatten/Reshape/Transpose/(Un)Squeeze: the same op on v

The head turns Gaussian logits (m, v) into the predictive with a fixed quasi-Monte Carlo quadrature
(S scrambled-Sobol standard-normal points, baked as constants): logits_q = m + √v ⊙ z_q, then the same
head as the sampling modes, so ``mutual_info`` is the logit-level epistemic spread. No random ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

import numpy as np
import onnx
from onnx import numpy_helper
from scipy.stats import norm, qmc

from edgebnn.errors import UnsupportedLayerError
from edgebnn.exporters._graph import Builder, P, attrs_of, set_metadata, static_shapes
from edgebnn.exporters.layers import LayerKind, bias_name, layer_kind
from edgebnn.ir import BNNModel

SHAPE_OPS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity"})
VAR_FLOOR = 1e-12  # keeps √v finite where a unit has no variance


def quadrature_points(samples: int, classes: int, seed: int = 0) -> np.ndarray:
    """[samples, classes] standard-normal points from a scrambled Sobol sequence (fixed for a seed)."""
    u = qmc.Sobol(d=classes, scramble=True, seed=seed).random(samples)
    return norm.ppf(np.clip(u, 1e-6, 1 - 1e-6)).astype(np.float32)


def export_analytic(model: BNNModel, samples: int, *, progress: Callable[[int, int], None] | None = None,
                    ) -> onnx.ModelProto:
    encoded = {w.name: w for w in model.encoded_weights()}
    base = model.float_model()
    shapes = static_shapes(base)
    fixed = {t.name: numpy_helper.to_array(t) for t in base.graph.initializer if t.name not in encoded}
    b = Builder([t for t in base.graph.initializer if t.name not in encoded])
    var: dict[str, str | None] = {model.manifest.input_name: None}  # data values -> variance value (None = 0)

    def where(node: onnx.NodeProto) -> str:
        return f"{model.where}: {node.op_type} node {node.name or node.output[0]!r}"

    def moments(name: str) -> tuple[np.ndarray, np.ndarray]:
        if name in encoded:
            return encoded[name].encoding.moments()
        if name in fixed:
            return fixed[name], np.zeros_like(fixed[name])
        raise UnsupportedLayerError(f"{model.where}: weight {name!r} is not a constant; analytic mode needs one")

    for k, node in enumerate(base.graph.node, 1):
        if progress is not None:  # one step per node (a progress bar)
            progress(k, len(base.graph.node))
        data_in = [i for i in node.input if i in var]
        if not data_in or node.op_type == "Shape":
            b.nodes.append(node)
            continue
        p = f"{P}{node.output[0]}/"
        out = node.output[0]
        op = node.op_type
        kind = layer_kind(node)
        if kind is not None:
            _layer_moments(b, node, kind, var, moments, encoded, where(node), p)
        elif op == "Relu":
            x, vx = node.input[0], var[node.input[0]]
            if vx is None:
                b.nodes.append(node)
                var[out] = None
                continue
            var[out] = _relu_moments(b, x, vx, out, p)
        elif op == "BatchNormalization":
            b.nodes.append(node)
            vx = var[node.input[0]]
            if vx is not None:
                scale, _, _, rvar = (fixed[n] for n in node.input[1:5])
                eps = attrs_of(node).get("epsilon", 1e-5)
                rank = len(shapes.get(node.input[0], [0, 0, 0, 0]))  # [B, C, *spatial]: C on axis 1
                a2 = (scale.astype(np.float64) ** 2 / (rvar + eps)).reshape(-1, *([1] * (rank - 2)))
                var[out] = b.add("Mul", [vx, b.f32(p + "a2", a2)], p + "v")
            else:
                var[out] = None
        elif op == "MaxPool":
            vx = var[node.input[0]]
            if vx is None:
                b.nodes.append(node)
                var[out] = None
                continue
            idx = p + "argmax"
            b.nodes.append(onnx.helper.make_node("MaxPool", [node.input[0]], [out, idx], **attrs_of(node)))
            flat = b.add("Reshape", [vx, b.i64(p + "flat", -1)], p + "v_flat")
            var[out] = b.add("Gather", [flat, idx], p + "v", axis=0)
        elif op in ("AveragePool", "GlobalAveragePool"):
            b.nodes.append(node)
            vx = var[node.input[0]]
            if vx is None:
                var[out] = None
                continue
            attrs = attrs_of(node)
            n = math.prod(attrs["kernel_shape"]) if op == "AveragePool" else math.prod(shapes[node.input[0]][2:])
            pooled = b.add(op, [vx], p + "v_pool", **attrs)
            var[out] = b.add("Mul", [pooled, b.f32(p + "inv_n", 1.0 / n)], p + "v")
        elif op == "ReduceMean":  # e.g. AdaptiveAvgPool2d(1): mean of n independent units
            b.nodes.append(node)
            vx = var[node.input[0]]
            if vx is None:
                var[out] = None
                continue
            # n = elements averaged per output = |input| / |output| (however the axes are expressed)
            if node.input[0] not in shapes or out not in shapes:
                raise UnsupportedLayerError(f"{where(node)}: analytic mode needs static shapes around ReduceMean")
            n = math.prod(shapes[node.input[0]]) // math.prod(shapes[out])
            pooled = b.add("ReduceMean", [vx, *node.input[1:]], p + "v_mean", **attrs_of(node))
            var[out] = b.add("Mul", [pooled, b.f32(p + "inv_n", 1.0 / n)], p + "v")
        elif op in SHAPE_OPS:
            b.nodes.append(node)
            vx = var[node.input[0]]
            var[out] = None if vx is None else b.add(op, [vx, *node.input[1:]], p + "v", **attrs_of(node))
        elif op in ("Add", "Sub"):
            b.nodes.append(node)
            vs = [v for i in node.input if (v := var.get(i))]
            var[out] = _sum(b, vs, p)
        elif op in ("Slice", "Pad"):  # selection / zero-variance padding: the same op on v, padding with 0
            b.nodes.append(node)
            vx = var[node.input[0]]
            var[out] = None if vx is None else b.add(op, [vx, *_zero_pad_value(node)], p + "v", **attrs_of(node))
        elif op == "ReduceMax":
            b.nodes.append(node)
            vx = var[node.input[0]]
            var[out] = None if vx is None else _reduce_max_variance(b, node, vx, p)
        elif op == "LogSoftmax" and out == base.graph.output[0].name:
            b.nodes.append(node)  # the head: the predictive's softmax of log-softmaxed logits is that of the logits
            _check_last_axis(node, shapes, where(node))
            var[out] = var[node.input[0]]
        else:
            raise UnsupportedLayerError(f"{where(node)}: analytic mode cannot propagate variance through {op}; "
                                        "use --mode baked or noise")

    logits = base.graph.output[0].name
    classes = model.manifest.num_classes
    v = var.get(logits)
    if v is None:
        v = b.add("Mul", [logits, b.f32(P + "zero_v", 0.0)], P + "logit_var")
    std = b.add("Sqrt", [b.add("Max", [v, b.f32(P + "var_floor", VAR_FLOOR)], P + "v_floor")], P + "logit_std")
    z = b.f32(P + "quadrature", quadrature_points(samples, classes)[None])  # [1, Q, K]
    axis1 = b.i64(P + "head_axis1", 1)
    m3 = b.add("Unsqueeze", [logits, axis1], P + "m3")
    s3 = b.add("Unsqueeze", [std, axis1], P + "s3")
    lq = b.add("Add", [m3, b.add("Mul", [s3, z], P + "sz")], P + "logits_q")  # [B, Q, K]
    flat = b.add("Reshape", [lq, b.i64(P + "q_flat", -1, classes)], P + "logits_flat")
    b.predictive_head(flat, samples, classes)
    out = b.model(base, list(base.graph.input), f"edgebnn_analytic_Q{samples}", classes)
    set_metadata(out, model, mode="analytic", samples=samples, seed=None, quadrature="sobol", quadrature_seed=0)
    return out


def _layer_moments(b: Builder, node: onnx.NodeProto, kind: LayerKind, var: dict[str, str | None],
                   moments: Callable[[str], tuple[np.ndarray, np.ndarray]], encoded: Collection[str], where: str,
                   p: str) -> None:
    """m' = op(m, mu) + b_mu,  v' = op(m² + v, s²) + op(v, mu²) + s_b² (writes the mean, records the variance)."""
    x, out = node.input[0], node.output[0]
    if node.input[1] in var:
        raise UnsupportedLayerError(f"{where}: weights computed from the input are not supported")
    kind.attrs(node, where)
    mu_w, s2_w = moments(node.input[1])
    bias = bias_name(node)
    mu_b, s2_b = moments(bias) if bias else (None, None)
    mean_in = [x, b.f32(p + "mu_w", mu_w) if node.input[1] in encoded else node.input[1]]
    if bias:
        mean_in.append(b.f32(p + "mu_b", mu_b) if bias in encoded and mu_b is not None else bias)
    kind.plain(b, node, mean_in, out)
    vx = var[x]
    operands = []  # (input, weight) pairs of the variance: op(m² + v, s²) and op(v, mu²)
    if s2_w.any():
        m2 = b.add("Mul", [x, x], p + "m2")
        operands.append((b.add("Add", [m2, vx], p + "ex2") if vx else m2, s2_w))
    if vx:
        operands.append((vx, mu_w.astype(np.float64) ** 2))
    has_b = s2_b is not None and s2_b.any()
    v: str | None = None
    if len(operands) == 2 and _concatenable(node):
        # one op for both terms: inputs side by side on the reduction axis (channels / features), weights too
        axis = 0 if node.op_type == "Gemm" and not attrs_of(node).get("transB", 0) else 1
        both = b.add("Concat", [operands[0][0], operands[1][0]], p + "ex2_v", axis=1)
        w2 = np.concatenate([operands[0][1], operands[1][1]], axis=axis)
        bias_in = [b.f32(p + "s2_b", s2_b)] if has_b and s2_b is not None else []
        v = kind.plain(b, node, [both, b.f32(p + "s2_w_mu_w2", w2), *bias_in], p + "v")
        has_b = False
    else:
        v = _sum(b, [kind.plain(b, node, [xi, b.f32(f"{p}w2_{i}", wi)], f"{p}v_{i}")
                     for i, (xi, wi) in enumerate(operands)], p)
    if has_b and s2_b is not None:
        s2b = b.f32(p + "s2_b", s2_b.reshape(kind.bias_shape(mu_w.shape)))
        v = b.add("Add", [v, s2b], p + "v") if v else b.add("Expand", [s2b, b.add("Shape", [out], p + "shp")], p + "v")
    var[out] = v


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


def _check_last_axis(node: onnx.NodeProto, shapes: dict[str, list[int]], where: str) -> None:
    """A LogSoftmax head passes the logits' moments through only when it normalises over the classes.

    softmax(log_softmax(z)) = softmax(z) for every draw z, so the quadrature head on the logits' (m, v) gives the
    predictive of the log-probabilities; (m, v) are not the log-probabilities' own moments (that would be
    wrong anywhere but before the head)."""
    axis = int(attrs_of(node).get("axis", -1))
    rank = len(shapes.get(node.input[0], [0, 0]))
    if axis not in (-1, rank - 1):
        raise UnsupportedLayerError(f"{where}: analytic mode takes a LogSoftmax head over the last axis only "
                                    f"(got axis {axis}); use --mode baked or noise")


def _sum(b: Builder, terms: list[str], p: str) -> str | None:
    if not terms:
        return None
    total = terms[0]
    for i, t in enumerate(terms[1:]):
        total = b.add("Add", [total, t], f"{p}vsum{i}")
    return total


def _relu_moments(b: Builder, m: str, v: str, out: str, p: str) -> str:
    """Mean and variance of max(0, X), X ~ N(m, v); writes the mean to ``out`` and returns the variance.

    With s = √v, a = m/s: m' = m Φ(a) + s φ(a), and since E[max(0,X)²] = (m² + v) Φ(a) + m s φ(a) = v Φ(a) + m m',
    v' = v Φ(a) + m' (m − m') (fewer nodes than (m² + v) Φ + m s φ − m'², and no cancellation of large terms
    where Φ(a) ≈ 1).
    """
    s = b.add("Sqrt", [b.add("Max", [v, b.f32(p + "floor", VAR_FLOOR)], p + "vf")], p + "s")
    a_r2 = b.add("Div", [m, b.add("Mul", [s, b.f32(p + "sqrt2", math.sqrt(2))], p + "s_r2")], p + "a_r2")  # a/√2
    cdf = b.add("Add", [b.add("Mul", [b.add("Erf", [a_r2], p + "erf"), b.f32(p + "half", 0.5)], p + "erf_h"),
                        b.f32(p + "half_", 0.5)], p + "cdf")
    # s φ(a) = s / √(2π) · exp(-(a/√2)²)
    e = b.add("Exp", [b.add("Mul", [a_r2, b.add("Neg", [a_r2], p + "neg_a_r2")], p + "ea")], p + "exp")
    sp = b.add("Mul", [b.add("Mul", [s, e], p + "s_e"), b.f32(p + "rsqrt2pi", 1 / math.sqrt(2 * math.pi))],
               p + "s_pdf")
    b.add("Add", [b.add("Mul", [m, cdf], p + "m_cdf"), sp], out)
    vc = b.add("Mul", [v, cdf], p + "v_cdf")
    spread = b.add("Mul", [out, b.add("Sub", [m, out], p + "m_minus")], p + "spread")
    return b.add("Relu", [b.add("Add", [vc, spread], p + "var_raw")], p + "v")
