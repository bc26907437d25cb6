"""``edgebnn profile``: the exported ensemble and both float baselines, measured in one run.

Latency (ARCHITECTURE.md §6): ``warmup`` untimed runs, then ``runs`` timed runs of one batch each;
min/mean/p50/p90/p95/p99 in ms and throughput in inferences/s (batch / mean latency). The ``float_bnn``
baseline needs S graph runs per inference (one posterior sample each, noise drawn in the graph, as
bayesian-torch does it), so its latency is the time of those S runs.

Energy: the power meter integrates power over the timed window minus the idle power measured just
before; with no sensor the figure is null and ``energy_reason`` says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from edgebnn import __version__
from edgebnn.errors import InvalidOptionError
from edgebnn.ir import BNNModel
from edgebnn.runtime import Session
from edgebnn.runtime.reference import check_samples
from edgebnn.targets.devices import get_device
from edgebnn.targets.power import open_meter
from edgebnn.targets.runners import OrtRunner

SCHEMA = "edgebnn.profile/1"


@dataclass
class Measurement:
    latency_ms: dict[str, float]
    throughput_per_s: float
    energy: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms,
            "throughput_per_s": self.throughput_per_s,
            "energy_mj_per_inference": self.energy.get("energy_mj_per_inference"),
            "energy_source": self.energy.get("source"),
            "energy_reason": self.energy.get("reason"),
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


def profile(
    model: BNNModel,
    ensemble: onnx.ModelProto,
    *,
    device: str = "cpu",
    samples: int,
    batch: int = 1,
    runs: int = 100,
    warmup: int = 10,
    threads: int = 2,
    power_meter: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure ``ensemble`` (an exported S-sample graph) against the float baselines of ``model``."""
    from edgebnn.exporters.ensemble import float_bnn, float_deterministic

    check_samples(samples)
    if batch <= 0 or runs <= 0 or warmup < 0:
        raise InvalidOptionError(f"--batch {batch} / --runs {runs} / --warmup {warmup}: must be positive")
    dev = get_device(device)
    if dev.kind != "cpu":
        raise InvalidOptionError(
            f"--device {device}: profiling on {dev.kind} needs the TensorRT runner (edgebnn profile --engine); "
            "this build profiles onnxruntime on the CPU"
        )
    x = np.random.default_rng(0).random((batch, *model.manifest.input_shape[1:]), dtype=np.float32)
    session = Session(ensemble, threads=threads)  # fills noise inputs on the host, inside the timed call
    runners = {
        "float_deterministic": OrtRunner(float_deterministic(model), threads=threads),
        "float_bnn": OrtRunner(float_bnn(model), threads=threads),
    }
    calls: dict[str, Callable[[], Any]] = {
        "ensemble": lambda: session.predict(x),
        "float_deterministic": lambda: runners["float_deterministic"].run(x),
        "float_bnn": lambda: [runners["float_bnn"].run(x) for _ in range(samples)],
    }
    results: dict[str, Measurement] = {}
    with open_meter(power_meter, dev.name) as meter:
        for name, fn in calls.items():
            if progress:
                progress(name)
            results[name] = measure(fn, batch=batch, runs=runs, warmup=warmup, meter=meter)
    ens = results["ensemble"]
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "edgebnn_version": __version__,
        "device": dev.name,
        "runner": runners["float_deterministic"].name,
        "provider": runners["float_deterministic"].provider,
        "mode": session.mode,
        "threads": threads,
        "batch": batch,
        "samples": samples,
        "runs": runs,
        "warmup": warmup,
        "artifact_bytes": len(ensemble.SerializeToString()),
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
