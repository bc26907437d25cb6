"""Predictive summaries and calibration metrics (docs/design.md, Metrics).

For S sampled networks with class probabilities p_s:
    p̄ = mean_s p_s                                  (predictive distribution)
    H[p̄] = -Σ_k p̄_k log p̄_k                         (predictive entropy, total uncertainty)
    MI = H[p̄] - mean_s H[p_s]                        (mutual information, epistemic part)
ECE uses 15 equal-width bins of the max probability.

The task (:class:`edgebnn.tasks.Task`, recorded in the IR manifest and the export metadata) says what the
network's output is and how S member outputs reduce to a predictive:

    classification  logits [N, K]        probs, entropy, mutual_info as above
    segmentation    logits [N, C, *sp]   the same per pixel: probs [N, C, *sp], entropy/mutual_info [N, *sp]
    regression      [N, D] means (a stated noise variance σ², or none) or [N, 2D] means and log-variances:
                    mean = mean_s μ_s,  aleatoric = mean_s σ²_s,  epistemic = Var_s μ_s (1/S),
                    variance = aleatoric + epistemic   (the moments of the S-member Gaussian mixture)

Regression metrics on float targets y (every element of [N, D]): Gaussian NLL ½log(2π v) + (y − m)²/(2v),
RMSE, MAE, coverage of the central p-intervals m ± z_{(1+p)/2} √v for p = 0.5, 0.9, 0.95, and the calibration
error mean_p |coverage(p) − p| over p = 0.05, 0.10, ..., 0.95. Segmentation metrics per pixel: accuracy, mean IoU
over the classes present in labels or predictions, NLL, ECE (15 bins).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgebnn.tasks.spec import CLASSIFICATION, REGRESSION, SEGMENTATION, Task

EPS = 1e-12
ECE_BINS = 15
COVERAGE_LEVELS = (0.5, 0.9, 0.95)
CALIBRATION_LEVELS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05 .. 0.95
VARIANCE_FLOOR = 1e-12


@dataclass
class Predictive:
    """The predictive distribution of an ensemble over a batch."""

    probs: np.ndarray  # [N, K]
    entropy: np.ndarray  # [N]
    mutual_info: np.ndarray  # [N]

    def ood_scores(self) -> tuple[np.ndarray, np.ndarray]:
        """Per example (total, epistemic) uncertainty: entropy and mutual information (their image means for
        per-pixel maps)."""
        n = len(self.entropy)
        return self.entropy.reshape(n, -1).mean(1), self.mutual_info.reshape(n, -1).mean(1)


@dataclass
class RegressionPredictive:
    """The predictive of a regression ensemble over a batch: moments of the S-member Gaussian mixture."""

    mean: np.ndarray  # [N, D]
    variance: np.ndarray  # [N, D] = aleatoric + epistemic
    aleatoric: np.ndarray  # [N, D] mean of the members' variances
    epistemic: np.ndarray  # [N, D] variance of the members' means

    def ood_scores(self) -> tuple[np.ndarray, np.ndarray]:
        """Per example (total, epistemic) uncertainty: the mean over D of the Gaussian predictive entropy
        ½log(2πe·variance), and of the epistemic variance."""
        total = 0.5 * np.log(2 * np.pi * np.e * np.maximum(self.variance.astype(np.float64), VARIANCE_FLOOR))
        return total.mean(1), self.epistemic.astype(np.float64).mean(1)


AnyPredictive = Predictive | RegressionPredictive


def log_softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    z = logits - logits.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def predictive_from_logits(sample_logits: np.ndarray) -> Predictive:
    """Summarise ``[S, N, K]`` per-sample logits."""
    logp = log_softmax(sample_logits.astype(np.float64))
    p = np.exp(logp)
    probs = p.mean(axis=0)
    entropy = -(probs * np.log(np.maximum(probs, EPS))).sum(-1)
    expected = -(p * logp).sum(-1).mean(0)
    mi = np.maximum(entropy - expected, 0.0)
    return Predictive(probs.astype(np.float32), entropy.astype(np.float32), mi.astype(np.float32))


def predictive_from_samples(task: Task, outputs: np.ndarray) -> AnyPredictive:
    """The predictive of ``[S, N, ...]`` member outputs for ``task`` (what the exported head computes)."""
    if task.name == CLASSIFICATION:
        return predictive_from_logits(outputs)
    if task.name == SEGMENTATION:
        logp = log_softmax(outputs.astype(np.float64), axis=2)  # [S, N, C, *sp]
        p = np.exp(logp)
        probs = p.mean(axis=0)
        entropy = -(probs * np.log(np.maximum(probs, EPS))).sum(1)
        mi = np.maximum(entropy - (-(p * logp).sum(2).mean(0)), 0.0)
        return Predictive(probs.astype(np.float32), entropy.astype(np.float32), mi.astype(np.float32))
    out = outputs.astype(np.float64)
    d = task.dims or 1
    mu = out[..., :d]
    if task.head == "mean_logvar":
        aleatoric = np.exp(out[..., d:2 * d]).mean(0)
    else:
        aleatoric = np.full(mu.shape[1:], task.noise_var or 0.0)
    mean = mu.mean(0)
    epistemic = ((mu - mean) ** 2).mean(0)
    f = np.float32
    return RegressionPredictive(mean.astype(f), (aleatoric + epistemic).astype(f), aleatoric.astype(f),
                                epistemic.astype(f))


def accuracy(probs: np.ndarray, y: np.ndarray) -> float:
    return float((probs.argmax(-1) == y).mean())


def nll(probs: np.ndarray, y: np.ndarray) -> float:
    return float(-np.log(np.maximum(probs[np.arange(len(y)), y].astype(np.float64), EPS)).mean())


def brier(probs: np.ndarray, y: np.ndarray) -> float:
    onehot = np.eye(probs.shape[1])[y]
    return float(((probs.astype(np.float64) - onehot) ** 2).sum(-1).mean())


def _bin_sums(probs: np.ndarray, y: np.ndarray, bins: int) -> np.ndarray:
    """Per equal-width bin of the max probability: ``[3, bins]`` rows count, sum of confidence, sum correct."""
    conf = probs.max(-1).astype(np.float64)
    correct = (probs.argmax(-1) == y).astype(np.float64)
    idx = np.minimum((conf * bins).astype(int), bins - 1)
    return np.stack([np.bincount(idx, minlength=bins).astype(np.float64),
                     np.bincount(idx, conf, minlength=bins), np.bincount(idx, correct, minlength=bins)])


def _ece_from_sums(sums: np.ndarray) -> float:
    count, conf, correct = sums
    used = count > 0
    return float((np.abs(correct[used] - conf[used])).sum() / count.sum())


def ece(probs: np.ndarray, y: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error with ``bins`` equal-width bins of the max probability."""
    return _ece_from_sums(_bin_sums(probs, y, bins))


def classification_report(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """``accuracy``, ``nll``, ``ece`` (15 bins) and ``brier`` of mean probabilities ``[N, K]`` against labels."""
    return {
        "accuracy": accuracy(probs, y),
        "nll": nll(probs, y),
        "ece": ece(probs, y),
        "brier": brier(probs, y),
    }


class MetricSums:
    """:func:`classification_report` over a stream of batches: sums per batch, the same numbers at the end.

    Also keeps the per-bin counts of the reliability diagram (:meth:`reliability`).
    """

    def __init__(self, bins: int = ECE_BINS) -> None:
        self.bins = bins
        self.n = 0
        self._sums = {"accuracy": 0.0, "nll": 0.0, "brier": 0.0}
        self._bin_sums = np.zeros((3, bins))

    def add(self, probs: np.ndarray, y: np.ndarray) -> None:
        """Add one batch of mean probabilities ``[B, K]`` and labels ``[B]``."""
        b = len(y)
        self.n += b
        for name, fn in (("accuracy", accuracy), ("nll", nll), ("brier", brier)):
            self._sums[name] += fn(probs, y) * b
        self._bin_sums += _bin_sums(probs, y, self.bins)

    def report(self) -> dict[str, float]:
        """The :func:`classification_report` of every batch added."""
        out = {k: v / self.n for k, v in self._sums.items()}
        return {"accuracy": out["accuracy"], "nll": out["nll"], "ece": _ece_from_sums(self._bin_sums),
                "brier": out["brier"]}

    def reliability(self) -> dict[str, list[float]]:
        """Per bin: ``count``, mean ``confidence`` and ``accuracy`` (NaN for an empty bin)."""
        count, conf, correct = self._bin_sums
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"count": count.tolist(), "confidence": (conf / count).tolist(),
                    "accuracy": (correct / count).tolist()}


def ood_report(in_entropy: np.ndarray, in_mutual_info: np.ndarray, ood_entropy: np.ndarray,
               ood_mutual_info: np.ndarray) -> dict[str, float]:
    """How well uncertainty separates out-of-distribution inputs from in-distribution ones (scikit-learn).

    Returns:
        ``auroc_mutual_info`` and ``auroc_entropy``: area under the ROC curve of each score, OOD as the
        positive class (0.5: no separation, 1: perfect); ``aupr_mutual_info``: average precision of the
        mutual information, OOD positive; ``fpr_at_95_tpr``: the fraction of OOD inputs taken for
        in-distribution when the mutual-information threshold keeps 95% of the in-distribution inputs
        (in-distribution positive, lower is better).
    """
    from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

    is_ood = np.concatenate([np.zeros(len(in_entropy)), np.ones(len(ood_entropy))])
    mi = np.concatenate([in_mutual_info, ood_mutual_info]).astype(np.float64)
    ent = np.concatenate([in_entropy, ood_entropy]).astype(np.float64)
    fpr, tpr, _ = roc_curve(1 - is_ood, -mi)  # in-distribution positive: low mutual information
    return {
        "auroc_mutual_info": float(roc_auc_score(is_ood, mi)),
        "auroc_entropy": float(roc_auc_score(is_ood, ent)),
        "aupr_mutual_info": float(average_precision_score(is_ood, mi)),
        "fpr_at_95_tpr": float(fpr[np.searchsorted(tpr, 0.95, side="left")]),
    }


def _z(level: float) -> float:
    """The half-width of the central ``level`` interval of a standard normal."""
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


class RegressionSums:
    """Regression metrics over a stream of batches (module docstring): sums per batch, the report at the end."""

    def __init__(self) -> None:
        self.n = 0  # examples
        self.elements = 0  # examples x D
        self._levels = sorted(set(CALIBRATION_LEVELS) | set(COVERAGE_LEVELS))
        self._z = np.array([_z(p) for p in self._levels])
        self._sums = {"nll": 0.0, "sq": 0.0, "abs": 0.0, "var": 0.0, "aleatoric": 0.0, "epistemic": 0.0}
        self._covered = np.zeros(len(self._levels))

    def add(self, pred: RegressionPredictive, y: np.ndarray) -> None:
        """Add one batch of predictive moments ``[B, D]`` and float targets ``[B, D]`` (or ``[B]`` for D = 1)."""
        m = pred.mean.astype(np.float64)
        y = y.astype(np.float64).reshape(m.shape)
        v = np.maximum(pred.variance.astype(np.float64), VARIANCE_FLOOR)
        err = y - m
        self.n += len(m)
        self.elements += m.size
        self._sums["nll"] += float((0.5 * np.log(2 * np.pi * v) + err**2 / (2 * v)).sum())
        self._sums["sq"] += float((err**2).sum())
        self._sums["abs"] += float(np.abs(err).sum())
        self._sums["var"] += float(v.sum())
        self._sums["aleatoric"] += float(pred.aleatoric.astype(np.float64).sum())
        self._sums["epistemic"] += float(pred.epistemic.astype(np.float64).sum())
        zscore = (np.abs(err) / np.sqrt(v)).reshape(-1)
        self._covered += (zscore[None, :] <= self._z[:, None]).sum(1)

    def add_predictive(self, pred: AnyPredictive, y: np.ndarray) -> None:
        assert isinstance(pred, RegressionPredictive)
        self.add(pred, y)

    def report(self) -> dict[str, Any]:
        """``nll``, ``rmse``, ``mae``, ``coverage`` {"50", "90", "95"}, ``calibration_error`` and the mean
        ``variance``, ``aleatoric`` and ``epistemic`` (per target element)."""
        e = self.elements
        cover = dict(zip(self._levels, (self._covered / e).tolist(), strict=True))
        return {
            "nll": self._sums["nll"] / e,
            "rmse": float(np.sqrt(self._sums["sq"] / e)),
            "mae": self._sums["abs"] / e,
            "coverage": {f"{round(p * 100)}": cover[p] for p in COVERAGE_LEVELS},
            "calibration_error": float(np.mean([abs(cover[p] - p) for p in CALIBRATION_LEVELS])),
            "variance": self._sums["var"] / e,
            "aleatoric": self._sums["aleatoric"] / e,
            "epistemic": self._sums["epistemic"] / e,
        }

    def reliability(self) -> dict[str, list[float]]:
        """Observed coverage of each central interval (``nominal``, ``coverage``)."""
        return {"nominal": list(self._levels), "coverage": (self._covered / max(self.elements, 1)).tolist()}


class SegmentationSums:
    """Per-pixel metrics over a stream of batches: pixel accuracy, mean IoU, NLL and ECE (15 bins)."""

    def __init__(self, classes: int, bins: int = ECE_BINS) -> None:
        self.classes, self.bins = classes, bins
        self.n = 0  # images
        self.pixels = 0
        self._nll = 0.0
        self._confusion = np.zeros((classes, classes), np.int64)  # [label, predicted]
        self._bin_sums = np.zeros((3, bins))

    def add(self, probs: np.ndarray, y: np.ndarray) -> None:
        """Add one batch of per-pixel probabilities ``[B, C, *sp]`` and integer masks ``[B, *sp]``."""
        flat = np.moveaxis(probs, 1, -1).reshape(-1, self.classes)  # [pixels, C]
        labels = y.reshape(-1).astype(np.int64)
        self.n += len(y)
        self.pixels += len(labels)
        self._nll += nll(flat, labels) * len(labels)
        self._confusion += np.bincount(labels * self.classes + flat.argmax(-1),
                                       minlength=self.classes**2).reshape(self.classes, self.classes)
        self._bin_sums += _bin_sums(flat, labels, self.bins)

    def add_predictive(self, pred: AnyPredictive, y: np.ndarray) -> None:
        assert isinstance(pred, Predictive)
        self.add(pred.probs, y)

    def report(self) -> dict[str, Any]:
        """``pixel_accuracy``, ``mean_iou`` (over classes present in labels or predictions), ``iou`` per class
        (None where absent), ``nll`` and ``ece`` per pixel."""
        c = self._confusion.astype(np.float64)
        tp = np.diag(c)
        union = c.sum(0) + c.sum(1) - tp
        with np.errstate(invalid="ignore", divide="ignore"):
            iou = tp / union
        present = union > 0
        return {
            "pixel_accuracy": float(tp.sum() / c.sum()),
            "mean_iou": float(iou[present].mean()) if present.any() else 0.0,
            "iou": [float(v) if ok else None for v, ok in zip(iou, present, strict=True)],
            "nll": self._nll / self.pixels,
            "ece": _ece_from_sums(self._bin_sums),
            "pixels": self.pixels,
        }

    def reliability(self) -> dict[str, list[float]]:
        """Per bin of the per-pixel max probability: ``count``, mean ``confidence`` and ``accuracy``."""
        count, conf, correct = self._bin_sums
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"count": count.tolist(), "confidence": (conf / count).tolist(),
                    "accuracy": (correct / count).tolist()}


class ClassificationSums(MetricSums):
    """:class:`MetricSums` taking a :class:`Predictive` (the task-generic interface of :func:`metric_sums`)."""

    def add_predictive(self, pred: AnyPredictive, y: np.ndarray) -> None:
        assert isinstance(pred, Predictive)
        self.add(pred.probs, y)


def metric_sums(task: Task, classes: int) -> Any:
    """The running metrics of ``task``: an object with ``add_predictive(pred, y)``, ``report()``, ``reliability()``."""
    if task.name == REGRESSION:
        return RegressionSums()
    if task.name == SEGMENTATION:
        return SegmentationSums(classes)
    return ClassificationSums()
