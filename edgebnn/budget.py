"""Uncertainty budgets: how much worse than the float BNN a lowered model may be, per metric.

::

    budget = Budget.parse("nll=+0.02,ece=+0.01,auroc=-0.01")
    budget.check(float_metrics, lowered_metrics)   # [] when kept, else one Violation per metric broken

A budget bounds ``lowered - float`` of each metric it names. ``nll``, ``ece`` and ``brier`` are lower-is-better:
``nll=+0.02`` allows NLL to rise by at most 0.02. ``accuracy`` (``acc``) and ``auroc`` (the mutual-information
AUROC against OOD data) are higher-is-better: ``auroc=-0.01`` allows it to fall by at most 0.01. A value without
a sign is an allowance in the metric's worse direction (``auroc=0.01`` is ``auroc=-0.01``); a sign against it
demands an improvement (``nll=-0.01``: the lowered model must be 0.01 better).

Metric dicts are the ones :func:`edgebnn.api.lowering_quality` reports, which follow the model's task
(:mod:`edgebnn.metrics`): ``accuracy``, ``nll``, ``ece``, ``brier`` (classification); ``nll``, ``rmse``, ``mae``,
``calibration_error`` (regression); ``nll``, ``ece``, ``mean_iou``, ``pixel_accuracy`` (segmentation); and
``ood.auroc_mutual_info`` when OOD data was given. A metric the task does not report is refused when measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgebnn.errors import EdgeBNNError, InvalidOptionError

LOWER_IS_BETTER = ("nll", "ece", "brier", "rmse", "mae", "calibration_error")
HIGHER_IS_BETTER = ("accuracy", "auroc", "mean_iou", "pixel_accuracy")
METRICS = (*LOWER_IS_BETTER, *HIGHER_IS_BETTER)
ALIASES = {"acc": "accuracy", "auroc_mi": "auroc", "mi_auroc": "auroc", "miou": "mean_iou", "iou": "mean_iou"}
LABELS = {"nll": "NLL", "ece": "ECE", "brier": "Brier", "accuracy": "accuracy", "auroc": "MI-AUROC",
          "rmse": "RMSE", "mae": "MAE", "calibration_error": "calibration error", "mean_iou": "mean IoU",
          "pixel_accuracy": "pixel accuracy"}
_SCALE_FLOOR = 1e-3  # a limit of 0 still has a scale to normalise deltas by


def metric_value(metrics: Mapping[str, Any], name: str) -> float | None:
    """Metric ``name`` of a report (``auroc``: ``ood.auroc_mutual_info``); None when the report lacks it."""
    if name == "auroc":
        ood = metrics.get("ood")
        value = ood.get("auroc_mutual_info") if isinstance(ood, Mapping) else metrics.get("auroc")
    else:
        value = metrics.get(name)
    return None if value is None else float(value)


def worse(name: str, delta: float) -> float:
    """``delta`` (lowered - float) signed so that positive is worse, whatever the metric's direction."""
    return delta if name in LOWER_IS_BETTER else -delta


@dataclass(frozen=True)
class Violation:
    """One metric over its budget: ``delta`` (lowered - float) against ``limit`` (both signed as given)."""

    metric: str
    delta: float
    limit: float

    def __str__(self) -> str:
        op = ">" if self.metric in LOWER_IS_BETTER else "<"
        return f"{self.metric} {self.delta:+.4f} {op} {self.limit:+.4f}"


@dataclass(frozen=True)
class Budget:
    """Allowed change of each named metric, lowered minus float BNN (see the module docstring).

    Attributes:
        limits: Metric name -> the signed bound of ``lowered - float`` (upper bound for lower-is-better
            metrics, lower bound for higher-is-better ones), in the order given.
    """

    limits: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in self.limits.items():
            if name not in METRICS:
                raise InvalidOptionError(f"budget metric {name!r}: known metrics are {', '.join(METRICS)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidOptionError(f"budget {name}={value!r}: must be a finite number")
        if not self.limits:
            raise InvalidOptionError("budget: name at least one metric, e.g. nll=+0.02")
        object.__setattr__(self, "limits", {k: float(v) for k, v in self.limits.items()})

    @classmethod
    def parse(cls, text: str, option: str = "--budget") -> Budget:
        """Parse ``"nll=+0.02,ece=+0.01,auroc=-0.01"``.

        Raises:
            InvalidOptionError: One line naming ``option`` and the bad part.
        """
        hint = "expected METRIC=CHANGE[,...], e.g. nll=+0.02,ece=+0.01,auroc=-0.01"
        if not isinstance(text, str) or not text.strip():
            raise InvalidOptionError(f"{option} {text!r}: {hint}")
        limits: dict[str, float] = {}
        for part in text.split(","):
            name, sep, value_text = (s.strip() for s in part.partition("="))
            name = ALIASES.get(name.lower(), name.lower())
            if not sep or not name or not value_text:
                raise InvalidOptionError(f"{option} {text}: {part.strip()!r}: {hint}")
            if name not in METRICS:
                raise InvalidOptionError(f"{option} {text}: unknown metric {name!r}; known: {', '.join(METRICS)}")
            if name in limits:
                raise InvalidOptionError(f"{option} {text}: {name} is given twice")
            try:
                value = float(value_text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise InvalidOptionError(f"{option} {text}: {name}={value_text!r} is not a finite number")
            if value_text[0] not in "+-" and name in HIGHER_IS_BETTER:
                value = -value  # unsigned: an allowance in the worse direction
            limits[name] = value
        return cls(limits)

    @property
    def needs_ood(self) -> bool:
        """Whether the budget names a metric that needs OOD data (``auroc``)."""
        return "auroc" in self.limits

    def __str__(self) -> str:
        return ",".join(f"{k}={v:+g}" for k, v in self.limits.items())

    def to_dict(self) -> dict[str, float]:
        return dict(self.limits)

    def deltas(self, float_metrics: Mapping[str, Any], lowered_metrics: Mapping[str, Any]) -> dict[str, float]:
        """``lowered - float`` of each budgeted metric.

        Raises:
            InvalidOptionError: A report lacks a budgeted metric (``auroc`` without OOD data).
        """
        out = {}
        for name in self.limits:
            before, after = metric_value(float_metrics, name), metric_value(lowered_metrics, name)
            if before is None or after is None:
                raise InvalidOptionError(f"budget {name}: not measured (auroc needs OOD data: --ood-data)"
                                         if name == "auroc" else f"budget {name}: this model's task does not "
                                         f"report it (reported: {', '.join(k for k in METRICS if k in float_metrics)})")
            out[name] = after - before
        return out

    def check(self, float_metrics: Mapping[str, Any], lowered_metrics: Mapping[str, Any]) -> list[Violation]:
        """The metrics whose change breaks the budget (empty: the budget is kept)."""
        return self.violations(self.deltas(float_metrics, lowered_metrics))

    def violations(self, deltas: Mapping[str, float]) -> list[Violation]:
        """The metrics whose change (``lowered - float``, as :meth:`deltas` gives) breaks the budget."""
        return [Violation(k, deltas[k], v) for k, v in self.limits.items() if worse(k, deltas[k]) > worse(k, v)]

    def usage(self, deltas: Mapping[str, float]) -> float:
        """How much of the budget ``deltas`` use: Σ worse-signed delta / |limit| (negative: better than float)."""
        return sum(worse(k, deltas[k]) / max(abs(v), _SCALE_FLOOR) for k, v in self.limits.items())

    def costliest(self, change: Mapping[str, float]) -> str:
        """The metric whose ``change`` uses the most of its budget (in units of its |limit|)."""
        return max(self.limits, key=lambda k: worse(k, change[k]) / max(abs(self.limits[k]), _SCALE_FLOOR))

    def excess(self, deltas: Mapping[str, float]) -> float:
        """How far ``deltas`` are outside the budget, each metric in units of its |limit| (0: kept)."""
        return sum(max(0.0, worse(k, deltas[k]) - worse(k, v)) / max(abs(v), _SCALE_FLOOR)
                   for k, v in self.limits.items())


class BudgetNotMetError(EdgeBNNError):
    """No configuration keeps the budget; ``closest`` is the report of the one that came nearest."""

    def __init__(self, message: str, closest: dict[str, Any]) -> None:
        super().__init__(message)
        self.closest = closest
