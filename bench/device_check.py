"""The GPU check (``make device-check``): each export mode through the torch CUDA runner against the float baselines
on the same GPU, NVML energy per predictive, and the numerics against onnxruntime on the CPU. One JSON out.

For a machine with an NVIDIA GPU and a CUDA build of torch (no TensorRT needed, onnxruntime may be CPU-only). The
model is LeNet-5 with a synthetic posterior shaped like the trained digits CNN's (``edgebnn.models``), lowered
``fixed``; every mode is exported at S = 16 for the CPU target (the torch runner interprets the ONNX; ``noise_graph``
is the CPU's default artifact, noise drawn in the graph) and timed at batch 1 and 32:

* ``latency_ms``: the profiler's protocol (``edgebnn.targets.profiler.measure``): warm-up, then timed runs that each
  end when the GPU has finished; runs are chosen so each window lasts at least ``--window`` seconds (NVML's energy
  counter updates every 20-100 ms);
* ``energy_mj_per_inference``: NVML's total-energy counter over the window minus the idle power measured just
  before (``edgebnn.targets.power.nvml``); null with the reason where NVML cannot measure;
* ``ratios``: p50 latency over the float deterministic net's (one pass) and the float BNN's (S sampled passes, torch
  drawing fresh weights on the GPU as bayesian-torch does) p50, same GPU, same batch;
* ``numerics``: the largest |Δ| of each output between torch on the GPU and onnxruntime on the CPU for the same input
  (and, for ``noise``, the same host noise; none for graphs that draw their own numbers).

Without a GPU (``--device cpu``, what ``tests/unit/test_device_check.py`` runs) the same JSON is written from torch on
the CPU, with the energy null and its reason: that checks the script, not a GPU.

    PYTHONPATH=. python bench/device_check.py --out device_check.json        # on the GPU machine (make device-check)
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# name -> export options: the exact modes, host noise (same noise into torch and onnxruntime: comparable), and the
# CPU's default artifact (noise drawn in the graph: torch and onnxruntime draw different numbers, so no numerics)
MODES = {"baked": {"mode": "baked"}, "noise": {"mode": "noise", "rng": "host"},
         "noise_graph": {"mode": "noise", "rng": "graph"}, "analytic": {"mode": "analytic"}}


def build_model(seed: int = 0) -> Any:
    import torch

    import edgebnn
    from edgebnn.models import lenet5, synthetic_posterior

    torch.manual_seed(seed)
    return edgebnn.lower(edgebnn.from_torch(synthetic_posterior(lenet5()), (1, 1, 28, 28)), "fixed")


def graphs(model: Any, samples: int) -> dict[str, Any]:
    """The exported modes and the two float baselines, as ONNX protos."""
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.ensemble import float_bnn, float_deterministic
    from edgebnn.exporters.export import export_model

    out = {name: export_model(model, ExportConfig(samples, device="cpu", **options)).proto for name,
           options in MODES.items()}
    out["float_deterministic"] = float_deterministic(model)
    out["float_bnn"] = float_bnn(model)
    return out


def _feed(proto: Any, x: np.ndarray, samples: int, seed: int) -> dict[str, np.ndarray]:
    from edgebnn.exporters.metadata import read_metadata
    from edgebnn.exporters.noise import fill_noise

    feed = {proto.graph.input[0].name: x}
    meta = read_metadata(proto, "device_check")
    if meta.noise_inputs:
        feed.update(fill_noise(list(meta.noise_inputs), x.shape[0], samples, np.random.default_rng(seed)))
    return feed


def _timed(runner: Any, feed: dict[str, np.ndarray], passes: int, batch: int, window_s: float, meter: Any,
           min_runs: int = 20) -> dict[str, Any]:
    from edgebnn.targets.profiler import measure

    call = runner.bind(feed) if hasattr(runner, "bind") else (lambda: runner.run(feed))
    one = call if passes == 1 else (lambda: [call() for _ in range(passes)])
    for _ in range(3):
        one()
    t0 = time.perf_counter()
    one()
    per = max(time.perf_counter() - t0, 1e-6)
    runs = max(min_runs, math.ceil(window_s / per))
    result = measure(one, batch=batch, runs=runs, warmup=5, meter=meter).to_dict()
    result["runs"] = runs
    return result


def _numerics(proto: Any, runner: Any, feed: dict[str, np.ndarray]) -> dict[str, float]:
    from edgebnn.targets.runners import OrtRunner

    ref = OrtRunner(proto, provider="cpu", threads=2).run(feed)
    got = runner.run(feed)
    names = [o.name for o in proto.graph.output]
    return {name: float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
            for name, a, b in zip(names, ref, got, strict=True)}


def run(device: str, samples: int, batches: list[int], window_s: float, min_runs: int = 20) -> dict[str, Any]:
    import torch

    from edgebnn.targets.power import open_meter
    from edgebnn.targets.runners import TorchRunner

    cuda = device.startswith("cuda")
    model = build_model()
    protos = graphs(model, samples)
    meter_device = "rtx" if cuda else "cpu"
    report: dict[str, Any] = {
        "schema": "edgebnn.device_check/1",
        "model": "lenet5 (synthetic posterior, fixed)",
        "samples": samples,
        "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "torch_device": device,
        "window_s": window_s,
        "rows": [],
    }
    with open_meter(None, meter_device) as meter:
        for batch in batches:
            x = np.random.default_rng(batch).random((batch, 1, 28, 28), dtype=np.float32)
            row: dict[str, Any] = {"batch": batch, "graphs": {}}
            for name, proto in protos.items():
                feed = _feed(proto, x, samples, seed=batch)
                try:
                    runner = TorchRunner(proto, device=device)
                    timing = _timed(runner, feed, samples if name == "float_bnn" else 1, batch, window_s, meter,
                                    min_runs)
                    drawn = name in ("float_bnn", "noise_graph")  # random ops in the graph: other draws
                    entry = {**timing, "numerics_max_abs": None if drawn else _numerics(proto, runner, feed)}
                except Exception as e:  # a mode the torch runner cannot run is reported, not fatal
                    entry = {"error": f"{type(e).__name__}: {e}"}
                row["graphs"][name] = entry
                print(f"batch {batch} {name}: " + (entry.get("error") or
                      f"p50 {entry['latency_ms']['p50']:.3f} ms, energy {entry['energy_mj_per_inference']}"),
                      file=sys.stderr)
            det = row["graphs"]["float_deterministic"].get("latency_ms", {}).get("p50")
            bnn = row["graphs"]["float_bnn"].get("latency_ms", {}).get("p50")
            row["ratios_p50"] = {
                mode: {"vs_float_deterministic": g["latency_ms"]["p50"] / det if det else None,
                       "speedup_vs_float_bnn": bnn / g["latency_ms"]["p50"] if bnn else None}
                for mode, g in row["graphs"].items() if mode in MODES and "latency_ms" in g}
            report["rows"].append(row)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="device_check.json", help="JSON report path")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--window", type=float, default=1.5, help="seconds per timed window (NVML needs >= 1)")
    parser.add_argument("--min-runs", type=int, default=20, help="timed runs per graph at least")
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = run(device, args.samples, [int(b) for b in args.batches.split(",")], args.window, args.min_runs)
    text = json.dumps(report, indent=1)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
