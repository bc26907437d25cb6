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
A task may declare metrics of its own report that a budget can bound (:attr:`edgebnn.tasks.Task.budget_metrics`,
each ``"min"`` or ``"max"``: a plug-in's ``exact_match``, higher-is-better); they are bounded by the bootstrap.

**Bounds** (docs/uncertainty_budget.md). A budget is *kept with confidence* 1 - δ when, for every metric, a one-sided
confidence limit of the population change (lowered minus float, on data exchangeable with the rows measured) lies
within its limit. Each metric has its own bound on the paired per-input evidence:

* averages over inputs (:data:`MEAN_METRICS`: NLL, Brier, accuracy, MAE, pixel accuracy): the more cautious of the
  Student-t and the studentized-bootstrap (bootstrap-t) limits of the mean paired difference (:func:`mean_bound`);
  accuracy-like metrics, whose per-input change is -1, 0 or +1,
  first get Agresti and Min's pseudo-inputs (half an input lost, half gained, one unchanged), so that a lowering
  agreeing with the float BNN on all n inputs is bounded at t/(n + 1.5), not at 0;
* the others (ECE, AUROC, RMSE, calibration error, mean IoU): the percentile bootstrap of the paired difference,
  inputs resampled with their float and lowered evidence together, in- and out-of-distribution inputs resampled
  apart for AUROC (:func:`bootstrap_bound`, :func:`scipy.stats.bootstrap`).

A candidate is kept when every metric's limit is within budget: an intersection-union test, so the metrics need
no correction among themselves. Candidates are tested along an order fixed before the certification rows are
read (fixed-sequence testing), so their number needs none either.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgebnn.errors import EdgeBNNError, InvalidOptionError

if TYPE_CHECKING:  # numpy is imported by the bounds that use it, as scipy: the command line reads the
    import numpy as np  # budget's names for --help without either

LOWER_IS_BETTER = ("nll", "ece", "brier", "rmse", "mae", "calibration_error")
HIGHER_IS_BETTER = ("accuracy", "auroc", "mean_iou", "pixel_accuracy")
METRICS = (*LOWER_IS_BETTER, *HIGHER_IS_BETTER)
ALIASES = {"acc": "accuracy", "auroc_mi": "auroc", "mi_auroc": "auroc", "miou": "mean_iou", "iou": "mean_iou"}
LABELS = {"nll": "NLL", "ece": "ECE", "brier": "Brier", "accuracy": "accuracy", "auroc": "MI-AUROC",
          "rmse": "RMSE", "mae": "MAE", "calibration_error": "calibration error", "mean_iou": "mean IoU",
          "pixel_accuracy": "pixel accuracy"}
_SCALE_FLOOR = 1e-3  # a limit of 0 still has a scale to normalise deltas by
MINIMIZE = ("size", "latency")
"""What ``lower --budget`` may minimize: the deployed file, or the export's latency on the device
(:func:`edgebnn.budget.fastest_within_budget`)."""
DEFAULT_CONFIDENCE = 0.9
"""``--confidence``: the probability that the chosen lowering keeps the budget on new data (1 - δ)."""
MEAN_METRICS = ("nll", "brier", "accuracy", "mae", "pixel_accuracy")
"""Metrics that are an average of one number per input (per image for the pixel ones: every image has the same
pixel count): bounded with Student's t on the paired per-input differences."""
BOUNDED_METRICS = ("accuracy", "pixel_accuracy")
"""Mean metrics whose per-input change lies in [-1, 1]: Agresti-Min pseudo-inputs before the t limit."""
BOOTSTRAP_RESAMPLES = 2000
"""Resamples of a bootstrap bound (its Monte Carlo error on a 90% limit: about 0.7% of the interval's width)."""


def metric_value(metrics: Mapping[str, Any], name: str) -> float | None:
    """Metric ``name`` of a report (``auroc``: ``ood.auroc_mutual_info``); None when the report lacks it."""
    if name == "auroc":
        ood = metrics.get("ood")
        value = ood.get("auroc_mutual_info") if isinstance(ood, Mapping) else metrics.get("auroc")
    else:
        value = metrics.get(name)
    return None if value is None else float(value)


def task_metric_goal(name: str) -> str | None:
    """``"min"`` or ``"max"``: the goal a registered task declares for its own metric ``name``
    (:attr:`edgebnn.tasks.Task.budget_metrics`: a plug-in's ``exact_match``, say), the plug-ins loaded first; None
    when no task declares it."""
    from edgebnn.tasks import TASKS

    return next((t.budget_metrics[name] for t in TASKS.listing() if name in t.budget_metrics), None)


def known_metric(name: str) -> bool:
    """Whether a budget may bound ``name``: a built-in metric (:data:`METRICS`) or a registered task's own."""
    return name in METRICS or task_metric_goal(name) is not None


def known_metrics() -> tuple[str, ...]:
    """Every metric a budget may bound: :data:`METRICS`, then the registered tasks' own."""
    from edgebnn.tasks import TASKS

    own = [m for t in TASKS.listing() for m in t.budget_metrics if m not in METRICS]
    return (*METRICS, *dict.fromkeys(own))


def lower_is_better(name: str) -> bool:
    """Whether a lower ``name`` is better (:data:`LOWER_IS_BETTER`, or a task's own metric declared ``"min"``)."""
    if name in LOWER_IS_BETTER or name in HIGHER_IS_BETTER:
        return name in LOWER_IS_BETTER
    return task_metric_goal(name) == "min"


def worse(name: str, delta: float) -> float:
    """``delta`` (lowered - float) signed so that positive is worse, whatever the metric's direction."""
    return delta if lower_is_better(name) else -delta


@dataclass(frozen=True)
class Violation:
    """One metric over its budget: ``delta`` (lowered - float) against ``limit`` (both signed as given)."""

    metric: str
    delta: float
    limit: float

    def __str__(self) -> str:
        op = ">" if lower_is_better(self.metric) else "<"
        return f"{self.metric} {self.delta:+.4f} {op} {self.limit:+.4f}"


@dataclass(frozen=True)
class Budget:
    """Allowed change of each named metric, lowered minus float BNN (see the module docstring).

    Attributes:
        limits: Metric name -> the signed bound of ``lowered - float`` (upper bound for lower-is-better
            metrics, lower bound for higher-is-better ones), in the order given.
        confidence: 1 - δ: the probability with which a chosen lowering must keep the budget on new data
            (``--confidence``; :func:`check_confidence`).
    """

    limits: Mapping[str, float] = field(default_factory=dict)
    confidence: float = DEFAULT_CONFIDENCE

    def __post_init__(self) -> None:
        check_confidence(self.confidence)
        for name, value in self.limits.items():
            if not known_metric(name):
                raise InvalidOptionError(f"budget metric {name!r}: known metrics are {', '.join(known_metrics())}")
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
            if not known_metric(name):
                raise InvalidOptionError(f"{option} {text}: unknown metric {name!r}; known: "
                                         f"{', '.join(known_metrics())}")
            if name in limits:
                raise InvalidOptionError(f"{option} {text}: {name} is given twice")
            try:
                value = float(value_text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise InvalidOptionError(f"{option} {text}: {name}={value_text!r} is not a finite number")
            if value_text[0] not in "+-" and not lower_is_better(name):
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
                reported = ", ".join(k for k in known_metrics() if k in float_metrics)
                raise InvalidOptionError(f"budget {name}: not measured (auroc needs OOD data: --ood-data)"
                                         if name == "auroc" else f"budget {name}: this model's task does not "
                                         f"report it (reported: {reported})")
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


def check_confidence(confidence: float, option: str = "--confidence") -> float:
    """``confidence`` when it is a probability in [0.5, 1) (one line naming ``option`` otherwise)."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 <= confidence < 1:
        raise InvalidOptionError(f"{option} {confidence!r}: give the probability that the budget holds on new data, "
                                 "at least 0.5 and below 1 (e.g. 0.9)")
    return float(confidence)


@dataclass(frozen=True)
class Bound:
    """One metric's change, lowered minus float, with its one-sided confidence limit.

    Attributes:
        metric: The budgeted metric.
        delta: The change measured on the certification rows.
        bound: The limit on the worse side (an upper limit for lower-is-better metrics, a lower one for the others)
            that the population change passes with probability at most 1 - ``confidence``.
        limit: The budget's allowance (signed as given).
        method: ``t | bootstrap-t``, ``t | bootstrap-t, Agresti-Min`` or ``bootstrap`` (the module docstring).
        rows: Inputs measured (``ood_rows``: out-of-distribution inputs, AUROC only).
    """

    metric: str
    delta: float
    bound: float
    limit: float
    method: str
    rows: int
    ood_rows: int | None = None

    @property
    def kept(self) -> bool:
        """The limit lies within the budget (the metric's part of the certificate)."""
        return worse(self.metric, self.bound) <= worse(self.metric, self.limit)

    def __str__(self) -> str:
        op = "<=" if self.kept else ">"
        if not lower_is_better(self.metric):
            op = ">=" if self.kept else "<"
        return f"{self.metric} {self.delta:+.4f}, bound {self.bound:+.4f} {op} {self.limit:+.4f}"

    def to_dict(self) -> dict[str, Any]:
        out = {"metric": self.metric, "delta": self.delta, "bound": self.bound, "limit": self.limit,
               "kept": self.kept, "method": self.method, "rows": self.rows}
        if self.ood_rows is not None:
            out["ood_rows"] = self.ood_rows
        return out


def _t_limit(values: np.ndarray, pseudo: tuple[np.ndarray, np.ndarray] | None, confidence: float) -> float:
    """Student's upper ``confidence`` limit of the mean of ``values`` (with weighted ``pseudo`` values added)."""
    import numpy as np
    from scipy import stats

    pv, pw = pseudo if pseudo is not None else (np.zeros(0), np.zeros(0))
    x, w = np.concatenate([values, pv]), np.concatenate([np.ones(len(values)), pw])
    total = float(w.sum())
    if total <= 1:
        return math.inf
    mean = float(np.dot(w, x) / total)
    var = float(np.dot(w, (x - mean) ** 2) / (total - 1))
    return mean + float(stats.t.ppf(confidence, total - 1)) * math.sqrt(var / total)


def _studentized_limit(values: np.ndarray, pseudo: tuple[np.ndarray, np.ndarray] | None, confidence: float,
                       seed: int, resamples: int) -> float:
    """Upper ``confidence`` limit of the mean of ``values`` by the studentized (bootstrap-t) bootstrap: the
    (1 - confidence) quantile of t* = (mean* - mean) / se* over resamples replaces Student's t, which corrects the
    limit for a skewed population (a few inputs whose loss rises a lot) to second order, where Student's t is only
    first-order right (Hall 1988, "Theoretical comparison of bootstrap confidence intervals"). ``pseudo``:
    (values, weights) added to the sample and to every resample (the Agresti-Min pseudo-inputs)."""
    import numpy as np

    pv, pw = pseudo if pseudo is not None else (np.zeros(0), np.zeros(0))
    n = len(values)
    total = n + float(pw.sum())

    def mean_se(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean = (x.sum(-1) + float(np.dot(pw, pv))) / total
        dev = ((x - mean[..., None]) ** 2).sum(-1) + (pw * (pv - mean[..., None]) ** 2).sum(-1)
        return mean, np.sqrt(dev / max(total - 1, 1) / total)

    mean, se = (float(v[0]) for v in mean_se(values[None, :]))
    if se == 0 or n < 2:
        return mean
    rng = np.random.default_rng(seed)
    stats = []
    for start in range(0, resamples, max(1, 2_000_000 // n)):
        count = min(resamples - start, max(1, 2_000_000 // n))
        m, e = mean_se(values[rng.integers(0, n, (count, n))])
        stats.append(np.where(e > 0, (m - mean) / np.where(e > 0, e, 1.0), 0.0))
    return mean - float(np.quantile(np.concatenate(stats), 1 - confidence)) * se


def mean_bound(metric: str, diffs: np.ndarray, limit: float, confidence: float, *, seed: int = 0,
               resamples: int = BOOTSTRAP_RESAMPLES) -> Bound:
    """The one-sided limit of the mean of the paired per-input changes ``diffs`` (lowered - float): the more
    cautious of Student's t (:func:`_t_limit`) and the studentized bootstrap (:func:`_studentized_limit`, which
    widens the limit where a few inputs lose a lot: NLL and Brier changes are skewed that way).

    For :data:`BOUNDED_METRICS` the changes get Agresti and Min's pseudo-inputs first (half an input at the
    worst change, half at the best, one unchanged; Agresti & Min 2005, "Simple improved confidence intervals for
    comparing matched proportions"): the limit is then never degenerate; a lowering that agrees with the float
    BNN on every one of n inputs is bounded near z / (n + 1.5), not at 0 (:func:`agreeing_bound`).
    """
    import numpy as np

    diffs = np.asarray(diffs, np.float64)
    lower = lower_is_better(metric)
    worse_side = diffs if lower else -diffs
    pseudo = (np.array([1.0, -1.0, 0.0]), np.array([0.5, 0.5, 1.0])) if metric in BOUNDED_METRICS else None
    upper = math.inf
    if len(diffs):
        upper = max(_t_limit(worse_side, pseudo, confidence),
                    _studentized_limit(worse_side, pseudo, confidence, seed, resamples))
    bound = upper if lower else -upper
    method = "t | bootstrap-t, Agresti-Min" if metric in BOUNDED_METRICS else "t | bootstrap-t"
    return Bound(metric, float(diffs.mean()) if len(diffs) else math.nan, bound, limit, method, len(diffs))


Statistic = Callable[..., "np.ndarray"]
"""``statistic(*indices, axis=-1)``: the change (lowered - float) of a metric on the inputs ``indices`` (one index
array per group, resamples along the leading axes), vectorized as :func:`scipy.stats.bootstrap` calls it."""


def bootstrap_bound(metric: str, statistic: Statistic, sizes: Sequence[int], limit: float, confidence: float, *,
                    seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES) -> Bound:
    """The one-sided percentile-bootstrap limit of a metric's paired change.

    ``statistic`` computes lowered minus float on the inputs it is given; each group (``sizes``: the
    in-distribution inputs, and the OOD inputs for AUROC) is resampled with replacement apart from the others,
    an input's float and lowered evidence together (the pairing). Seeded: the same evidence gives the same bound.
    """
    import numpy as np
    from scipy import stats

    lower = lower_is_better(metric)
    groups = tuple(np.arange(n) for n in sizes)
    observed = float(np.asarray(statistic(*groups, axis=-1)))
    if min(sizes, default=0) < 2:
        return Bound(metric, observed, math.inf if lower else -math.inf, limit, "bootstrap",
                     sizes[0] if sizes else 0, sizes[1] if len(sizes) > 1 else None)
    res = stats.bootstrap(groups, statistic, n_resamples=resamples, vectorized=True, paired=False,
                          confidence_level=confidence, method="percentile",
                          alternative="less" if lower else "greater",
                          rng=np.random.default_rng(seed), batch=max(1, 4_000_000 // max(sum(sizes), 1)))
    interval = res.confidence_interval
    bound = float(interval.high if lower else interval.low)
    if not math.isfinite(bound):  # every resample gave the same change (identical evidence)
        bound = observed
    return Bound(metric, observed, bound, limit, "bootstrap", sizes[0], sizes[1] if len(sizes) > 1 else None)


def agreeing_bound(metric: str, rows: int, confidence: float) -> float | None:
    """The limit :func:`mean_bound` gives a lowering whose every per-input change on ``rows`` inputs is 0, in the
    metric's worse direction (None for a metric whose bound can reach 0: any budget >= 0 is resolvable there)."""
    if metric not in BOUNDED_METRICS:
        return None
    import numpy as np

    return abs(mean_bound(metric, np.zeros(rows), 0.0, confidence).bound)


def rows_to_resolve(metric: str, limit: float, floor: Bound, confidence: float) -> int | None:
    """About how many inputs ``limit`` needs when ``floor``, the bound of the float BNN's own weights against
    themselves (another draw of the device's noise: a population change of 0), is outside it. The bound of a change
    of 0 (its measured value is noise too) shrinks as 1/sqrt(n); accuracy's pseudo-inputs alone need t / |limit|
    inputs. None when no number of inputs can: a limit that asks the lowering to improve on the float BNN (or to
    match it exactly)."""
    from scipy import stats

    allowance = worse(metric, limit)
    if allowance <= 0:
        return None
    n = floor.rows
    need = math.ceil(n * (max(worse(metric, floor.bound), 0.0) / allowance) ** 2)
    if metric in BOUNDED_METRICS:  # a lowering agreeing everywhere: about t / n <= allowance
        need = max(need, math.ceil(float(stats.t.ppf(confidence, max(n, 2))) / allowance))
    return max(need, n + 1)


@dataclass(frozen=True)
class Certificate:
    """A candidate's bounds on the certification rows: it keeps the budget when every metric's bound does."""

    bounds: tuple[Bound, ...]
    confidence: float

    @property
    def kept(self) -> bool:
        return all(b.kept for b in self.bounds)

    @property
    def broken(self) -> list[Bound]:
        return [b for b in self.bounds if not b.kept]

    @property
    def deltas(self) -> dict[str, float]:
        return {b.metric: b.delta for b in self.bounds}

    def excess(self, budget: Budget) -> float:
        """How far the bounds are outside the budget, each metric in units of its |limit| (0: kept)."""
        return budget.excess({b.metric: b.bound for b in self.bounds})

    def __str__(self) -> str:
        return "; ".join(map(str, self.bounds))

    def to_dict(self) -> dict[str, Any]:
        return {"confidence": self.confidence, "kept": self.kept, "bounds": [b.to_dict() for b in self.bounds]}


class BudgetNotMetError(EdgeBNNError):
    """No configuration keeps the budget; ``closest`` is the report of the one that came nearest."""

    def __init__(self, message: str, closest: dict[str, Any]) -> None:
        super().__init__(message)
        self.closest = closest
