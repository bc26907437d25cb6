"""Evaluate an IR or an export on data (with OOD), compare a lowered IR with its float BNN, profile."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebnn.api._files import PathLike, Progress, load_ir
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import DEFAULT_SAMPLES

if TYPE_CHECKING:
    import numpy as np

    from edgebnn.data import Dataset, DataSource
    from edgebnn.ir import BNNModel
    from edgebnn.metrics import AnyPredictive
    from edgebnn.runtime import Session
    from edgebnn.tasks import Task

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
    dataset, ood = _eval_data(float_ir, data, split, ood_data)
    before, after = _measure([_reference(float_ir, samples, seed), _reference(lowered, samples, seed)], dataset,
                             ood, progress, *task_of(float_ir))[0]
    out = {**dataset.describe(), "samples": samples, "seed": seed, "float_bnn": before, "lowered": after,
           "delta": _delta(before, after)}
    if ood is not None:
        out["ood_data"] = ood.name
    return out


def _eval_data(model: BNNModel, data: DataSource, split: str | None,
               ood_data: DataSource | None) -> tuple[Dataset, Dataset | None]:
    """The ``--eval`` data (digits: the validation split) and the ``--ood-data`` inputs, checked for ``model``."""
    dataset = dataset_for(model, data, split=split or ("val" if str(data) == "digits" else None), option="--eval")
    ood = None if ood_data is None else dataset_for(model, ood_data, labels=False, option="--ood-data")
    return dataset, ood


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """``after - before`` of each scalar metric, and of the MI-AUROC (``auroc``) when both have OOD reports."""
    out = {k: after[k] - before[k] for k, v in before.items() if isinstance(v, float)}
    if "ood" in before and "ood" in after:
        out["auroc"] = after["ood"]["auroc_mutual_info"] - before["ood"]["auroc_mutual_info"]
    return out




def input_range_of(model: BNNModel | Session) -> tuple[float, float] | None:
    """The [min, max] of the inputs ``model`` was lowered with (its manifest, or its export's metadata), if recorded."""
    from edgebnn.ir import BNNModel

    rng = model.manifest.input_range if isinstance(model, BNNModel) else model.meta.input_range
    return None if rng is None else (float(rng[0]), float(rng[1]))


def checked_range(fn: Callable[[np.ndarray], AnyPredictive], model: BNNModel | Session,
                  dataset: Dataset) -> Callable[[np.ndarray], AnyPredictive]:
    """``fn``, refusing (one line) a batch far outside the input range ``model`` records (the rule of
    :func:`edgebnn.runtime.session.outside_input_range`, which ``Session.predict`` applies too)."""
    from edgebnn.runtime.session import outside_input_range

    limits = input_range_of(model)
    if limits is None:
        return fn

    def check(x: np.ndarray) -> AnyPredictive:
        outside = outside_input_range(x, limits)
        if outside:
            raise InvalidOptionError(f"{dataset.name}: {outside.replace('the model', model.where, 1)}")
        return fn(x)

    return check


def _reference(model: BNNModel, samples: int, seed: int) -> Callable[[np.ndarray], AnyPredictive]:
    from edgebnn.runtime.reference import Reference

    ref = Reference(model)
    return lambda x: ref.predict(x, samples, seed)


def task_of(model: BNNModel | Session) -> tuple[Task, int]:
    """The task of an IR or an export, and its class count (regression: the output width)."""
    from edgebnn.ir import BNNModel

    if isinstance(model, BNNModel):
        return model.manifest.task_spec(model.where), model.manifest.num_classes
    return model.task, model.meta.num_classes


class _Sums:
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


def _stream(predictors: Iterable[Callable[[np.ndarray], AnyPredictive]], dataset: Dataset,
            progress: Progress | None, *, task: Task, classes: int, labelled: bool = True) -> list[_Sums]:
    """Run every predictor on every batch of ``dataset``; only metric sums and two floats per input are kept."""
    from edgebnn.data import DEFAULT_BATCH

    fns = list(predictors)
    sums = [_Sums(task, classes) for _ in fns]
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


def _measure(predictors: Sequence[Callable[[np.ndarray], AnyPredictive]], dataset: Dataset, ood: Dataset | None,
             progress: Progress | None, task: Task, classes: int,
             ) -> tuple[list[dict[str, Any]], list[_Sums], list[_Sums] | None]:
    """Each predictor's metrics on ``dataset`` (and its ``ood`` report against the ``ood`` inputs), with the sums."""
    import numpy as np

    total = dataset.n + (ood.n if ood else 0)

    def step(offset: int) -> Progress | None:
        return (lambda done, _n: progress(offset + done, total)) if progress else None

    sums = _stream(predictors, dataset, step(0), task=task, classes=classes)
    reports: list[dict[str, Any]] = [dict(s.report()) for s in sums]
    if ood is None:
        return reports, sums, None
    from edgebnn.metrics import ood_report

    outs = _stream(predictors, ood, step(dataset.n), labelled=False, task=task, classes=classes)
    for report, s, out in zip(reports, sums, outs, strict=True):
        in_mi, ood_mi = np.concatenate(s.mutual_info), np.concatenate(out.mutual_info)
        report["ood"] = {"data": ood.name, "n": ood.n,
                         "scores": {"total": task.ood_scores[0], "epistemic": task.ood_scores[1],
                                    "short": list(task.ood_short)},
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


def evaluate_artifact(artifact: BNNModel | Session | PathLike, *, data: DataSource = "digits",
                      split: str | None = None, samples: int | str | None = None, seed: int = 0,
                      ood_data: DataSource | None = None, plot: PathLike | None = None,
                      progress: Progress | None = None) -> dict[str, Any]:
    """The task's metrics of an IR (reference runtime, S samples) or an exported ensemble: accuracy, NLL, ECE
    (15 bins) and Brier of a classifier; NLL, RMSE, MAE, interval coverage, calibration error and the variance
    split of a regression; pixel accuracy, mean IoU, per-pixel NLL and ECE of a segmentation
    (:mod:`edgebnn.metrics`).

    Data streams in batches, so a shard folder larger than memory is evaluated in bounded memory.

    Args:
        artifact: An ``.ebnn`` or exported ``.onnx`` path, an IR, or a :class:`Session`.
        data: ``digits``, a labelled ``.npz`` (``x``, ``y``), a folder of shards, or ``(x, y)`` arrays
            (:func:`edgebnn.data.load_data`); ``y`` as the task takes it: class indices ``(N,)``, float targets
            ``(N,)``/``(N, D)``, or integer masks ``(N, *spatial)``.
        split: Digits split (default ``test``); digits only.
        samples: S for an IR (an export has S built in; default 16, a deep ensemble's M members: M), or ``"auto"``:
            the IR's anytime predictive (the stopping rule's defaults, :mod:`edgebnn.stopping`), as an anytime
            export computes it.
        seed: Sampling seed for an IR, and of the host-drawn noise of a ``noise`` export.
        ood_data: Out-of-distribution inputs (``x`` only; any labels are ignored). Adds ``ood``:
            ``auroc_mutual_info``, ``auroc_entropy``, ``aupr_mutual_info``, ``fpr_at_95_tpr``
            (:func:`edgebnn.metrics.ood_report`), ``data``, ``n`` and the mean mutual information of each side.
        plot: Write a PNG: reliability diagram (regression: interval coverage), and the epistemic histogram (in vs
            OOD); segmentation adds the first image, its mask, the predicted mask and the MI map.
        progress: Called as ``progress(rows done, rows total)`` after each batch.

    Returns:
        The ``edgebnn.eval/1`` report: ``artifact``, ``runtime``, ``data``, ``split``, the task's metrics
        (classification: ``accuracy``, ``nll``, ``ece``, ``brier``; others add ``task``), ``samples``, ``n``
        (and ``ood``: for segmentation on the image-mean MI and entropy, for regression on the mean epistemic
        variance and Gaussian entropy). An anytime ensemble (``--samples auto``) adds ``samples_used`` (mean, p50,
        p90, min, max, ``at``: the share of inputs at each count; in ``ood`` too, with ``samples_ratio``, OOD mean
        over in-distribution mean) and ``anytime`` (its stopping rule); ``samples`` is its largest count.

    Raises:
        InvalidOptionError: Bad data (named by file and key), inputs of another shape than the model's.
        InvalidArtifactError: A missing or corrupt artifact.
    """
    import numpy as np

    from edgebnn.ir import BNNModel
    from edgebnn.runtime import Session
    from edgebnn.runtime.reference import check_samples

    if isinstance(artifact, (BNNModel, Session)):
        model: BNNModel | Session = artifact
        name = model.where
    elif Path(artifact).suffix == ".onnx":
        model, name = Session(artifact, seed=seed), str(artifact)
    else:
        model, name = load_ir(artifact), str(artifact)
    rule = None
    if isinstance(model, Session):
        if model.anytime and samples == "auto":
            samples = None
        if samples is not None and samples != model.samples:
            raise InvalidOptionError(
                f"{name}: --samples {samples}: this export has S = {model.samples} built in; drop --samples, or "
                f"export the .ebnn again with --samples {samples} (or evaluate the .ebnn itself)")
        predict: Callable[[np.ndarray], AnyPredictive] = model.predict
        samples, runtime = model.samples, f"onnxruntime ({model.mode}{', anytime' if model.anytime else ''})"
        rule = model.meta.anytime
    elif samples == "auto":
        from edgebnn.exporters.config import rule_for
        from edgebnn.runtime.reference import Reference

        anytime = rule_for(model)
        ref = Reference(model)
        predict, runtime, samples = (lambda x: ref.predict_anytime(x, anytime, seed)), "reference (anytime)", \
            anytime.max_samples
        rule = anytime.to_dict()
    else:
        from edgebnn.exporters.families import default_samples

        if isinstance(samples, str):
            raise InvalidOptionError(f"--samples {samples}: a positive integer, or auto")
        samples = samples if samples is not None else default_samples(model)
        check_samples(samples)
        predict, runtime = _reference(model, samples, seed), "reference"
    dataset = dataset_for(model, data, split=split)
    ood = None if ood_data is None else dataset_for(model, ood_data, split=None, labels=False, option="--ood-data")
    task, classes = task_of(model)
    reports, sums, outs = _measure([checked_range(predict, model, dataset)], dataset, ood, progress, task, classes)
    report: dict[str, Any] = {"artifact": name, "runtime": runtime, **dataset.describe(), **reports[0],
                              "samples": samples}
    report["n"] = dataset.n
    if rule is not None:
        report["anytime"] = dict(rule)
    limits = input_range_of(model)  # None: the model was lowered without data, so a scale error passes unseen
    report["input_range"] = None if limits is None else list(limits)
    report.update(task.record(options=False))
    in_mi = np.concatenate(sums[0].mutual_info)
    ood_mi = None if outs is None else np.concatenate(outs[0].mutual_info)
    if plot:
        _plot(task, sums[0], in_mi, ood_mi, plot,
              title=f"{Path(name).name} on {dataset.name}" + (f" vs {ood.name}" if ood else ""))
    return report


def _plot(task: Task, sums: _Sums, in_mi: np.ndarray, ood_mi: np.ndarray | None, path: PathLike, title: str) -> None:
    """eval --plot, as the task says (:attr:`edgebnn.tasks.Task.plot`): the reliability diagram (classification,
    segmentation's pixels) or interval coverage (regression) beside the epistemic histogram; segmentation adds the
    first image, its mask and its MI map."""
    from edgebnn import plots
    from edgebnn.metrics import Predictive

    if task.plot == "maps" and sums.first is not None:
        x, y, pred = sums.first
        assert isinstance(pred, Predictive)
        plots.plot_segmentation(x[0], None if y is None else y[0], pred.probs[0].argmax(0), pred.mutual_info[0],
                                sums.metrics.reliability(), path, title=title)
    elif task.plot == "coverage":
        plots.plot_regression(sums.metrics.reliability(), in_mi, ood_mi, path, title=title)
    else:
        plots.plot_evaluation(sums.metrics.reliability(), in_mi, ood_mi, path, title=title)


def profile_artifact(artifact: str | Path, *, device: str = "cpu", samples: int | str = DEFAULT_SAMPLES,
                     mode: str = "auto",
                     onnx_path: str | None = None, engine: str | None = None, baseline_runner: str = "auto",
                     bench_results: str | None = None, remote: str | None = None, remote_edgebnn: str = "edgebnn",
                     batch: int = 1, runs: int | None = None, warmup: int = 20, threads: int = 2,
                     power_meter: str | None = None, progress: Callable[[str], None] | None = None,
                     data: DataSource | None = None, ood_data: DataSource | None = None,
                     inputs: int = 100) -> dict[str, Any]:
    """Profile an .ebnn's ensemble against its float baselines built from the same IR, on one target.

    An anytime ensemble (``samples="auto"``, or an anytime ``onnx_path``) costs what its inputs make it draw: it is
    timed per input on the first ``inputs`` rows of ``data`` (and of ``ood_data``), ``runs`` rounds (default 3; a
    fixed ensemble: ``runs`` timed runs, default 200), against the
    fixed export at its largest count, det-S and the float BNN (:func:`edgebnn.targets.profiler.profile_anytime`).

    The ensemble is ``engine`` (a TensorRT engine, rtx/jetson), ``onnx_path`` (an exported ONNX), or exported
    on the fly in ``mode`` (``auto``: on the CPU without ``bench_results`` what ``edgebnn export`` writes by default,
    :data:`edgebnn.exporters.config.DEFAULT_EXPORT`; else the target's
    :meth:`~edgebnn.targets.base.Target.default_mode`, reading ``bench_results`` on the CPU). ``remote="user@host"``
    runs the whole profile on that machine over ssh (:mod:`edgebnn.targets.remote`) and returns its report.
    """
    from edgebnn.targets.profiler import profile

    if Path(artifact).suffix == ".onnx":
        ir_path = Path(artifact).with_suffix(".ebnn")
        ir_name = str(ir_path) if ir_path.is_file() else "MODEL.ebnn"
        raise InvalidOptionError(
            f"{artifact}: profile builds the float baselines from the .ebnn the export came from; give both: "
            f"edgebnn profile {ir_name} --onnx {artifact}" + ("" if ir_path.is_file() else " (your .ebnn)"))
    model = load_ir(artifact)  # validated here, also before copying it to a remote machine
    anytime_onnx = None
    if onnx_path and not engine:
        from edgebnn.runtime.session import read_export

        proto, meta, _ = read_export(onnx_path)
        anytime_onnx = proto if meta.anytime is not None else None
    if samples == "auto" or anytime_onnx is not None:
        if remote or engine or device != "cpu":
            raise InvalidOptionError("--samples auto: profile times an anytime ensemble per input with onnxruntime "
                                     "here (--device cpu); an engine or a remote board is not profiled that way yet")
        sets = _anytime_inputs(model, data, ood_data, inputs)
        report = _profile_anytime(model, anytime_onnx, mode, sets, runs=3 if runs is None else runs, warmup=warmup,
                                  threads=threads, progress=progress)
        report["data"] = {"in": str(data), **({"ood": str(ood_data)} if ood_data is not None else {})}
        return report
    runs = 200 if runs is None else runs
    if isinstance(samples, str):
        raise InvalidOptionError(f"--samples {samples}: a positive integer, or auto")
    if remote:
        from edgebnn.targets.remote import profile_remote

        options = {"device": device, "samples": samples, "mode": None if mode == "auto" else mode,
                   "baseline_runner": baseline_runner, "batch": batch, "runs": runs, "warmup": warmup,
                   "threads": threads, "power_meter": power_meter}
        if progress:
            progress(f"on {remote}")
        return profile_remote(remote, artifact, options, engine=engine, onnx_path=onnx_path,
                              remote_edgebnn=remote_edgebnn)
    if engine and onnx_path:
        raise InvalidOptionError("--engine and --onnx: give one (the engine is the ensemble that is profiled)")
    ensemble, mode_reason = (None, None) if engine else _profiled_ensemble(model, device, samples, mode, onnx_path,
                                                                          bench_results, batch)
    report = profile(model, ensemble, device=device, samples=samples, engine=engine,
                     baseline_runner=baseline_runner, batch=batch, runs=runs, warmup=warmup,
                     threads=threads, power_meter=power_meter, progress=progress)
    report["mode_reason"] = mode_reason
    return report


def _profiled_ensemble(model: BNNModel, device: str, samples: int, mode: str, onnx_path: str | None,
                       bench_results: str | None, batch: int) -> tuple[Any, str | None]:
    """The fixed ensemble ``profile`` times and why its mode: ``onnx_path``, or exported in ``mode`` (``auto``: on the
    CPU without ``bench_results`` what ``edgebnn export`` writes by default, else the target's default mode)."""
    import dataclasses

    from edgebnn.exporters.config import DEFAULT_EXPORT, ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.runtime.session import read_export
    from edgebnn.targets.registry import get_target

    if onnx_path:
        ensemble, meta, _ = read_export(onnx_path)
        if meta.samples != samples:
            raise InvalidOptionError(f"{onnx_path}: was exported with S={meta.samples}; pass --samples {meta.samples}")
        return ensemble, None
    if mode == "auto" and bench_results is None and get_target(device).name == "cpu":
        result = export_model(model, dataclasses.replace(DEFAULT_EXPORT, samples=samples))
        choice = result.choice  # what edgebnn export writes by default
        return result.proto, f"what edgebnn export writes by default ({choice.reason})"
    reason = None
    if mode == "auto":
        mode, reason = get_target(device).default_mode(samples=samples, batch=batch, bench_results=bench_results)
    return export_model(model, ExportConfig(samples, mode=mode, rng="host")).proto, reason


def _anytime_inputs(model: BNNModel, data: DataSource | None, ood_data: DataSource | None,
                    inputs: int) -> dict[str, np.ndarray]:
    """The first ``inputs`` rows of ``data`` (``in``) and of ``ood_data`` (``ood``) an anytime ensemble is timed on."""
    if data is None:
        raise InvalidOptionError("--samples auto: an anytime ensemble's latency depends on its inputs; give --data "
                                 "(in-distribution inputs; --ood-data adds unfamiliar ones)")
    if inputs <= 0:
        raise InvalidOptionError(f"--inputs {inputs}: must be positive")
    sets = {"in": _first_rows(dataset_for(model, data, split="test" if str(data) == "digits" else None), inputs)}
    if ood_data is not None:
        sets["ood"] = _first_rows(dataset_for(model, ood_data, labels=False, option="--ood-data"), inputs)
    return sets


def _profile_anytime(model: BNNModel, ensemble: Any, mode: str, sets: dict[str, np.ndarray], *, runs: int,
                     warmup: int, threads: int, progress: Callable[[str], None] | None) -> dict[str, Any]:
    """profile of an anytime ensemble (``ensemble``, or exported here in ``mode`` with the rule's defaults): per
    input, on the rows of ``sets``, against the fixed export of the same configuration at its largest count."""
    import dataclasses

    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.exporters.metadata import read_metadata
    from edgebnn.targets.profiler import profile_anytime

    if ensemble is None:
        ensemble = export_model(model, ExportConfig("auto", mode=mode, device="cpu")).proto
    meta = read_metadata(ensemble, "ensemble")
    if meta.config is not None:  # what exported it, at a fixed S
        config = dataclasses.replace(ExportConfig.from_dict(meta.config, "ensemble"), samples=meta.samples, rule=None)
    else:  # an export that records no config: its mode, noise, rng and weights
        config = ExportConfig(meta.samples, mode=meta.mode, noise=meta.noise or "auto", device="cpu",
                              rng=meta.rng or "host", weights=meta.weights or "ir")
    fixed = export_model(model, config).proto
    return profile_anytime(model, ensemble, fixed, sets, device="cpu", rounds=runs, warmup=warmup, threads=threads,
                           progress=progress)


def _first_rows(dataset: Dataset, n: int) -> np.ndarray:
    """The first ``n`` inputs of ``dataset`` (all, if it has fewer)."""
    import numpy as np

    rows = []
    for x, _ in dataset.batches(min(n, 1024)):
        rows.append(x)
        if sum(len(r) for r in rows) >= n:
            break
    return np.concatenate(rows)[:n]
