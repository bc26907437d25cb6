"""``search --budget``: the best trial, certified on rows no trial was measured on.

With a budget, the search data is split at random (seeded by the search seed; :data:`SELECT_FRACTION` select)
the way ``lower --budget`` splits it (:class:`edgebnn.budget.Rows`). Every trial is measured on the selection
rows, where NSGA-II chooses. Then, from the selection figures alone, the candidates are fixed: the completed
trials within the budget there and smaller than the fp32 BNN (all of them when none is), largest first (the first
ones are the fallbacks of the smaller), each at least :data:`~edgebnn.budget.PATH_STEP` smaller than the one
before. On the certification rows they are tested in that order, each trial's own export run as the device runs it
against the float BNN's default export (:func:`edgebnn.budget.certify`: one-sided bounds per metric at the
budget's confidence), stopping at the first one not certified: fixed-sequence testing, so the number of trials
costs no confidence. ``best`` is the last one certified: with probability at least the confidence it keeps the
budget on new data exchangeable with the search data (docs/uncertainty_budget.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgebnn.budget import Budget, Certificate

SELECT_FRACTION = 0.5
"""The share of the search data (at random) the trials are measured on; the rest certify."""
MAX_ROWS = 4000
"""At most this many rows of the search data (and of the OOD data) are read, the first ones."""


def rows_spec(budget: Mapping[str, float], seed: int) -> tuple[float, int, int] | None:
    """What :attr:`edgebnn.search.trial.TrialJob.rows` is for a search: its selection rows when it has a budget."""
    return (SELECT_FRACTION, seed, MAX_ROWS) if budget else None


def candidates(trials: Sequence[Mapping[str, Any]], baseline: Mapping[str, float], budget: Budget,
               fp32_bytes: int | None = None) -> list[Mapping[str, Any]]:
    """The trials to certify, in order (module docstring), from their selection figures only."""
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


def certify_best(settings: Any, trials: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any],
                 budget_limits: Mapping[str, float]) -> dict[str, Any]:
    """Certify the candidates (:func:`candidates`) on the certification rows, in order.

    Returns:
        ``best`` (the last trial certified, or None), ``best_reason``, ``closest`` (None unless no trial is
        certified) and ``certification``: ``confidence``, the rows, each candidate tested with its bounds, and why
        the test stopped.
    """
    from edgebnn.api import dataset_for, load_ir
    from edgebnn.budget import Budget, BudgetNotMetError, Rows, certify, export_evidence, session_evidence, unresolvable
    from edgebnn.runtime import Session
    from edgebnn.search.objectives import choose_best
    from edgebnn.search.trial import data_split, trial_export
    from edgebnn.targets.registry import get_target

    budget = Budget(dict(budget_limits), confidence=settings.confidence)
    model = load_ir(settings.model)
    dataset = dataset_for(model, settings.data, split=data_split(settings.data))
    ood = None if settings.ood_data is None else dataset_for(model, settings.ood_data, labels=False,
                                                             option="--ood-data")
    rows = Rows(dataset, ood, MAX_ROWS, SELECT_FRACTION, settings.seed)
    seed = settings.seed
    reference, _ = export_evidence(model, rows.certify_x, rows.certify_ood, seed=seed,
                                   fallback_samples=baseline["samples"])

    def of(evidence_model: Any, again: bool = False) -> tuple[Certificate, str]:
        ev, what = export_evidence(evidence_model, rows.certify_x, rows.certify_ood, seed=seed + (7919 if again else 0),
                                   fallback_samples=baseline["samples"])
        return certify(budget, reference, ev, rows.certify_y, seed=seed), what["runtime"]

    out: dict[str, Any] = {"best": None, "closest": None,
                           "certification": {"confidence": budget.confidence, **rows.describe(),
                                             "select_fraction": SELECT_FRACTION, "tested": [], "stopped": None}}
    order = candidates(trials, baseline["metrics"], budget, int(baseline["bytes"]))
    if not order:
        _, reason, closest = choose_best(trials, baseline["metrics"], budget.to_dict())
        out.update(best_reason=f"{reason} (on the {len(rows.select_idx)} selection rows)", closest=closest)
        return out
    floor, runtime = of(model, again=True)
    out["certification"]["floor"] = floor.to_dict()
    if not floor.kept:
        error = unresolvable(budget, rows, floor, {"runtime": runtime})
        assert isinstance(error, BudgetNotMetError)
        out.update(best_reason=str(error).removesuffix("; nothing was written"), closest=order[0])
        return out
    device = get_target(settings.device).name
    for t in order:
        from edgebnn.search.space import TrialConfig

        _, proto = trial_export(model, TrialConfig.from_dict(t["config"]), seed, device)
        session = Session(proto.SerializeToString(deterministic=True), seed=seed, threads=1)
        cert = certify(budget, reference, session_evidence(session, rows.certify_x, rows.certify_ood), rows.certify_y,
                       seed=seed)
        out["certification"]["tested"].append({"number": t["number"], "bytes": t["bytes"], **cert.to_dict()})
        if not cert.kept:
            out["certification"]["stopped"] = (f"trial {t['number']} ({t['bytes']} bytes) was not certified: "
                                               f"{'; '.join(map(str, cert.broken))}")
            break
        out["best"] = t
    tested = len(out["certification"]["tested"])
    n = len(rows.certify_idx)
    if out["best"] is None:
        out.update(best_reason=(f"no trial is certified at {budget.confidence:.0%} confidence on the {n} certification "
                                f"rows: {out['certification']['stopped']}"), closest=order[0])
    else:
        out["best_reason"] = (f"the smallest of {tested} trial(s) certified in order on the {n} certification rows "
                              f"({len(order)} candidates from the {len(rows.select_idx)} selection rows; budget kept "
                              f"with {budget.confidence:.0%} confidence)")
    return out
