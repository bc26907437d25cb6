"""SWAG in one ONNX graph: SGD iterates of a digits MLP summarised as SWAG, deployed as its S-sample predictive.

SWAG (Maddox et al. 2019) fits a Gaussian to the SGD iterates: per parameter the running mean, the squared mean
and the last K deviations ``D`` [K, numel]. This script collects those statistics in the SWAG reference code's
format (``{name}_mean``, ``{name}_sq_mean``, ``{name}_covariance_sqrt``), writes them to a ``.safetensors`` file
(what ``edgebnn lower --swag FILE --swag-scale 0.5`` reads), imports them with ``edgebnn.from_swag`` and exports
the predictive as one graph: each sample is w = mean + sqrt(scale) · (σ ⊙ z₁ + Dᵀ z₂ / sqrt(K − 1)), with one
z₂ per sample shared by every layer, as the reference ``SWAG.sample`` draws it::

    .venv/bin/python examples/swag.py --out swag-out [--rank 10] [--samples 64]

It compares the export (``baked``: S members drawn now; ``noise --noise weight``: drawn in the graph from host
noise) with torch sampling the same SWAG posterior, on the digits test split; the last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

import edgebnn
from edgebnn.data import digits
from edgebnn.metrics import accuracy, nll


def build_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def train_swag(model: nn.Module, x: np.ndarray, y: np.ndarray, *, burn_in: int, rank: int,
               seed: int) -> dict[str, torch.Tensor]:
    """SGD, then one SWAG snapshot per epoch for ``rank`` epochs (the reference ``collect_model``)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    params = dict(model.named_parameters())
    mean = {n: torch.zeros_like(p) for n, p in params.items()}
    sq_mean = {n: torch.zeros_like(p) for n, p in params.items()}
    deviations: dict[str, list[torch.Tensor]] = {n: [] for n in params}
    for epoch in range(burn_in + rank):
        for idx in torch.randperm(len(xt), generator=generator).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
        if epoch >= burn_in:
            n = epoch - burn_in
            for name, p in params.items():
                w = p.detach()
                mean[name] = mean[name] * n / (n + 1) + w / (n + 1)
                sq_mean[name] = sq_mean[name] * n / (n + 1) + w**2 / (n + 1)
                deviations[name] = (deviations[name] + [(w - mean[name]).reshape(-1)])[-rank:]
    stats = {}
    for name in params:
        stats[f"{name}_mean"], stats[f"{name}_sq_mean"] = mean[name], sq_mean[name]
        stats[f"{name}_covariance_sqrt"] = torch.stack(deviations[name])
    return stats


def torch_swag(model: nn.Module, stats: dict[str, torch.Tensor], x: np.ndarray, samples: int,
               scale: float) -> np.ndarray:
    """torch sampling the SWAG posterior as the reference ``SWAG.sample`` does, softmax averaged."""
    net = build_model().eval()
    names = [n for n, _ in net.named_parameters()]
    k = stats[f"{names[0]}_covariance_sqrt"].shape[0]
    probs = []
    with torch.no_grad():
        for _ in range(samples):
            z2 = torch.randn(k)  # one z2 for every parameter
            for name, p in net.named_parameters():
                mean = stats[f"{name}_mean"]
                var = torch.clamp(stats[f"{name}_sq_mean"] - mean**2, 1e-30)
                low = (stats[f"{name}_covariance_sqrt"].t() @ z2 / (k - 1) ** 0.5).view_as(mean)
                p.copy_(mean + scale**0.5 * (var.sqrt() * torch.randn_like(mean) + low))
            probs.append(net(torch.from_numpy(x)).softmax(-1))
    return torch.stack(probs).mean(0).numpy()


def scores(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    return {"accuracy": round(accuracy(probs, y), 4), "nll": round(nll(probs, y), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("swag-out"))
    parser.add_argument("--rank", "-K", type=int, default=10, help="deviations kept (SWAG's max_num_models)")
    parser.add_argument("--samples", "-S", type=int, default=64)
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # fastest for this small MLP
    data = digits(args.seed)
    model = build_model()
    stats = train_swag(model, data.x_train, data.y_train, burn_in=5, rank=args.rank, seed=args.seed)
    stats_path = args.out / "swag_stats.safetensors"
    save_file({k: v.contiguous() for k, v in stats.items()}, str(stats_path))

    ir = edgebnn.from_swag(model.eval(), stats_path, (1, 1, 8, 8), scale=args.scale, name="digits-swag")
    edgebnn.save(ir, args.out / "swag.ebnn")
    baked = edgebnn.export(ir, args.out / "swag.onnx", samples=args.samples, mode="baked", seed=args.seed)
    noise = edgebnn.export(ir, args.out / "swag_noise.onnx", samples=args.samples, mode="noise", noise="weight")
    torch.manual_seed(args.seed + 1)
    ref = torch_swag(model, stats, data.x_test, args.samples, args.scale)
    summary = {
        "rank": args.rank, "samples": args.samples, "scale": args.scale,
        "torch_swag": scores(ref, data.y_test),
        "onnx_baked": scores(edgebnn.Session(baked).predict(data.x_test).probs, data.y_test),
        "onnx_noise": scores(edgebnn.Session(noise, seed=args.seed).predict(data.x_test).probs, data.y_test),
        "onnx_bytes": baked.stat().st_size, "onnx_noise_bytes": noise.stat().st_size,
    }
    print(f"torch SWAG, S={args.samples}: {summary['torch_swag']}")
    print(f"one ONNX graph (baked), S={args.samples}: {summary['onnx_baked']}  -> {baked}")
    print(f"one ONNX graph (noise, z2 drawn in the graph): {summary['onnx_noise']}  -> {noise}")
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
