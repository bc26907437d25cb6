"""Certifying a budget: each metric's change, lowered minus float, bounded over inputs (:mod:`edgebnn.budget`).

The evidence is per input. The float BNN is what ``lower --eval`` compares against: the reference runtime at S
samples and the lowering seed, a fixed ensemble of S draws, the same function on every input. A candidate is
judged by what the device runs: its default export (:data:`edgebnn.exporters.config.DEFAULT_EXPORT`, or the
export a ``search`` trial writes) in onnxruntime. A sampling export (``noise``, ``shared``) draws fresh noise on
every call, so each input is run in a call of its own, ``draws`` times: the Monte Carlo noise of the device's
predictive is in the evidence, independent from input to input (a call's rows share a layer's noise draw), and
averaging ``draws`` of the same input estimates the device's expected metric on that input without bias. A
deterministic export (``baked``, ``analytic``) is run once per input.

For a classifier the metrics are computed from per-input arrays (NLL, Brier and accuracy as per-input values,
ECE as per-input bin contributions, the MI-AUROC from ranks), so a bootstrap of 2000 resamples is a few matrix
products. Other tasks are resampled through their own metric accumulators (:meth:`edgebnn.tasks.Task.metrics`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from edgebnn.exporters import DEFAULT_SAMPLES

if TYPE_CHECKING:
    from edgebnn.budget._bounds import Budget, Certificate
    from edgebnn.ir import BNNModel
    from edgebnn.metrics import AnyPredictive
    from edgebnn.runtime import Session
    from edgebnn.tasks import Task

DRAWS = 4
"""Device calls per input when the export samples (its Monte Carlo noise averaged per input, not removed)."""
_GENERIC_RESAMPLES = 500  # tasks resampled through their accumulators (a Python call per resample)


@dataclasses.dataclass(frozen=True)
class Evidence:
    """One predictor's predictive on the certification inputs, ``draws`` rows per input (row ``i * draws + r``).

    Attributes:
        task, classes: The model's task and class count.
        draws: Rows per input (1: a deterministic predictor).
        pred: The predictive of every row.
        in_scores: Epistemic score (mutual information; regression: epistemic variance) of every row.
        ood_scores: The same on the OOD inputs (``draws`` rows each), or None.
        runtime: What ran (``reference`` or ``onnxruntime (noise)``...).
    """

    task: Task
    classes: int
    draws: int
    pred: AnyPredictive
    in_scores: np.ndarray
    ood_scores: np.ndarray | None
    runtime: str

    @property
    def rows(self) -> int:
        return len(self.in_scores) // self.draws


def _concat(preds: list[AnyPredictive]) -> AnyPredictive:
    """One predictive of the rows of ``preds``, in order (an optional field none of them has stays None)."""
    first = preds[0]
    fields = {f.name: [getattr(p, f.name) for p in preds] for f in dataclasses.fields(first)}
    return type(first)(**{k: None if any(v is None for v in vs) else np.concatenate(vs)  # type: ignore[arg-type]
                          for k, vs in fields.items()})


def _take(pred: AnyPredictive, rows: np.ndarray) -> AnyPredictive:
    values = {f.name: getattr(pred, f.name) for f in dataclasses.fields(pred)}
    return type(pred)(**{k: None if v is None else v[rows] for k, v in values.items()})  # type: ignore[arg-type]


def reference_evidence(model: BNNModel, x: np.ndarray, ood: np.ndarray | None, samples: int,
                       seed: int) -> Evidence:
    """The reference runtime's predictive (S ``samples``, ``seed``: the same S networks for every input)."""
    from edgebnn.measure import task_of
    from edgebnn.runtime.reference import Reference

    ref = Reference(model)
    task, classes = task_of(model)

    def run(inputs: np.ndarray) -> AnyPredictive:
        return _concat([ref.predict(inputs[i:i + 512], samples, seed) for i in range(0, len(inputs), 512)])

    pred = run(x)
    ood_pred = None if ood is None else run(ood)
    return Evidence(task, classes, 1, pred, pred.ood_scores()[1],
                    None if ood_pred is None else ood_pred.ood_scores()[1], "reference")


def session_evidence(session: Session, x: np.ndarray, ood: np.ndarray | None, draws: int = DRAWS) -> Evidence:
    """What ``session`` (an exported ensemble) predicts: one call per input with ``draws`` copies of it when the
    export samples on the device, else batches (module docstring)."""
    from edgebnn.measure import task_of

    sampling = session.mode in ("noise", "shared")
    draws = draws if sampling else 1
    task, classes = task_of(session)

    def run(inputs: np.ndarray) -> AnyPredictive:
        if not sampling:
            return _concat([session.predict(inputs[i:i + 256]) for i in range(0, len(inputs), 256)])
        return _concat([session.predict(np.repeat(inputs[i:i + 1], draws, axis=0)) for i in range(len(inputs))])

    pred = run(x)
    ood_pred = None if ood is None else run(ood)
    return Evidence(task, classes, draws, pred, pred.ood_scores()[1],
                    None if ood_pred is None else ood_pred.ood_scores()[1], f"onnxruntime ({session.mode})")


def export_evidence(model: BNNModel, x: np.ndarray, ood: np.ndarray | None, *, seed: int,
                    draws: int = DRAWS, export: Callable[[BNNModel], bytes] | None = None,
                    fallback_samples: int = DEFAULT_SAMPLES) -> tuple[Evidence, dict[str, Any]]:
    """The evidence of ``model`` as the device runs it: its default export (``export`` gives other bytes), or, when
    the export is refused, the reference runtime at ``fallback_samples`` (what ``baked`` stores); and what ran.
    Inputs an export refuses (:func:`check_in_range`) are refused here too, never run on the reference runtime."""
    from edgebnn.budget._greedy import default_export
    from edgebnn.errors import EdgeBNNError
    from edgebnn.runtime import Session

    check_in_range(model, x, ood)
    what: dict[str, Any]
    try:
        if export is not None:
            data = export(model)
            what = {"export": "given"}
        else:
            data, mode = default_export(model, fallback_samples, seed)
            what = {"mode": mode, "samples": fallback_samples}
        what["file_bytes"] = len(data)
        evidence = session_evidence(Session(data, seed=seed, threads=1), x, ood, draws)
    except EdgeBNNError as e:
        evidence = reference_evidence(model, x, ood, fallback_samples, seed)
        what = {"mode": "reference", "samples": fallback_samples, "export_error": str(e), "file_bytes": None}
    return evidence, {**what, "draws": evidence.draws, "runtime": evidence.runtime}


def check_in_range(model: BNNModel, x: np.ndarray, ood: np.ndarray | None,
                   names: tuple[str, str] = ("--eval", "--ood-data")) -> None:
    """Refuse (one line, naming the option: ``names`` of ``x`` and ``ood``) validation or OOD inputs far outside
    the input range ``model`` records: every export refuses them (:func:`edgebnn.runtime.session.outside_input_range`),
    so a budget on them cannot be measured as the device runs it."""
    from edgebnn.errors import InvalidOptionError
    from edgebnn.runtime.session import outside_input_range

    for option, inputs in zip(names, (x, ood), strict=True):
        outside = None if inputs is None else outside_input_range(inputs, model.manifest.input_range)
        if outside:
            raise InvalidOptionError(f"{option}: {outside}; every export refuses such inputs, so the budget cannot "
                                     "be measured as the device runs it")


# -- the statistics of each metric ---------------------------------------------------------------------------------

def _weights(idx: np.ndarray, n: int) -> np.ndarray:
    """Resample counts ``[B, n]`` of index rows ``idx`` ``[..., n]`` (flattened to ``B`` rows)."""
    rows = idx.reshape(-1, idx.shape[-1])
    offsets = rows + n * np.arange(len(rows))[:, None]
    return np.bincount(offsets.ravel(), minlength=len(rows) * n).reshape(len(rows), n).astype(np.float64)


def _per_input(values: np.ndarray, draws: int) -> np.ndarray:
    return values.reshape(-1, draws).mean(1)


def _classification_rows(ev: Evidence, y: np.ndarray) -> dict[str, np.ndarray]:
    """Per input (mean over its draws): correct, NLL, Brier, and the ECE bin contributions ``[n, 2 * bins]``
    (the bin's count, then correct - confidence)."""
    from edgebnn.metrics import ECE_BINS, EPS

    probs = np.asarray(ev.pred.probs, np.float64)  # type: ignore[union-attr]
    ys = np.repeat(y, ev.draws)
    rows = np.arange(len(ys))
    conf = probs.max(-1)
    correct = (probs.argmax(-1) == ys).astype(np.float64)
    nll = -np.log(np.maximum(probs[rows, ys], EPS))
    onehot = np.zeros_like(probs)
    onehot[rows, ys] = 1.0
    brier = ((probs - onehot) ** 2).sum(-1)
    bins = np.minimum((conf * ECE_BINS).astype(int), ECE_BINS - 1)
    contrib = np.zeros((len(ys), 2 * ECE_BINS))
    contrib[rows, bins] = 1.0
    contrib[rows, ECE_BINS + bins] = correct - conf
    n = len(y)
    return {"accuracy": _per_input(correct, ev.draws), "nll": _per_input(nll, ev.draws),
            "brier": _per_input(brier, ev.draws), "ece": contrib.reshape(n, ev.draws, -1).mean(1)}


def _ece(contrib: np.ndarray, weights: np.ndarray) -> np.ndarray:
    from edgebnn.metrics import ECE_BINS

    sums = weights @ contrib
    return np.abs(sums[:, ECE_BINS:]).sum(1) / np.maximum(sums[:, :ECE_BINS].sum(1), 1e-300)


def _auroc(in_scores: np.ndarray, ood_scores: np.ndarray, draws: int, w_in: np.ndarray,
           w_ood: np.ndarray) -> np.ndarray:
    """MI-AUROC (OOD positive, ties half) of every resample: input weights ``w_in`` ``[B, n]``, ``w_ood`` ``[B, m]``,
    each of an input's ``draws`` rows carrying its weight / draws (the AUROC of single device calls)."""
    levels, inverse = np.unique(np.concatenate([in_scores, ood_scores]).astype(np.float64), return_inverse=True)
    lin, lood = inverse[:len(in_scores)], inverse[len(in_scores):]
    b, count = len(w_in), len(levels)
    row_w = np.repeat(w_in, draws, axis=1) / draws  # [B, n * draws]
    at = np.bincount((lin[None, :] + count * np.arange(b)[:, None]).ravel(), weights=row_w.ravel(),
                     minlength=b * count).reshape(b, count)
    below = np.cumsum(at, axis=1) - at
    score = below[:, lood] + 0.5 * at[:, lood]  # [B, m * draws]
    ood_w = np.repeat(w_ood, draws, axis=1) / draws
    return (score * ood_w).sum(1) / (w_in.sum(1) * w_ood.sum(1))


def _auroc_change(reference: Evidence, lowered: Evidence, n: int, m: int) -> Callable[..., np.ndarray]:
    """The bootstrap statistic of the MI-AUROC's change: in- and out-of-distribution inputs resampled apart."""
    assert reference.ood_scores is not None and lowered.ood_scores is not None

    def change(i: np.ndarray, j: np.ndarray, axis: int = -1) -> np.ndarray:
        assert reference.ood_scores is not None and lowered.ood_scores is not None
        wi, wj = _weights(i, n), _weights(j, m)
        out = (_auroc(lowered.in_scores, lowered.ood_scores, lowered.draws, wi, wj)
               - _auroc(reference.in_scores, reference.ood_scores, reference.draws, wi, wj))
        return out.reshape(i.shape[:-1])

    return change


def certify(budget: Budget, reference: Evidence, lowered: Evidence, y: np.ndarray, *, seed: int = 0) -> Certificate:
    """Every budgeted metric's change (``lowered`` - ``reference`` on the same inputs) with its one-sided limit
    at ``budget.confidence`` (:mod:`edgebnn.budget`)."""
    from edgebnn.budget._bounds import MEAN_METRICS, Bound, Certificate, bootstrap_bound, mean_bound
    from edgebnn.errors import InvalidOptionError

    n = reference.rows
    bounds: list[Bound] = []
    classification = reference.task.softmax_classifier
    rows_f = _classification_rows(reference, y) if classification else None
    rows_l = _classification_rows(lowered, y) if classification else None
    for metric, limit in budget.limits.items():
        if metric == "auroc":
            if reference.ood_scores is None or lowered.ood_scores is None:
                raise InvalidOptionError(f"budget {metric}: not measured (auroc needs OOD data: --ood-data)")
            m = len(reference.ood_scores) // reference.draws
            bounds.append(bootstrap_bound(metric, _auroc_change(reference, lowered, n, m), (n, m), limit,
                                          budget.confidence, seed=seed))
        elif rows_f is not None and rows_l is not None:
            if metric not in rows_f:
                raise InvalidOptionError(f"budget {metric}: a classification model reports accuracy, nll, ece, brier")
            if metric in MEAN_METRICS:
                bounds.append(mean_bound(metric, rows_l[metric] - rows_f[metric], limit, budget.confidence))
                continue
            cf, cl = rows_f[metric], rows_l[metric]

            def ece(i: np.ndarray, axis: int = -1, cf: np.ndarray = cf, cl: np.ndarray = cl) -> np.ndarray:
                w = _weights(i, n)
                return (_ece(cl, w) - _ece(cf, w)).reshape(i.shape[:-1])

            bounds.append(bootstrap_bound(metric, ece, (n,), limit, budget.confidence, seed=seed))
        else:
            bounds.append(_generic_bound(metric, limit, budget.confidence, reference, lowered, y, seed))
    return Certificate(tuple(bounds), budget.confidence)


def _generic_bound(metric: str, limit: float, confidence: float, reference: Evidence, lowered: Evidence,
                   y: np.ndarray, seed: int) -> Any:
    """A regression or segmentation metric through the task's accumulator: per-input values for a mean metric
    (each input's own report: every input has the same number of elements), else the bootstrap, one
    accumulation per resample."""
    from edgebnn.budget._bounds import MEAN_METRICS, bootstrap_bound, mean_bound
    from edgebnn.errors import InvalidOptionError
    n = reference.rows

    def value(ev: Evidence, inputs: np.ndarray) -> float:
        acc = ev.task.metrics(ev.classes)
        rows = (inputs[:, None] * ev.draws + np.arange(ev.draws)).ravel()
        acc.add_predictive(_take(ev.pred, rows), np.repeat(y[inputs], ev.draws, axis=0))
        report = acc.report()
        if metric not in report:
            raise InvalidOptionError(f"budget {metric}: a {ev.task.name} model does not report it")
        return float(report[metric])

    if metric in MEAN_METRICS:
        one = [np.array([i]) for i in range(n)]
        diffs = np.array([value(lowered, i) - value(reference, i) for i in one])
        return mean_bound(metric, diffs, limit, confidence)

    def statistic(i: np.ndarray, axis: int = -1) -> np.ndarray:
        rows = i.reshape(-1, i.shape[-1])
        return np.array([value(lowered, r) - value(reference, r) for r in rows]).reshape(i.shape[:-1])

    return bootstrap_bound(metric, statistic, (n,), limit, confidence, seed=seed, resamples=_GENERIC_RESAMPLES)
