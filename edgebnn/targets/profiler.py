"""``edgebnn profile``: the exported ensemble and both float baselines, measured in one run on one target.

The profile is a loop over ``(name, graph)`` pairs — the ensemble, then the target's float baselines
(:meth:`~edgebnn.targets.base.Target.baselines`) — each compiled by the target
(:func:`edgebnn.targets.registry.get_target`) for the runtime its plan names, then timed. What runs where
is the target's business (:mod:`edgebnn.targets.cpu`, :mod:`edgebnn.targets.gpu`); the profiler only times.

Latency (docs/design.md): ``warmup`` untimed runs, then ``runs`` timed runs of one batch each;
min/mean/p50/p90/p95/p99 in ms and throughput in inferences/s (batch / mean latency). The ``float_bnn``
baseline needs S graph runs per inference (one posterior sample each, noise drawn in the graph, as
bayesian-torch does it), so its latency is the time of those S runs. Each timed call returns only when
its work has finished (CUDA and TensorRT calls synchronize); inputs are staged on the device before
timing, outputs stay there (see :mod:`edgebnn.targets.runners`).

Energy: the target's power meter integrates power over the timed window minus the idle power measured just
before; with no sensor the figure is null and ``energy_reason`` says why.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgebnn._version import __version__
from edgebnn.errors import InvalidOptionError
from edgebnn.ir import BNNModel
from edgebnn.runtime.reference import check_samples
from edgebnn.schemas import PROFILE as SCHEMA
from edgebnn.targets.base import CompileOptions, Executable
from edgebnn.targets.registry import get_target


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


RATIO_OF = "p50s of interleaved runs"
"""What every latency ratio edgebnn prints compares: the graphs' medians over the same interleaved rounds."""


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


def measure_interleaved(calls: dict[str, Callable[[], Any]], *, batch: int, runs: int, warmup: int, meter: Any,
                        progress: Callable[[str], None] | None = None) -> dict[str, Measurement]:
    """Time every graph in the same rounds (round r runs each graph once, in turn), so a load that comes and goes
    on a shared machine slows them alike and their p50 ratio holds; energy, where a sensor measures it, from
    one window of ``runs`` calls per graph after that (a window needs ~1 s of one graph's work)."""
    from edgebnn.targets.power.null import NullMeter

    for name, call in calls.items():
        if progress:
            progress(f"{name} (warm-up)")
        for _ in range(warmup):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(runs):
        if progress and r % max(1, runs // 10) == 0:
            progress(f"round {r + 1}/{runs} of {', '.join(calls)}")
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name, call in calls.items():
        meter.start()
        if not isinstance(meter, NullMeter):
            if progress:
                progress(f"{name} (energy window)")
            for _ in range(runs):
                call()
        energy = meter.stop(runs * batch).to_dict()
        stats, throughput = latency_stats(times[name], batch)
        out[name] = Measurement(stats, throughput, energy)
    return out


def _repeat(call: Callable[[], Any], passes: int) -> Callable[[], Any]:
    """One inference of ``passes`` graph runs (float_bnn: S sampled passes)."""
    return call if passes == 1 else lambda: [call() for _ in range(passes)]


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
        ensemble: The exported S-sample graph, compiled here for the target's default runtime (on rtx/jetson
            a TensorRT engine) unless ``engine`` is given (then it may be None).
        device: Device profile name (``cpu``, ``rtx``, ``jetson``, ``jetson-orin-*``).
        samples: Ensemble size S (the float_bnn baseline runs S passes per inference).
        engine: A compiled ensemble (a TensorRT engine with its build manifest beside it; rtx/jetson only).
        baseline_runner: ``auto``, ``onnxruntime`` or ``torch`` (:meth:`~edgebnn.targets.base.Target.plan`).
        batch, runs, warmup: Batch size, timed runs and untimed runs per graph.
        threads: onnxruntime / torch CPU threads.
        power_meter: Meter name, or None to try the device's meters.
        progress: Called with the name of each graph before it is measured.
        workspace_mib: TensorRT builder workspace for engines built here.

    Raises:
        MissingDependencyError: The runtime a graph needs is not installed (on rtx/jetson: ``tensorrt``,
            torch/onnxruntime CUDA for the float_bnn baseline).
        InvalidArtifactError: The engine does not match its manifest, the installed TensorRT or the device.
        InvalidOptionError: Inconsistent options, or options the device does not support.
    """
    check_samples(samples)
    if batch <= 0 or runs <= 0 or warmup < 0:
        raise InvalidOptionError(f"--batch {batch} / --runs {runs} / --warmup {warmup}: must be positive")
    target = get_target(device)
    plan = target.plan(baseline_runner)
    x = np.random.default_rng(0).random((batch, *model.manifest.input_shape[1:]), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="edgebnn-profile-") as tmp:
        options = CompileOptions(workdir=tmp, threads=threads, max_batch=batch, workspace_mib=workspace_mib)
        if engine is not None:
            ens = target.load(engine, samples=samples)
        elif ensemble is None:
            raise InvalidOptionError(f"profile on {target.name} needs the exported ensemble (or --engine on "
                                     "rtx/jetson)")
        else:
            ens = target.compile(ensemble, options=replace(options, name="ensemble"))
        executables: dict[str, Executable] = {"ensemble": ens}
        for name, graph in target.baselines(model).items():
            executables[name] = target.compile(graph, runtime=plan[name], options=replace(options, name=name))
        passes = {"float_bnn": samples}
        calls = {name: _repeat(exe.bind(x), passes.get(name, 1)) for name, exe in executables.items()}
        with target.open_meter(power_meter) as meter:
            results = measure_interleaved(calls, batch=batch, runs=runs, warmup=warmup, meter=meter,
                                          progress=progress)
    for name, exe in executables.items():
        results[name].runner, results[name].provider = exe.name, exe.provider
    mode = ens.meta.mode if ens.meta else "unknown (no export ONNX beside the engine)"
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "edgebnn_version": __version__,
        "device": target.name,
        "runner": ens.name,
        "provider": ens.provider,
        "mode": mode,
        "engine": str(engine) if engine is not None else None,
        "threads": threads,
        "batch": batch,
        "samples": samples,
        "runs": runs,
        "warmup": warmup,
        "artifact_bytes": ens.size_bytes,
        **results["ensemble"].to_dict(),
        "baselines": {k: results[k].to_dict() for k in ("float_deterministic", "float_bnn")},
    }
    p50 = results["ensemble"].latency_ms["p50"]
    report["ratios"] = {  # one figure per comparison: the medians of the same interleaved rounds
        "of": RATIO_OF,
        "vs_float_deterministic": p50 / results["float_deterministic"].latency_ms["p50"],
        "speedup_vs_float_bnn": results["float_bnn"].latency_ms["p50"] / p50,
    }
    return report


def profile_anytime(model: BNNModel, ensemble: onnx.ModelProto, fixed: onnx.ModelProto,
                    inputs: dict[str, np.ndarray], *, device: str = "cpu", rounds: int = 3, warmup: int = 3,
                    threads: int = 2, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Per-input latency of an anytime ensemble (``--samples auto``), whose cost depends on the input, against the
    fixed export at its largest count S, det-S (the float net on S copies of the input), one float pass and the
    float BNN (S sampled passes), on each set of ``inputs`` (``{"in": x, "ood": x}``, batch 1).

    Every input runs every graph once per round, in turn, ``rounds`` rounds; an input's latency is its median over
    the rounds, and each graph's figures are the p50, p90 and mean over the inputs of a set (the mean is what a
    stream of such inputs costs). Ratios compare means over the same inputs."""
    from edgebnn.exporters.ensemble import float_bnn, float_deterministic
    from edgebnn.exporters.metadata import read_metadata

    meta = read_metadata(ensemble, "ensemble")
    if meta.anytime is None:
        raise InvalidOptionError("profile_anytime: the ensemble is not an anytime export (--samples auto)")
    samples = meta.samples
    if rounds <= 0 or warmup < 0:
        raise InvalidOptionError(f"--runs {rounds} / --warmup {warmup}: must be positive")
    target = get_target(device)
    with tempfile.TemporaryDirectory(prefix="edgebnn-profile-") as tmp:
        options = CompileOptions(workdir=tmp, threads=threads, max_batch=samples)
        exes = {"ensemble": target.compile(ensemble, options=replace(options, name="ensemble")),
                "fixed": target.compile(fixed, options=replace(options, name="fixed")),
                "float_deterministic": target.compile(float_deterministic(model), runtime="onnxruntime",
                                                      options=replace(options, name="float_deterministic")),
                "float_bnn": target.compile(float_bnn(model), runtime="onnxruntime",
                                            options=replace(options, name="float_bnn"))}
        det_s = f"det_{samples}"
        out: dict[str, Any] = {}
        for tag, xs in inputs.items():
            used = np.concatenate([exes["ensemble"].run(xs[i:i + 64])[3] for i in range(0, len(xs), 64)])
            calls = [{"ensemble": exes["ensemble"].bind(x), "fixed": exes["fixed"].bind(x),
                      det_s: exes["float_deterministic"].bind(np.repeat(x, samples, 0)),
                      "float_deterministic": exes["float_deterministic"].bind(x),
                      "float_bnn": _repeat(exes["float_bnn"].bind(x), samples)}
                     for x in (xs[j:j + 1] for j in range(len(xs)))]
            for fn in calls[0].values():
                for _ in range(warmup):
                    fn()
            times = {name: np.zeros((rounds, len(xs))) for name in calls[0]}
            for r in range(rounds):
                if progress:
                    progress(f"{tag} inputs, round {r + 1}/{rounds}")
                for j, per_graph in enumerate(calls):
                    for name, fn in per_graph.items():
                        t0 = time.perf_counter()
                        fn()
                        times[name][r, j] = time.perf_counter() - t0
            per_input = {name: np.median(t, axis=0) * 1e3 for name, t in times.items()}
            graphs = {name: {"p50": float(np.percentile(ms, 50)), "p90": float(np.percentile(ms, 90)),
                             "mean": float(ms.mean())} for name, ms in per_input.items()}
            mean = graphs["ensemble"]["mean"]
            summary = {"mean": float(used.mean()), "p50": float(np.percentile(used, 50)),
                       "p90": float(np.percentile(used, 90))}
            out[tag] = {"n": len(xs), "latency_ms": graphs, "samples_used": summary,
                "ratios": {"of": "means over the same inputs, each input's median of the rounds",
                           "vs_fixed": mean / graphs["fixed"]["mean"], f"vs_{det_s}": mean / graphs[det_s]["mean"],
                           "vs_float_deterministic": mean / graphs["float_deterministic"]["mean"],
                           "speedup_vs_float_bnn": graphs["float_bnn"]["mean"] / mean}}
    return {"schema": SCHEMA, "edgebnn_version": __version__, "device": target.name, "runner": exes["ensemble"].name,
            "provider": exes["ensemble"].provider, "mode": meta.mode, "anytime": dict(meta.anytime),
            "samples": samples, "fixed_mode": read_metadata(fixed, "fixed").mode, "threads": threads, "batch": 1,
            "rounds": rounds, "warmup": warmup, "artifact_bytes": exes["ensemble"].size_bytes,
            "fixed_bytes": exes["fixed"].size_bytes, "per_input": out}


def plot_profile(report: dict[str, Any], out_png: str) -> None:
    """Bar chart of p50 latency (and energy where measured) for the ensemble and its baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from edgebnn._io import atomic_write

    names = ["ensemble", "float_deterministic", "float_bnn"]
    rows = [report, report["baselines"]["float_deterministic"], report["baselines"]["float_bnn"]]
    lat = [r["latency_ms"]["p50"] for r in rows]
    energy = [r["energy_mj_per_inference"] for r in rows]
    has_energy = all(e is not None for e in energy)
    fig, axes = plt.subplots(1, 2 if has_energy else 1, figsize=(9 if has_energy else 5.5, 3.6), squeeze=False)
    ax = axes[0][0]
    ax.bar(names, lat, color=["#2a7", "#888", "#c55"])
    ax.set_ylabel("p50 latency per batch (ms)")
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
