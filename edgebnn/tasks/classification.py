"""Classification: S members' logits [B·S, K] -> probs, entropy, mutual_info (and the quadrature that integrates
Gaussian logits for ``analytic`` mode); the same in numpy; accuracy, NLL, ECE, Brier.

classification, logits [B·S, K]:   probs = mean_s softmax; entropy = H[probs]; mutual_info = H − mean_s H_s

Analytic: the softmax integrated over the Gaussian logits with fixed quasi-Monte Carlo points
(logits_q = m + √v ⊙ z_q), then the sampled head over the Q points.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from edgebnn.data import ClassLabels, Targets
from edgebnn.errors import UnsupportedLayerError
from edgebnn.metrics import AnyPredictive, MetricSums, Predictive, log_softmax, predictive_from_logits
from edgebnn.tasks.base import EPS_PROBS, VAR_FLOOR, GraphBuilder, Points, Task, probs_entropy_mi, register_task
from edgebnn.tasks.base import PREFIX as P


def _classification(b: GraphBuilder, logits: str, samples: int, classes: int) -> None:
    """logits [B·S, K] -> probs [B, K], entropy [B], mutual_info [B].

    probs = mean_s softmax; entropy = -Σ probs·log(max(probs, 1e-12));
    mutual_info = max(entropy - mean_s(-Σ p_s·log_softmax_s), 0) (clamps round-off).
    """
    p = P + "head/"
    ax1, axk = b.i64(p + "axis1", 1), b.i64(p + "axis_last", -1)
    x3 = b.add("Reshape", [logits, b.i64(p + "shape", -1, samples, classes)], p + "logits3")
    mean_entropy_mi(b, p, x3, -1, ax1, axk, axk)


def _classification_analytic(b: GraphBuilder, logits: str, v: str | None, samples: int, classes: int,
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
    _classification(b, lq, samples, classes)  # [B, Q·K], row-major over (q, k): the head's [B, Q, K]


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


def mean_entropy_mi(b: GraphBuilder, p: str, x: str, class_axis: int, ax1: str, ax_probs: str, ax_s: str) -> None:
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


class ClassificationSums(MetricSums):
    """:class:`MetricSums` taking a :class:`Predictive` (:class:`edgebnn.tasks.MetricAccumulator`)."""

    def add_predictive(self, pred: AnyPredictive, y: np.ndarray) -> None:
        assert isinstance(pred, Predictive)
        self.add(pred.probs, y)


@register_task
class Classification(Task):
    """Logits [N, K >= 2] -> probs, entropy, mutual_info (module docstring); integer class labels; accuracy, NLL,
    ECE, Brier."""

    name = "classification"
    columns = ("accuracy", "nll", "ece", "brier")
    default_objectives = ("bytes", "nll", "ece")
    softmax_axis = -1
    softmax_classifier = True

    @classmethod
    def from_output(cls, shape: tuple[int, ...], where: str, **options: Any) -> Task:
        if len(shape) != 2:
            raise UnsupportedLayerError(f"{where}: task classification needs a [batch, outputs] output, got "
                                        f"{list(shape)}; per-pixel logits are task segmentation")
        if shape[1] < 2:
            raise UnsupportedLayerError(
                f"{where}: forward returns one output per example; edgebnn exports a softmax predictive over >= 2 "
                "classes: for a sigmoid (binary) classifier return torch.cat([torch.zeros_like(z), z], 1) (its "
                "softmax is [1 - sigmoid(z), sigmoid(z)]); for regression pass task='regression'"
            )
        return cls()

    def describe(self, classes: int) -> str:
        return f"{classes} classes"

    def sampled(self, b: GraphBuilder, outputs: str, samples: int, classes: int) -> None:
        _classification(b, outputs, samples, classes)

    def analytic(self, b: GraphBuilder, m: str, v: str | None, samples: int, classes: int, points: Points) -> None:
        _classification_analytic(b, m, v, samples, classes, points)

    def output_infos(self, classes: int) -> list[onnx.ValueInfoProto]:
        return probs_entropy_mi([classes])

    def baseline_output(self, output: str) -> onnx.NodeProto:
        return helper.make_node("Softmax", [output], ["probs"], axis=-1)

    def reduce(self, outputs: np.ndarray) -> AnyPredictive:
        """[S, N, K] member logits -> probs, entropy, mutual_info (:func:`edgebnn.metrics.predictive_from_logits`)."""
        return predictive_from_logits(outputs)

    def members(self, outputs: np.ndarray) -> np.ndarray:
        """Each member's class probabilities (softmax of its logits)."""
        return np.exp(log_softmax(outputs.astype(np.float64), axis=-1))

    def metrics(self, classes: int) -> ClassificationSums:
        return ClassificationSums()

    def targets(self, classes: int) -> Targets:
        return ClassLabels()
