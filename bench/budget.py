"""Uncertainty-budget benchmark: how small ``lower --budget`` gets a BNN while calibration stays within budget.

Two models, both trained on sklearn digits (train split, fixed seeds) and imported with ``edgebnn.from_torch``:

- **digits_cnn**: edgebnn's own digits CNN (edgebnn.models.digits_cnn, ``edgebnn.train.train_bnn``);
- **bayesian-torch**: a small CNN converted with bayesian-torch's ``dnn_to_bnn`` and fitted briefly (ELBO),
  exactly as ``examples/deploy_bayesian_torch.py`` builds and trains it (it is imported from there).

For each: the variance rule alone (``fixed``, bits auto), then ``lower_within_budget`` with the budget
(default ``nll=+0.05,ece=+0.01``) searched on the digits validation split (S = 16, seed 0), starting from
``fixed`` and from ``prune+fixed``. Reported: compression against the fp32 BNN (μ+σ, tensor bytes), the deltas
on the validation split the search used, and the deltas on the held-out test split it never saw.

Prints one JSON line, then a table. Run from the repository root:

    .venv/bin/python bench/budget.py [--budget nll=+0.05,ece=+0.01] [--epochs 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import edgebnn
from edgebnn._io import atomic_write_json
from edgebnn.api import lower_within_budget, lowering_quality
from edgebnn.passes import LowerConfig

STARTS = ("fixed", "prune+fixed")  # prune+fixed is what lower --budget starts from without --scheme


def digits_cnn() -> Any:
    import torch

    from edgebnn.data import digits
    from edgebnn.models import digits_cnn as build
    from edgebnn.train import train_bnn

    torch.manual_seed(0)
    model = build()
    train_bnn(model, digits(0), seed=0, progress=False)
    return model


def bayesian_torch_cnn(epochs: int) -> Any:
    import contextlib
    import io

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from deploy_bayesian_torch import build_model, train

    from edgebnn.data import digits

    torch.manual_seed(0)
    data = digits(0)
    model, _ = build_model((1, 8, 8), 10)
    with contextlib.redirect_stdout(io.StringIO()):  # its per-epoch lines
        train(model, data.x_train, data.y_train, epochs=epochs, batch=64, lr=1e-2, seed=0)
    return model


def bench_model(name: str, model: Any, budget: str) -> dict[str, Any]:
    bnn = edgebnn.from_torch(model, (1, 1, 8, 8), name=name)
    rule = edgebnn.lower(bnn, "fixed")
    out: dict[str, Any] = {"model": name, "variance_rule": {
        "compression_ratio": rule.lowering_report["compression_ratio"],
        "val": lowering_quality(bnn, rule, split="val")["delta"],
        "test": lowering_quality(bnn, rule, split="test")["delta"]}}
    val = lowering_quality(bnn, rule, split="val")
    out["float_bnn"] = {"val": val["float_bnn"], "bytes": rule.lowering_report["float_bnn_bytes"]}
    for start in STARTS:
        t = time.perf_counter()
        try:
            lowered = lower_within_budget(bnn, LowerConfig(scheme=start), budget)
        except edgebnn.errors.EdgeBNNError as e:
            out[start] = {"error": str(e)}
            continue
        report = lowered.lowering_report
        out[start] = {
            "compression_ratio": report["compression_ratio"], "total_bytes": report["total_bytes"],
            "ebnn_bytes": report["ebnn_bytes"], "ebnn_ratio": report["float_bnn_bytes"] / report["ebnn_bytes"],
            "met": report["budget"]["met"], "val": report["eval"]["delta"],
            "test": lowering_quality(bnn, lowered, split="test")["delta"],
            "evaluations": report["budget"]["evaluations"], "seconds": time.perf_counter() - t,
            "layers": [{k: row[k] for k in ("layer", "scheme", "bits", "options", "bytes")}
                       for row in report["budget"]["layers"]],
            "config": report["config"], "warnings": report["budget"]["warnings"]}
    return out


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"budget {result['budget']} (digits val; test = held out)", title_justify="left")
    for col in ("model", "lowering", "ratio", "dNLL val", "dECE val", "dNLL test", "dECE test", "dacc test"):
        table.add_column(col, justify="left" if col in ("model", "lowering") else "right")
    for m in result["models"]:
        for label, key in (("variance rule (fixed)", "variance_rule"), *((f"budget from {s}", s) for s in STARTS)):
            r = m[key]
            if "error" in r:
                table.add_row(m["model"], label, "—", r["error"][:60], "", "", "", "")
                continue
            table.add_row(m["model"], label, f"{r['compression_ratio']:.1f}x", f"{r['val']['nll']:+.4f}",
                          f"{r['val']['ece']:+.4f}", f"{r['test']['nll']:+.4f}", f"{r['test']['ece']:+.4f}",
                          f"{r['test']['accuracy']:+.4f}")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="nll=+0.05,ece=+0.01")
    parser.add_argument("--epochs", type=int, default=15, help="bayesian-torch model: training epochs")
    parser.add_argument("--json", type=Path, help="Also write the JSON here.")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    models = [bench_model("digits_cnn", digits_cnn(), args.budget),
              bench_model("bayesian-torch dnn_to_bnn CNN", bayesian_torch_cnn(args.epochs), args.budget)]
    result = {"budget": args.budget, "samples": 16, "seed": 0, "models": models}
    print(json.dumps(result))
    if args.json:
        atomic_write_json(args.json, result)
    print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
