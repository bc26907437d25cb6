"""``lower --budget ... --minimize latency`` on held-out-style models: the chosen export's latency, and whether it
keeps the budget on data it never saw, over random splits (issue 44, item 4).

For each model: train it on 1400 of sklearn's 1797 digits (fixed seeds; bench/budget.py's split), hold out the other
397; OOD inputs are 400 noise images, uniform in the digits' [0, 1] range (an export refuses inputs far outside the
range the model was lowered with). For each of ``--splits`` random splits of the held-out rows (and of the OOD
inputs) into halves: ``fastest_within_budget`` on one half (what ``lower --eval half.npz --ood-data ood.npz --budget
... --minimize latency`` runs: its own selection/certification split inside), then the chosen export, written again
from the chosen IR with the reported mode and S, is measured on the other half against the float BNN's own export
(``edgebnn export float.ebnn``: noise, S = 16) as onnxruntime runs both: the split *keeps the budget* when every
budgeted change (NLL, ECE and the MI-AUROC the search adds) is within its allowance there, and the MI-AUROC is
*within 0.02* when its change is at most 0.02 in magnitude. Latency: the search's own measurement (onnxruntime on
this CPU, ``--threads``, batch 1, p50s of interleaved rounds: the candidates, one float pass of the mean network,
the float BNN's export).

Models (``--models``): ``bt<seed>``, ``dc<seed>`` as in bench/budget.py (the bayesian-torch digits CNN of
examples/deploy_bayesian_torch.py; edgebnn's ``digits_cnn``); ``lenet<seed>``: edgebnn's ``lenet5`` trained with
``edgebnn.train.train_bnn`` (``--lenet-epochs``) on the same digits, bilinearly upsampled to 28x28.

Prints one JSON line per model, then a summary line. From the repository root (2 CPU cores: about 1 minute a split
for the CNNs):

    .venv/bin/python bench/fastest.py [--models bt0,lenet0] [--splits 10] [--samples 4,16,64]
        [--budget nll=+0.05,ece=+0.02] [--json out.json]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budget as budget_bench

import edgebnn
from edgebnn._io import atomic_write_json
from edgebnn.budget import Budget, LatencySpace, certify, device_evidence, fastest_within_budget
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.passes import LowerConfig

OOD_ROWS = 400
AUROC_WITHIN = 0.02


def upsample(x: np.ndarray, size: int) -> np.ndarray:
    import torch

    return torch.nn.functional.interpolate(torch.from_numpy(x), size=(size, size), mode="bilinear").numpy()


def train(name: str, lenet_epochs: int) -> tuple[Any, np.ndarray, np.ndarray]:
    """(float BNN IR, held-out x, held-out y) of model ``name`` (module docstring)."""
    if not name.startswith("lenet"):
        return budget_bench.train(name)
    import torch
    from sklearn.model_selection import train_test_split

    from edgebnn.data import DigitsSplits
    from edgebnn.models import lenet5
    from edgebnn.train import train_bnn

    seed = int(name[5:])
    x, y = budget_bench._digits()
    x = upsample(x, 28)
    xtr, xho, ytr, yho = train_test_split(x, y, test_size=budget_bench.HELD_OUT, stratify=y, random_state=100 + seed)
    xt, xv, yt, yv = train_test_split(xtr, ytr, test_size=200, stratify=ytr, random_state=seed)
    torch.manual_seed(seed)
    model = lenet5()
    train_bnn(model, DigitsSplits(xt, yt, xv, yv, xv, yv), seed=seed, epochs=lenet_epochs, progress=False)
    return edgebnn.from_torch(model, (1, 1, 28, 28), name=name), xho, yho


def one_split(ir: Any, x: np.ndarray, y: np.ndarray, ood: np.ndarray, budget: str, space: LatencySpace,
              k: int) -> dict[str, Any]:
    """Search on one half, check the chosen export on the other (module docstring)."""
    rng = np.random.default_rng(k)
    perm, operm = rng.permutation(len(x)), rng.permutation(len(ood))
    seen, unseen = perm[:len(x) // 2], perm[len(x) // 2:]
    ood_seen, ood_unseen = operm[:len(ood) // 2], operm[len(ood) // 2:]
    t = time.perf_counter()
    try:
        low = fastest_within_budget(ir, LowerConfig(), budget, data=(x[seen], y[seen]), ood_data=ood[ood_seen],
                                    space=space)
    except edgebnn.errors.EdgeBNNError as e:
        return {"split": k, "kept_unseen": False, "error": str(e), "seconds": time.perf_counter() - t}
    seconds = time.perf_counter() - t
    report = low.lowering_report
    fastest, certified = report["fastest"], report["budget"]
    data = export_model(low, ExportConfig(fastest["samples"], mode=fastest["mode"], seed=0, device=space.device)
                        ).proto.SerializeToString(deterministic=True)
    reference = export_model(ir, ExportConfig(16, seed=0, device=space.device)).proto.SerializeToString(
        deterministic=True)
    limits = Budget(certified["limits"])
    xs, ys, os_ = x[unseen], y[unseen], ood[ood_unseen]
    cert = certify(limits, device_evidence(reference, xs, os_, 0, space.draws),
                   device_evidence(data, xs, os_, 0, space.draws), ys, seed=0)
    return {"split": k, "kept_unseen": not limits.violations(cert.deltas), "unseen": cert.deltas,
            "auroc_within": abs(cert.deltas["auroc"]) <= AUROC_WITHIN, "seconds": seconds,
            "certified": {b["metric"]: b["bound"] for b in certified["bounds"]},
            "deterministic": fastest["deterministic"], "sampled": fastest["sampled"], "mode": fastest["mode"],
            "samples": fastest["samples"], "latency_ms": fastest["latency_ms"], "baselines_ms": fastest["baselines_ms"],
            "ratios": fastest["ratios"], "candidates": len(fastest["candidates"]),
            "tested": len(certified["certification"]["tested"]), "stopped": certified["certification"]["stopped"]}


def summary(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "error" not in r]

    def median(key: str) -> float | None:
        return statistics.median(r["ratios"][key] for r in ok) if ok else None

    return {"model": name, "splits": len(rows), "kept_unseen": sum(r["kept_unseen"] for r in rows),
            "auroc_within_0.02": sum(r.get("auroc_within", False) for r in rows), "errors": len(rows) - len(ok),
            "median_vs_float_pass": median("vs_float_pass"),
            "median_vs_float_bnn_export": median("vs_float_bnn_export"),
            "max_vs_float_pass": max((r["ratios"]["vs_float_pass"] for r in ok), default=None),
            "chosen": sorted({f"{r['mode']} S={r['samples']}, sampled: {', '.join(r['sampled'])}" for r in ok})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bt0,lenet0")
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--budget", default="nll=+0.05,ece=+0.02")
    parser.add_argument("--samples", default="4,16,64", help="S of the candidates (comma-separated; 'auto' too).")
    parser.add_argument("--modes", default="analytic,baked,noise")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=100, help="Interleaved timing rounds per candidate.")
    parser.add_argument("--lenet-epochs", type=int, default=30)
    parser.add_argument("--json", type=Path, help="Also write everything here.")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    samples = tuple(s if s == "auto" else int(s) for s in args.samples.split(","))
    space = LatencySpace(modes=tuple(args.modes.split(",")), samples=samples, threads=args.threads, runs=args.runs)
    ood = np.random.default_rng(12345).uniform(0.0, 1.0, size=(OOD_ROWS, 1, 8, 8)).astype(np.float32)
    result: dict[str, Any] = {"schema": "edgebnn.bench.fastest/1", "budget": args.budget, "splits": args.splits,
                              "samples": args.samples, "modes": args.modes, "threads": args.threads, "models": []}
    for name in args.models.split(","):
        ir, x, y = train(name, args.lenet_epochs)
        model_ood = upsample(ood, x.shape[-1]) if x.shape[-1] != 8 else ood
        rows = [one_split(ir, x, y, model_ood, args.budget, space, k) for k in range(args.splits)]
        entry = {**summary(name, rows), "rows": rows}
        result["models"].append(entry)
        print(json.dumps(entry), flush=True)
    print(json.dumps({"summary": [{k: v for k, v in m.items() if k != "rows"} for m in result["models"]]}))
    if args.json:
        atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
