"""The uncertainty budget: how much worse than the float BNN a lowered model may be, per metric, and the
lowering (or search trial) that keeps it on new data with a stated confidence.

::

    budget = Budget({"nll": 0.02, "ece": 0.01}, confidence=0.9)   # or Budget.parse("nll=+0.02,ece=+0.01")
    lowered = lower_within_budget(float_ir, LowerConfig(), budget, data="val.npz")   # edgebnn lower --budget

The parts, each public here (``edgebnn search --budget`` certifies its trials through the same ones):

* the budget and its statistics (:class:`Budget`, :class:`Bound`, :class:`Certificate`, :func:`mean_bound`,
  :func:`bootstrap_bound`, :func:`rows_to_resolve`): which one-sided limit bounds each metric's change;
* the evidence (:class:`Evidence`, :func:`export_evidence`, :func:`session_evidence`, :func:`certify`): each
  predictor's per-input predictive on the certification rows, as the device runs it, and the certificate
  (:func:`check_in_range` refuses rows an export refuses);
* the rows (:class:`Rows`): the validation rows in memory, split at random into selection and certification rows;
* the candidates: the data-free chain (:func:`data_free_chain`) and the greedy per-layer walk (``order="split"``),
  tested in a fixed sequence by :func:`lower_within_budget`; :func:`unresolvable` is the error when even the float
  BNN's own weights are not certified (a budget finer than the rows resolve, with the rows it would need);
* the fastest export within a budget (:func:`fastest_within_budget`, ``lower --minimize latency``): which layers
  sample (:func:`deterministic_prefix`), the mode and S, each candidate timed on the device, certified the same way.

docs/uncertainty_budget.md states the guarantee.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgebnn.budget._bounds import (
    ALIASES,
    BOUNDED_METRICS,
    DEFAULT_CONFIDENCE,
    HIGHER_IS_BETTER,
    LABELS,
    LOWER_IS_BETTER,
    MEAN_METRICS,
    METRICS,
    MINIMIZE,
    Bound,
    Budget,
    BudgetNotMetError,
    Certificate,
    Violation,
    agreeing_bound,
    bootstrap_bound,
    check_confidence,
    mean_bound,
    metric_value,
    rows_to_resolve,
    worse,
)

if TYPE_CHECKING:
    from edgebnn.budget._certify import (
        DRAWS,
        Evidence,
        certify,
        check_in_range,
        export_evidence,
        reference_evidence,
        session_evidence,
    )
    from edgebnn.budget._greedy import (
        BUDGET_START,
        PATH_STEP,
        default_export,
        deployed_size,
        lower_config,
        start_config,
    )
    from edgebnn.budget._latency import (
        LatencySpace,
        deterministic_prefix,
        device_evidence,
        epistemic_budget,
        fastest_within_budget,
    )
    from edgebnn.budget._lower import (
        BUDGET_ROWS,
        ORDERS,
        BudgetOptions,
        Candidate,
        Rows,
        budget_sizes,
        check_budget,
        data_free_chain,
        lower_within_budget,
        unresolvable,
    )

__all__ = [
    "ALIASES", "BOUNDED_METRICS", "BUDGET_ROWS", "BUDGET_START", "DEFAULT_CONFIDENCE", "DRAWS", "HIGHER_IS_BETTER",
    "LABELS", "LOWER_IS_BETTER", "MEAN_METRICS", "METRICS", "ORDERS", "PATH_STEP", "Bound", "Budget",
    "BudgetNotMetError", "BudgetOptions", "Candidate", "Certificate", "Evidence", "Rows", "Violation",
    "agreeing_bound", "bootstrap_bound", "budget_sizes", "certify", "check_budget", "check_confidence",
    "check_in_range",
    "data_free_chain", "default_export", "deployed_size", "export_evidence", "lower_config", "lower_within_budget",
    "mean_bound", "metric_value", "reference_evidence", "rows_to_resolve", "session_evidence", "start_config",
    "unresolvable", "worse",
]
__all__ += ["MINIMIZE", "LatencySpace", "deterministic_prefix", "device_evidence", "epistemic_budget",  # --minimize
            "fastest_within_budget"]


def __getattr__(name: str) -> Any:
    """The names of the certification, the greedy walk, the latency search and the lowering within a budget,
    imported on first use: the command line's options read :mod:`._bounds` (light) without numpy or the passes."""
    if name in ("DRAWS", "Evidence", "certify", "check_in_range", "export_evidence", "reference_evidence",
                "session_evidence"):
        from edgebnn.budget import _certify as module
    elif name in ("BUDGET_START", "PATH_STEP", "default_export", "deployed_size", "lower_config", "start_config"):
        from edgebnn.budget import _greedy as module  # type: ignore[no-redef]
    elif name in ("LatencySpace", "deterministic_prefix", "device_evidence", "epistemic_budget",
                  "fastest_within_budget"):
        from edgebnn.budget import _latency as module  # type: ignore[no-redef]
    elif name in ("BUDGET_ROWS", "ORDERS", "BudgetOptions", "Candidate", "Rows", "budget_sizes", "check_budget",
                  "data_free_chain", "lower_within_budget", "unresolvable"):
        from edgebnn.budget import _lower as module  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module 'edgebnn.budget' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
