"""MC dropout in one ONNX graph: a plain torch CNN with dropout, trained on digits, deployed as its predictive.

Monte Carlo dropout (Gal & Ghahramani 2016) keeps a network's dropout on at prediction and averages S passes.
``edgebnn.from_torch(model, shape, mc_dropout=True)`` (``edgebnn lower --mc-dropout`` on the command line)
imports each ``nn.Dropout``/``Dropout2d`` as a Bernoulli-mask posterior; the export is one ONNX graph that
computes the S-pass predictive with its uncertainty (``probs``, ``entropy``, ``mutual_info``)::

    .venv/bin/python examples/deploy_mc_dropout.py --out mc-out [--samples 64] [--mode baked|noise|analytic]

It trains a small CNN on sklearn's digits for a few seconds, compares torch's own MC dropout (S passes with
dropout on) with the exported graph run by onnxruntime on the digits test split, and writes OUT/model.ebnn and
OUT/model.onnx; the last stdout line is a JSON summary.
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


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Dropout2d(0.1), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 10),
    )


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, *, epochs: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=generator).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()


def torch_mc_dropout(model: nn.Module, x: np.ndarray, samples: int) -> np.ndarray:
    """torch's own MC dropout: ``samples`` passes with dropout on, softmax averaged."""
    model.train()  # dropout on (the model has no batch norm)
    with torch.no_grad():
        probs = torch.stack([torch.softmax(model(torch.from_numpy(x)), -1) for _ in range(samples)]).mean(0)
    model.eval()
    return probs.numpy()


def scores(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    return {"accuracy": round(accuracy(probs, y), 4), "nll": round(nll(probs, y), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("mc-dropout-out"))
    parser.add_argument("--samples", "-S", type=int, default=64, help="ensemble size S (MC dropout passes)")
    parser.add_argument("--mode", default="baked", choices=["baked", "noise", "analytic"])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    data = digits(args.seed)
    model = build_model()
    train(model, data.x_train, data.y_train, epochs=args.epochs, seed=args.seed)

    # import with the dropout kept on as the posterior, save the IR, export the S-pass predictive as one graph
    ir = edgebnn.from_torch(model, (1, 1, 8, 8), name="digits-cnn", mc_dropout=True)
    ebnn_path = edgebnn.save(ir, args.out / "model.ebnn")
    extra = {"noise": "weight"} if args.mode == "noise" else {}  # masks are drawn per sample from uniform inputs
    onnx_path = edgebnn.export(ir, args.out / "model.onnx", samples=args.samples, mode=args.mode, seed=args.seed,
                               **extra)

    exported = edgebnn.Session(onnx_path, seed=args.seed).predict(data.x_test)
    torch.manual_seed(args.seed + 1)
    summary = {
        "samples": args.samples, "mode": args.mode,
        "torch_mc_dropout": scores(torch_mc_dropout(model, data.x_test, args.samples), data.y_test),
        "onnx": scores(exported.probs, data.y_test),
        "onnx_mean_mutual_info": round(float(exported.mutual_info.mean()), 4),
        "ebnn_bytes": ebnn_path.stat().st_size, "onnx_bytes": onnx_path.stat().st_size,
    }
    print(f"torch MC dropout, S={args.samples}: {summary['torch_mc_dropout']}")
    print(f"one ONNX graph ({args.mode}), S={args.samples}: {summary['onnx']}  -> {onnx_path}")
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
