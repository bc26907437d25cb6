"""Deploy a bayesian-torch model trained on your own data: train → lower → export → eval with OOD → profile.

Your data are .npz files (or folders of shards, see ``python -c "import edgebnn; help(edgebnn.load_data)"``):
``x`` (N, C, H, W) float32, preprocessed as the model expects, and ``y`` (N,) integer labels 0..K-1; the
OOD file needs only ``x``. The model is bayesian-torch's own zoo CNN (``simple_cnn_variational.SCNN``) for
1x28x28 inputs with 10 classes (MNIST-shaped data), otherwise a small CNN sized to your data and converted
with bayesian-torch's ``dnn_to_bnn``. It trains briefly (ELBO: NLL + KL/N), then goes through edgebnn::

    .venv/bin/python examples/deploy_bayesian_torch.py --train train.npz --test test.npz --ood ood.npz \\
        --out deploy-out [--epochs 3] [--scheme fixed] [--samples 16]

Try it without data of your own: ``--demo-data DIR`` writes sklearn digits as DIR/train.npz, DIR/test.npz
and, as OOD, DIR/ood.npz (the test digits upside down and inverted), then runs on them.

Writes OUT/model.ebnn, OUT/model.onnx, OUT/eval.json, OUT/eval.png and OUT/profile.json; the last stdout
line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from torch import nn

import edgebnn
from edgebnn.tables import print_eval, print_lower_report, print_profile

console = Console()
PRIOR = {"prior_mu": 0.0, "prior_sigma": 1.0, "posterior_mu_init": 0.0, "posterior_rho_init": -3.0,
         "type": "Reparameterization", "moped_enable": False, "moped_delta": 0.5}


def build_model(input_shape: tuple[int, ...], classes: int) -> tuple[nn.Module, str]:
    """bayesian-torch's zoo SCNN for 1x28x28 / 10 classes; else a small CNN converted with ``dnn_to_bnn``."""
    if input_shape == (1, 28, 28) and classes == 10:
        from bayesian_torch.models.bayesian.simple_cnn_variational import SCNN

        return SCNN(), "bayesian_torch.models.bayesian.simple_cnn_variational.SCNN"
    from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn

    channels, height, width = input_shape
    dnn = nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (height // 4) * (width // 4), 64), nn.ReLU(), nn.Linear(64, classes),
    )
    dnn_to_bnn(dnn, PRIOR)
    return dnn, "small CNN + bayesian_torch dnn_to_bnn"


def forward(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits or log-probabilities, KL): the zoo model returns both, a dnn_to_bnn model only the first."""
    from bayesian_torch.models.dnn_to_bnn import get_kl_loss

    out = model(x)
    return out if isinstance(out, tuple) else (out, get_kl_loss(model))


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, *, epochs: int, batch: int, lr: float, seed: int) -> None:
    """A brief ELBO fit: cross-entropy plus KL divided by the training-set size."""
    generator = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for idx in torch.randperm(len(xt), generator=generator).split(batch):
            out, kl = forward(model, xt[idx])
            loss = nn.functional.cross_entropy(out, yt[idx]) + kl / len(xt)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        print(f"epoch {epoch + 1}/{epochs}: loss {total / len(xt):.4f}", flush=True)
    model.eval()


def write_demo_data(folder: Path) -> tuple[Path, Path, Path]:
    """sklearn digits as train.npz / test.npz, and the test digits upside down and inverted as ood.npz."""
    from edgebnn.data import digits

    folder.mkdir(parents=True, exist_ok=True)
    d = digits(0)
    paths = folder / "train.npz", folder / "test.npz", folder / "ood.npz"
    np.savez(paths[0], x=d.x_train, y=d.y_train)
    np.savez(paths[1], x=d.x_test, y=d.y_test)
    np.savez(paths[2], x=np.ascontiguousarray(1.0 - d.x_test[:, :, ::-1, :]))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, help="training data: .npz with x and y (or a shard folder)")
    parser.add_argument("--test", type=Path, help="held-out labelled data for edgebnn.evaluate")
    parser.add_argument("--ood", type=Path, help="out-of-distribution inputs (x only)")
    parser.add_argument("--demo-data", type=Path, metavar="DIR", help="write digits .npz files here and use them")
    parser.add_argument("--out", type=Path, default=Path("deploy-out"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--max-train", type=int, default=None, help="train on the first N rows only")
    parser.add_argument("--scheme", default="fixed", help="lowering scheme (edgebnn lower --help)")
    parser.add_argument("--samples", "-S", type=int, default=16, help="ensemble size S")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per graph when profiling")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.demo_data:
        args.train, args.test, args.ood = write_demo_data(args.demo_data)
    if not (args.train and args.test):
        parser.error("give --train and --test (and --ood), or --demo-data DIR")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)

    # 1. your data, checked (dtype, shape, labels) by the same loader edgebnn eval uses
    x, y = edgebnn.load_data(args.train).arrays(args.max_train)
    assert y is not None
    classes = int(y.max()) + 1
    input_shape = tuple(x.shape[1:])
    model, name = build_model(input_shape, classes)
    print(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters; training on {len(x)} rows",
          flush=True)
    train(model, x, y, epochs=args.epochs, batch=args.batch, lr=args.lr, seed=args.seed)

    # 2. import and lower; 3. save the IR and export the S-sample ensemble
    ir = edgebnn.from_torch(model, (1, *input_shape), output_index=0, name=name)
    small = edgebnn.lower(ir, args.scheme, seed=args.seed)
    ebnn_path = edgebnn.save(small, args.out / "model.ebnn")
    print_lower_report(console, small.lowering_report, str(ebnn_path), model=name,
                       manifest=json.loads(small.manifest.to_json()))
    onnx_path = edgebnn.export(small, args.out / "model.onnx", samples=args.samples, seed=args.seed)

    # 4. evaluate the exported ensemble on held-out data, with OOD detection, reliability plot
    report = edgebnn.evaluate(onnx_path, data=args.test, ood_data=args.ood, plot=args.out / "eval.png")
    print_eval(console, [report])
    (args.out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")

    # 5. profile the ensemble against the float baselines on this CPU
    from edgebnn.api import profile_artifact

    prof = profile_artifact(ebnn_path, device="cpu", samples=args.samples, onnx_path=str(onnx_path),
                            runs=args.runs, warmup=min(20, args.runs))
    print_profile(console, prof)
    (args.out / "profile.json").write_text(json.dumps(prof, indent=2) + "\n")
    summary: dict[str, Any] = {
        "model": name, "scheme": args.scheme, "samples": args.samples,
        "ebnn_bytes": ebnn_path.stat().st_size, "onnx_bytes": onnx_path.stat().st_size,
        **{k: round(report[k], 4) for k in ("accuracy", "nll", "ece", "brier")},
        "ood": {k: round(v, 4) for k, v in report.get("ood", {}).items() if isinstance(v, float)},
        "latency_ms_p50": prof["latency_ms"]["p50"],
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
