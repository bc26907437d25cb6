"""``analytic`` mode on a last-layer posterior: the linearised (GLM) predictive with the probit link, one pass.

When the only sampled layer of an IR is the final Gemm ``f = W φ + b`` (the graph's logits) on features φ that
deterministic layers computed (a last-layer posterior: laplace-torch's ``*LLLaplace``, or any BNN with only its
last layer Bayesian), the logits are exactly Gaussian, ``f ~ N(M φ + m_b, Σ_f)``. The diagonal of ``Σ_f`` is
exact per family (the encoding's own covariance, not a mean-field one: its family's
:attr:`~edgebnn.plugins.Analytic.last_layer`, :mod:`edgebnn.families.laplace`)::

    mean-field W (every encoding of independent weights, from moments()):
        var_k = Σ_i φ_i² Var W[k, i]
    Kronecker-factored W = M + Q_o (Z ⊙ D) Q_iᵀ (the Laplace family's), u = Q_iᵀ φ:
        var_k = Σ_p Q_o[k, p]² Σ_q D[p, q]² u_q²                       (two MatMuls on u², no [K·n]² matrix)
    dense W = M + reshape(L z) (the Laplace family's, L [K·n, r]):
        var_k = Σ_r (Σ_i L[k·n + i, r] φ_i)²                            (one MatMul, square, sum)
    bias b (any family): + Var b_k, its marginal (∂f_k/∂b = e_k)

and the predictive is the probit approximation (MacKay 1992), exactly laplace-torch's
``la(x, pred_type="glm", link_approx="probit")``::

    probs = softmax(f_mean / sqrt(1 + π/8 · var))

``entropy`` is that of ``probs``; ``mutual_info`` = entropy − E[H(softmax(f))], the expectation over the S
quasi-Monte Carlo points of the analytic mode's quadrature (:func:`.analytic.quadrature_matrix`) on N(f_mean, var).

A model whose only layer is sampled (no deterministic features) keeps :mod:`.analytic` (its quadrature head
integrates the same logit distribution with S points) unless that layer is correlated. A family whose analytic
rule gives a last-layer variance (:attr:`edgebnn.families.Analytic.last_layer`: Kronecker-factored, dense) takes
the GLM head on the last layer only; anywhere else :func:`check_analytic` refuses ``analytic`` in one line, with the
family's reason.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters._graph import Builder, P, set_metadata
from edgebnn.exporters.analytic import VAR_FLOOR, quadrature_matrix
from edgebnn.exporters.config import GraphSpec
from edgebnn.exporters.layers import layer_kind
from edgebnn.family import Analytic, family_of
from edgebnn.ir import BNNModel, attrs_of
from edgebnn.ir.encodings import Encoding


def analytic_rule(enc: Encoding) -> Analytic:
    """What ``--mode analytic`` does with ``enc`` (its family's :class:`~edgebnn.plugins.Analytic`; an encoding no
    family registered: refused)."""
    family = family_of(enc.op_type)
    if family is None:
        return Analytic("refused", f"{enc.op_type} belongs to no registered family, which would say whether its "
                                   "weights are independent")
    return family.analytic_for(enc)


def check_analytic(model: BNNModel, last_layer: bool) -> list[str]:
    """Refuse (one line) a weight whose family refuses ``analytic`` (anywhere, or but as the last layer when
    ``last_layer`` says the IR is a last-layer posterior); returns the approximations the export makes, one line
    per family that states a bound."""
    notes: dict[str, str] = {}
    for w in model.iter_encoded_weights():
        rule = analytic_rule(w.encoding)
        if rule.kind == "refused" and not (last_layer and rule.last_layer is not None):
            family = family_of(w.encoding.op_type)
            what = f"{w.encoding.op_type}" + (f" ({family.noun})" if family is not None else "")
            raise InvalidOptionError(f"{model.where}: layer {w.layer!r} is {what}: --mode analytic {rule.why}")
        if rule.kind == "approximate":
            family = family_of(w.encoding.op_type)
            notes[w.encoding.op_type] = f"{family.noun if family else w.encoding.op_type}: {rule.bound}"
    return sorted(notes.values())


def _last_layer(model: BNNModel) -> onnx.NodeProto | None:
    """The Gemm (``transB=1``, ``alpha = beta = 1``) that every encoded weight feeds and that writes the logits."""
    names = set(model.encoded_weight_names())
    users = [n for n in model.proto.graph.node if n.domain != "ai.edgebnn" and any(x in names for x in n.input)]
    if len(users) != 1 or users[0].op_type != "Gemm":
        return None
    node = users[0]
    attrs = attrs_of(node)
    if (node.output[0] != model.proto.graph.output[0].name or node.input[0] in names or attrs.get("transA", 0)
            or not attrs.get("transB", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
        return None
    return node


def uses_glm(model: BNNModel) -> bool:
    """Whether ``analytic`` runs as the GLM/probit predictive: a last-layer posterior, i.e. the only sampled layer
    writes the logits and reads features that deterministic layers computed (or its family's analytic rule gives a
    last-layer variance: Kronecker-factored, dense). A network whose only layer is sampled (a linear model) keeps
    the quadrature head of :mod:`.analytic` (the same exact Gaussian logits, integrated with S points).
    """
    if not model.manifest.task_spec(model.where).softmax_classifier:
        return False  # the GLM/probit head is a softmax classifier's; other tasks integrate their own head
    node = _last_layer(model)
    correlated = any(analytic_rule(w.encoding).kind != "exact" and analytic_rule(w.encoding).last_layer is not None
                     for w in model.iter_encoded_weights())
    return node is not None and (correlated or any(
        n is not node and n.domain != "ai.edgebnn" and layer_kind(n) is not None for n in model.proto.graph.node))


def export_glm(model: BNNModel, spec: GraphSpec) -> onnx.ModelProto:
    """The GLM/probit predictive of a last-layer posterior (see the module docstring); ``spec.samples`` quadrature
    points for ``mutual_info`` only."""
    samples = spec.samples
    node = _last_layer(model)
    if node is None:
        raise InvalidOptionError(f"{model.where}: the GLM predictive needs one sampled layer, the final Gemm")
    encoded = {w.name: w for w in model.encoded_weights()}
    base = model.float_model()  # the posterior-mean network: its last Gemm gives the mean logits
    b = Builder([t for t in base.graph.initializer])
    b.nodes.extend(base.graph.node)
    phi = node.input[0]
    p = f"{P}glm/"
    weight = encoded[node.input[1]].encoding
    emit = analytic_rule(weight).last_layer or _moment_variance
    terms = [emit(b, weight, phi, p + "w_")]
    if len(node.input) > 2 and node.input[2] in encoded:
        bias = encoded[node.input[2]].encoding
        terms.append(b.f32(p + "b_var", np.square(bias.stddev().astype(np.float64))))
    var = terms[0] if len(terms) == 1 else b.add("Add", terms, p + "var")
    if spec.progress is not None:
        spec.progress(1, 1)
    mean = node.output[0]
    classes = model.manifest.num_classes
    kappa = b.add("Reciprocal", [b.add("Sqrt", [b.add("Add", [b.f32(p + "one", 1.0), b.add(
        "Mul", [var, b.f32(p + "pi_8", math.pi / 8)], p + "var_pi8")], p + "probit_den2")], p + "probit_den")],
        p + "kappa")
    probs = b.add("Softmax", [b.add("Mul", [mean, kappa], p + "scaled")], "probs", axis=-1)
    _head(b, mean, var, probs, samples, classes, p)
    b.outputs = model.manifest.task_spec(model.where).output_infos(classes)  # a classifier's: probs, entropy, mi
    out = b.model(base, list(base.graph.input), f"edgebnn_analytic_glm_Q{samples}")
    set_metadata(out, model, mode="analytic", samples=samples, seed=None, quadrature="glm-probit", quadrature_seed=0)
    return out


def _head(b: Builder, mean: str, var: str, probs: str, samples: int, classes: int, p: str) -> None:
    """entropy of ``probs``; mutual_info = entropy − mean entropy of softmax(mean + √var ⊙ z_q) over S points."""
    axk = b.i64(p + "axis_last", -1)
    logp = b.add("Log", [b.add("Max", [probs, b.f32(p + "eps", 1e-12)], p + "probs_eps")], p + "logprobs")
    neg_h = b.add("ReduceSum", [b.add("Mul", [probs, logp], p + "plogp"), axk], p + "neg_h", keepdims=0)
    b.add("Neg", [neg_h], "entropy")
    std = b.add("Sqrt", [b.add("Max", [var, b.f32(p + "var_floor", VAR_FLOOR)], p + "v_floor")], p + "std")
    ms = b.add("Concat", [mean, std], p + "m_s", axis=-1)
    lq = b.add("MatMul", [ms, b.f32(p + "quadrature", quadrature_matrix(samples, classes))], p + "logits_q")
    x3 = b.add("Reshape", [lq, b.i64(p + "q_shape", -1, samples, classes)], p + "logits3")
    ps = b.add("Softmax", [x3], p + "p_q", axis=-1)
    logps = b.add("LogSoftmax", [x3], p + "logp_q", axis=-1)
    neg_hs = b.add("ReduceSum", [b.add("Mul", [ps, logps], p + "plogp_q"), axk], p + "neg_h_q", keepdims=0)
    neg_eh = b.add("ReduceMean", [neg_hs, b.i64(p + "axis1", 1)], p + "neg_expected_h", keepdims=0)
    mi = b.add("Neg", [b.add("Sub", [neg_h, neg_eh], p + "neg_mi")], p + "mi_raw")
    b.add("Max", [mi, b.f32(p + "zero", 0.0)], "mutual_info")


def _moment_variance(b: Builder, enc: Encoding, phi: str, p: str) -> str:
    """Independent weights: var_k = Σ_i φ_i² Var W[k, i] (one MatMul of φ² by Varᵀ)."""
    _, var = enc.moments()
    phi2 = b.add("Mul", [phi, phi], p + "phi2")
    return b.add("MatMul", [phi2, b.f32(p + "var_t", np.ascontiguousarray(var.astype(np.float32).T))], p + "var")
