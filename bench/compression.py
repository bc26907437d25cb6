"""Compression benchmark of the lowering schemes: size, speed, memory, and what lowering costs in accuracy.

Two parts:

- **synthetic**: a 5M-weight Gaussian posterior (MLP 1024 -> 2048 -> 1408 -> 10, every weight and the first
  bias Bayesian). Recipe per weight matrix with fan-in ``f``: μ = t₄ · sqrt(1/(2f)) (Student-t with 4 degrees
  of freedom: heavier tails than a Gaussian, like trained weights), σ = 0.25 · sqrt(1/(2f)) · exp(0.5 z),
  z ~ N(0, 1) (a log-normal spread of posterior widths). Measures, per scheme, the artifact bytes, the
  compression ratio against the fp32 BNN (tensor bytes, as the lowering report counts them, and whole
  ``.ebnn`` files, graph and manifest included), the lowering speed (weights/s, end to end: verify, lower,
  verify; best of two runs) and the peak Python-heap memory of lowering (tracemalloc) as a multiple of the posterior's
  bytes (μ and σ in fp32).
- **digits**: the digits CNN (edgebnn.models.digits_cnn) trained on sklearn digits, imported, lowered with
  every scheme, and evaluated on the test split with the reference runtime at S = 16 (mean of three
  sampling seeds): accuracy, NLL, ECE, and their change against the float BNN.

Prints one JSON line (machine-readable) and then rich tables. Run from the repository root:

    .venv/bin/python bench/compression.py [--seed 0] [--skip-digits] [--variants mcq,fixed,...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

from edgebnn.ir import BNNModel, gaussian_mlp
from edgebnn.passes import ebnn_bytes, lower

# (label, scheme, options): every scheme at its defaults, plus the settings the goals were checked with
VARIANTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("float", "float", {}),
    ("mcq", "mcq", {}),
    ("fixed", "fixed", {}),
    ("fixed f=0.5 sigma0", "fixed", {"noise_fraction": 0.5, "sigma_bits": 0}),
    ("codebook", "codebook", {}),
    ("codebook f=0.05", "codebook", {"noise_fraction": 0.05}),
    ("ternary", "ternary", {}),
    ("binary", "binary", {}),
    ("prune+codebook", "prune+codebook", {}),
    ("prune+mcq", "prune+mcq", {}),
)
SYNTHETIC_SIZES = (1024, 2048, 1408, 10)


def synthetic_posterior(seed: int, sizes: tuple[int, ...] = SYNTHETIC_SIZES) -> BNNModel:
    """The 5M-weight synthetic MLP posterior described in the module docstring."""
    rng = np.random.default_rng(seed)
    layers = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes), start=1):
        scale = np.sqrt(1 / (2 * fan_in))
        mu = (rng.standard_t(4, (fan_out, fan_in)) * scale).astype(np.float32)
        sigma = (0.25 * scale * np.exp(0.5 * rng.standard_normal((fan_out, fan_in)))).astype(np.float32)
        bias = (0.01 * rng.standard_normal(fan_out)).astype(np.float32)
        layers.append((mu, sigma, bias, np.full(fan_out, 0.005, np.float32) if i == 1 else None))
    return gaussian_mlp(layers, name="synthetic 5M posterior")


def bench_synthetic(variants: list[tuple[str, str, dict[str, Any]]], seed: int, repeats: int = 2) -> dict[str, Any]:
    """Bytes, ratio, lowering speed and peak memory per variant on the synthetic posterior."""
    model = synthetic_posterior(seed)
    n_weights = sum(w.encoding.size for w in model.encoded_weights())
    posterior_bytes = 8 * n_weights
    float_file = ebnn_bytes(model)
    rows: dict[str, Any] = {}
    for label, scheme, options in variants:
        seconds = float("inf")
        for _ in range(repeats):  # best of a few: the machine may be shared
            started = time.perf_counter()
            result = lower(model, scheme, seed=seed, **options)
            seconds = min(seconds, time.perf_counter() - started)
            del result
        tracemalloc.start()
        result = lower(model, scheme, seed=seed, **options)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rows[label] = {
            "bytes": result.report["total_bytes"],
            "compression_ratio": round(result.report["compression_ratio"], 3),
            "ebnn_bytes": result.report["ebnn_bytes"],
            "file_ratio": round(float_file / result.report["ebnn_bytes"], 3),
            "lower_s": round(seconds, 3),
            "weights_per_s": round(n_weights / seconds),
            "peak_bytes": peak,
            "peak_vs_posterior": round(peak / posterior_bytes, 3),
            "bits": {row["name"]: row["bits"] for row in result.report["layers"]},
        }
        del result
    return {"n_weights": n_weights, "posterior_bytes": posterior_bytes, "schemes": rows}


def bench_digits(
    variants: list[tuple[str, str, dict[str, Any]]], seed: int, samples: int = 16, epochs: int = 40,
    eval_repeats: int = 3,
) -> dict[str, Any]:
    """Train, import, lower and evaluate the digits CNN; metrics per variant and deltas against float.

    Each metric is the mean over ``eval_repeats`` sampling seeds of an S-sample ensemble (S = ``samples``),
    so the deltas are not one draw's Monte Carlo noise.
    """
    try:
        import torch

        from edgebnn.data import digits
        from edgebnn.importers import import_model
        from edgebnn.metrics import classification_report
        from edgebnn.models import digits_cnn
        from edgebnn.runtime.reference import predict
        from edgebnn.train import train_bnn
    except ImportError as e:
        return {"skipped": f"digits part needs {e.name}"}
    torch.manual_seed(seed)
    data = digits(seed)
    net = digits_cnn()
    started = time.perf_counter()
    train_bnn(net, data, epochs=epochs, seed=seed, progress=False)
    train_s = time.perf_counter() - started
    bnn = import_model(net, (1, 1, 8, 8), where="digits_cnn")
    x, y = data.split("test")
    float_file = ebnn_bytes(bnn)
    rows: dict[str, Any] = {}
    for label, scheme, options in [VARIANTS[0], *[v for v in variants if v[0] != "float"]]:
        result = lower(bnn, scheme, seed=seed, **options)
        runs = [classification_report(predict(result.model, x, samples=samples, seed=seed + r).probs, y)
                for r in range(eval_repeats)]
        metrics = {k: float(np.mean([run[k] for run in runs])) for k in runs[0]}
        rows[label] = {
            "bytes": result.report["total_bytes"],
            "compression_ratio": round(result.report["compression_ratio"], 3),
            "ebnn_bytes": result.report["ebnn_bytes"],
            "file_ratio": round(float_file / result.report["ebnn_bytes"], 3),
            **{k: round(v, 5) for k, v in metrics.items()},
        }
    base = rows["float"]
    for row in rows.values():
        row["d_accuracy_pts"] = round(100 * (row["accuracy"] - base["accuracy"]), 3)
        row["d_nll"] = round(row["nll"] - base["nll"], 5)
        row["d_ece"] = round(row["ece"] - base["ece"], 5)
    return {"samples": samples, "eval_repeats": eval_repeats, "n_test": len(y), "train_s": round(train_s, 1),
            "schemes": rows}


def print_tables(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, width=140)
    syn = result.get("synthetic")
    if syn:
        table = Table(title=f"synthetic posterior, {syn['n_weights']:,} weights", title_justify="left")
        for col in ("variant", "bytes", "ratio", "file ratio", "lower s", "weights/s", "peak / posterior"):
            table.add_column(col, justify="left" if col == "variant" else "right")
        for label, r in syn["schemes"].items():
            table.add_row(label, f"{r['bytes']:,}", f"{r['compression_ratio']:.1f}x", f"{r['file_ratio']:.1f}x",
                          f"{r['lower_s']:.2f}",
                          f"{r['weights_per_s'] / 1e6:.2f}M", f"{r['peak_vs_posterior']:.2f}x")
        console.print(table)
    dig = result.get("digits")
    if not dig or "schemes" not in dig:
        if dig:
            console.print(f"digits: {dig.get('skipped')}")
        return
    table = Table(title=f"digits CNN, test split (n={dig['n_test']}), S={dig['samples']}", title_justify="left")
    for col in ("variant", "bytes", "ratio", "file ratio", "accuracy", "Δacc pts", "nll", "Δnll", "ece", "Δece"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for label, r in dig["schemes"].items():
        table.add_row(label, f"{r['bytes']:,}", f"{r['compression_ratio']:.1f}x", f"{r['file_ratio']:.1f}x",
                      f"{r['accuracy']:.4f}",
                      f"{r['d_accuracy_pts']:+.2f}", f"{r['nll']:.4f}", f"{r['d_nll']:+.4f}", f"{r['ece']:.4f}",
                      f"{r['d_ece']:+.4f}")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(v[0] for v in VARIANTS),
                        help="comma-separated labels of VARIANTS")
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--epochs", type=int, default=40, help="digits training epochs")
    args = parser.parse_args(argv)
    wanted = {s.strip() for s in args.variants.split(",") if s.strip()}
    unknown = wanted - {v[0] for v in VARIANTS}
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}")
    variants = [v for v in VARIANTS if v[0] in wanted]
    result: dict[str, Any] = {"bench": "compression", "seed": args.seed}
    if not args.skip_synthetic:
        result["synthetic"] = bench_synthetic(variants, args.seed)
    if not args.skip_digits:
        result["digits"] = bench_digits(variants, args.seed, epochs=args.epochs)
    print(json.dumps(result, sort_keys=True))
    print_tables(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
