"""Bayes by Backprop on digits: the plain ELBO trainer (:func:`edgebnn.train.train_bnn`, the demo's recipe) on
``digits_cnn``, then the S=16 Monte Carlo predictive against the posterior-mean network (every weight at its
mean, one pass), and the baked S=16 ONNX export of the float IR; the last stdout line is the JSON result.

Blundell et al. (2015)'s claims, as checked here (:mod:`edgebnn.train.claims`): half of the weights (lowest
|μ|/σ) can be removed with the posterior-mean network at most 3 test images worse, and the predictive of weights
sampled from the learned posterior is as accurate as the posterior-mean network (within 3 images; on digits its NLL
is slightly higher, docs/recipes.md).

    .venv/bin/python examples/train_bbb.py [--epochs 60] [--lr 0.003] [--warmup 10] [--seed 0]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch
from _common import S, emit, exported, metrics

from edgebnn.data import digits
from edgebnn.importers import import_model
from edgebnn.models import digits_cnn
from edgebnn.nn import bayesian_layers, posterior_mean
from edgebnn.train import mc_predict, train_bnn


def mean_network(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    """Softmax of the posterior-mean network: every Bayesian layer at its means (no draws)."""
    model.eval()
    with posterior_mean(model), torch.no_grad():
        return torch.softmax(model(torch.from_numpy(x)), dim=1).numpy()


def snr_pruned(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, fractions: tuple[float, ...]) -> dict[str, Any]:
    """Blundell et al.'s Table 2: the posterior-mean network with the given fraction of its weights, those of the
    lowest signal-to-noise ratio |μ|/σ over all layers, set to 0 (biases kept): accuracy and NLL per fraction."""
    layers = [layer for _, layer in bayesian_layers(model)]
    snr = torch.cat([(layer.weight_mu.abs() / layer.weight_sigma).detach().flatten() for layer in layers])
    saved = [layer.weight_mu.detach().clone() for layer in layers]
    out = {}
    try:
        for fraction in fractions:
            cut = torch.quantile(snr, fraction) if fraction > 0 else torch.tensor(-1.0)
            with torch.no_grad():
                for layer, mu in zip(layers, saved, strict=True):
                    keep = (mu.abs() / layer.weight_sigma) > cut
                    layer.weight_mu.copy_(mu * keep)
            out[str(fraction)] = {k: v for k, v in metrics(mean_network(model, x), y).items() if k != "ece"}
    finally:
        with torch.no_grad():
            for layer, mu in zip(layers, saved, strict=True):
                layer.weight_mu.copy_(mu)
    return out


def misclassification_auroc(probs: np.ndarray, y: np.ndarray) -> float:
    """AUROC of the predictive entropy for telling misclassified test images from correct ones."""
    from sklearn.metrics import roc_auc_score

    wrong = probs.argmax(1) != y
    entropy = -(probs * np.log(np.clip(probs, 1e-12, None))).sum(1)
    return round(float(roc_auc_score(wrong, entropy)), 4) if 0 < wrong.sum() < len(y) else float("nan")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=10, help="KL warm-up epochs")
    p.add_argument("--seed", type=int, default=0)
    return p


def train(args: argparse.Namespace) -> tuple[torch.nn.Module, float]:
    """digits_cnn trained by the ELBO trainer (the demo's recipe), and the training seconds."""
    torch.manual_seed(args.seed)
    model = digits_cnn()
    result = train_bnn(model, digits(args.seed), epochs=args.epochs, lr=args.lr, kl_warmup_epochs=args.warmup,
                       seed=args.seed, progress=False)
    return model, result.wall_time_s


def run(model: torch.nn.Module, args: argparse.Namespace, train_s: float | None = None) -> dict[str, Any]:
    """The trained model's predictive, posterior-mean network, SNR pruning and export: the JSON result."""
    x, y = digits(args.seed).split("test")
    torch.manual_seed(args.seed)
    probs = mc_predict(model, x, samples=S)
    return {
        "recipe": "bbb",
        "before": metrics(probs, y),
        "posterior_mean": metrics(mean_network(model, x), y),
        "after": exported(import_model(model, (1, 1, 8, 8)), x, y, seed=args.seed),
        "snr_pruned": snr_pruned(model, x, y, (0.0, 0.5, 0.75, 0.9, 0.95)),
        "misclassified_auroc": misclassification_auroc(probs, y),
        "train_s": None if train_s is None else round(train_s, 1),
        "epochs": args.epochs,
    }


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    model, seconds = train(args)
    emit(run(model, args, seconds))


if __name__ == "__main__":
    main()
