"""Compact stores benchmark: file bytes, predictive quality and latency of exports that carry the lowered encoding.

Model: the bayesian-torch digits CNN of ``examples/deploy_bayesian_torch.py`` (``dnn_to_bnn``, ELBO-fitted on the
digits train split, fixed seeds, as ``bench/budget.py`` builds it), imported with ``edgebnn.from_torch`` and lowered
with ``lower_within_budget`` (start ``prune+fixed``, budget ``nll=+0.05,ece=+0.01,accuracy=-0.005`` on the
validation split: ``edgebnn lower --budget ... --eval``). S = 16 everywhere.

Reported (one JSON line on stdout, schema ``edgebnn.bench.store_latency/1``; a table on stderr):

- ``fp32_bnn_bytes``: μ and σ of every Bayesian tensor in fp32 (the lowering report's ``float_bnn_bytes``);
- ``exports``: per export, the ONNX file bytes, ``ratio`` = fp32 BNN / file, the graph inputs, and accuracy / NLL /
  ECE on the digits test split (``Session``, seed 0) with their change against the FLOAT export of the same mode
  (the unlowered IR, fp32 moments: ``vs_float``). ``self_contained`` exports take the data as their only input.
- ``smallest_self_contained``: the smallest one-input export within dNLL <= 0.05, dECE <= 0.01 and accuracy
  -1.5 pt of its float export, and its ratio (goal >= 8x);
- ``baked_int4``: ``--mode baked --weights int4 --form qdq --device cpu`` of the float IR, bytes / fp32 BNN (goal
  <= 1.05);
- ``latency``: every compact noise / analytic export against its twin with fp32 moments (same lowered IR, same
  graph otherwise), batch 1 and 32, onnxruntime CPU (``--threads``, default 2 intra-op threads, no spinning,
  Session.predict: host noise generation included for ``rng=host``), timed in one run with each compact call
  alternating with its twin's (:func:`time_pairs`); ``ratio`` = the median of compact / twin over the
  alternations (goal <= 1.1), with its quartiles. ``folded``: each compact graph as onnxruntime runs it (after its
  optimizations: constant folding evaluates the stores' decode at session creation) against its twin's: node
  counts, the same ops, the same initializer shapes and values (analytic: ``s² + μ²`` rounds in float32 in the
  graph, float64 then float32 in the fp32 twin, so values may differ in the last bit). Same ops on tensors of the
  same shapes cost the same: what the timings add beyond 1.0 is load from other processes.

Run from the repository root (training + the budget search take a few minutes; ``--cache DIR`` keeps the IRs):

    .venv/bin/python bench/store_latency.py [--cache /tmp/store_bench] [--seconds 20]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BUDGET = "nll=+0.05,ece=+0.01,accuracy=-0.005"
S = 16
ROUNDS = 5
THREADS = 2


def build_irs(cache: Path | None, epochs: int) -> tuple[Any, Any, dict[str, Any]]:
    """(float IR, lowered IR, lowering report) of the bayesian-torch digits CNN, from ``cache`` when there."""
    import edgebnn
    from edgebnn.api import lower_within_budget
    from edgebnn.passes import LowerConfig

    if cache is not None and (cache / "lowered.ebnn").exists():
        return (edgebnn.load(cache / "float.ebnn"), edgebnn.load(cache / "lowered.ebnn"),
                json.loads((cache / "report.json").read_text()))
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from deploy_bayesian_torch import build_model, train

    from edgebnn.data import digits

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = digits(0)
    model, _ = build_model((1, 8, 8), 10)
    with contextlib.redirect_stdout(io.StringIO()):  # its per-epoch lines
        train(model, data.x_train, data.y_train, epochs=epochs, batch=64, lr=1e-2, seed=0)
    bnn = edgebnn.from_torch(model, (1, 1, 8, 8), name="bayesian-torch digits CNN")
    lowered = lower_within_budget(bnn, LowerConfig(scheme="prune+fixed"), BUDGET)
    report = {k: lowered.lowering_report[k] for k in ("float_bnn_bytes", "total_bytes", "ebnn_bytes",
                                                         "compression_ratio")}
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        edgebnn.save(bnn, cache / "float.ebnn")
        edgebnn.save(lowered, cache / "lowered.ebnn")
        (cache / "report.json").write_text(json.dumps(report))
    return bnn, lowered, report


def quality(proto: Any, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    from edgebnn.metrics import accuracy, ece, nll
    from edgebnn.runtime import Session

    probs = Session(proto, seed=0).predict(x).probs
    return {"accuracy": accuracy(probs, y), "nll": nll(probs, y), "ece": ece(probs, y)}


def optimized(proto: Any) -> tuple[list[str], list[tuple[tuple[int, ...], bytes]]]:
    """``proto`` as onnxruntime runs it (after its optimizations, constant folding included): the sorted op types
    and the sorted (shape, bytes) of its initializers."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED  # ALL's layouts are not saved
        opts.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        opt = onnx.load(opts.optimized_model_filepath)
    return (sorted(n.op_type for n in opt.graph.node),
            sorted((tuple(t.dims), numpy_helper.to_array(t).tobytes()) for t in opt.graph.initializer))


def time_pairs(pairs: dict[str, tuple[Any, Any]], seconds: float) -> dict[str, dict[str, float]]:
    """Per pair (compact call, fp32-twin call): the two calls alternate, one after the other, for ``ROUNDS``
    passes through all pairs sized to share ``seconds``; medians of each call's times and of the per-alternation
    ratios (a burst of load from other processes hits both calls of an alternation alike)."""
    single = {}
    for name, (a, b) in pairs.items():
        for fn in (a, b, a, b):  # first-call costs, then a warm pair
            t0 = time.perf_counter()
            fn()
        single[name] = time.perf_counter() - t0
    runs = {k: max(20, int(seconds / len(pairs) / ROUNDS / max(2 * t, 1e-6))) for k, t in single.items()}
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in pairs}
    for _ in range(ROUNDS):
        for name, (a, b) in pairs.items():
            for _ in range(min(10, runs[name] // 5)):
                a()
                b()
            for i in range(runs[name]):
                for fn, out in ((a, times[name][0]), (b, times[name][1]))[:: 1 if i % 2 else -1]:
                    t0 = time.perf_counter()
                    fn()
                    out.append(time.perf_counter() - t0)
    out = {}
    for k, (ta, tb) in times.items():
        ratios = sorted(x / y for x, y in zip(ta, tb, strict=True))
        out[k] = {"compact_ms": statistics.median(ta) * 1e3, "fp32_ms": statistics.median(tb) * 1e3,
                  "ratio": statistics.median(ratios), "ratio_p25": ratios[len(ratios) // 4],
                  "ratio_p75": ratios[3 * len(ratios) // 4], "alternations": len(ratios)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=None, help="Keep / reuse the float and lowered IRs here.")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=20.0, help="Timing budget per batch size.")
    parser.add_argument("--threads", type=int, default=THREADS, help="onnxruntime intra-op threads.")
    args = parser.parse_args(argv)

    from edgebnn.data import digits
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.runtime import Session

    float_ir, lowered, report = build_irs(args.cache, args.epochs)
    fp32_bnn = int(report["float_bnn_bytes"])
    data = digits(0)
    x, y = data.x_test.astype(np.float32), data.y_test

    specs = {  # name: (ir, mode, export options)
        "float noise (graph rng)": (float_ir, "noise", {"rng": "graph", "weights": "fp32"}),
        "float noise (host rng)": (float_ir, "noise", {"weights": "fp32"}),
        "float analytic": (float_ir, "analytic", {"weights": "fp32"}),
        "float baked": (float_ir, "baked", {"weights": "fp32"}),
        "float baked int4 qdq": (float_ir, "baked", {"weights": "int4", "form": "qdq", "device": "cpu"}),
        "lowered noise ir (graph rng)": (lowered, "noise", {"rng": "graph"}),
        "lowered noise fp32 (graph rng)": (lowered, "noise", {"rng": "graph", "weights": "fp32"}),
        "lowered noise ir (host rng)": (lowered, "noise", {}),
        "lowered noise fp32 (host rng)": (lowered, "noise", {"weights": "fp32"}),
        "lowered analytic ir": (lowered, "analytic", {}),
        "lowered analytic fp32": (lowered, "analytic", {"weights": "fp32"}),
        "lowered noise int4 (graph rng)": (lowered, "noise", {"rng": "graph", "weights": "int4"}),
    }
    float_of = {"noise": "float noise (graph rng)", "analytic": "float analytic", "baked": "float baked"}
    protos = {name: export_model(ir, ExportConfig(S, mode=mode, seed=0, **{"rng": "host", **opts})).proto
              for name, (ir, mode, opts) in specs.items()}
    exports: dict[str, Any] = {}
    for name, proto in protos.items():
        _, mode, opts = specs[name]
        size = len(proto.SerializeToString(deterministic=True))
        exports[name] = {"bytes": size, "ratio": fp32_bnn / size, "inputs": len(proto.graph.input),
                         "self_contained": len(proto.graph.input) == 1, "mode": mode, "options": opts,
                         **quality(proto, x, y)}
    for row in exports.values():
        ref = exports[float_of[row["mode"]]]
        row["vs_float"] = {k: row[k] - ref[k] for k in ("accuracy", "nll", "ece")}
    within = [n for n, r in exports.items() if r["self_contained"] and n.startswith("lowered")
              and r["vs_float"]["nll"] <= 0.05 and r["vs_float"]["ece"] <= 0.01
              and r["vs_float"]["accuracy"] >= -0.015]
    smallest = min(within, key=lambda n: exports[n]["bytes"]) if within else None

    twins = [("lowered noise ir (graph rng)", "lowered noise fp32 (graph rng)"),
             ("lowered noise ir (host rng)", "lowered noise fp32 (host rng)"),
             ("lowered analytic ir", "lowered analytic fp32")]
    latency: dict[str, Any] = {}
    for batch in (1, 32):
        xb = x[:batch]
        sessions = {n: Session(protos[n], seed=0, threads=args.threads) for pair in twins for n in pair}
        calls = {c: (lambda s=sessions[c], xb=xb: s.predict(xb), lambda s=sessions[t], xb=xb: s.predict(xb))
                 for c, t in twins}
        latency[f"batch{batch}"] = time_pairs(calls, args.seconds)
    folded = {}
    for c, t in twins:
        (ops_c, init_c), (ops_t, init_t) = optimized(protos[c]), optimized(protos[t])
        folded[c] = {"nodes": len(protos[c].graph.node), "twin_nodes": len(protos[t].graph.node),
                     "after_ort": len(ops_c), "twin_after_ort": len(ops_t), "same_ops": ops_c == ops_t,
                     "same_initializer_shapes": [i[0] for i in init_c] == [i[0] for i in init_t],
                     "same_initializer_values": init_c == init_t}
    out = {
        "schema": "edgebnn.bench.store_latency/1", "samples": S, "budget": BUDGET, "fp32_bnn_bytes": fp32_bnn,
        "lowering": report, "exports": exports,
        "smallest_self_contained": None if smallest is None else {
            "export": smallest, "bytes": exports[smallest]["bytes"], "ratio": exports[smallest]["ratio"],
            "goal_met": exports[smallest]["ratio"] >= 8},
        "baked_int4": {"bytes": exports["float baked int4 qdq"]["bytes"],
                       "vs_fp32_bnn": exports["float baked int4 qdq"]["bytes"] / fp32_bnn,
                       "goal_met": exports["float baked int4 qdq"]["bytes"] <= 1.05 * fp32_bnn},
        "latency": latency, "threads": args.threads,
        "latency_goal_met": all(v["ratio"] <= 1.1 for b in latency.values() for v in b.values()),
        "folded": folded,
    }
    print(json.dumps(out))
    for name, r in exports.items():
        print(f"{name:34s} {r['bytes']:>8d} B  {r['ratio']:6.2f}x  in={r['inputs']}  acc {r['accuracy']:.4f}  "
              f"nll {r['nll']:.4f} ({r['vs_float']['nll']:+.4f})  ece {r['ece']:.4f} ({r['vs_float']['ece']:+.4f})",
              file=sys.stderr)
    for b, rows in latency.items():
        for c, v in rows.items():
            print(f"{b:8s} {c:34s} {v['compact_ms']:.3f} ms vs fp32 {v['fp32_ms']:.3f} ms: {v['ratio']:.3f}x",
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
