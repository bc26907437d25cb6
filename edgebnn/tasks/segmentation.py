"""The segmentation (per-pixel) head: the classification head over the class axis of every pixel.

segmentation, logits [B·S, C, *sp]: probs [B, C, *sp], entropy and mutual_info [B, *sp]

Analytic: the per-pixel Gaussian logits integrated at the same Q points at every pixel, then the sampled head.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from edgebnn.tasks.classification import mean_entropy_mi
from edgebnn.tasks.head import VAR_FLOOR, GraphBuilder, Head, P, Points
from edgebnn.tasks.spec import Task


def _segmentation(b: GraphBuilder, logits: str, samples: int, task: Task, classes: int) -> None:
    """logits [B·S, C, *sp] -> probs [B, C, *sp], entropy [B, *sp], mutual_info [B, *sp] (per pixel)."""
    assert task.shape is not None
    p = P + "head/"
    ax1, ax2 = b.i64(p + "axis1", 1), b.i64(p + "axis2", 2)
    x = b.add("Reshape", [logits, b.i64(p + "shape", -1, samples, *task.shape)], p + "logits_s")  # [B, S, C, *sp]
    mean_entropy_mi(b, p, x, 2, ax1, ax1, ax2)


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


HEAD = Head(_segmentation, _segmentation_analytic, _segmentation_outputs)
