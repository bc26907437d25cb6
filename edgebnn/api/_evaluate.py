"""Evaluate an IR or an export on data (with OOD), compare a lowered IR with its float BNN, profile."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebnn.api._files import PathLike, load_ir
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import DEFAULT_SAMPLES
from edgebnn.measure import Progress, dataset_for, lowering_quality, samples_used, task_of
from edgebnn.measure import Sums as _Sums
from edgebnn.measure import measure as _measure
from edgebnn.measure import reference_predictor as _reference

if TYPE_CHECKING:
    import numpy as np

    from edgebnn.data import Dataset, DataSource
    from edgebnn.ir import BNNModel
    from edgebnn.metrics import AnyPredictive
    from edgebnn.runtime import Session
    from edgebnn.tasks import Task

__all__ = ["checked_range", "dataset_for", "evaluate_artifact", "input_range_of", "lowering_quality",
           "profile_artifact", "samples_used", "task_of"]


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
