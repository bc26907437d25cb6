"""The regression head: S members' means (and log-variances) -> the moments of the S-member Gaussian mixture.

regression, [B·S, D] means μ_s (noise variance σ² stated, or 0) or [B·S, 2D] (μ_s, log σ²_s):
    mean = mean_s μ_s; aleatoric = mean_s σ²_s; epistemic = mean_s (μ_s − mean)²; variance = aleatoric + epistemic
    (each [B, D])

Analytic: no quadrature: mean = m_μ and epistemic = v_μ (the moments of the mean output), aleatoric = σ² for a
``mean`` head and, for a log-variance head whose log σ² ~ N(m_l, v_l), E[σ²] = exp(m_l + v_l / 2) (the log-normal
mean, taking the propagated Gaussian as exact).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from edgebnn.tasks.head import GraphBuilder, Head, P, Points
from edgebnn.tasks.spec import Task


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


HEAD = Head(_regression, _regression_analytic, _regression_outputs)
