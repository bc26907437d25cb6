"""Evaluate an IR or an export on data (with OOD), compare a lowered IR with its float BNN, profile."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebnn.api._files import PathLike, Progress, load_ir
from edgebnn.errors import InvalidOptionError

if TYPE_CHECKING:
    import numpy as np

    from edgebnn.data import Dataset, DataSource
    from edgebnn.ir import BNNModel
    from edgebnn.metrics import Predictive
    from edgebnn.runtime import Session

def lowering_quality(float_ir: BNNModel, lowered: BNNModel, *, data: DataSource = "digits",
                     split: str | None = None, ood_data: DataSource | None = None, samples: int = 16, seed: int = 0,
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
                             ood, progress)[0]
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


def _reference(model: BNNModel, samples: int, seed: int) -> Callable[[np.ndarray], Predictive]:
    from edgebnn.metrics import predictive_from_logits
    from edgebnn.runtime.reference import Reference

    ref = Reference(model)
    return lambda x: predictive_from_logits(ref.logits(x, samples, seed))


class _Sums:
    """One predictor's running metrics over a stream, plus its per-input uncertainties."""

    def __init__(self) -> None:
        from edgebnn.metrics import MetricSums

        self.metrics = MetricSums()
        self.entropy: list[np.ndarray] = []
        self.mutual_info: list[np.ndarray] = []

    def report(self) -> dict[str, float]:
        return self.metrics.report()


def _stream(predictors: Iterable[Callable[[np.ndarray], Predictive]], dataset: Dataset,
            progress: Progress | None, *, labelled: bool = True) -> list[_Sums]:
    """Run every predictor on every batch of ``dataset``; only metric sums and two floats per input are kept."""
    from edgebnn.data import DEFAULT_BATCH

    fns = list(predictors)
    sums = [_Sums() for _ in fns]
    done = 0
    for x, y in dataset.batches(DEFAULT_BATCH):
        for fn, acc in zip(fns, sums, strict=True):
            pred = fn(x)
            if labelled and y is not None:
                acc.metrics.add(pred.probs, y)
            acc.entropy.append(pred.entropy)
            acc.mutual_info.append(pred.mutual_info)
        done += len(x)
        if progress:
            progress(done, dataset.n)
    return sums


def _measure(predictors: Sequence[Callable[[np.ndarray], Predictive]], dataset: Dataset, ood: Dataset | None,
             progress: Progress | None) -> tuple[list[dict[str, Any]], list[_Sums], list[_Sums] | None]:
    """Each predictor's metrics on ``dataset`` (and its ``ood`` report against the ``ood`` inputs), with the sums."""
    import numpy as np

    total = dataset.n + (ood.n if ood else 0)

    def step(offset: int) -> Progress | None:
        return (lambda done, _n: progress(offset + done, total)) if progress else None

    sums = _stream(predictors, dataset, step(0))
    reports: list[dict[str, Any]] = [dict(s.report()) for s in sums]
    if ood is None:
        return reports, sums, None
    from edgebnn.metrics import ood_report

    outs = _stream(predictors, ood, step(dataset.n), labelled=False)
    for report, s, out in zip(reports, sums, outs, strict=True):
        in_mi, ood_mi = np.concatenate(s.mutual_info), np.concatenate(out.mutual_info)
        report["ood"] = {"data": ood.name, "n": ood.n,
                         **ood_report(np.concatenate(s.entropy), in_mi, np.concatenate(out.entropy), ood_mi),
                         "mean_mutual_info_in": float(in_mi.mean()), "mean_mutual_info_ood": float(ood_mi.mean())}
    return reports, sums, outs


def dataset_for(model: BNNModel | Session, data: DataSource, *, split: str | None = None, labels: bool = True,
                option: str = "--data") -> Dataset:
    """Open ``data`` (:func:`edgebnn.data.load_data`) for ``model``: its input shape and class count are checked."""
    from edgebnn.data import load_data
    from edgebnn.ir import BNNModel

    shape: tuple[int, ...]
    classes: int | None
    if isinstance(model, BNNModel):
        shape, classes = tuple(model.manifest.input_shape[1:]), model.manifest.num_classes
    else:
        shape, classes = model.input_shape, model.meta.num_classes
    where = model.where
    # Files are checked against the model's input shape as they are opened (the message names the file).
    want = None if isinstance(data, str) and data == "digits" else shape
    dataset = load_data(data, split=split, input_shape=want, num_classes=classes, labels=labels, option=option)
    if tuple(dataset.input_shape) != tuple(shape):
        raise InvalidOptionError(f"{where}: takes inputs {tuple(shape)}, {dataset.name} has {dataset.input_shape}")
    return dataset


def evaluate_artifact(artifact: BNNModel | Session | PathLike, *, data: DataSource = "digits",
                      split: str | None = None, samples: int | None = None, seed: int = 0,
                      ood_data: DataSource | None = None, plot: PathLike | None = None,
                      progress: Progress | None = None) -> dict[str, Any]:
    """Accuracy, NLL, ECE (15 bins) and Brier of an IR (reference runtime, S samples) or an exported ensemble.

    Data streams in batches, so a shard folder larger than memory is evaluated in bounded memory.

    Args:
        artifact: An ``.ebnn`` or exported ``.onnx`` path, an IR, or a :class:`Session`.
        data: ``digits``, a labelled ``.npz`` (``x``, ``y``), a folder of shards, or ``(x, y)`` arrays
            (:func:`edgebnn.data.load_data`).
        split: Digits split (default ``test``); digits only.
        samples: S for an IR (an export has S built in; default 16, a deep ensemble's M members: M).
        seed: Sampling seed for an IR, and of the host-drawn noise of a ``noise`` export.
        ood_data: Out-of-distribution inputs (``x`` only; any labels are ignored). Adds ``ood``:
            ``auroc_mutual_info``, ``auroc_entropy``, ``aupr_mutual_info``, ``fpr_at_95_tpr``
            (:func:`edgebnn.metrics.ood_report`), ``data``, ``n`` and the mean mutual information of each side.
        plot: Write a PNG: reliability diagram, and the mutual-information histogram (in vs OOD).
        progress: Called as ``progress(rows done, rows total)`` after each batch.

    Returns:
        The ``edgebnn.eval/1`` report: ``artifact``, ``runtime``, ``data``, ``split``, ``accuracy``, ``nll``,
        ``ece``, ``brier``, ``samples``, ``n`` (and ``ood``).

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
    if isinstance(model, Session):
        predict: Callable[[np.ndarray], Predictive] = model.predict
        samples, runtime = model.samples, f"onnxruntime ({model.mode})"
    else:
        from edgebnn.exporters.families import default_samples

        samples = samples if samples is not None else default_samples(model, 16)
        check_samples(samples)
        predict, runtime = _reference(model, samples, seed), "reference"
    dataset = dataset_for(model, data, split=split)
    ood = None if ood_data is None else dataset_for(model, ood_data, split=None, labels=False, option="--ood-data")
    reports, sums, outs = _measure([predict], dataset, ood, progress)
    report: dict[str, Any] = {"artifact": name, "runtime": runtime, **dataset.describe(), **reports[0],
                              "samples": samples}
    report["n"] = dataset.n
    in_mi = np.concatenate(sums[0].mutual_info)
    ood_mi = None if outs is None else np.concatenate(outs[0].mutual_info)
    if plot:
        from edgebnn.plots import plot_evaluation

        plot_evaluation(sums[0].metrics.reliability(), in_mi, ood_mi, plot,
                        title=f"{Path(name).name} on {dataset.name}" + (f" vs {ood.name}" if ood else ""))
    return report


def profile_artifact(artifact: str | Path, *, device: str = "cpu", samples: int = 16, mode: str = "auto",
                     onnx_path: str | None = None, engine: str | None = None, baseline_runner: str = "auto",
                     bench_results: str | None = None, remote: str | None = None, remote_edgebnn: str = "edgebnn",
                     batch: int = 1, runs: int = 200, warmup: int = 20, threads: int = 2,
                     power_meter: str | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Profile an .ebnn's ensemble against its float baselines built from the same IR, on one target.

    The ensemble is ``engine`` (a TensorRT engine, rtx/jetson), ``onnx_path`` (an exported ONNX), or exported
    on the fly in ``mode`` (``auto``: the target's :meth:`~edgebnn.targets.base.Target.default_mode`, reading
    ``bench_results`` on the CPU). ``remote="user@host"`` runs the whole profile on that machine over ssh
    (:mod:`edgebnn.targets.remote`) and returns its report.
    """
    from edgebnn.exporters.ensemble import export_onnx
    from edgebnn.runtime.session import read_export
    from edgebnn.targets.profiler import profile
    from edgebnn.targets.registry import get_target

    model = load_ir(artifact)  # validated here, also before copying it to a remote machine
    if remote:
        from edgebnn.targets.remote import profile_remote

        options = {"device": device, "samples": samples, "mode": None if mode == "auto" else mode,
                   "baseline_runner": baseline_runner, "batch": batch, "runs": runs, "warmup": warmup,
                   "threads": threads, "power_meter": power_meter}
        if progress:
            progress(f"on {remote}")
        return profile_remote(remote, artifact, options, engine=engine, onnx_path=onnx_path,
                              remote_edgebnn=remote_edgebnn)
    ensemble = None
    mode_reason = None
    if engine:
        if onnx_path:
            raise InvalidOptionError("--engine and --onnx: give one (the engine is the ensemble that is profiled)")
    elif onnx_path:
        ensemble, meta, _ = read_export(onnx_path)
        if meta.samples != samples:
            raise InvalidOptionError(f"{onnx_path}: was exported with S={meta.samples}; pass --samples {meta.samples}")
    else:
        if mode == "auto":
            mode, mode_reason = get_target(device).default_mode(samples=samples, batch=batch,
                                                                bench_results=bench_results)
        ensemble = export_onnx(model, samples, mode=mode)
    report = profile(model, ensemble, device=device, samples=samples, engine=engine,
                     baseline_runner=baseline_runner, batch=batch, runs=runs, warmup=warmup,
                     threads=threads, power_meter=power_meter, progress=progress)
    report["mode_reason"] = mode_reason
    return report
