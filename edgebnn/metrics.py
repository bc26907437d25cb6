"""Predictive summaries and calibration metrics (docs/design.md, Metrics).

For S sampled networks with class probabilities p_s:
    p̄ = mean_s p_s                                  (predictive distribution)
    H[p̄] = -Σ_k p̄_k log p̄_k                         (predictive entropy, total uncertainty)
    MI = H[p̄] - mean_s H[p_s]                        (mutual information, epistemic part)
ECE uses 15 equal-width bins of the max probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPS = 1e-12
ECE_BINS = 15


@dataclass
class Predictive:
    """The predictive distribution of an ensemble over a batch."""

    probs: np.ndarray  # [N, K]
    entropy: np.ndarray  # [N]
    mutual_info: np.ndarray  # [N]


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


def accuracy(probs: np.ndarray, y: np.ndarray) -> float:
    return float((probs.argmax(-1) == y).mean())


def nll(probs: np.ndarray, y: np.ndarray) -> float:
    return float(-np.log(np.maximum(probs[np.arange(len(y)), y].astype(np.float64), EPS)).mean())


def brier(probs: np.ndarray, y: np.ndarray) -> float:
    onehot = np.eye(probs.shape[1])[y]
    return float(((probs.astype(np.float64) - onehot) ** 2).sum(-1).mean())


def ece(probs: np.ndarray, y: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error with ``bins`` equal-width bins of the max probability."""
    conf = probs.max(-1).astype(np.float64)
    correct = probs.argmax(-1) == y
    idx = np.minimum((conf * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        mask = idx == b
        if mask.any():
            total += mask.mean() * abs(correct[mask].mean() - conf[mask].mean())
    return float(total)


def classification_report(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    return {
        "accuracy": accuracy(probs, y),
        "nll": nll(probs, y),
        "ece": ece(probs, y),
        "brier": brier(probs, y),
    }
