"""The task heads: how an exported graph reduces its S members' outputs to the task's predictive.

One registry (:data:`HEADS`, by task name, :class:`edgebnn.metrics.Task`); each head gives

- ``sampled``: the graph head from the member outputs ``[B·S, ...]`` (row b·S + s, every sampling mode), and
- ``analytic``: the head from the output's Gaussian moments ``(m, v)`` of ``analytic`` mode, and
- ``outputs``: the graph outputs' value infos,

and :func:`edgebnn.metrics.predictive_from_samples` is the same reduction in numpy (the reference runtime's).

classification, logits [B·S, K]:   probs = mean_s softmax; entropy = H[probs]; mutual_info = H − mean_s H_s
segmentation, logits [B·S, C, *sp]: the same over the class axis, per pixel: probs [B, C, *sp], entropy and
                                   mutual_info [B, *sp]
regression, [B·S, D] means μ_s (noise variance σ² stated, or 0) or [B·S, 2D] (μ_s, log σ²_s):
                                   mean = mean_s μ_s; aleatoric = mean_s σ²_s; epistemic = mean_s (μ_s − mean)²;
                                   variance = aleatoric + epistemic   (each [B, D])

Analytic: classification and segmentation integrate the softmax over the Gaussian logits with fixed
quasi-Monte Carlo points (logits_q = m + √v ⊙ z_q), then the sampled head over the Q points. Regression needs
no quadrature: mean = m_μ and epistemic = v_μ (the moments of the mean output), aleatoric = σ² for a ``mean``
head and, for a log-variance head whose log σ² ~ N(m_l, v_l), E[σ²] = exp(m_l + v_l / 2) (the log-normal mean,
taking the propagated Gaussian as exact).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgebnn.metrics import CLASSIFICATION, REGRESSION, SEGMENTATION, Task

P = "ens/"  # prefix of every value an exporter adds (as exporters._graph.P)
EPS_PROBS = 1e-12
VAR_FLOOR = 1e-12  # keeps √v finite where a logit has no variance


class GraphBuilder(Protocol):
    """What a head needs of :class:`edgebnn.exporters._graph.Builder`."""

    store_choice: str  # how the moments are stored: "fp32", or a compact store (its quadrature built in the graph)

    def add(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str: ...

    def i64(self, name: str, *values: int) -> str: ...

    def f32(self, name: str, value: float | np.ndarray) -> str: ...


# (samples Q, dims) -> [Q, dims] standard-normal quadrature points (exporters.analytic.quadrature_points)
Points = Callable[[int, int], np.ndarray]


@dataclass(frozen=True)
class Head:
    """One task's reduction (module docstring)."""

    sampled: Callable[[GraphBuilder, str, int, Task, int], None]
    analytic: Callable[[GraphBuilder, str, str | None, int, Task, int, Points], None]
    outputs: Callable[[Task, int], list[onnx.ValueInfoProto]]


def _classification(b: GraphBuilder, logits: str, samples: int, task: Task, classes: int) -> None:
    """logits [B·S, K] -> probs [B, K], entropy [B], mutual_info [B].

    probs = mean_s softmax; entropy = -Σ probs·log(max(probs, 1e-12));
    mutual_info = max(entropy - mean_s(-Σ p_s·log_softmax_s), 0) (clamps round-off).
    """
    p = P + "head/"
    ax1, axk = b.i64(p + "axis1", 1), b.i64(p + "axis_last", -1)
    x3 = b.add("Reshape", [logits, b.i64(p + "shape", -1, samples, classes)], p + "logits3")
    _mean_entropy_mi(b, p, x3, -1, ax1, axk, axk)


def _classification_analytic(b: GraphBuilder, logits: str, v: str | None, samples: int, task: Task, classes: int,
                             points: Points) -> None:
    """Gaussian logits (m, v) [B, K] -> the predictive, integrated at Q fixed points, as one MatMul:
    [m, √v] [B, 2K] @ [[I ... I], [diag z_1 ... diag z_Q]] = (m + √v ⊙ z_q)_q [B, Q·K]."""
    if v is None:
        v = b.add("Mul", [logits, b.f32(P + "zero_v", 0.0)], P + "logit_var")
    std = b.add("Sqrt", [b.add("Max", [v, b.f32(P + "var_floor", VAR_FLOOR)], P + "v_floor")], P + "logit_std")
    ms = b.add("Concat", [logits, std], P + "m_s", axis=-1)
    z = points(samples, classes)
    matrix = (b.f32(P + "quadrature", quadrature_matrix_of(z)) if b.store_choice == "fp32"
              else _quadrature_in_graph(b, z))  # a compact export: the matrix from its points, in the graph
    lq = b.add("MatMul", [ms, matrix], P + "logits_q")
    _classification(b, lq, samples, task, classes)  # [B, Q·K], row-major over (q, k): the head's [B, Q, K]


def quadrature_matrix_of(z: np.ndarray) -> np.ndarray:
    """[2K, Q·K] from the points z [Q, K]: [m, s] @ it = (m + s ⊙ z_q for q in 1..Q)."""
    samples, classes = z.shape
    eye = np.eye(classes, dtype=np.float32)
    return np.concatenate([np.tile(eye, (1, samples)), (eye[:, None, :] * z.T[:, :, None]).reshape(classes, -1)])


def _quadrature_in_graph(b: GraphBuilder, z: np.ndarray) -> str:
    """:func:`quadrature_matrix_of` built in the graph from its Q·K points (the matrix is 2Q·K² numbers, mostly
    the identity's zeros: 12.8 KB of fp32 for 10 classes and Q = 16, about 1 KB this way):
    ``[Tile(I, Q); Reshape(Unsqueeze(I, 1) · Unsqueeze(zᵀ, 2))]``, the same float32 products, folded at session
    creation like the stores' decodes."""
    samples, classes = z.shape
    p = P + "quad/"
    eye = b.f32(p + "eye", np.eye(classes, dtype=np.float32))
    top = b.add("Tile", [eye, b.i64(p + "reps", 1, samples)], p + "top")
    z_t = b.f32(p + "z_t", np.ascontiguousarray(np.asarray(z, np.float32).T))  # [K, Q]
    diag = b.add("Mul", [b.add("Unsqueeze", [eye, b.i64(p + "ax1", 1)], p + "eye3"),
                         b.add("Unsqueeze", [z_t, b.i64(p + "ax2", 2)], p + "z3")], p + "diag")  # [K, Q, K]
    bottom = b.add("Reshape", [diag, b.i64(p + "shape", classes, samples * classes)], p + "bottom")
    return b.add("Concat", [top, bottom], p + "matrix", axis=0)


def _mean_entropy_mi(b: GraphBuilder, p: str, x: str, class_axis: int, ax1: str, ax_probs: str, ax_s: str) -> None:
    """The outputs ``probs``, ``entropy`` and ``mutual_info`` of per-sample logits ``x`` [B, S, ...] whose classes
    lie on ``class_axis``: probs = mean_s softmax (``ax1``, the sample axis, a constant), entropy = -Σ probs ·
    log(max(probs, 1e-12)) over the classes of ``probs`` (``ax_probs``), mutual_info = max(entropy - mean_s H_s, 0)
    with H_s over the classes of ``x`` (``ax_s``); the max clamps round-off."""
    ps = b.add("Softmax", [x], p + "p_s", axis=class_axis)
    logps = b.add("LogSoftmax", [x], p + "logp_s", axis=class_axis)
    probs = b.add("ReduceMean", [ps, ax1], "probs", keepdims=0)
    logp = b.add("Log", [b.add("Max", [probs, b.f32(p + "eps", EPS_PROBS)], p + "probs_eps")], p + "logprobs")
    neg_h = b.add("ReduceSum", [b.add("Mul", [probs, logp], p + "plogp"), ax_probs], p + "neg_h", keepdims=0)
    b.add("Neg", [neg_h], "entropy")
    neg_hs = b.add("ReduceSum", [b.add("Mul", [ps, logps], p + "plogp_s"), ax_s], p + "neg_h_s", keepdims=0)
    neg_eh = b.add("ReduceMean", [neg_hs, ax1], p + "neg_expected_h", keepdims=0)
    mi = b.add("Neg", [b.add("Sub", [neg_h, neg_eh], p + "neg_mi")], p + "mi_raw")  # H - E[H_s]
    b.add("Max", [mi, b.f32(p + "zero", 0.0)], "mutual_info")


def _classification_outputs(task: Task, classes: int) -> list[onnx.ValueInfoProto]:
    return [
        helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", classes]),
        helper.make_tensor_value_info("entropy", TensorProto.FLOAT, ["batch"]),
        helper.make_tensor_value_info("mutual_info", TensorProto.FLOAT, ["batch"]),
    ]


def _segmentation(b: GraphBuilder, logits: str, samples: int, task: Task, classes: int) -> None:
    """logits [B·S, C, *sp] -> probs [B, C, *sp], entropy [B, *sp], mutual_info [B, *sp] (per pixel)."""
    assert task.shape is not None
    p = P + "head/"
    ax1, ax2 = b.i64(p + "axis1", 1), b.i64(p + "axis2", 2)
    x = b.add("Reshape", [logits, b.i64(p + "shape", -1, samples, *task.shape)], p + "logits_s")  # [B, S, C, *sp]
    _mean_entropy_mi(b, p, x, 2, ax1, ax1, ax2)


def _segmentation_analytic(b: GraphBuilder, logits: str, v: str | None, samples: int, task: Task, classes: int,
                           points: Points) -> None:
    """Per-pixel Gaussian logits (m, v) [B, C, *sp] -> logits_q = m + √v ⊙ z_q [B·Q, C, *sp] (the same Q points
    at every pixel) -> the sampled head over Q."""
    assert task.shape is not None
    p = P + "quad/"
    if v is None:
        v = b.add("Mul", [logits, b.f32(p + "zero_v", 0.0)], p + "logit_var")
    std = b.add("Sqrt", [b.add("Max", [v, b.f32(p + "var_floor", VAR_FLOOR)], p + "v_floor")], p + "logit_std")
    ax1 = b.i64(p + "axis1", 1)
    spatial = len(task.shape) - 1
    z = points(samples, classes).reshape(1, samples, classes, *([1] * spatial))
    m1 = b.add("Unsqueeze", [logits, ax1], p + "m1")
    s1 = b.add("Unsqueeze", [std, ax1], p + "s1")
    lq = b.add("Add", [m1, b.add("Mul", [s1, b.f32(p + "points", z)], p + "s_z")], p + "logits_q")  # [B, Q, C, *sp]
    flat = b.add("Reshape", [lq, b.i64(p + "flat", -1, *task.shape)], p + "logits_flat")
    _segmentation(b, flat, samples, task, classes)


def _segmentation_outputs(task: Task, classes: int) -> list[onnx.ValueInfoProto]:
    assert task.shape is not None
    spatial = list(task.shape[1:])
    return [
        helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", *task.shape]),
        helper.make_tensor_value_info("entropy", TensorProto.FLOAT, ["batch", *spatial]),
        helper.make_tensor_value_info("mutual_info", TensorProto.FLOAT, ["batch", *spatial]),
    ]


def _aleatoric_const(b: GraphBuilder, like: str, task: Task, p: str) -> str:
    """The stated noise variance (0 without one) broadcast to ``like``'s shape."""
    return b.add("Add", [b.add("Mul", [like, b.f32(p + "zero", 0.0)], p + "zeros"),
                         b.f32(p + "noise_var", float(task.noise_var or 0.0))], "aleatoric")


def _slice(b: GraphBuilder, x: str, start: int, end: int, axis: int, out: str) -> str:
    c = f"{P}slice/{out.removeprefix(P)}."
    return b.add("Slice", [x, b.i64(c + "start", start), b.i64(c + "end", end), b.i64(c + "axis", axis)], out)


def _regression(b: GraphBuilder, outputs: str, samples: int, task: Task, classes: int) -> None:
    """[B·S, D] means or [B·S, 2D] (means, log-variances) -> mean, variance, aleatoric, epistemic [B, D]."""
    assert task.dims is not None
    p = P + "head/"
    d = task.dims
    ax1 = b.i64(p + "axis1", 1)
    x = b.add("Reshape", [outputs, b.i64(p + "shape", -1, samples, task.width())], p + "out_s")  # [B, S, W]
    mu = _slice(b, x, 0, d, 2, p + "mu_s") if task.head == "mean_logvar" else x
    mean = b.add("ReduceMean", [mu, ax1], "mean", keepdims=0)
    dev = b.add("Sub", [mu, b.add("Unsqueeze", [mean, ax1], p + "mean1")], p + "dev")
    epistemic = b.add("ReduceMean", [b.add("Mul", [dev, dev], p + "dev2"), ax1], "epistemic", keepdims=0)
    if task.head == "mean_logvar":
        var_s = b.add("Exp", [_slice(b, x, d, 2 * d, 2, p + "logvar_s")], p + "var_s")
        aleatoric = b.add("ReduceMean", [var_s, ax1], "aleatoric", keepdims=0)
    else:
        aleatoric = _aleatoric_const(b, mean, task, p)
    b.add("Add", [aleatoric, epistemic], "variance")


def _regression_analytic(b: GraphBuilder, m: str, v: str | None, samples: int, task: Task, classes: int,
                         points: Points) -> None:
    """(m, v) of the output [B, W] -> mean = m_μ, epistemic = v_μ, aleatoric = σ² or exp(m_l + v_l / 2)."""
    assert task.dims is not None
    p = P + "head/"
    d = task.dims
    if v is None:
        v = b.add("Mul", [m, b.f32(p + "zero_v", 0.0)], p + "out_var")
    two = task.head == "mean_logvar"
    mean = _slice(b, m, 0, d, 1, "mean") if two else b.add("Identity", [m], "mean")
    epistemic = _slice(b, v, 0, d, 1, "epistemic") if two else b.add("Identity", [v], "epistemic")
    if two:
        m_l, v_l = _slice(b, m, d, 2 * d, 1, p + "m_logvar"), _slice(b, v, d, 2 * d, 1, p + "v_logvar")
        half_v = b.add("Mul", [v_l, b.f32(p + "half", 0.5)], p + "half_v")
        aleatoric = b.add("Exp", [b.add("Add", [m_l, half_v], p + "log_e_var")], "aleatoric")
    else:
        aleatoric = _aleatoric_const(b, mean, task, p)
    b.add("Add", [aleatoric, epistemic], "variance")


def _regression_outputs(task: Task, classes: int) -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", task.dims or 0])
            for name in task.outputs]


HEADS: dict[str, Head] = {
    CLASSIFICATION: Head(_classification, _classification_analytic, _classification_outputs),
    SEGMENTATION: Head(_segmentation, _segmentation_analytic, _segmentation_outputs),
    REGRESSION: Head(_regression, _regression_analytic, _regression_outputs),
}


def head_of(task: Task) -> Head:
    """The head of ``task`` (its name is one of :data:`HEADS`: :class:`Task` parsing checks it)."""
    return HEADS[task.name]

