"""Regression: S members' means (and log-variances) -> the moments of the S-member Gaussian mixture, in the graph and
in numpy; Gaussian NLL, RMSE, MAE, interval coverage and calibration error (:mod:`edgebnn.metrics` docstring).

regression, [B·S, D] means μ_s (noise variance σ² stated, or 0) or [B·S, 2D] (μ_s, log σ²_s):
    mean = mean_s μ_s; aleatoric = mean_s σ²_s; epistemic = mean_s (μ_s − mean)²; variance = aleatoric + epistemic
    (each [B, D])

Analytic: no quadrature: mean = m_μ and epistemic = v_μ (the moments of the mean output), aleatoric = σ² for a
``mean`` head and, for a log-variance head whose log σ² ~ N(m_l, v_l), E[σ²] = exp(m_l + v_l / 2) (the log-normal
mean, taking the propagated Gaussian as exact).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgebnn.data import FloatTargets, Targets
from edgebnn.errors import InvalidArtifactError, InvalidOptionError, UnsupportedLayerError
from edgebnn.metrics import (
    CALIBRATION_LEVELS,
    COVERAGE_LEVELS,
    VARIANCE_FLOOR,
    AnyPredictive,
    RegressionPredictive,
)
from edgebnn.tasks.base import PREFIX as P
from edgebnn.tasks.base import GraphBuilder, Points, Task, register_task

HEADS = ("mean", "mean_logvar")  # the member output: [N, D] means, or [N, 2D] means then log-variances


def _aleatoric_const(b: GraphBuilder, like: str, task: Regression, p: str) -> str:
    """The stated noise variance (0 without one) broadcast to ``like``'s shape."""
    return b.add("Add", [b.add("Mul", [like, b.f32(p + "zero", 0.0)], p + "zeros"),
                         b.f32(p + "noise_var", float(task.noise_var or 0.0))], "aleatoric")


def _slice(b: GraphBuilder, x: str, start: int, end: int, axis: int, out: str) -> str:
    c = f"{P}slice/{out.removeprefix(P)}."
    return b.add("Slice", [x, b.i64(c + "start", start), b.i64(c + "end", end), b.i64(c + "axis", axis)], out)


def _regression(b: GraphBuilder, outputs: str, samples: int, task: Regression) -> None:
    """[B·S, D] means or [B·S, 2D] (means, log-variances) -> mean, variance, aleatoric, epistemic [B, D]."""
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


def _regression_analytic(b: GraphBuilder, m: str, v: str | None, task: Regression) -> None:
    """(m, v) of the output [B, W] -> mean = m_μ, epistemic = v_μ, aleatoric = σ² or exp(m_l + v_l / 2)."""
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


@register_task
@dataclass(frozen=True)
class Regression(Task):
    """Means (with a stated noise variance, or none) or means and log-variances -> the moments of the S-member
    Gaussian mixture (module docstring); float targets; Gaussian NLL, RMSE, MAE, coverage, calibration error.

    Attributes:
        head: ``mean`` ([N, D] means) or ``mean_logvar`` ([N, 2D]: means, then log-variances).
        dims: D.
        noise_var: ``mean`` head: the stated observation noise variance (None: none, aleatoric 0).
    """

    head: str
    dims: int
    noise_var: float | None = None

    name = "regression"
    outputs = ("mean", "variance", "aleatoric", "epistemic")
    columns = ("nll", "rmse", "mae", "calibration_error")
    default_objectives = ("bytes", "nll", "rmse")
    import_options = ("noise_var", "regression_head")
    joins_output_pair = True
    plot = "coverage"
    ood_scores = ("Gaussian entropy", "epistemic variance")
    ood_short = ("entropy", "epi. var")

    @classmethod
    def from_options(cls, options: Mapping[str, Any], where: str) -> Task:
        head, dims, noise = options.get("head"), options.get("dims"), options.get("noise_var")
        if head not in HEADS or not (isinstance(dims, int) and not isinstance(dims, bool) and dims > 0) or not (
                noise is None or (isinstance(noise, (int, float)) and not isinstance(noise, bool)
                                  and np.isfinite(noise) and noise >= 0)):
            raise InvalidArtifactError(f"{where}: regression task options {dict(options)!r} are not "
                                       "{head: mean|mean_logvar, dims: int > 0, noise_var: null or >= 0}")
        return cls(str(head), dims, None if noise is None else float(noise))

    def options(self) -> dict[str, Any]:
        return {"head": self.head, "dims": self.dims, "noise_var": self.noise_var}

    @classmethod
    def from_output(cls, shape: tuple[int, ...], where: str, *, pair: bool = False, noise_var: float | None = None,
                    regression_head: str | None = None, **options: Any) -> Task:
        """``pair``: ``forward`` returned (mean, log-variance), joined into ``shape``; ``regression_head``: ``mean``
        or ``mean_logvar`` (default: ``mean_logvar`` for a pair or an even width without ``noise_var``)."""
        if noise_var is not None and (not np.isfinite(noise_var) or noise_var < 0):
            raise InvalidOptionError(f"--noise-var {noise_var}: must be a finite variance >= 0")
        if len(shape) != 2:
            raise UnsupportedLayerError(f"{where}: task regression needs a [batch, outputs] output, got "
                                        f"{list(shape)}")
        width = shape[1]
        head = regression_head or ("mean_logvar" if pair or (noise_var is None and width % 2 == 0) else "mean")
        if head not in HEADS:
            raise InvalidOptionError(f"--regression-head {head}: choose {' or '.join(HEADS)}")
        if head == "mean_logvar" and (width % 2 or noise_var is not None):
            raise InvalidOptionError(
                f"{where}: a mean and log-variance head returns [batch, 2D] (got {list(shape)})"
                + (" and states no --noise-var (the log-variance is the noise)" if noise_var is not None else "")
            )
        return cls(head, width // 2 if head == "mean_logvar" else width, noise_var)

    def width(self) -> int:
        """The member output's width (D or 2D)."""
        return 2 * self.dims if self.head == "mean_logvar" else self.dims

    def describe(self, classes: int) -> str:
        return (f"regression of {self.dims} value(s), {self.head} head"
                + (f", noise variance {self.noise_var:g}" if self.noise_var is not None else ""))

    def check_output(self, shape: Sequence[int | None] | None, classes: int, output: str, where: str) -> None:
        if self.width() != classes:
            raise InvalidArtifactError(f"{where}: a {self.head} regression head of {self.dims} value(s) is "
                                       f"{self.width()} wide, the manifest says num_classes {classes}")
        super().check_output(shape, classes, output, where)

    def sampled(self, b: GraphBuilder, outputs: str, samples: int, classes: int) -> None:
        _regression(b, outputs, samples, self)

    def analytic(self, b: GraphBuilder, m: str, v: str | None, samples: int, classes: int, points: Points) -> None:
        _regression_analytic(b, m, v, self)

    def output_infos(self, classes: int) -> list[onnx.ValueInfoProto]:
        return [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", self.dims]) for name in self.outputs]

    def reduce(self, outputs: np.ndarray) -> AnyPredictive:
        """[S, N, W] member outputs -> mean, variance, aleatoric, epistemic [N, D] (the module docstring's
        moments)."""
        out = outputs.astype(np.float64)
        d = self.dims
        mu = out[..., :d]
        if self.head == "mean_logvar":
            aleatoric = np.exp(out[..., d:2 * d]).mean(0)
        else:
            aleatoric = np.full(mu.shape[1:], self.noise_var or 0.0)
        mean = mu.mean(0)
        epistemic = ((mu - mean) ** 2).mean(0)
        f = np.float32
        return RegressionPredictive(mean.astype(f), (aleatoric + epistemic).astype(f), aleatoric.astype(f),
                                    epistemic.astype(f))

    def predictive(self, arrays: Sequence[np.ndarray]) -> AnyPredictive:
        return RegressionPredictive(*arrays)

    def members(self, outputs: np.ndarray) -> np.ndarray:
        """Each member's means."""
        return outputs[..., : self.dims]

    def metrics(self, classes: int) -> RegressionSums:
        return RegressionSums()

    def targets(self, classes: int) -> Targets:
        return FloatTargets((self.dims,))

    @classmethod
    def summary(cls, report: Mapping[str, Any]) -> str | None:
        cover = " · ".join(f"{k}%: {v:.3f}" for k, v in report["coverage"].items())
        return (f"coverage {cover} · variance {report['variance']:.4g} = aleatoric {report['aleatoric']:.4g} + "
                f"epistemic {report['epistemic']:.4g}")
