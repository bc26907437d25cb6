"""Objectives, budgets, the Pareto front and the choice of ``best``.

A trial result (:func:`edgebnn.search.trial.run_trial`) has ``metrics`` (``accuracy``, ``nll``, ``ece``,
``brier``; a regression model's ``nll``, ``rmse``, ``mae``, ``calibration_error``; a segmentation model's
``nll``, ``ece``, ``mean_iou``, ``pixel_accuracy``; and, with OOD data, ``auroc``), ``bytes`` (the exported ONNX
the trial would deploy, byte for byte the file ``edgebnn export`` writes: the figure ``compression_ratio``
divides), ``artifact_bytes`` (the same, the name of search/1), ``ir_bytes`` (the lowered IR's stored weights,
``lower``'s ``total_bytes``), ``deployed`` (the file's breakdown, :mod:`edgebnn.exporters.sizes`), ``latency_ms``
and ``energy_mj``.

A budget bounds metrics relative to the float BNN measured once per search: ``nll=+0.05,ece=+0.01`` keeps
trials whose NLL is at most 0.05 and ECE at most 0.01 above the float BNN's; ``accuracy=-0.01`` keeps those
at most 0.01 below it (a bound moves in each metric's bad direction). ``best`` is the smallest ``bytes``
within the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgebnn.budget import Budget
from edgebnn.errors import InvalidOptionError


@dataclass(frozen=True)
class Objective:
    """One figure a search optimizes.

    Attributes:
        name: As ``--objectives`` names it.
        path: Where it sits in a trial result (``("metrics", "nll")``).
        maximize: Higher is better.
        deterministic: The same config gives the same value on every run (latency and energy are timings).
    """

    name: str
    path: tuple[str, ...]
    maximize: bool = False
    deterministic: bool = True

    def value(self, result: Mapping[str, Any]) -> float | None:
        """The objective's value in a trial result (None: not measured)."""
        node: Any = result
        for key in self.path:
            node = node.get(key) if isinstance(node, Mapping) else None
        return None if node is None else float(node)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("bytes", ("bytes",)),
    Objective("artifact_bytes", ("artifact_bytes",)),
    Objective("ir_bytes", ("ir_bytes",)),
    Objective("latency", ("latency_ms",), deterministic=False),
    Objective("energy", ("energy_mj",), deterministic=False),
    Objective("accuracy", ("metrics", "accuracy"), maximize=True),
    Objective("nll", ("metrics", "nll")),
    Objective("ece", ("metrics", "ece")),
    Objective("brier", ("metrics", "brier")),
    Objective("auroc", ("metrics", "auroc"), maximize=True),
    # regression and segmentation models report these instead of accuracy/ECE/Brier (edgebnn.metrics)
    Objective("rmse", ("metrics", "rmse")),
    Objective("mae", ("metrics", "mae")),
    Objective("calibration_error", ("metrics", "calibration_error")),
    Objective("mean_iou", ("metrics", "mean_iou"), maximize=True),
    Objective("pixel_accuracy", ("metrics", "pixel_accuracy"), maximize=True),
)}
# the scalar metrics a trial keeps from its evaluation report (those its model's task reports)
TRIAL_METRICS = ("accuracy", "nll", "ece", "brier", "rmse", "mae", "calibration_error", "mean_iou", "pixel_accuracy")
DEFAULT_OBJECTIVES = ("bytes", "nll", "ece")


def parse_objectives(text: str | Sequence[str], *, ood: bool = False) -> tuple[Objective, ...]:
    """``bytes,latency,nll`` -> objectives.

    Raises:
        InvalidOptionError: An unknown or repeated name, none at all, or ``auroc`` without OOD data.
    """
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)]
    if not names or any(not n for n in names):
        raise InvalidOptionError(f"--objectives {text!r}: give comma-separated names from {', '.join(OBJECTIVES)}")
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        raise InvalidOptionError(f"--objectives: unknown objective {unknown[0]!r}; choose from {', '.join(OBJECTIVES)}")
    if len(set(names)) != len(names):
        raise InvalidOptionError(f"--objectives {text!r}: an objective is named twice")
    if "auroc" in names and not ood:
        raise InvalidOptionError("--objectives auroc: needs --ood-data")
    return tuple(OBJECTIVES[n] for n in names)


def for_task(task: str, objectives: tuple[Objective, ...], budget: Mapping[str, float], *, defaulted: bool,
             ood: bool = False) -> tuple[Objective, ...]:
    """The objectives of a model of ``task`` (its name): the default objectives become the task's defaults
    (:attr:`edgebnn.tasks.Task.default_objectives`); a metric the task does not report
    (:attr:`~edgebnn.tasks.Task.columns`) is refused.

    Raises:
        InvalidOptionError: An objective or budget metric that a ``task`` model does not report (one line).
    """
    from edgebnn.tasks import option_task  # here: the command line reads DEFAULT_OBJECTIVES without the tasks

    spec = option_task(task)
    if defaulted:
        objectives = parse_objectives(spec.default_objectives, ood=ood)
    reported = (*spec.columns, "auroc")
    for option, names in (("--objectives", [o.name for o in objectives if o.path[0] == "metrics"]),
                          ("--budget", list(budget))):
        wrong = [n for n in names if n not in reported]
        if wrong:
            raise InvalidOptionError(f"{option} {wrong[0]}: a {task} model reports {', '.join(reported)}")
    return objectives


def parse_budget(text: str | None, *, ood: bool = False) -> dict[str, float]:
    """``nll=+0.05,ece=+0.01`` -> ``{"nll": 0.05, "ece": 0.01}``: the allowed change of each metric vs the float
    BNN, parsed by :meth:`edgebnn.budget.Budget.parse` (the parser ``lower --budget`` uses); ``{}`` for no budget.

    Raises:
        InvalidOptionError: Malformed, an unknown metric, or ``auroc`` without OOD data.
    """
    if not text:
        return {}
    budget = Budget.parse(text)
    if budget.needs_ood and not ood:
        raise InvalidOptionError("--budget auroc: needs --ood-data")
    return budget.to_dict()


def budget_excess(result: Mapping[str, Any], baseline: Mapping[str, float], budget: Mapping[str, float]
                  ) -> dict[str, float]:
    """By how much each budgeted metric of a completed trial exceeds its bound (0: within)."""
    out = {}
    for key, delta in budget.items():
        value = OBJECTIVES[key].value(result)
        if value is None:
            out[key] = float("inf")
            continue
        change = value - baseline[key]
        out[key] = max(0.0, delta - change) if OBJECTIVES[key].maximize else max(0.0, change - delta)
    return out


def _change(result: Mapping[str, Any], baseline: Mapping[str, float], key: str) -> str:
    value = OBJECTIVES[key].value(result)
    return "not measured" if value is None else f"{value - baseline[key]:+.4f}"


def choose_best(trials: Sequence[Mapping[str, Any]], baseline: Mapping[str, float],
                budget: Mapping[str, float]) -> tuple[Mapping[str, Any] | None, str, Mapping[str, Any] | None]:
    """``(best, reason, closest)``: the smallest completed trial within the budget (ties: lowest number).

    With none within, ``best`` is None, ``reason`` says why and ``closest`` is the trial with the smallest
    worst excess relative to its bound (ties: smaller bytes), else None.
    """
    done = [t for t in trials if t.get("state") == "complete"]
    if not done:
        return None, "no trial completed", None
    within = [t for t in done if not any(budget_excess(t, baseline, budget).values())]
    if within:
        best = min(within, key=lambda t: (t["bytes"], t["number"]))
        where = "within the budget" if budget else "completed (no --budget: every trial counts)"
        return best, f"smallest bytes of {len(within)} trial(s) {where}", None

    def badness(t: Mapping[str, Any]) -> tuple[float, int, int]:
        excess = budget_excess(t, baseline, budget)
        return max(e / max(abs(budget[k]), 1e-12) for k, e in excess.items()), t["bytes"], t["number"]

    closest = min(done, key=badness)
    excess = budget_excess(closest, baseline, budget)
    over = ", ".join(f"{k} {_change(closest, baseline, k)} (allowed {budget[k]:+g})" for k in budget if excess[k] > 0)
    return None, (f"no trial of {len(done)} within the budget; closest: trial {closest['number']} "
                  f"({closest['config']['scheme']}, {closest['bytes']} bytes): {over}"), closest
