"""Analytic mode's latency against one float pass at real scale: bayesian-torch's ImageNet ResNet-18.

The model is ``bayesian_torch.models.bayesian.resnet_variational_large.resnet18`` freshly initialised (seed 0,
batch-norm statistics from two random batches, as ``bench/zoo_scale.py`` builds it), imported at 1x3x224x224.
Three graphs run in onnxruntime (CPU, 2 intra-op threads, 1 inter-op, sequential):

    float      the posterior-mean network exported deterministically (``BNNModel.float_model()``)
    analytic   ``export_model(ir, ExportConfig(S, mode="analytic"))`` (default weights; exact variances)
    separable  the same with ``variance="separable"`` (each k×k variance Conv as a depthwise k×k and a 1×1 Conv)

For each batch, ``--rounds`` interleaved rounds (float, analytic, separable, float, ...) of ``--calls`` timed calls
each after one warm-up call; the p50 of every call's wall time per graph, and each analytic graph's p50 over
float's. Then separable against exact on ``--inputs`` random inputs (the batch's, standard normal, seed 1): the
largest absolute difference of any class probability and of the mutual information, and the largest exact MI.

Run from the repository root (about two minutes per batch on 2 cores)::

    .venv/bin/python bench/analytic_speed.py [--batches 1,8] [--rounds 5] [--calls 3] [--samples 16]

Prints one JSON line per batch (schema ``edgebnn.bench.analytic_speed/2``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = "edgebnn.bench.analytic_speed/2"


def build_ir(cache: Path | None) -> Any:
    """The imported bt ResNet-18 (an ``.ebnn`` cache is read when it exists, written when it does not)."""
    from edgebnn import ir as ir_io

    if cache is not None and cache.exists():
        return ir_io.load(cache)
    from zoo_scale import resnet_large  # bench/zoo_scale.py: the same freshly initialised ResNet

    from edgebnn.importers import import_model

    ir = import_model(resnet_large("resnet18", "variational"), (1, 3, 224, 224), where="variational_large:resnet18")
    if cache is not None:
        ir_io.save(ir, cache)
    return ir


def _session(proto: Any) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def timed(sessions: dict[str, Any], x: np.ndarray, rounds: int, calls: int) -> dict[str, float]:
    """p50 ms per graph over interleaved rounds."""
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for s in sessions.values():  # warm-up
        s.run(None, {s.get_inputs()[0].name: x})
    for _ in range(rounds):
        for name, s in sessions.items():
            feed = {s.get_inputs()[0].name: x}
            for _ in range(calls):
                t = time.perf_counter()
                s.run(None, feed)
                times[name].append((time.perf_counter() - t) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--cache", type=Path, default=None, help="an .ebnn to read the imported IR from (or write)")
    args = parser.parse_args()

    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.exporters.metadata import read_metadata

    ir = build_ir(args.cache)
    float_net = ir.float_model()
    graphs, export_s, notes = {}, {}, {}
    for name, variance in (("analytic", "exact"), ("separable", "separable")):
        t = time.perf_counter()
        graphs[name] = export_model(ir, ExportConfig(args.samples, mode="analytic", variance=variance)).proto
        export_s[name] = round(time.perf_counter() - t, 2)
        notes[name] = read_metadata(graphs[name], name).approximations
    sessions = {"float": _session(float_net), **{k: _session(g) for k, g in graphs.items()}}
    for batch in (int(b) for b in args.batches.split(",")):
        x = np.random.default_rng(1).standard_normal((batch, 3, 224, 224)).astype(np.float32)
        p50 = timed(sessions, x, args.rounds, args.calls)
        row = {"schema": SCHEMA, "model": "variational_large:resnet18", "batch": batch, "samples": args.samples,
               "export_s": export_s, "p50_ms": {k: round(v, 2) for k, v in p50.items()},
               "analytic_over_float": round(p50["analytic"] / p50["float"], 3),
               "separable_over_float": round(p50["separable"] / p50["float"], 3),
               "separable_vs_exact": agreement(sessions, x), "separable_note": notes["separable"]}
        print(json.dumps(row), flush=True)
        print(f"batch {batch}: float {p50['float']:.1f} ms, analytic {p50['analytic']:.1f} ms "
              f"({row['analytic_over_float']:.2f}x), separable {p50['separable']:.1f} ms "
              f"({row['separable_over_float']:.2f}x); {row['separable_vs_exact']}", file=sys.stderr)


def agreement(sessions: dict[str, Any], x: np.ndarray) -> dict[str, float]:
    """The separable graph's predictive against the exact one's on the inputs ``x``."""
    out = {}
    for name in ("analytic", "separable"):
        s = sessions[name]
        out[name] = dict(zip([o.name for o in s.get_outputs()], s.run(None, {s.get_inputs()[0].name: x}),
                             strict=True))
    exact, fast = out["analytic"], out["separable"]
    return {"inputs": len(x), "max_abs_prob_diff": float(np.abs(exact["probs"] - fast["probs"]).max()),
            "max_abs_mi_diff": float(np.abs(exact["mutual_info"] - fast["mutual_info"]).max()),
            "max_rel_mi_diff": float((np.abs(exact["mutual_info"] - fast["mutual_info"])
                                      / np.maximum(exact["mutual_info"], 1e-12)).max()),
            "max_exact_mi": float(exact["mutual_info"].max()), "max_exact_prob": float(exact["probs"].max())}

if __name__ == "__main__":
    main()
