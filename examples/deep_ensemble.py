"""A deep ensemble in one ONNX graph: M plain torch MLPs trained on digits, deployed as their predictive.

A deep ensemble (Lakshminarayanan et al. 2017) averages the softmax of M independently trained networks.
``edgebnn.from_torch([m1, ..., mM], shape)`` (``edgebnn lower --model mod:factory`` with a factory that returns
the list and one weights file whose keys are prefixed ``0.``, ``1.``, ...) imports them as one IR whose layers
hold the M members (``MemberSetWeight``); ``fixed`` puts every member of a layer on one fixed-point grid, and the
``baked`` export with S = M runs the M members as one graph::

    .venv/bin/python examples/deep_ensemble.py --out ens-out [--members 5] [--epochs 8]

It trains the members on sklearn's digits (a few seconds), compares torch's ensemble (mean of the members'
softmax) with the float and the ``fixed`` exports run by onnxruntime on the digits test split, and writes
OUT/ensemble.ebnn, OUT/ensemble.onnx and OUT/ensemble_fixed.onnx; the last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

import edgebnn
from edgebnn.data import digits
from edgebnn.metrics import accuracy, nll


def build_member() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, *, epochs: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=generator).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    return model.eval()


def scores(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    return {"accuracy": round(accuracy(probs, y), 4), "nll": round(nll(probs, y), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("ensemble-out"))
    parser.add_argument("--members", "-M", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # fastest for these small MLPs
    data = digits(args.seed)
    members = [train(build_member(), data.x_train, data.y_train, epochs=args.epochs, seed=args.seed + k)
               for k in range(args.members)]
    with torch.no_grad():
        ref = torch.stack([m(torch.from_numpy(data.x_test)).softmax(-1) for m in members]).mean(0).numpy()

    ir = edgebnn.from_torch(members, (1, 1, 8, 8), name="digits-ensemble")  # M members -> one IR
    edgebnn.save(ir, args.out / "ensemble.ebnn")
    float_path = edgebnn.export(ir, args.out / "ensemble.onnx")  # samples defaults to M: each member once
    small = edgebnn.lower(ir, "fixed")  # one fixed-point grid per layer, shared by the members
    fixed_path = edgebnn.export(small, args.out / "ensemble_fixed.onnx", weights="int8")
    exported = edgebnn.Session(float_path).predict(data.x_test)
    fixed = edgebnn.Session(fixed_path).predict(data.x_test)
    summary = {
        "members": args.members,
        "torch_ensemble": scores(ref, data.y_test),
        "onnx": scores(exported.probs, data.y_test),
        "onnx_max_abs_diff_vs_torch": float(np.abs(exported.probs - ref).max()),
        "onnx_fixed": scores(fixed.probs, data.y_test),
        "fixed_bits": sorted({row["bits"] for row in small.lowering_report["layers"]}),
        "onnx_bytes": float_path.stat().st_size, "onnx_fixed_bytes": fixed_path.stat().st_size,
        "onnx_mean_mutual_info": round(float(exported.mutual_info.mean()), 4),
    }
    print(f"torch ensemble of {args.members}: {summary['torch_ensemble']}")
    print(f"one ONNX graph (baked, S={args.members}): {summary['onnx']}  -> {float_path}")
    print(f"fixed point, int8 members: {summary['onnx_fixed']}  -> {fixed_path}")
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
