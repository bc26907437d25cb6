"""Bayesian Compression recipe on digits: group normal-Jeffreys CNN, ``prune+fixed --bits auto``, ONNX export;
the last stdout line is the JSON result (pruned architecture and bits per layer included).

    .venv/bin/python examples/train_bc.py [--epochs 100] [--threshold -2] [--seed 0]
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from typing import Any

import torch
from _common import S, emit, exported, metrics
from torch import nn

from edgebnn.data import digits
from edgebnn.importers import import_model
from edgebnn.train import mc_predict
from edgebnn.train.bc import GroupNJConv2d, GroupNJLinear, compress, train_bc


def bc_cnn() -> nn.Module:
    """digits_cnn's shape (conv 16, conv 32, fc 64, fc 10) with group normal-Jeffreys layers."""
    return nn.Sequential(OrderedDict([
        ("conv1", GroupNJConv2d(1, 16, 3, padding=1)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", GroupNJConv2d(16, 32, 3, padding=1)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()), ("fc1", GroupNJLinear(128, 64)), ("relu3", nn.ReLU()),
        ("fc2", GroupNJLinear(64, 10)),
    ]))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=30, help="KL warm-up epochs")
    p.add_argument("--threshold", type=float, default=-2.0, help="prune groups with log alpha >= this")
    p.add_argument("--noise-fraction", type=float, default=0.05, help="fixed: rounding noise / variance")
    p.add_argument("--sigma-bits", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train, compress and export: the JSON result."""
    torch.manual_seed(args.seed)
    data = digits(args.seed)
    model = bc_cnn()
    result = train_bc(model, data, epochs=args.epochs, lr=args.lr, kl_warmup_epochs=args.warmup, seed=args.seed)
    x, y = data.split("test")
    torch.manual_seed(args.seed)
    before = metrics(mc_predict(model, x, samples=S), y)
    ir, report = compress(model, import_model(model, (1, 1, 8, 8)), threshold=args.threshold, seed=args.seed,
                          noise_fraction=args.noise_fraction, sigma_bits=args.sigma_bits)
    after = exported(ir, x, y, seed=args.seed)
    return {
        "recipe": "bc",
        "before": before,
        "after": after,
        "train_s": round(result.wall_time_s, 1),
        "epochs": args.epochs,
        "architecture": report["architecture"],
        "bits": {row["name"]: row["bits"] for row in report["layers"]},
        "groups_pruned": {p["name"]: p.get("groups_pruned") for p in report["passes"][0]["layers"]
                          if p.get("groups_pruned") is not None},
        "weights_pruned": round(sum(r["pruned"] * r["n_weights"] for r in report["passes"][0]["layers"])
                                / sum(r["n_weights"] for r in report["passes"][0]["layers"]), 4),
        "threshold": args.threshold,
        "noise_fraction": args.noise_fraction,
        "compression_ratio": round(report["compression_ratio"], 2),
    }


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    emit(run(args))


if __name__ == "__main__":
    main()
