"""One trial, as pure functions of a picklable :class:`TrialJob`: lower, export, evaluate, profile.

:func:`evaluate_trial` lowers the IR with the trial's scheme, bits and σ bits (:func:`edgebnn.api.lower`), exports the
ensemble (S, mode, weight format, hoisting) and evaluates it in onnxruntime on the search data
(:func:`edgebnn.api.evaluate_artifact`); :func:`profile_trial` compiles the exported graph for the named device
(:func:`edgebnn.targets.registry.get_target`) and times it (:func:`edgebnn.targets.profiler.measure`, with the
device's power meter). The two halves are separate so a cluster can run the first on CPU nodes and the second
on the board it names (:mod:`edgebnn.search.executors`); :func:`run_trial` runs both in one process.

A worker process opens the model and the data once (:func:`open_inputs`), and :func:`warm_up` does it, with the
imports a trial needs, before the first trial arrives; the trials of one search then share them.

A failure becomes data, never an exception: an error while lowering, exporting or evaluating makes the trial
``failed`` with its one-line error; an error while profiling (a device whose runtime is not installed here)
leaves latency and energy null with ``profile_error``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebnn.search.objectives import TRIAL_METRICS
from edgebnn.search.space import ANYTIME, TrialConfig, exact_noise

if TYPE_CHECKING:
    from edgebnn.data import Dataset
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.ir import BNNModel


@dataclass(frozen=True)
class TrialJob:
    """Everything a worker needs to run one trial (plain data: it crosses process and machine boundaries).

    Attributes:
        number: The Optuna trial number.
        config: What to lower and export.
        model: Path of the ``.ebnn`` IR (float BNN).
        data: Labelled search data (``digits`` means its ``val`` split).
        ood_data: Out-of-distribution inputs, or None.
        seed: Seeds the lowering, the baked samples and the host noise.
        device: Device profile the trial is profiled on.
        runs, warmup: Timed and untimed runs of the profile (0 runs: no profile).
        threads: onnxruntime threads of evaluation and profiling.
        rows: With a budget, the trial is evaluated on the selection rows only: ``(fraction, seed, max_rows)`` of
            :func:`selection_rows` (the others certify the best trial, :mod:`edgebnn.search.certify`); None: all.
    """

    number: int
    config: TrialConfig
    model: str
    data: str
    ood_data: str | None
    seed: int
    device: str
    runs: int = 20
    warmup: int = 3
    threads: int = 1
    rows: tuple[float, int, int] | None = None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def data_split(data: str) -> str | None:
    """The split a search evaluates on: ``val`` for the built-in digits (never the test split)."""
    return "val" if data == "digits" else None


Stamp = tuple[tuple[str, int, int], ...]


def _stamp(source: str | None) -> Stamp:
    """Name, size and modification time of a file, or of each file of a folder: a changed input is opened again."""
    from edgebnn.data import DIGITS

    if source is None or source == DIGITS or not Path(source).exists():
        return ()
    path = Path(source)
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    return tuple((f.name, (st := f.stat()).st_size, st.st_mtime_ns) for f in files)


@functools.lru_cache(maxsize=1)
def _open(model: str, data: str, ood_data: str | None, rows: tuple[float, int, int] | None,
          _stamps: tuple[Stamp, ...]) -> tuple[BNNModel, Dataset, Dataset | None]:
    from edgebnn.api import dataset_for, load_ir

    ir = load_ir(model)
    ood = None if ood_data is None else dataset_for(ir, ood_data, labels=False, option="--ood-data")
    dataset = dataset_for(ir, data, split=data_split(data))
    if rows is not None:
        dataset, ood = selection_rows(dataset, ood, rows)
    return ir, dataset, ood


def selection_rows(dataset: Dataset, ood: Dataset | None,
                   rows: tuple[float, int, int]) -> tuple[Dataset, Dataset | None]:
    """The rows a budgeted search's trials are measured on: ``fraction`` of the first ``max_rows``, drawn with
    ``seed`` (:class:`edgebnn.budget.Rows`, the split ``lower_within_budget(..., order="split")`` makes), in
    memory."""
    from edgebnn.budget import Rows

    fraction, seed, max_rows = rows
    return Rows(dataset, ood, max_rows, fraction, seed).selection()


def open_inputs(model: str, data: str, ood_data: str | None,
                rows: tuple[float, int, int] | None = None) -> tuple[BNNModel, Dataset, Dataset | None]:
    """The float BNN and the search data (and OOD inputs; ``rows``: their selection rows), opened once per process
    while the files are unchanged.

    Lowering does not modify the IR, and a :class:`~edgebnn.data.Dataset` reads its files again on each pass,
    so the trials of a search share them; the cache holds one search's inputs.
    """
    return _open(model, data, ood_data, rows, (_stamp(model), _stamp(data), _stamp(ood_data)))


def warm_up(model: str, data: str, ood_data: str | None, rows: tuple[float, int, int] | None = None) -> None:
    """Import what a trial runs and open its inputs in this process, before its first trial arrives."""
    import edgebnn.exporters.export
    import edgebnn.runtime
    import edgebnn.targets.profiler
    import edgebnn.targets.registry  # noqa: F401

    with contextlib.suppress(Exception):  # each trial opens them again and records the error as its own
        open_inputs(model, data, ood_data, rows)


def trial_export_config(lowered: BNNModel, config: TrialConfig, seed: int, device: str) -> ExportConfig:
    """The export configuration of a trial: what ``edgebnn export --rng host`` writes for its config on ``device``
    (the graph form export writes for the device; ``auto`` samples: the anytime ensemble with the rule's defaults;
    SWAG: per-weight noise, :func:`~edgebnn.search.space.exact_noise`)."""
    from edgebnn.exporters.config import ExportConfig

    c = config
    export = ExportConfig(c.samples if c.samples == ANYTIME else int(c.samples), mode=c.mode, weights=c.weights,
                          hoist=c.hoist, seed=seed, device=device, rng="host")
    top = export.resolve(lowered).samples  # an anytime ensemble's largest count
    return dataclasses.replace(export, noise=exact_noise(lowered, c.mode, top) or "auto")


def trial_export(model: BNNModel, config: TrialConfig, seed: int, device: str) -> tuple[Any, Any]:
    """``(lowered IR, exported ONNX proto)`` of a trial: the file ``edgebnn export --rng host`` writes for its config
    (and ``search --export-best`` for the best trial): :func:`trial_export_config`."""
    from edgebnn.api import lower
    from edgebnn.exporters.export import export_model

    c = config
    lowered = lower(model, c.scheme, seed=seed, bits=c.bits_value, **c.options)
    return lowered, export_model(lowered, trial_export_config(lowered, c, seed, device)).proto


def evaluate_trial(job: TrialJob) -> tuple[dict[str, Any], bytes | None]:
    """Lower, export and evaluate; returns ``(result, exported ONNX bytes or None when it failed)``."""
    from edgebnn.api import evaluate_artifact
    from edgebnn.exporters.sizes import deployed_bytes
    from edgebnn.runtime import Session

    c = job.config
    result: dict[str, Any] = {"number": job.number, "state": "failed", "config": c.to_dict(), "metrics": None,
                              "bytes": None, "artifact_bytes": None, "engine_bytes": None, "ir_bytes": None,
                              "deployed": None,
                              "compression_ratio": None, "ir_compression_ratio": None,
                              "latency_ms": None, "energy_mj": None, "energy_reason": None, "error": None,
                              "profile_error": None}
    try:
        model, dataset, ood = open_inputs(job.model, job.data, job.ood_data, job.rows)
        lowered, proto = trial_export(model, c, job.seed, job.device)
        report = lowered.lowering_report
        onnx_bytes = proto.SerializeToString(deterministic=True)  # the bytes `export` writes
        ev = evaluate_artifact(Session(onnx_bytes, seed=job.seed, threads=job.threads), data=dataset, seed=job.seed,
                               ood_data=ood)
    except Exception as e:  # a failed trial is recorded with its error; the search goes on
        result["error"] = _one_line(e)
        return result, None
    metrics = {k: ev[k] for k in TRIAL_METRICS if k in ev}
    if "samples_used" in ev:  # an anytime trial: the samples its inputs drew (mean)
        metrics["samples_used"] = ev["samples_used"]["mean"]
    if "ood" in ev:
        metrics["auroc"] = ev["ood"]["auroc_mutual_info"]
    deployed = deployed_bytes(onnx_bytes, float_bnn_bytes=int(report["float_bnn_bytes"]),
                              ebnn_bytes=int(report["ebnn_bytes"]))
    try:
        engine = engine_bytes(proto, job.device)
    except Exception as e:  # the builder refused this trial's graph: a failed trial, with TensorRT's reason
        result["error"] = _one_line(e)
        return result, None
    size = deployed.file_bytes if engine is None else engine  # what the device loads: on rtx, the engine
    result.update(state="complete", metrics=metrics, bytes=size, artifact_bytes=size, engine_bytes=engine,
                  ir_bytes=int(report["total_bytes"]), deployed=deployed.to_dict(),
                  compression_ratio=int(report["float_bnn_bytes"]) / size,
                  ir_compression_ratio=report["float_bnn_bytes"] / report["total_bytes"], n=ev["n"])
    return result, onnx_bytes


def engine_bytes(proto: Any, device: str) -> int | None:
    """The bytes of the engine TensorRT for RTX builds from ``proto`` when ``device`` builds its engines ahead of
    time (``rtx``); None elsewhere (onnxruntime loads the ONNX itself; Jetson builds on the board)."""
    from edgebnn.devices import get_device

    profile = get_device(device)
    if profile.builder != "tensorrt-rtx":
        return None
    from edgebnn.exporters.tensorrt import compile_engine

    with tempfile.TemporaryDirectory(prefix="edgebnn-search-") as tmp:
        return int(compile_engine(proto, Path(tmp) / "trial.engine", profile.name)["engine_bytes"])


def profile_trial(result: dict[str, Any], onnx_bytes: bytes | None, job: TrialJob) -> dict[str, Any]:
    """Time the exported ensemble on ``job.device`` (batch 1, median of ``job.runs``); returns the result. An anytime
    ensemble's cost depends on its input: it runs the search data's first ``job.runs`` inputs in turn (random
    numbers would be unfamiliar inputs, which draw the most), and its latency is their mean."""
    if onnx_bytes is None or job.runs <= 0:
        return result
    import numpy as np
    import onnx

    from edgebnn.runtime.session import read_export
    from edgebnn.targets.base import CompileOptions
    from edgebnn.targets.profiler import measure
    from edgebnn.targets.registry import get_target

    try:
        proto = onnx.load_from_string(onnx_bytes)
        meta = read_export(proto)[1]
        shape = (1, *meta.input_shape[1:])
        target = get_target(job.device)
        with tempfile.TemporaryDirectory(prefix="edgebnn-search-") as tmp:
            exe = target.compile(proto, options=CompileOptions(name=f"trial{job.number}", workdir=tmp,
                                                               threads=job.threads))
            x = np.random.default_rng(0).random(shape, dtype=np.float32)
            call = exe.bind(x)
            if meta.anytime is not None:
                _, dataset, _ = open_inputs(job.model, job.data, job.ood_data)
                rows = next(dataset.batches(max(1, job.runs)))[0]
                calls = [exe.bind(rows[i:i + 1]) for i in range(len(rows))]
                turn = iter(range(10**12))

                def call() -> Any:
                    return calls[next(turn) % len(calls)]()

            with target.open_meter(None) as meter:
                m = measure(call, batch=1, runs=job.runs, warmup=job.warmup, meter=meter)
    except Exception as e:  # no runtime for this device here: the trial keeps its metrics
        return {**result, "profile_error": _one_line(e)}
    stat = "mean" if meta.anytime is not None else "p50"  # an anytime ensemble: the mean over the inputs
    return {**result, "latency_ms": m.latency_ms[stat], "energy_mj": m.energy.get("energy_mj_per_inference"),
            "energy_reason": m.energy.get("reason"), "runner": f"{exe.name} ({exe.provider})"}


def run_trial(job: TrialJob) -> dict[str, Any]:
    """:func:`evaluate_trial`, then :func:`profile_trial`, in this process."""
    result, onnx_bytes = evaluate_trial(job)
    return profile_trial(result, onnx_bytes, job)
