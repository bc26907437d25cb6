"""A multi-label task for edgebnn, as a plug-in defines one: K independent labels, a sigmoid per output.

Importing this module registers the task ``multilabel`` (:func:`edgebnn.tasks.register_task`); it uses edgebnn's
public names only (docs/extending.md, "A task").

Member logits z_s [N, K] (one logit per label) reduce to, per label k::

    probs_k       = mean_s σ(z_s,k)                                 the predictive probability of label k
    entropy_k     = H(probs_k),  H(p) = −p log p − (1 − p) log(1 − p)   (binary entropy: total uncertainty)
    mutual_info_k = max(entropy_k − mean_s H(σ(z_s,k)), 0)          (the epistemic part)

with H(σ(z)) = softplus(z) − σ(z)·z, exact and finite for any logit. ``analytic`` mode integrates σ over the
Gaussian logits z ~ N(m, v) at Q fixed quasi-Monte Carlo points z_q = m + √v ⊙ ε_q, then reduces them like Q members
(the pattern of edgebnn's classification head).

Metrics over all (input, label) pairs: ``accuracy`` (the mean over labels of each label's accuracy at threshold
0.5; ``label_accuracy`` lists them), ``nll`` (binary cross-entropy), ``ece`` (15 bins of the confidence
max(p, 1 − p)), ``brier`` (mean of (p − y)²), and ``exact_match`` (every label of an input right). Labels: ``y``
of shape (N, K) holding 0 or 1 (integers or booleans).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx import helper

from edgebnn.data import Targets
from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.metrics import (
    ECE_BINS,
    EPS,
    AnyPredictive,
    Predictive,
    bin_sums,
    ece_from_sums,
    reliability_from_sums,
)
from edgebnn.tasks import (
    EPS_PROBS,
    PREFIX,
    VAR_FLOOR,
    GraphBuilder,
    Points,
    Task,
    probs_entropy_mi,
    register_task,
)

P = PREFIX + "multilabel/"


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # σ(z), no overflow for any z


def _binary_entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(np.maximum(p, EPS)) + (1 - p) * np.log(np.maximum(1 - p, EPS)))


def _sampled(b: GraphBuilder, logits: str, samples: int, labels: int) -> None:
    """logits [B·S, K] -> probs, entropy, mutual_info [B, K] (module docstring)."""
    p = P + "head/"
    ax1 = b.i64(p + "axis1", 1)
    z = b.add("Reshape", [logits, b.i64(p + "shape", -1, samples, labels)], p + "z")  # [B, S, K]
    p_s = b.add("Sigmoid", [z], p + "p_s")
    probs = b.add("ReduceMean", [p_s, ax1], "probs", keepdims=0)
    eps = b.f32(p + "eps", EPS_PROBS)
    one = b.f32(p + "one", 1.0)
    q = b.add("Sub", [one, probs], p + "q")
    plogp = b.add("Mul", [probs, b.add("Log", [b.add("Max", [probs, eps], p + "p_eps")], p + "logp")], p + "plogp")
    qlogq = b.add("Mul", [q, b.add("Log", [b.add("Max", [q, eps], p + "q_eps")], p + "logq")], p + "qlogq")
    entropy = b.add("Neg", [b.add("Add", [plogp, qlogq], p + "neg_h")], "entropy")
    # H(σ(z)) = softplus(z) − σ(z)·z per member, then its mean over the members
    h_s = b.add("Sub", [b.add("Softplus", [z], p + "softplus"), b.add("Mul", [p_s, z], p + "p_z")], p + "h_s")
    expected = b.add("ReduceMean", [h_s, ax1], p + "expected_h", keepdims=0)
    mi = b.add("Sub", [entropy, expected], p + "mi_raw")
    b.add("Max", [mi, b.f32(p + "zero", 0.0)], "mutual_info")  # clamps round-off


def _analytic(b: GraphBuilder, m: str, v: str | None, samples: int, labels: int, points: Points) -> None:
    """Gaussian logits (m, v) [B, K] -> z_q = m + √v ⊙ ε_q [B·Q, K] at Q fixed points -> the sampled head."""
    p = P + "quad/"
    if v is None:
        v = b.add("Mul", [m, b.f32(p + "zero_v", 0.0)], p + "v0")
    std = b.add("Sqrt", [b.add("Max", [v, b.f32(p + "var_floor", VAR_FLOOR)], p + "v_floor")], p + "std")
    ax1 = b.i64(p + "axis1", 1)
    eps = points(samples, labels).astype(np.float32)[None]  # [1, Q, K]
    m1 = b.add("Unsqueeze", [m, ax1], p + "m1")
    s1 = b.add("Unsqueeze", [std, ax1], p + "s1")
    zq = b.add("Add", [m1, b.add("Mul", [s1, b.f32(p + "points", eps)], p + "s_eps")], p + "z_q")  # [B, Q, K]
    flat = b.add("Reshape", [zq, b.i64(p + "flat", -1, labels)], p + "z_flat")
    _sampled(b, flat, samples, labels)


@dataclass(frozen=True)
class BinaryLabels(Targets):
    """``y`` of shape (N, K): 0 or 1 per label (integers or booleans)."""

    shape: tuple[int, ...] = ()

    def describe(self, n: int) -> str:
        return f"({n}, {', '.join(map(str, self.shape))}): 0/1 labels, one per output"

    def dtype_error(self, dtype: np.dtype[Any]) -> str | None:
        return None if dtype.kind in "iub" else "multi-label targets must be 0/1 integers or booleans"

    def check(self, y: np.ndarray, classes: int | None, where: str, start: int) -> None:
        bad = np.argwhere((y != 0) & (y != 1))
        if len(bad):
            row, label = (int(i) for i in bad[0])
            raise InvalidOptionError(f"{where}: label {int(y[row, label])} at row {start + row} (output {label}) "
                                     "is not 0 or 1")


class MultiLabelSums:
    """The multi-label metrics over a stream of batches (module docstring): sums per batch, the report at the end."""

    def __init__(self, labels: int, bins: int = ECE_BINS) -> None:
        self.labels, self.bins = labels, bins
        self.n = 0
        self._correct = np.zeros(labels)
        self._exact = 0
        self._nll = 0.0
        self._brier = 0.0
        self._bin_sums = np.zeros((3, bins))

    def add(self, probs: np.ndarray, y: np.ndarray) -> None:
        """Add one batch of predictive probabilities [B, K] and 0/1 labels [B, K]."""
        p = probs.astype(np.float64)
        y = y.astype(np.int64)
        right = (p > 0.5) == (y == 1)
        self.n += len(p)
        self._correct += right.sum(0)
        self._exact += int(right.all(1).sum())
        self._nll -= float(np.where(y == 1, np.log(np.maximum(p, EPS)), np.log(np.maximum(1 - p, EPS))).sum())
        self._brier += float(((p - y) ** 2).sum())
        pairs = np.stack([1 - p, p], -1).reshape(-1, 2)  # each (input, label) pair as a two-class prediction
        self._bin_sums += bin_sums(pairs, y.reshape(-1), self.bins)

    def add_predictive(self, pred: AnyPredictive, y: np.ndarray) -> None:
        assert isinstance(pred, Predictive)
        self.add(pred.probs, y)

    def report(self) -> dict[str, Any]:
        pairs = self.n * self.labels
        per_label = self._correct / self.n
        return {"accuracy": float(per_label.mean()), "nll": self._nll / pairs, "ece": ece_from_sums(self._bin_sums),
                "brier": self._brier / pairs, "exact_match": self._exact / self.n,
                "label_accuracy": per_label.tolist()}

    def reliability(self) -> dict[str, list[float]]:
        """Per bin of the pairs' confidence max(p, 1 − p): ``count``, mean ``confidence`` and ``accuracy``."""
        return reliability_from_sums(self._bin_sums)


@register_task
@dataclass(frozen=True)
class MultiLabel(Task):
    """K independent binary labels, a logit each: the mean sigmoid, its binary entropy and mutual information."""

    name = "multilabel"
    columns = ("accuracy", "nll", "ece", "brier")
    default_objectives = ("bytes", "nll", "ece")
    budget_metrics: ClassVar[Mapping[str, str]] = {"exact_match": "max"}  # lower --budget exact_match=-0.02

    @classmethod
    def from_output(cls, shape: tuple[int, ...], where: str, **options: Any) -> Task:
        if len(shape) != 2:
            raise UnsupportedLayerError(f"{where}: task multilabel needs [batch, labels] logits, got {list(shape)}")
        return cls()

    def describe(self, classes: int) -> str:
        return f"{classes} independent labels (sigmoid)"

    def sampled(self, b: GraphBuilder, outputs: str, samples: int, classes: int) -> None:
        _sampled(b, outputs, samples, classes)

    def analytic(self, b: GraphBuilder, m: str, v: str | None, samples: int, classes: int, points: Points) -> None:
        _analytic(b, m, v, samples, classes, points)

    def output_infos(self, classes: int) -> list[onnx.ValueInfoProto]:
        return probs_entropy_mi([classes], [classes])

    def baseline_output(self, output: str) -> onnx.NodeProto:
        return helper.make_node("Sigmoid", [output], ["probs"])

    def reduce(self, outputs: np.ndarray) -> AnyPredictive:
        z = outputs.astype(np.float64)  # [S, N, K]
        p_s = _sigmoid(z)
        probs = p_s.mean(0)
        entropy = _binary_entropy(probs)
        expected = (np.logaddexp(0.0, z) - p_s * z).mean(0)  # mean_s H(σ(z_s))
        mi = np.maximum(entropy - expected, 0.0)
        return Predictive(probs.astype(np.float32), entropy.astype(np.float32), mi.astype(np.float32))

    def members(self, outputs: np.ndarray) -> np.ndarray:
        """Each member's label probabilities σ(z_s)."""
        return _sigmoid(outputs.astype(np.float64))

    def metrics(self, classes: int) -> MultiLabelSums:
        return MultiLabelSums(classes)

    def targets(self, classes: int) -> Targets:
        return BinaryLabels((classes,))

    @classmethod
    def summary(cls, report: Mapping[str, Any]) -> str | None:
        labels = " ".join(f"{a:.3f}" for a in report["label_accuracy"])
        return f"accuracy per label {labels} · exact match {report['exact_match']:.3f}"
