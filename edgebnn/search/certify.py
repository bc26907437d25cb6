"""``search --budget``: the smallest artifact certified on rows no trial was measured on.

With a budget, the search data is split at random (seeded by the search seed; :data:`SELECT_FRACTION` select)
the way ``lower --budget`` splits it (:class:`edgebnn.budget.Rows`). Every trial is measured on the selection
rows, where NSGA-II chooses. Then, before a certification row is read, the candidates are fixed, largest deployed
file first: the completed trials within the budget on the selection rows and smaller than the fp32 BNN (all of them
when none is), and the candidates of ``lower --budget``'s own data-free chain
(:func:`edgebnn.budget.data_free_chain`, from the float BNN's weights alone, exported as ``edgebnn export`` does),
each at least :data:`~edgebnn.budget.PATH_STEP` smaller than the one before. So a search whose trials all break
the budget still finds what ``lower --budget`` finds.

**How confidence is kept: the fallback procedure** (Wiens 2003, a Bonferroni-based closed test). Candidate i
(in that order) is given the share ``w_i`` of δ = 1 - confidence (:func:`fallback_weights`: half to the first
candidate, the other half spread evenly over the rest) and is tested at level ``α_i = w_i δ``, plus ``α_{i-1}``
when the candidate before it was certified. A candidate is certified when every budgeted metric's one-sided bound
at ``1 - α_i`` lies within its allowance (:func:`edgebnn.budget.certify`, each trial's own export run as the
device runs it, against the float BNN's default export). Unlike a fixed sequence, a candidate that is not
certified does not end the test: the next ones are still tested, at their own shares. Whatever the dependence
between the tests, the probability that any candidate whose expected change breaks the budget is certified is at
most δ, so ``best``, the smallest certified candidate, keeps the budget on new data exchangeable with the search
data with probability at least the confidence (docs/uncertainty_budget.md). When every candidate is certified the
last is tested at the full δ, as a fixed sequence would.

Before any trial runs, the float BNN's own weights, exported the same way, are certified against themselves on a
second run of the device's noise at the first candidate's level: a budget finer than the certification rows
resolve is refused there, with the rows it would need (:func:`check_resolvable`), as ``lower --budget`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgebnn.budget import Budget, Candidate, Certificate, Evidence, Rows
    from edgebnn.ir import BNNModel

SELECT_FRACTION = 0.5
"""The share of the search data (at random) the trials are measured on; the rest certify."""
MAX_ROWS = 4000
"""At most this many rows of the search data (and of the OOD data) are read, the first ones."""
FIRST_SHARE = 0.5
"""The share of δ the first (largest) candidate is tested at; the rest is spread evenly over the others."""
_AGAIN = 7919  # the float BNN against itself: its export's random ops seeded this far from the others' (fresh noise)


def rows_spec(budget: Mapping[str, float], seed: int) -> tuple[float, int, int] | None:
    """What :attr:`edgebnn.search.trial.TrialJob.rows` is for a search: its selection rows when it has a budget."""
    return (SELECT_FRACTION, seed, MAX_ROWS) if budget else None


def fallback_weights(count: int) -> list[float]:
    """The fallback procedure's shares of δ for ``count`` candidates (module docstring); they sum to 1."""
    if count <= 1:
        return [1.0] * count
    rest = (1 - FIRST_SHARE) / (count - 1)
    return [FIRST_SHARE] + [rest] * (count - 1)


def candidates(trials: Sequence[Mapping[str, Any]], baseline: Mapping[str, float], budget: Budget,
               fp32_bytes: int | None = None) -> list[Mapping[str, Any]]:
    """The trials to certify, largest first (module docstring), from their selection figures only."""
    from edgebnn.budget import PATH_STEP
    from edgebnn.search.objectives import OBJECTIVES

    within = []
    for t in trials:
        if t.get("state") != "complete":
            continue
        values = {k: OBJECTIVES[k].value(t) for k in budget.limits}
        deltas = {k: float(v) - baseline[k] for k, v in values.items() if v is not None}
        if len(deltas) == len(values) and not budget.violations(deltas):
            within.append(t)
    smaller = [t for t in within if fp32_bytes and int(t["bytes"]) < fp32_bytes]
    within = smaller or within  # files larger than the fp32 BNN only when nothing smaller is within the budget
    within.sort(key=lambda t: (-int(t["bytes"]), int(t["number"])))  # largest first: the first ones are fallbacks
    order: list[Mapping[str, Any]] = []
    for t in within:
        if not order or int(t["bytes"]) <= (1 - PATH_STEP) * int(order[-1]["bytes"]):
            order.append(t)
    return order


@dataclass
class _Certification:
    """The float BNN, the certification rows and its evidence there: what every candidate is certified against."""

    model: BNNModel
    rows: Rows
    reference: Evidence
    budget: Budget
    samples: int
    seed: int

    @classmethod
    def open(cls, settings: Any, budget_limits: Mapping[str, float], samples: int) -> _Certification:
        from edgebnn.api import dataset_for, load_ir
        from edgebnn.budget import Budget, Rows, export_evidence
        from edgebnn.search.trial import data_split

        model = load_ir(settings.model)
        dataset = dataset_for(model, settings.data, split=data_split(settings.data))
        ood = None if settings.ood_data is None else dataset_for(model, settings.ood_data, labels=False,
                                                                 option="--ood-data")
        rows = Rows(dataset, ood, MAX_ROWS, SELECT_FRACTION, settings.seed)
        rows.check_range(model)
        reference, _ = export_evidence(model, rows.certify_x, rows.certify_ood, seed=settings.seed,
                                       fallback_samples=samples)
        budget = Budget(dict(budget_limits), confidence=settings.confidence)
        return cls(model, rows, reference, budget, samples, settings.seed)

    def at(self, alpha: float) -> Budget:
        """The budget tested at level ``alpha`` (its bounds at confidence 1 - ``alpha``)."""
        from edgebnn.budget import Budget

        return Budget(self.budget.limits, confidence=1 - alpha)

    def certify(self, evidence: Evidence, alpha: float) -> Certificate:
        from edgebnn.budget import certify

        return certify(self.at(alpha), self.reference, evidence, self.rows.certify_y, seed=self.seed)

    def floor(self, alpha: float) -> tuple[Certificate, str]:
        """The float BNN's own weights against themselves, on a second run of the device's noise."""
        from edgebnn.budget import export_evidence

        evidence, what = export_evidence(self.model, self.rows.certify_x, self.rows.certify_ood,
                                         seed=self.seed + _AGAIN, fallback_samples=self.samples)
        return self.certify(evidence, alpha), what["runtime"]


def check_resolvable(settings: Any, budget_limits: Mapping[str, float], samples: int) -> None:
    """Refuse, before any trial runs, a budget the certification rows cannot resolve (module docstring).

    Raises:
        BudgetNotMetError: One line: each metric's bound of the float BNN against itself and the rows it would need.
    """
    from edgebnn.budget import unresolvable

    cert = _Certification.open(settings, budget_limits, samples)
    alpha = (1 - cert.budget.confidence) * FIRST_SHARE
    floor, runtime = cert.floor(alpha)
    if not floor.kept:
        error = unresolvable(cert.at(alpha), cert.rows, floor, {"runtime": runtime})
        raise type(error)(f"{str(error).removesuffix('; nothing was written')}; no trial was run",
                          getattr(error, "closest", {}))


def certify_best(settings: Any, trials: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any],
                 budget_limits: Mapping[str, float]) -> dict[str, Any]:
    """Certify the candidates (module docstring) on the certification rows by the fallback procedure.

    Returns:
        ``best`` (the smallest candidate certified, a trial or a chain candidate (``source: chain``), or None),
        ``best_reason``, ``closest`` (None unless none is certified) and ``certification``: ``confidence``,
        ``procedure``, the rows, each candidate tested (``level``: the α it was tested at) with its bounds.
    """
    from edgebnn.budget import PATH_STEP, data_free_chain
    from edgebnn.passes import LowerConfig

    cert = _Certification.open(settings, budget_limits, baseline["samples"])
    budget, rows = cert.budget, cert.rows
    order = candidates(trials, baseline["metrics"], budget, int(baseline["bytes"]))
    chain = data_free_chain(cert.model, LowerConfig(seed=cert.seed), cert.samples, {})
    merged: list[Candidate | Mapping[str, Any]] = sorted([*order, *chain], key=lambda c: -_bytes(c))
    sequence: list[Candidate | Mapping[str, Any]] = []
    for c in merged:
        if not sequence or _bytes(c) <= (1 - PATH_STEP) * _bytes(sequence[-1]):
            sequence.append(c)
    delta = 1 - budget.confidence
    certification: dict[str, Any] = {
        "confidence": budget.confidence, "procedure": "fallback", **rows.describe(),
        "select_fraction": SELECT_FRACTION, "candidates": len(sequence), "trial_candidates": len(order),
        "chain_candidates": len(chain), "tested": [], "stopped": None}
    best: Mapping[str, Any] | None = None
    carried = 0.0
    for c, share in zip(sequence, fallback_weights(len(sequence)), strict=True):
        alpha = share * delta + carried
        result = cert.certify(_evidence(cert, c, settings.device), alpha)
        entry = _entry(c, cert.samples)
        certification["tested"].append({**entry, "level": alpha, **result.to_dict()})
        carried = alpha if result.kept else 0.0
        if result.kept:
            best = entry  # the sequence is largest first: the last one certified is the smallest
    floor, _ = cert.floor(FIRST_SHARE * delta)
    certification["floor"] = floor.to_dict()
    n, tested = len(rows.certify_idx), certification["tested"]
    if best is None:
        closest = min(tested, key=lambda t: cert.budget.excess({b["metric"]: b["bound"] for b in t["bounds"]}),
                      default=None)
        reason = (f"no candidate is certified at {budget.confidence:.0%} confidence on the {n} certification rows "
                  f"({len(tested)} tested: {len(order)} trial(s) within the budget on the {len(rows.select_idx)} "
                  f"selection rows and {len(chain)} of lower --budget's chain)")
        return {"best": None, "best_reason": reason, "closest": closest, "certification": certification}
    kept = sum(t["kept"] for t in tested)
    reason = (f"the smallest of {kept} of {len(tested)} candidates certified on the {n} certification rows "
              f"({len(order)} trial(s) within the budget on the {len(rows.select_idx)} selection rows, "
              f"{len(chain)} of lower --budget's chain; fallback procedure, budget kept with "
              f"{budget.confidence:.0%} confidence)")
    return {"best": best, "best_reason": reason, "closest": None, "certification": certification}


def _bytes(candidate: Candidate | Mapping[str, Any]) -> int:
    return int(candidate["bytes"]) if isinstance(candidate, Mapping) else candidate.file_bytes


def _entry(candidate: Candidate | Mapping[str, Any], samples: int) -> dict[str, Any]:
    """What the report says of a candidate: a trial as it is, a chain candidate as what ``export_best`` replays."""
    if isinstance(candidate, Mapping):
        return dict(candidate)
    report = candidate.model.lowering_report
    return {"number": None, "source": "chain", "label": candidate.label, "state": "complete",
            "lower_config": candidate.config.to_dict(), "samples": samples, "bytes": candidate.file_bytes,
            "ir_bytes": int(report["total_bytes"]), "config": None, "metrics": None}


def _evidence(cert: _Certification, candidate: Candidate | Mapping[str, Any], device: str) -> Evidence:
    """A candidate's evidence on the certification rows: a trial's own export, a chain candidate's default one."""
    from edgebnn.budget import export_evidence, session_evidence
    from edgebnn.runtime import Session
    from edgebnn.search.space import TrialConfig
    from edgebnn.search.trial import trial_export
    from edgebnn.targets.registry import get_target

    x, ood = cert.rows.certify_x, cert.rows.certify_ood
    if not isinstance(candidate, Mapping):
        return export_evidence(candidate.model, x, ood, seed=cert.seed, fallback_samples=cert.samples)[0]
    _, proto = trial_export(cert.model, TrialConfig.from_dict(candidate["config"]), cert.seed,
                            get_target(device).name)
    session = Session(proto.SerializeToString(deterministic=True), seed=cert.seed, threads=1)
    return session_evidence(session, x, ood)
