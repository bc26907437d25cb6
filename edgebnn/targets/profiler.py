"""``edgebnn profile``: the exported ensemble and both float baselines, measured in one run.

Latency (docs/design.md): ``warmup`` untimed runs, then ``runs`` timed runs of one batch each;
min/mean/p50/p90/p95/p99 in ms and throughput in inferences/s (batch / mean latency). The ``float_bnn``
baseline needs S graph runs per inference (one posterior sample each, noise drawn in the graph, as
bayesian-torch does it), so its latency is the time of those S runs. Each timed call returns only when
its work has finished (CUDA and TensorRT calls synchronize); inputs are staged on the device before
timing, outputs stay there (see :mod:`edgebnn.targets.runners`).

Energy: the power meter integrates power over the timed window minus the idle power measured just
before; with no sensor the figure is null and ``energy_reason`` says why.

What runs where:

=========  ===================================  ==================================  =========================
device     ensemble                              float_deterministic                 float_bnn
=========  ===================================  ==================================  =========================
cpu        onnxruntime CPU (``Session``)         onnxruntime CPU (or torch CPU)      onnxruntime CPU (or torch)
rtx,       TensorRT engine (``--engine``, or     TensorRT engine built here from     torch CUDA; else
jetson     built here from the ensemble ONNX)    the same IR                         onnxruntime CUDA
=========  ===================================  ==================================  =========================

``float_bnn`` never runs in TensorRT: it must draw new weights on every pass, and TensorRT imports random
ops as a Fill layer that ignores seeds (edgebnn's compatibility check refuses them), so the S sampled
passes run where bayesian-torch users run them, in torch on the GPU. ``--baseline-runner onnxruntime`` or
``torch`` puts both baselines on that runtime instead.

Default export mode (``mode="auto"``): on rtx/jetson ``baked``; on the CPU the fastest mode in a benchmark
result file when there is one (:func:`fastest_mode_in`), else ``baked``.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgebnn import __version__
from edgebnn.errors import InvalidArtifactError, InvalidOptionError, MissingDependencyError
from edgebnn.exporters.metadata import ExportMetadata
from edgebnn.ir import BNNModel
from edgebnn.runtime.reference import check_samples
from edgebnn.schemas import PROFILE as SCHEMA
from edgebnn.targets.devices import DeviceProfile, get_device
from edgebnn.targets.power import open_meter
from edgebnn.targets.runners import OrtRunner, TensorRTRunner, TorchRunner, import_tensorrt

MODES = ("baked", "noise", "analytic")
BASELINE_RUNNERS = ("auto", "onnxruntime", "torch")


@dataclass
class Measurement:
    latency_ms: dict[str, float]
    throughput_per_s: float
    energy: dict[str, Any]
    runner: str | None = None
    provider: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms,
            "throughput_per_s": self.throughput_per_s,
            "energy_mj_per_inference": self.energy.get("energy_mj_per_inference"),
            "energy_source": self.energy.get("source"),
            "energy_reason": self.energy.get("reason"),
            "runner": self.runner,
            "provider": self.provider,
        }


def latency_stats(seconds: list[float], batch: int) -> tuple[dict[str, float], float]:
    ms = np.asarray(seconds) * 1e3
    stats = {
        "min": float(ms.min()),
        "mean": float(ms.mean()),
        "p50": float(np.percentile(ms, 50)),
        "p90": float(np.percentile(ms, 90)),
        "p95": float(np.percentile(ms, 95)),
        "p99": float(np.percentile(ms, 99)),
    }
    return stats, batch * 1e3 / stats["mean"]


def measure(fn: Callable[[], Any], *, batch: int, runs: int, warmup: int, meter: Any) -> Measurement:
    for _ in range(warmup):
        fn()
    times = []
    meter.start()
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    energy = meter.stop(runs * batch).to_dict()
    stats, throughput = latency_stats(times, batch)
    return Measurement(stats, throughput, energy)


# -- default mode -----------------------------------------------------------------------------------------


_CONTEXT_KEYS = ("samples", "batch", "device", "model")


def _bench_records(obj: Any, context: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Mode records at any depth, each carrying the samples/batch/device/model of the objects around it."""
    context = dict(context or {})
    if isinstance(obj, dict):
        context.update({k: obj[k] for k in _CONTEXT_KEYS if k in obj and not isinstance(obj[k], dict | list)})
        if obj.get("mode") in MODES:
            yield {**context, **obj}
        for key, value in obj.items():
            if key in MODES and isinstance(value, dict) and "mode" not in value:
                yield {**context, "mode": key, **value}
            elif isinstance(value, dict | list):
                yield from _bench_records(value, context)
    elif isinstance(obj, list):
        for item in obj:
            yield from _bench_records(item, context)


def _latency(record: dict[str, Any]) -> float | None:
    lat = record.get("latency_ms", record.get("p50_ms", record.get("p50")))
    if isinstance(lat, dict):
        lat = lat.get("p50", lat.get("mean"))
    return float(lat) if isinstance(lat, int | float) and not isinstance(lat, bool) else None


def fastest_mode_in(path: str | Path, *, device: str = "cpu", samples: int | None = None,
                    batch: int | None = None) -> tuple[str, float] | None:
    """The export mode with the lowest latency in a benchmark result file, or None when it has none.

    The file is JSON; every object with a ``mode`` (baked/noise/analytic) and a latency — ``latency_ms``
    as a number or as ``{"p50": ...}`` (an ``edgebnn profile --json`` report qualifies), or ``p50_ms`` — is
    a record, found at any depth; so is ``{"baked": {...}, "noise": {...}}``. A record inherits ``samples``,
    ``batch``, ``device`` and ``model`` from the objects that contain it (``bench/ensemble_latency.py`` writes
    them on the cell); records with a ``device``, ``samples`` or ``batch`` other than asked are skipped.

    Returns:
        ``(mode, p50 ms)`` of the fastest record.

    Raises:
        InvalidOptionError: The file exists but is not JSON.
    """
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidOptionError(f"--bench-results {path}: not a readable JSON file ({e})") from e
    best: tuple[str, float] | None = None
    for rec in _bench_records(data):
        if "device" in rec and str(rec["device"]) != device:
            continue
        if samples is not None and "samples" in rec and rec["samples"] != samples:
            continue
        if batch is not None and "batch" in rec and rec["batch"] != batch:
            continue
        lat = _latency(rec)
        if lat is not None and (best is None or lat < best[1]):
            best = (rec["mode"], lat)
    return best


def default_mode(device: str, *, samples: int | None = None, batch: int | None = None,
                 bench_results: str | Path | None = None) -> tuple[str, str]:
    """``(mode, reason)``: the export mode ``profile`` uses on ``device`` when none is given."""
    dev = get_device(device)
    if dev.kind != "cpu":
        # TensorRT imports RandomNormal as a Fill layer that ignores its seed (whether it redraws per run is
        # undocumented) and DLA runs no random ops at all; a noise graph would need host-drawn noise copied
        # in per call. Baked samples are plain constants: deterministic, DLA-friendly, no transfers.
        return "baked", f"{dev.kind}: TensorRT ignores RNG seeds and DLA has no random ops, so samples are baked"
    if bench_results is None:
        return "baked", "no --bench-results given: baked (no random numbers at run time)"
    path = Path(bench_results)
    found = fastest_mode_in(path, device=dev.name, samples=samples, batch=batch)
    if found is None:
        raise InvalidOptionError(f"--bench-results {path}: no CPU mode measurements for S={samples}, "
                                 f"batch {batch} in it")
    return found[0], f"fastest measured mode in {path} ({found[1]:.3g} ms p50)"


# -- runners per target ----------------------------------------------------------------------------------


def _baseline_runners(model: BNNModel, dev: DeviceProfile, choice: str, threads: int,
                      build: Callable[[onnx.ModelProto, str], Any] | None) -> dict[str, Any]:
    from edgebnn.exporters.ensemble import float_bnn, float_deterministic

    det, bnn = float_deterministic(model), float_bnn(model)
    if dev.kind == "cpu":
        if choice == "torch":
            return {"float_deterministic": TorchRunner(det, threads=threads),
                    "float_bnn": TorchRunner(bnn, threads=threads)}
        return {"float_deterministic": OrtRunner(det, threads=threads), "float_bnn": OrtRunner(bnn, threads=threads)}
    if choice == "onnxruntime":
        return {"float_deterministic": OrtRunner(det, provider="cuda"), "float_bnn": OrtRunner(bnn, provider="cuda")}
    if choice == "torch":
        return {"float_deterministic": TorchRunner(det, device="cuda"), "float_bnn": TorchRunner(bnn, device="cuda")}
    assert build is not None
    return {"float_deterministic": build(det, "float_deterministic"), "float_bnn": _gpu_sampling_runner(bnn)}


def _gpu_sampling_runner(graph: onnx.ModelProto) -> Any:
    """float_bnn on the GPU: torch CUDA, else onnxruntime's CUDA provider (RandomNormal runs there)."""
    try:
        return TorchRunner(graph, device="cuda")
    except MissingDependencyError as torch_missing:
        try:
            return OrtRunner(graph, provider="cuda")
        except MissingDependencyError as ort_missing:
            raise MissingDependencyError(
                f"the float_bnn baseline on the GPU needs torch with CUDA or onnxruntime-gpu ({torch_missing}; "
                f"{ort_missing})"
            ) from ort_missing


def _engine_export(engine: Path, samples: int) -> ExportMetadata | None:
    """The edgebnn export metadata of the ONNX an engine was built from (named in its manifest), if beside it."""
    from edgebnn.exporters.tensorrt import manifest_path
    from edgebnn.runtime.session import read_export

    try:
        manifest = json.loads(manifest_path(engine).read_text())
    except (OSError, json.JSONDecodeError):
        return None  # check_engine reports a bad manifest with the right message
    onnx_file = engine.parent / str(manifest.get("onnx", ""))
    if not manifest.get("onnx") or not onnx_file.is_file():
        return None
    meta = read_export(onnx_file)[1]
    if meta.samples != samples:
        raise InvalidOptionError(f"{engine}: built from an S={meta.samples} ensemble ({onnx_file.name}); "
                                 f"pass --samples {meta.samples}")
    return meta


def profile(
    model: BNNModel,
    ensemble: onnx.ModelProto | None,
    *,
    device: str = "cpu",
    samples: int,
    engine: str | Path | None = None,
    baseline_runner: str = "auto",
    batch: int = 1,
    runs: int = 100,
    warmup: int = 10,
    threads: int = 2,
    power_meter: str | None = None,
    progress: Callable[[str], None] | None = None,
    workspace_mib: int = 1024,
) -> dict[str, Any]:
    """Measure an ensemble against the float baselines of ``model`` on ``device``.

    Args:
        model: The IR the ensemble and the baselines come from.
        ensemble: The exported S-sample graph; on rtx/jetson it is built into an engine here unless
            ``engine`` is given (then it may be None).
        device: Device profile (``cpu``, ``rtx``, ``jetson``, ``jetson-orin-*``).
        samples: Ensemble size S (the float_bnn baseline runs S passes per inference).
        engine: A TensorRT engine of the ensemble, with its build manifest beside it (rtx/jetson only).
        baseline_runner: ``auto``, ``onnxruntime`` or ``torch`` (see the module docstring).
        batch, runs, warmup: Batch size, timed runs and untimed runs per graph.
        threads: onnxruntime / torch CPU threads.
        power_meter: Meter name, or None to try the device's meters.
        progress: Called with the name of each graph before it is measured.
        workspace_mib: TensorRT builder workspace for engines built here.

    Raises:
        MissingDependencyError: rtx/jetson without the ``tensorrt`` package (or without torch/onnxruntime
            CUDA for the float_bnn baseline).
        InvalidArtifactError: The engine does not match its manifest, the installed TensorRT or the device.
        InvalidOptionError: Inconsistent options.
    """
    check_samples(samples)
    if batch <= 0 or runs <= 0 or warmup < 0:
        raise InvalidOptionError(f"--batch {batch} / --runs {runs} / --warmup {warmup}: must be positive")
    if baseline_runner not in BASELINE_RUNNERS:
        raise InvalidOptionError(f"--baseline-runner {baseline_runner}: choose one of {', '.join(BASELINE_RUNNERS)}")
    dev = get_device(device)
    x = np.random.default_rng(0).random((batch, *model.manifest.input_shape[1:]), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="edgebnn-profile-") as tmp:
        if dev.kind == "cpu":
            if engine is not None:
                raise InvalidOptionError(f"--engine {engine}: a TensorRT engine runs on rtx or jetson, not the cpu")
            if ensemble is None:
                raise InvalidOptionError("profile on the cpu needs the exported ensemble")
            from edgebnn.runtime import Session

            session = Session(ensemble, threads=threads)  # fills noise inputs on the host, inside the timed call
            ens_call: Callable[[], Any] = lambda: session.predict(x)  # noqa: E731
            ens_runner, ens_provider, mode = "onnxruntime", "CPUExecutionProvider", session.mode
            ens_bytes = len(ensemble.SerializeToString())
            build = None
        else:
            import_tensorrt()  # fail first, with what to install, before exporting or building anything

            def build(graph: onnx.ModelProto, name: str) -> TensorRTRunner:
                from edgebnn.exporters.ensemble import save_onnx
                from edgebnn.exporters.tensorrt import build_engine

                onnx_path = save_onnx(graph, Path(tmp) / f"{name}.onnx")
                build_engine(onnx_path, Path(tmp) / f"{name}.engine", dev.name, workspace_mib=workspace_mib,
                             max_batch=batch)
                return TensorRTRunner(Path(tmp) / f"{name}.engine", dev.name)

            if engine is not None:
                meta = _engine_export(Path(engine), samples)
                trt_runner = TensorRTRunner(engine, dev.name)
                mode = meta.mode if meta else "unknown (no export ONNX beside the engine)"
                ens_bytes = Path(engine).stat().st_size
            else:
                if ensemble is None:
                    raise InvalidOptionError(f"profile on {dev.name} needs --engine or the exported ensemble")
                from edgebnn.runtime.session import read_export

                mode = read_export(ensemble)[1].mode
                if mode == "noise":
                    raise InvalidOptionError(
                        f"--mode noise on {dev.name}: a noise graph takes host-drawn noise inputs, copied to the GPU "
                        "on every call; profile --mode baked (or analytic) on TensorRT"
                    )
                trt_runner = build(ensemble, "ensemble")
                ens_bytes = trt_runner.engine_path.stat().st_size
            if len(trt_runner.input_names) != 1:
                raise InvalidArtifactError(
                    f"{trt_runner.engine_path}: the engine takes {len(trt_runner.input_names)} inputs "
                    f"({', '.join(trt_runner.input_names)}); profile a baked or analytic ensemble on TensorRT"
                )
            ens_call = trt_runner.bind(x)
            ens_runner, ens_provider = trt_runner.name, trt_runner.provider
        runners = _baseline_runners(model, dev, baseline_runner, threads, build)
        det_call = runners["float_deterministic"].bind(x)
        bnn_call = runners["float_bnn"].bind(x)
        calls: dict[str, Callable[[], Any]] = {
            "ensemble": ens_call,
            "float_deterministic": det_call,
            "float_bnn": lambda: [bnn_call() for _ in range(samples)],
        }
        results: dict[str, Measurement] = {}
        with open_meter(power_meter, dev.name) as meter:
            for name, fn in calls.items():
                if progress:
                    progress(name)
                results[name] = measure(fn, batch=batch, runs=runs, warmup=warmup, meter=meter)
    results["ensemble"].runner, results["ensemble"].provider = ens_runner, ens_provider
    for name, runner in runners.items():
        results[name].runner, results[name].provider = runner.name, runner.provider
    ens = results["ensemble"]
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "edgebnn_version": __version__,
        "device": dev.name,
        "runner": ens_runner,
        "provider": ens_provider,
        "mode": mode,
        "engine": str(engine) if engine is not None else None,
        "threads": threads,
        "batch": batch,
        "samples": samples,
        "runs": runs,
        "warmup": warmup,
        "artifact_bytes": ens_bytes,
        **ens.to_dict(),
        "baselines": {k: results[k].to_dict() for k in ("float_deterministic", "float_bnn")},
    }
    mean = ens.latency_ms["mean"]
    report["ratios"] = {
        "vs_float_deterministic": mean / results["float_deterministic"].latency_ms["mean"],
        "speedup_vs_float_bnn": results["float_bnn"].latency_ms["mean"] / mean,
    }
    return report


def plot_profile(report: dict[str, Any], out_png: str) -> None:
    """Bar chart of mean latency (and energy where measured) for the ensemble and its baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from edgebnn._io import atomic_write

    names = ["ensemble", "float_deterministic", "float_bnn"]
    rows = [report, report["baselines"]["float_deterministic"], report["baselines"]["float_bnn"]]
    lat = [r["latency_ms"]["mean"] for r in rows]
    energy = [r["energy_mj_per_inference"] for r in rows]
    has_energy = all(e is not None for e in energy)
    fig, axes = plt.subplots(1, 2 if has_energy else 1, figsize=(9 if has_energy else 5.5, 3.6), squeeze=False)
    ax = axes[0][0]
    ax.bar(names, lat, color=["#2a7", "#888", "#c55"])
    ax.set_ylabel("mean latency per batch (ms)")
    ax.set_title(f"{report['device']} · S={report['samples']} · batch {report['batch']}")
    for i, v in enumerate(lat):
        ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    if has_energy:
        axes[0][1].bar(names, energy, color=["#2a7", "#888", "#c55"])
        axes[0][1].set_ylabel("energy per inference (mJ)")
    else:
        ax.text(0.5, 0.9, f"energy: n/a ({report['energy_source']})", transform=ax.transAxes, ha="center", fontsize=8)
    fig.tight_layout()
    atomic_write(out_png, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)
