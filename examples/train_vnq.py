"""VNQ recipe on digits: train with the ternary quantizing prior, lower with ``ternary`` (no fine-tuning),
export the S=64 ensemble to ONNX; the last stdout line is the JSON result.

    .venv/bin/python examples/train_vnq.py [--epochs 250] [--lr 0.01] [--warmup 80] [--prune-epochs 50]
        [--samples 64] [--seed 0] [--split-seed SEED] [--threads 1] [--variants]

``--seed`` seeds the initialisation, the training and the ensemble's draws; ``--split-seed`` (default: the
same) the digits train/val split (the test split never changes). ``tests/integration/test_recipes.py`` trains
with ``--split-seed 0``. ``gap_images`` is the ensemble's accuracy minus the posterior-mean network's, in
test images; ``posterior_mean`` is the network of the clipped means of all weights (what the gap is measured
against), ``masked_posterior_mean`` the same with the weights of log α ≥ 2 set to 0 (what ``--prune-epochs``,
the last epochs of pruning-aware training, trains for; 0 is the paper's recipe); ``pruned_mu`` the largest
|θ|/a of each layer's pruned weights; ``logit_shift`` the median over test images of the largest |Δlogit| that
pruning (masked against all means) and rounding the kept means (the ternary mean network, ``after_mean``,
against the masked one) cause. ``--threads`` sets torch's intra-op threads (other kernels train other
weights). ``--variants`` also lowers the trained model the other ways the paper allows and prints each one's
``gap_images`` (``variant_gap_images``): Lloyd's level instead of the learned one, the pruning threshold
log α ≥ 1 or 3 instead of 2, the first layer kept in float (the paper's "w/o 1").
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch
from _common import S, emit, exported, metrics

from edgebnn.data import digits
from edgebnn.importers import import_model
from edgebnn.passes import LayerOverride, LowerConfig, lower
from edgebnn.train import mc_predict
from edgebnn.train.vnq import (
    ENSEMBLE_SAMPLES,
    RECIPE,
    learned_levels,
    level_table,
    lower_to_ternary,
    train_vnq,
    vnq_cnn,
    vnq_layers,
)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64."""
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def float_logits(ir: Any, x: np.ndarray) -> np.ndarray:
    """Logits of ``ir``'s mean network (every weight at its decoded mean), run with onnxruntime."""
    import onnxruntime as ort

    sess = ort.InferenceSession(ir.float_model().SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def variant_gaps(model: torch.nn.Module, ir: Any, x: np.ndarray, y: np.ndarray, posterior_mean: float, *,
                 seed: int, samples: int) -> dict[str, int]:
    """Test images gained by the ensemble over the posterior mean, for each other lowering of ``ir``."""
    levels = learned_levels(model)
    first_float = (LayerOverride("conv1", scheme="float"),)
    variants = {
        "lloyd_level": lambda: lower(ir, "ternary", seed=seed),
        "learned_level_log_alpha_1": lambda: lower(ir, "ternary", seed=seed, levels=levels, prune_log_alpha=1.0),
        "learned_level_log_alpha_3": lambda: lower(ir, "ternary", seed=seed, levels=levels, prune_log_alpha=3.0),
        "learned_level_conv1_float": lambda: lower(ir, LowerConfig("ternary", seed=seed, overrides=first_float),
                                                   levels=levels),
    }
    return {name: round((exported(run().model, x, y, seed=seed, samples=samples)["accuracy"] - posterior_mean)
                        * len(y)) for name, run in variants.items()}


def mean_logits(model: torch.nn.Module, x: np.ndarray, *, pruning: bool) -> np.ndarray:
    """Logits of the posterior-mean network (clipped means), with ``pruning``: log α >= 2 weights at 0."""
    layers = [layer for _, layer in vnq_layers(model)]
    for layer in layers:
        layer.use_mean, layer.pruning = True, pruning
    with torch.no_grad():
        logits = model(torch.from_numpy(x)).numpy()
    for layer in layers:
        layer.use_mean = layer.pruning = False
    return logits


def median_largest_shift(a: np.ndarray, b: np.ndarray) -> float:
    """Median over the examples of the largest |Δlogit| between two networks' logits."""
    return round(float(np.median(np.abs(a - b).max(axis=1))), 4)


def pruned_mu(model: torch.nn.Module) -> dict[str, float]:
    """Per layer: the largest |θ| / a over its pruned (log α >= 2) weights, the means the lowering zeroes."""
    out = {}
    for path, layer in vnq_layers(model):
        with torch.no_grad():
            mu = layer.clipped_mu()[layer.pruned()].abs() / layer.level
        out[path] = round(float(mu.max()), 4) if mu.numel() else 0.0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=RECIPE["epochs"])
    parser.add_argument("--lr", type=float, default=RECIPE["lr"])
    parser.add_argument("--warmup", type=int, default=RECIPE["kl_warmup_epochs"], help="KL warm-up epochs")
    parser.add_argument("--prune-epochs", type=int, default=RECIPE["prune_epochs"],
                        help="last epochs trained with the log α >= 2 weights pruned (0: the paper)")
    parser.add_argument("--samples", type=int, default=ENSEMBLE_SAMPLES, help="members of the exported ensemble")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split-seed", type=int, default=None, help="digits' train/val split (default: --seed)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--variants", action="store_true", help="also measure the other lowerings (module doc)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = digits(args.seed if args.split_seed is None else args.split_seed)
    model = vnq_cnn()
    result = train_vnq(model, data, epochs=args.epochs, lr=args.lr, kl_warmup_epochs=args.warmup,
                       prune_epochs=args.prune_epochs, seed=args.seed)
    x, y = data.split("test")
    torch.manual_seed(args.seed)
    before = metrics(mc_predict(model, x, samples=S), y)
    full_logits, masked_logits = (mean_logits(model, x, pruning=p) for p in (False, True))
    bnn = import_model(model, (1, 1, 8, 8))
    ir, report = lower_to_ternary(model, bnn, seed=args.seed)
    after = exported(ir, x, y, seed=args.seed, samples=args.samples)
    posterior_mean = metrics(softmax(full_logits), y)
    masked_mean = metrics(softmax(masked_logits), y)
    ternary_logits = float_logits(ir, x)
    variants = (variant_gaps(model, bnn, x, y, posterior_mean["accuracy"], seed=args.seed, samples=args.samples)
                if args.variants else None)
    emit({
        "recipe": "vnq",
        "before": before,
        "posterior_mean": posterior_mean,
        "masked_posterior_mean": masked_mean,
        "after": after,
        "gap_images": round((after["accuracy"] - posterior_mean["accuracy"]) * len(y)),  # 4-decimal inputs: exact
        "variant_gap_images": variants,
        "after_mean": metrics(softmax(ternary_logits), y),
        "logit_shift": {"pruning": median_largest_shift(masked_logits, full_logits),
                        "rounding": median_largest_shift(ternary_logits, masked_logits)},
        "train_s": round(result.wall_time_s, 1),
        "epochs": args.epochs,
        "prune_epochs": args.prune_epochs,
        "threads": args.threads,
        "samples": args.samples,
        "levels": {k: {"learned": round(v["level"], 4), "prunable": round(v["prunable"], 4)}
                   for k, v in level_table(model).items()},
        "pruned_mu": pruned_mu(model),
        "ternary_layers": {r["name"]: {"level": round(r["level"], 4), "pruned": round(r["pruned"], 4)}
                           for r in report["layers"] if "level" in r},
        "compression_ratio": round(report["compression_ratio"], 2),
    })


if __name__ == "__main__":
    main()
