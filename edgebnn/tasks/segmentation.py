"""Segmentation (per pixel): the classification head over the class axis of every pixel; the same in numpy; pixel
accuracy, mean IoU, NLL and ECE per pixel.

segmentation, logits [B·S, C, *sp]: probs [B, C, *sp], entropy and mutual_info [B, *sp]

Analytic: the per-pixel Gaussian logits integrated at the same Q points at every pixel, then the sampled head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from edgebnn.data import ClassMasks, Targets
from edgebnn.errors import InvalidArtifactError, UnsupportedLayerError
from edgebnn.metrics import (
    ECE_BINS,
    EPS,
    AnyPredictive,
    Predictive,
    bin_sums,
    ece_from_sums,
    log_softmax,
    nll,
    reliability_from_sums,
)
from edgebnn.tasks.base import PREFIX as P
from edgebnn.tasks.base import VAR_FLOOR, GraphBuilder, Points, Task, probs_entropy_mi, register_task
from edgebnn.tasks.classification import mean_entropy_mi


def _segmentation(b: GraphBuilder, logits: str, samples: int, shape: tuple[int, ...]) -> None:
    """logits [B·S, C, *sp] -> probs [B, C, *sp], entropy [B, *sp], mutual_info [B, *sp] (per pixel); ``shape``:
    one example's [C, *sp]."""
    p = P + "head/"
    ax1, ax2 = b.i64(p + "axis1", 1), b.i64(p + "axis2", 2)
    x = b.add("Reshape", [logits, b.i64(p + "shape", -1, samples, *shape)], p + "logits_s")  # [B, S, C, *sp]
    mean_entropy_mi(b, p, x, 2, ax1, ax1, ax2)


def _segmentation_analytic(b: GraphBuilder, logits: str, v: str | None, samples: int, shape: tuple[int, ...],
                           points: Points) -> None:
    """Per-pixel Gaussian logits (m, v) [B, C, *sp] -> logits_q = m + √v ⊙ z_q [B·Q, C, *sp] (the same Q points
    at every pixel) -> the sampled head over Q."""
    p = P + "quad/"
    if v is None:
        v = b.add("Mul", [logits, b.f32(p + "zero_v", 0.0)], p + "logit_var")
    std = b.add("Sqrt", [b.add("Max", [v, b.f32(p + "var_floor", VAR_FLOOR)], p + "v_floor")], p + "logit_std")
    ax1 = b.i64(p + "axis1", 1)
    classes, spatial = shape[0], len(shape) - 1
    z = points(samples, classes).reshape(1, samples, classes, *([1] * spatial))
    m1 = b.add("Unsqueeze", [logits, ax1], p + "m1")
    s1 = b.add("Unsqueeze", [std, ax1], p + "s1")
    lq = b.add("Add", [m1, b.add("Mul", [s1, b.f32(p + "points", z)], p + "s_z")], p + "logits_q")  # [B, Q, C, *sp]
    flat = b.add("Reshape", [lq, b.i64(p + "flat", -1, *shape)], p + "logits_flat")
    _segmentation(b, flat, samples, shape)


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
        self._bin_sums += bin_sums(flat, labels, self.bins)

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
            "ece": ece_from_sums(self._bin_sums),
            "pixels": self.pixels,
        }

    def reliability(self) -> dict[str, list[float]]:
        """Per bin of the per-pixel max probability: ``count``, mean ``confidence`` and ``accuracy``."""
        return reliability_from_sums(self._bin_sums)


@register_task
@dataclass(frozen=True)
class Segmentation(Task):
    """Per-pixel logits [N, C >= 2, *sp] -> per-pixel probs, entropy, mutual_info (module docstring); integer
    masks; pixel accuracy, mean IoU, NLL, ECE.

    Attributes:
        shape: One example's logits shape ``[C, *spatial]``.
    """

    shape: tuple[int, ...]

    name = "segmentation"
    aliases = ("dense",)
    columns = ("pixel_accuracy", "mean_iou", "nll", "ece")
    default_objectives = ("bytes", "nll", "mean_iou")
    softmax_axis = 1
    plot = "maps"

    @classmethod
    def from_options(cls, options: Mapping[str, Any], where: str) -> Task:
        shape = options.get("shape")
        if not (isinstance(shape, list) and len(shape) >= 2 and all(_positive_int(d) for d in shape)):
            raise InvalidArtifactError(f"{where}: segmentation task shape {shape!r} is not [C, *spatial] "
                                       "positive ints")
        return cls(tuple(shape))

    def options(self) -> dict[str, Any]:
        return {"shape": list(self.shape)}

    @classmethod
    def from_output(cls, shape: tuple[int, ...], where: str, **options: Any) -> Task:
        if len(shape) < 3 or shape[1] < 2:
            raise UnsupportedLayerError(f"{where}: task segmentation needs [batch, classes >= 2, *spatial] logits, "
                                        f"got {list(shape)}")
        return cls(tuple(int(d) for d in shape[1:]))

    def describe(self, classes: int) -> str:
        return f"segmentation {self.shape}"

    def check_output(self, shape: Sequence[int | None] | None, classes: int, output: str, where: str) -> None:
        if shape and len(shape) == len(self.shape) + 1 and any(
                d is not None and d != t for d, t in zip(shape[1:], self.shape, strict=True)):
            raise InvalidArtifactError(
                f"{where}: graph output {output!r} has shape {list(shape[1:])}, the manifest's task says "
                f"{list(self.shape)}"
            )
        if shape and shape[1] is not None and shape[1] != classes:
            raise InvalidArtifactError(
                f"{where}: graph output {output!r} has {shape[1]} classes, the manifest says {classes}")

    def sampled(self, b: GraphBuilder, outputs: str, samples: int, classes: int) -> None:
        _segmentation(b, outputs, samples, self.shape)

    def analytic(self, b: GraphBuilder, m: str, v: str | None, samples: int, classes: int, points: Points) -> None:
        _segmentation_analytic(b, m, v, samples, self.shape, points)

    def output_infos(self, classes: int) -> list[onnx.ValueInfoProto]:
        return probs_entropy_mi(self.shape, self.shape[1:])

    def baseline_output(self, output: str) -> onnx.NodeProto:
        return helper.make_node("Softmax", [output], ["probs"], axis=1)

    def reduce(self, outputs: np.ndarray) -> AnyPredictive:
        """[S, N, C, *sp] member logits -> per-pixel probs, entropy, mutual_info."""
        logp = log_softmax(outputs.astype(np.float64), axis=2)  # [S, N, C, *sp]
        p = np.exp(logp)
        probs = p.mean(axis=0)
        entropy = -(probs * np.log(np.maximum(probs, EPS))).sum(1)
        mi = np.maximum(entropy - (-(p * logp).sum(2).mean(0)), 0.0)
        return Predictive(probs.astype(np.float32), entropy.astype(np.float32), mi.astype(np.float32))

    def members(self, outputs: np.ndarray) -> np.ndarray:
        """Each member's per-pixel class probabilities."""
        return np.exp(log_softmax(outputs.astype(np.float64), axis=2))

    def metrics(self, classes: int) -> SegmentationSums:
        return SegmentationSums(classes)

    def targets(self, classes: int) -> Targets:
        return ClassMasks(self.shape[1:])

    @classmethod
    def summary(cls, report: Mapping[str, Any]) -> str | None:
        return "IoU per class " + " ".join("-" if v is None else f"{v:.3f}" for v in report["iou"])


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0
