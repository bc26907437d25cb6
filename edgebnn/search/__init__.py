"""``edgebnn search``: multi-objective search over scheme × bits × σ bits × S × export mode × weights × hoisting.

Each trial lowers, exports, evaluates (accuracy, NLL, ECE, Brier, OOD AUROC) and profiles (latency, energy)
one configuration through the public API; Optuna's seeded NSGA-II proposes the configurations
(:mod:`edgebnn.search.study`), a process pool or Ray runs them (:mod:`edgebnn.search.executors`), and the
report keeps every trial, the Pareto front and the smallest artifact within a budget relative to the float
BNN (:mod:`edgebnn.search.objectives`). optuna and ray are optional (``pip install 'edgebnn[search]'``) and
imported only when a search runs. See docs/search.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgebnn.search.executors import EXECUTORS, LocalExecutor, RayExecutor, make_executor
    from edgebnn.search.objectives import DEFAULT_OBJECTIVES, OBJECTIVES, parse_budget, parse_objectives
    from edgebnn.search.report import plot_front, print_search
    from edgebnn.search.run import SCHEMA, SearchSettings, export_best, run_search
    from edgebnn.search.space import SearchSpace, TrialConfig
    from edgebnn.search.trial import TrialJob, run_trial

__all__ = [
    "DEFAULT_OBJECTIVES",
    "EXECUTORS",
    "OBJECTIVES",
    "SCHEMA",
    "LocalExecutor",
    "RayExecutor",
    "SearchSettings",
    "SearchSpace",
    "TrialConfig",
    "TrialJob",
    "export_best",
    "make_executor",
    "parse_budget",
    "parse_objectives",
    "plot_front",
    "print_search",
    "run_search",
    "run_trial",
]


def __getattr__(name: str) -> Any:
    """The names above, imported on first use: ``edgebnn search --help`` reads the defaults in
    :mod:`.objectives` and :mod:`.study` without the trials' imports (onnx, onnxruntime, the passes)."""
    if name in ("EXECUTORS", "LocalExecutor", "RayExecutor", "make_executor"):
        from edgebnn.search import executors

        value = getattr(executors, name)
    elif name in ("DEFAULT_OBJECTIVES", "OBJECTIVES", "parse_budget", "parse_objectives"):
        from edgebnn.search import objectives

        value = getattr(objectives, name)
    elif name in ("plot_front", "print_search"):
        from edgebnn.search import report

        value = getattr(report, name)
    elif name in ("SCHEMA", "SearchSettings", "export_best", "run_search"):
        from edgebnn.search import run

        value = getattr(run, name)
    elif name in ("SearchSpace", "TrialConfig"):
        from edgebnn.search import space

        value = getattr(space, name)
    elif name in ("TrialJob", "run_trial"):
        from edgebnn.search import trial

        value = getattr(trial, name)
    else:
        raise AttributeError(f"module 'edgebnn.search' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
