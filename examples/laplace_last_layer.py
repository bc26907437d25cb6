"""A laplace-torch last-layer posterior in one ONNX graph: sampled exactly, or as its GLM/probit predictive.

laplace-torch (``pip install --no-deps laplace-torch`` and its pure-Python dependencies: ``make install`` does it)
fits a Laplace approximation around a trained network; ``edgebnn.from_torch(la, shape)`` imports the fitted
object with its own posterior structure (a Kronecker-factored last layer here: ``KronGaussianWeight``)::

    .venv/bin/python examples/laplace_last_layer.py --out laplace-out [--structure kron|full|diag] [--samples 64]

It trains an MLP on sklearn's digits for a second, fits ``Laplace(..., subset_of_weights="last_layer")``, and
compares on the digits test split laplace-torch's own predictives (``pred_type="nn"`` with S draws,
``pred_type="glm", link_approx="probit"``) with the exported graphs run by onnxruntime: ``baked`` and ``noise``
(S exact posterior draws) and ``analytic`` (one pass). It writes OUT/model.ebnn and OUT/<mode>.onnx; the last
stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from laplace import Laplace
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import edgebnn
from edgebnn.data import digits
from edgebnn.metrics import accuracy, nll


def scores(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    return {"accuracy": round(accuracy(probs, y), 4), "nll": round(nll(probs, y), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("laplace-out"))
    parser.add_argument("--structure", default="kron", choices=["kron", "full", "diag"])
    parser.add_argument("--samples", "-S", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    data = digits(args.seed)
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(100):  # full-batch steps: about a second
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    net.eval()

    la = Laplace(net, "classification", subset_of_weights="last_layer", hessian_structure=args.structure)
    la.fit(DataLoader(TensorDataset(x, y), batch_size=256))
    la.optimize_prior_precision(pred_type="glm", method="marglik")  # taken as fitted by the import

    ir = edgebnn.from_torch(la, (1, 1, 8, 8), name=f"digits-mlp-{args.structure}-ll")
    ebnn_path = edgebnn.save(ir, args.out / "model.ebnn")
    xt = torch.from_numpy(data.x_test)
    torch.manual_seed(args.seed + 1)
    summary: dict[str, object] = {
        "structure": args.structure, "samples": args.samples,
        "encodings": sorted({w.encoding.op_type for w in ir.encoded_weights()}),
        "prior_precision": [round(float(p), 4) for p in la.prior_precision.reshape(-1)],
        "laplace_nn": scores(la(xt, pred_type="nn", link_approx="mc", n_samples=args.samples).numpy(), data.y_test),
    }
    glm = la(xt, pred_type="glm", link_approx="probit").numpy()
    summary["laplace_glm_probit"] = scores(glm, data.y_test)
    for mode in ("baked", "noise", "analytic"):
        path = edgebnn.export(ir, args.out / f"{mode}.onnx", samples=args.samples, mode=mode, seed=args.seed)
        out = edgebnn.Session(path, seed=args.seed).predict(data.x_test)
        summary[f"onnx_{mode}"] = {**scores(out.probs, data.y_test), "bytes": path.stat().st_size}
        if mode == "analytic":
            summary["analytic_vs_glm_probit_max_abs"] = float(f"{np.abs(out.probs - glm).max():.2e}")
    summary["ebnn_bytes"] = ebnn_path.stat().st_size
    for key, value in summary.items():
        print(f"{key}: {value}")
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
