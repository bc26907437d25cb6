"""Does ``lower --budget`` keep its promise on data it never saw? The held-out check of issue 37, over many splits.

For each model: train it on 1400 of sklearn's 1797 digits (fixed seeds), hold out the other 397, then for each of
``--splits`` random splits of those 397 into 200 (given to ``lower_within_budget``, what ``lower --eval val.npz
--budget ...`` runs) and 197 (never seen): lower, export with the defaults (``edgebnn export m.ebnn -o m.onnx``:
noise mode, S = 16, the IR's codes), evaluate that file on the unseen 197 (``edgebnn eval m.onnx``) against the
float BNN (``edgebnn eval float.ebnn``: the reference runtime, S = 16, seed 0), and count the splits where every
budgeted change stays within the budget. Also the deployed file's ratio to the fp32 BNN (μ and σ). Both orders of
``lower_within_budget``: ``chain`` (the default: data-free, every row certifies) and ``split`` (a greedy walk on 20%
of the rows, certified on the rest).

Models (``--models``, comma-separated): ``bt<seed>``: the small CNN of ``examples/deploy_bayesian_torch.py``,
converted with bayesian-torch's ``dnn_to_bnn`` and fitted 15 epochs (ELBO) exactly as that example does, torch
seed <seed>, held-out split ``random_state = 100 + seed``; ``dc<seed>``: edgebnn's ``digits_cnn`` trained with
``edgebnn.train.train_bnn`` (200 of its 1400 images as its own early-stopping split).

``--coverage``: how often a bound misses the population change it bounds. One lowering that spends about the issue's
budget (``prune+fixed``, one σ per layer, noise fraction 1) on the first model: its 397 per-input changes (the
device's default export, 4 calls per input, against the float BNN's) are the population; 1000 samples of 200 rows
are drawn from it and each is bounded at 90%.

Prints one JSON line, then tables. Run from the repository root (2 CPU cores: about 3 minutes a model):

    .venv/bin/python bench/budget.py [--models bt0,bt2,dc1] [--splits 10] [--orders chain,split]
        [--budget nll=+0.05,ece=+0.02,accuracy=-0.02] [--coverage] [--json out.json]
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

import edgebnn
from edgebnn._io import atomic_write_json
from edgebnn.api import BudgetOptions, lower_within_budget
from edgebnn.budget import Budget
from edgebnn.passes import LowerConfig, float_bnn_bytes

HELD_OUT = 397
VAL = 200


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return (np.asarray(bunch.images, np.float32) / np.float32(16)).reshape(-1, 1, 8, 8), bunch.target.astype(np.int64)


def train(name: str) -> tuple[Any, np.ndarray, np.ndarray]:
    """(float BNN IR, held-out x, held-out y) of model ``name`` (module docstring)."""
    import torch
    from sklearn.model_selection import train_test_split

    kind, seed = name[:2], int(name[2:])
    x, y = _digits()
    xtr, xho, ytr, yho = train_test_split(x, y, test_size=HELD_OUT, stratify=y, random_state=100 + seed)
    torch.manual_seed(seed)
    if kind == "bt":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
        from deploy_bayesian_torch import build_model
        from deploy_bayesian_torch import train as fit

        model, _ = build_model((1, 8, 8), 10)
        with contextlib.redirect_stdout(io.StringIO()):  # its per-epoch lines
            fit(model, xtr, ytr, epochs=15, batch=64, lr=1e-2, seed=seed)
    elif kind == "dc":
        from edgebnn.data import DigitsSplits
        from edgebnn.models import digits_cnn
        from edgebnn.train import train_bnn

        xt, xv, yt, yv = train_test_split(xtr, ytr, test_size=200, stratify=ytr, random_state=seed)
        model = digits_cnn()
        train_bnn(model, DigitsSplits(xt, yt, xv, yv, xv, yv), seed=seed, progress=False)
    else:
        raise SystemExit(f"--models {name}: bt<seed> or dc<seed>")
    return edgebnn.from_torch(model, (1, 1, 8, 8), name=name), xho, yho


def held_out_check(ir: Any, x: np.ndarray, y: np.ndarray, budget: str, order: str, splits: int) -> dict[str, Any]:
    """Lower on 200 rows, check the default export on the other 197, ``splits`` times."""
    check = Budget.parse(budget)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(splits):
            perm = np.random.default_rng(k).permutation(len(x))
            val, unseen = perm[:VAL], perm[VAL:]
            t = time.perf_counter()
            try:
                low = lower_within_budget(ir, LowerConfig(), budget, data=(x[val], y[val]),
                                          options=BudgetOptions(order=order))
            except edgebnn.errors.EdgeBNNError as e:
                rows.append({"split": k, "held": False, "error": str(e), "seconds": time.perf_counter() - t})
                continue
            seconds = time.perf_counter() - t
            path = Path(tmp) / f"{order}{k}.onnx"
            edgebnn.export(low, path)
            lowered = edgebnn.evaluate(path, data=(x[unseen], y[unseen]))
            float_bnn = edgebnn.evaluate(ir, data=(x[unseen], y[unseen]), samples=16, seed=0)
            deltas = check.deltas(float_bnn, lowered)
            report = low.lowering_report
            rows.append({"split": k, "held": not check.violations(deltas), "unseen": deltas,
                         "bounds": {b["metric"]: b["bound"] for b in report["budget"]["bounds"]},
                         "ratio": report["float_bnn_bytes"] / path.stat().st_size, "file_bytes": path.stat().st_size,
                         "chosen": report["budget"]["chosen"], "stopped": report["budget"]["certification"]["stopped"],
                         "seconds": seconds})
    ratios = [r.get("ratio", 0.0) for r in rows]  # a split with nothing certified counts as no compression
    return {"order": order, "held": sum(r["held"] for r in rows), "splits": splits,
            "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
            "worst_unseen": {m: max((r["unseen"][m] for r in rows if "unseen" in r),
                                    key=lambda v, m=m: v if m in ("nll", "ece", "brier") else -v)
                             for m in check.limits},
            "median_seconds": statistics.median(r["seconds"] for r in rows), "rows": rows}


def coverage(ir: Any, x: np.ndarray, y: np.ndarray, repeats: int = 1000, n: int = VAL) -> dict[str, Any]:
    """Miss rates of 90% bounds on samples of ``n`` from one lowering's 397 per-input changes (module docstring)."""
    from edgebnn.budget import export_evidence, mean_bound, worse
    from edgebnn.budget._bounds import _t_limit
    from edgebnn.budget._certify import _classification_rows

    low = edgebnn.lower(ir, "prune+fixed", sigma_bits=0, noise_fraction=1.0)
    ref = _classification_rows(export_evidence(ir, x, None, seed=0)[0], y)
    new = _classification_rows(export_evidence(low, x, None, seed=0)[0], y)
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"lowering": "prune+fixed, sigma_bits 0, noise_fraction 1", "n": n, "repeats": repeats}
    for metric in ("nll", "brier", "accuracy"):
        population = new[metric] - ref[metric]
        truth = worse(metric, float(population.mean()))
        misses = {"t": 0, "t | bootstrap-t": 0}
        for k in range(repeats):
            sample = population[rng.integers(0, len(population), n)]
            side = sample if worse(metric, 1.0) > 0 else -sample
            pseudo = (np.array([1.0, -1.0, 0.0]), np.array([0.5, 0.5, 1.0])) if metric == "accuracy" else None
            misses["t"] += truth > _t_limit(side, pseudo, 0.9)
            misses["t | bootstrap-t"] += truth > worse(metric, mean_bound(metric, sample, 0.0, 0.9, seed=k).bound)
        out[metric] = {"change": float(population.mean()), **{k: v / repeats for k, v in misses.items()}}
    return out


def print_tables(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"budget {result['budget']}: {result['splits']} random 200/197 splits of 397 held-out digits",
                  title_justify="left")
    for col in ("model", "order", "held on unseen 197", "median x smaller", "range", "worst unseen change",
                "s / split"):
        table.add_column(col, justify="left" if col in ("model", "order", "worst unseen change") else "right")
    for m in result["models"]:
        for r in m["checks"]:
            worst = ", ".join(f"{k} {v:+.4f}" for k, v in r["worst_unseen"].items())
            table.add_row(m["model"], r["order"], f"{r['held']}/{r['splits']}", f"{r['median_ratio']:.2f}",
                          f"{r['min_ratio']:.2f}-{r['max_ratio']:.2f}", worst, f"{r['median_seconds']:.0f}")
    Console().print(table)
    if result.get("coverage"):
        c = result["coverage"]
        cov = Table(title=f"90% bounds on {c['n']} rows, {c['repeats']} samples of {c['lowering']}: how often the "
                          "population change is outside", title_justify="left")
        for col in ("metric", "population change", "Student t", "more cautious of t, bootstrap-t"):
            cov.add_column(col, justify="left" if col == "metric" else "right")
        for metric in ("nll", "brier", "accuracy"):
            row = c[metric]
            cov.add_row(metric, f"{row['change']:+.4f}", f"{row['t']:.3f}", f"{row['t | bootstrap-t']:.3f}")
        Console().print(cov)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bt0,bt2,dc1")
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--orders", default="chain,split")
    parser.add_argument("--budget", default="nll=+0.05,ece=+0.02,accuracy=-0.02")
    parser.add_argument("--coverage", action="store_true", help="Also measure the bounds' miss rates.")
    parser.add_argument("--json", type=Path, help="Also write the JSON here.")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    result: dict[str, Any] = {"budget": args.budget, "splits": args.splits, "confidence": 0.9, "models": []}
    for name in args.models.split(","):
        ir, x, y = train(name)
        checks = [held_out_check(ir, x, y, args.budget, order, args.splits) for order in args.orders.split(",")]
        result["models"].append({"model": name, "fp32_bnn_bytes": float_bnn_bytes(ir), "checks": checks})
        if args.coverage and "coverage" not in result:
            result["coverage"] = coverage(ir, x, y)
    print(json.dumps(result))
    if args.json:
        atomic_write_json(args.json, result)
    print_tables(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
