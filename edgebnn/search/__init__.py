"""``edgebnn search``: multi-objective search over scheme × bits × σ bits × S × export mode × weights × hoisting.

Each trial lowers, exports, evaluates (accuracy, NLL, ECE, Brier, OOD AUROC) and profiles (latency, energy)
one configuration through the public API; Optuna's seeded NSGA-II proposes the configurations
(:mod:`edgebnn.search.study`), a process pool or Ray runs them (:mod:`edgebnn.search.executors`), and the
report keeps every trial, the Pareto front and the smallest artifact within a budget relative to the float
BNN (:mod:`edgebnn.search.objectives`). optuna and ray are optional (``pip install 'edgebnn[search]'``) and
imported only when a search runs. See docs/search.md.
"""

from __future__ import annotations

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
