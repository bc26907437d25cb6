"""Predictive summaries and calibration metrics (docs/design.md, Metrics).

For S sampled networks with class probabilities p_s:
    p̄ = mean_s p_s                                  (predictive distribution)
    H[p̄] = -Σ_k p̄_k log p̄_k                         (predictive entropy, total uncertainty)
    MI = H[p̄] - mean_s H[p_s]                        (mutual information, epistemic part)
ECE uses 15 equal-width bins of the max probability.

The task (:class:`edgebnn.tasks.Task`, recorded in the IR manifest and the export metadata) says what the
network's output is and how S member outputs reduce to a predictive; the built-in ones:

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

import numpy as np

EPS = 1e-12  # probabilities are clamped to it before a log
ECE_BINS = 15  # equal-width bins of the confidence
COVERAGE_LEVELS = (0.5, 0.9, 0.95)
CALIBRATION_LEVELS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05 .. 0.95
VARIANCE_FLOOR = 1e-12


@dataclass
class Predictive:
    """The predictive distribution of an ensemble over a batch."""

    probs: np.ndarray  # [N, K]
    entropy: np.ndarray  # [N]
    mutual_info: np.ndarray  # [N]
    samples: np.ndarray | None = None  # [N] members each input used (an anytime ensemble, --samples auto)

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
    samples: np.ndarray | None = None  # [N] members each input used (an anytime ensemble, --samples auto)

    def ood_scores(self) -> tuple[np.ndarray, np.ndarray]:
        """Per example (total, epistemic) uncertainty: the mean over D of the Gaussian predictive entropy
        ½log(2πe·variance), and of the epistemic variance."""
        total = 0.5 * np.log(2 * np.pi * np.e * np.maximum(self.variance.astype(np.float64), VARIANCE_FLOOR))
        return total.mean(1), self.epistemic.astype(np.float64).mean(1)


AnyPredictive = Predictive | RegressionPredictive


def log_softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """log softmax of ``logits`` over ``axis``, stable for any finite logits."""
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


def accuracy(probs: np.ndarray, y: np.ndarray) -> float:
    return float((probs.argmax(-1) == y).mean())


def nll(probs: np.ndarray, y: np.ndarray) -> float:
    return float(-np.log(np.maximum(probs[np.arange(len(y)), y].astype(np.float64), EPS)).mean())


def brier(probs: np.ndarray, y: np.ndarray) -> float:
    onehot = np.eye(probs.shape[1])[y]
    return float(((probs.astype(np.float64) - onehot) ** 2).sum(-1).mean())


def bin_sums(probs: np.ndarray, y: np.ndarray, bins: int) -> np.ndarray:
    """Per equal-width bin of the max probability: ``[3, bins]`` rows count, sum of confidence, sum correct."""
    conf = probs.max(-1).astype(np.float64)
    correct = (probs.argmax(-1) == y).astype(np.float64)
    idx = np.minimum((conf * bins).astype(int), bins - 1)
    return np.stack([np.bincount(idx, minlength=bins).astype(np.float64),
                     np.bincount(idx, conf, minlength=bins), np.bincount(idx, correct, minlength=bins)])


def ece_from_sums(sums: np.ndarray) -> float:
    """The expected calibration error of :func:`bin_sums` (summed over batches): Σ_b |correct_b − confidence_b| / n."""
    count, conf, correct = sums
    used = count > 0
    return float((np.abs(correct[used] - conf[used])).sum() / count.sum())


def reliability_from_sums(sums: np.ndarray) -> dict[str, list[float]]:
    """The reliability diagram of :func:`bin_sums`: per bin ``count``, mean ``confidence`` and ``accuracy`` (NaN for
    an empty bin)."""
    count, conf, correct = sums
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"count": count.tolist(), "confidence": (conf / count).tolist(), "accuracy": (correct / count).tolist()}


def ece(probs: np.ndarray, y: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error with ``bins`` equal-width bins of the max probability."""
    return ece_from_sums(bin_sums(probs, y, bins))


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
        self._bin_sums += bin_sums(probs, y, self.bins)

    def report(self) -> dict[str, float]:
        """The :func:`classification_report` of every batch added."""
        out = {k: v / self.n for k, v in self._sums.items()}
        return {"accuracy": out["accuracy"], "nll": out["nll"], "ece": ece_from_sums(self._bin_sums),
                "brier": out["brier"]}

    def reliability(self) -> dict[str, list[float]]:
        """Per bin: ``count``, mean ``confidence`` and ``accuracy`` (NaN for an empty bin)."""
        return reliability_from_sums(self._bin_sums)


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
