"""Measuring predictors on data: a task's metrics over a stream of batches, with the OOD report, and the change of a
lowered IR against its float BNN. ``edgebnn eval`` (:mod:`edgebnn.api`) and the uncertainty budget
(:mod:`edgebnn.budget`) both measure through these."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import DEFAULT_SAMPLES

if TYPE_CHECKING:
    import numpy as np

    from edgebnn.data import Dataset, DataSource
    from edgebnn.ir import BNNModel
    from edgebnn.metrics import AnyPredictive
    from edgebnn.runtime import Session
    from edgebnn.tasks import Task

Progress = Callable[[int, int], None]
"""A progress callback: ``progress(done, total)`` in rows (evaluation) or batches."""


def lowering_quality(float_ir: BNNModel, lowered: BNNModel, *, data: DataSource = "digits",
                     split: str | None = None, ood_data: DataSource | None = None, samples: int = DEFAULT_SAMPLES,
                     seed: int = 0,
                     progress: Progress | None = None) -> dict[str, Any]:
    """Accuracy/NLL/ECE/Brier of a lowered IR and of the float BNN it came from (same data, S and seed).

    ``data`` is ``digits`` (split ``split``, default ``val``) or a labelled file or folder; ``ood_data`` (inputs
    only) adds each side's ``ood`` report (:func:`edgebnn.metrics.ood_report`) and ``delta["auroc"]``, the
    change of the mutual-information AUROC.
    """
    from edgebnn.runtime.reference import check_samples

    check_samples(samples)
    dataset, ood = eval_data(float_ir, data, split, ood_data)
    predictors = [reference_predictor(float_ir, samples, seed), reference_predictor(lowered, samples, seed)]
    before, after = measure(predictors, dataset, ood, progress, *task_of(float_ir))[0]
    out = {**dataset.describe(), "samples": samples, "seed": seed, "float_bnn": before, "lowered": after,
           "delta": metric_delta(before, after)}
    if ood is not None:
        out["ood_data"] = ood.name
    return out


def eval_data(model: BNNModel, data: DataSource, split: str | None,
               ood_data: DataSource | None) -> tuple[Dataset, Dataset | None]:
    """The ``--eval`` data (digits: the validation split) and the ``--ood-data`` inputs, checked for ``model``."""
    dataset = dataset_for(model, data, split=split or ("val" if str(data) == "digits" else None), option="--eval")
    ood = None if ood_data is None else dataset_for(model, ood_data, labels=False, option="--ood-data")
    return dataset, ood


def metric_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """``after - before`` of each scalar metric, and of the MI-AUROC (``auroc``) when both have OOD reports."""
    out = {k: after[k] - before[k] for k, v in before.items() if isinstance(v, float)}
    if "ood" in before and "ood" in after:
        out["auroc"] = after["ood"]["auroc_mutual_info"] - before["ood"]["auroc_mutual_info"]
    return out


def reference_predictor(model: BNNModel, samples: int, seed: int) -> Callable[[np.ndarray], AnyPredictive]:
    from edgebnn.runtime.reference import Reference

    ref = Reference(model)
    return lambda x: ref.predict(x, samples, seed)


def task_of(model: BNNModel | Session) -> tuple[Task, int]:
    """The task of an IR or an export, and its class count (regression: the output width)."""
    from edgebnn.ir import BNNModel

    if isinstance(model, BNNModel):
        return model.manifest.task_spec(model.where), model.manifest.num_classes
    return model.task, model.meta.num_classes


class Sums:
    """One predictor's running metrics over a stream (the task's), plus its per-input uncertainties and the first
    example (for a segmentation plot)."""

    def __init__(self, task: Task, classes: int) -> None:
        self.metrics = task.metrics(classes)
        self.entropy: list[np.ndarray] = []  # per input: total uncertainty (entropy; image mean; Gaussian entropy)
        self.mutual_info: list[np.ndarray] = []  # per input: epistemic (MI; image mean MI; epistemic variance)
        self.samples: list[np.ndarray] = []  # per input: the members an anytime ensemble drew (--samples auto)
        self.first: tuple[np.ndarray, np.ndarray | None, AnyPredictive] | None = None

    def report(self) -> dict[str, Any]:
        return self.metrics.report()


def stream(predictors: Iterable[Callable[[np.ndarray], AnyPredictive]], dataset: Dataset,
            progress: Progress | None, *, task: Task, classes: int, labelled: bool = True) -> list[Sums]:
    """Run every predictor on every batch of ``dataset``; only metric sums and two floats per input are kept."""
    from edgebnn.data import DEFAULT_BATCH

    fns = list(predictors)
    sums = [Sums(task, classes) for _ in fns]
    done = 0
    for x, y in dataset.batches(DEFAULT_BATCH):
        for fn, acc in zip(fns, sums, strict=True):
            pred = fn(x)
            if labelled and y is not None:
                acc.metrics.add_predictive(pred, y)
            total, epistemic = pred.ood_scores()
            used = getattr(pred, "samples", None)
            if used is not None:
                acc.samples.append(used)
            acc.entropy.append(total)
            acc.mutual_info.append(epistemic)
            if acc.first is None:
                acc.first = (x, y, pred)
        done += len(x)
        if progress:
            progress(done, dataset.n)
    return sums


def measure(predictors: Sequence[Callable[[np.ndarray], AnyPredictive]], dataset: Dataset, ood: Dataset | None,
             progress: Progress | None, task: Task, classes: int,
             ) -> tuple[list[dict[str, Any]], list[Sums], list[Sums] | None]:
    """Each predictor's metrics on ``dataset`` (and its ``ood`` report against the ``ood`` inputs), with the sums."""
    import numpy as np

    total = dataset.n + (ood.n if ood else 0)

    def step(offset: int) -> Progress | None:
        return (lambda done, _n: progress(offset + done, total)) if progress else None

    sums = stream(predictors, dataset, step(0), task=task, classes=classes)
    reports: list[dict[str, Any]] = [dict(s.report()) for s in sums]
    if ood is None:
        return reports, sums, None
    from edgebnn.metrics import ood_report

    outs = stream(predictors, ood, step(dataset.n), labelled=False, task=task, classes=classes)
    for report, s, out in zip(reports, sums, outs, strict=True):
        in_mi, ood_mi = np.concatenate(s.mutual_info), np.concatenate(out.mutual_info)
        report["ood"] = {"data": ood.name, "n": ood.n,
                         **ood_report(np.concatenate(s.entropy), in_mi, np.concatenate(out.entropy), ood_mi),
                         "mean_mutual_info_in": float(in_mi.mean()), "mean_mutual_info_ood": float(ood_mi.mean())}
        if out.samples:
            report["ood"]["samples_used"] = samples_used(np.concatenate(out.samples))
    for report, s in zip(reports, sums, strict=True):
        if s.samples:
            report["samples_used"] = samples_used(np.concatenate(s.samples))
            if "ood" in report and "samples_used" in report["ood"]:
                report["ood"]["samples_ratio"] = report["ood"]["samples_used"]["mean"] / report["samples_used"]["mean"]
    return reports, sums, outs


def samples_used(per_input: np.ndarray) -> dict[str, Any]:
    """Summary of the members an anytime ensemble drew per input: mean, p50, p90, min, max and the share of inputs
    at each count (``at``: {count: share})."""
    import numpy as np

    counts, n = np.unique(per_input, return_counts=True)
    return {"mean": float(per_input.mean()), "p50": float(np.percentile(per_input, 50)),
            "p90": float(np.percentile(per_input, 90)), "min": int(per_input.min()), "max": int(per_input.max()),
            "at": {str(int(c)): float(k / len(per_input)) for c, k in zip(counts, n, strict=True)}}


def dataset_for(model: BNNModel | Session, data: DataSource, *, split: str | None = None, labels: bool = True,
                option: str = "--data") -> Dataset:
    """Open ``data`` (:func:`edgebnn.data.load_data`) for ``model``: its input shape is checked, and its labels are
    the targets of the model's task (:meth:`edgebnn.tasks.Task.targets`), checked against its class count."""
    from edgebnn.data import load_data
    from edgebnn.ir import BNNModel

    shape = tuple(model.manifest.input_shape[1:]) if isinstance(model, BNNModel) else model.input_shape
    task, classes = task_of(model)
    where = model.where
    # Files are checked against the model's input shape as they are opened (the message names the file).
    want = None if isinstance(data, str) and data == "digits" else shape
    dataset = load_data(data, split=split, input_shape=want, num_classes=classes, labels=labels, option=option,
                        targets=task.targets(classes))
    if tuple(dataset.input_shape) != tuple(shape):
        raise InvalidOptionError(f"{where}: takes inputs {tuple(shape)}, {dataset.name} has {dataset.input_shape}")
    return dataset
