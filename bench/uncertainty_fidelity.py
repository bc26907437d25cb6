"""Uncertainty fidelity: does a lowered artifact still know what it does not know? (issue 13, docs/uncertainty.md)

Trains the digits CNN once (``edgebnn.models.digits_cnn``, ``edgebnn.train.train_bnn``, seeded, one torch
thread; ``--library bayesian-torch``: the same architecture of bayesian-torch ``Conv2dReparameterization`` /
``LinearReparameterization`` layers, trained by the same ELBO loop), lowers it with every scheme at its
defaults (plus the ablations that explain the defaults), exports every applicable mode at S = 16 and runs
each artifact through :class:`edgebnn.runtime.Session` (onnxruntime) on three sets of 360 images:

- **in-distribution**: the digits test split (accuracy, NLL, ECE with 15 bins, mean mutual information);
- **flipped**: the same test digits mirrored left-right (``x[..., ::-1]``): digit-like strokes in shapes the
  model never saw (a hard set: 0, 1 and 8 are nearly symmetric);
- **noise blobs**: per image 1-3 isotropic Gaussian bumps, centres uniform over the 8x8 frame, widths
  uniform in [0.8, 2] px, summed and scaled to a maximum of 1 (seeded): smooth blobs in the digits'
  intensity range, with no strokes at all.

OOD score: the mutual information (the epistemic part of the predictive entropy); AUROC of in-distribution
(label 0) against each OOD set (label 1) by scikit-learn's ``roc_auc_score``. Sampling modes are evaluated at
three sampling seeds (baked draws and host noise), with the float BNN and the lowered artifact sharing each
seed, and the metrics averaged; ``analytic`` is deterministic.

Budget (per scheme and mode, against the float BNN in the same mode; ``baked-int8`` and ``shared`` against
float ``baked``): dNLL <= 0.05, dECE <= 0.01, and MI-AUROC on each OOD set at most 0.02 below.
``outside_budget`` lists the default schemes/modes that miss it; ``warned`` those whose scheme keeps only
posteriors trained for it and says so in the lowering report (ternary, binary: VNQ and EBP).

Prints one JSON line (schema ``edgebnn.bench.uncertainty_fidelity/1``), then a markdown table (the one in
docs/uncertainty.md). Run from the repository root (about 2 minutes on 2 cores):

    .venv/bin/python bench/uncertainty_fidelity.py [--seed 0] [--samples 16] [--library edgebnn|bayesian-torch]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

SCHEMA = "edgebnn.bench.uncertainty_fidelity/1"
BUDGET = {"nll": 0.05, "ece": 0.01, "auroc": 0.02}
SAMPLING_SEEDS = (0, 1, 2)
# (label, scheme, options, default): every scheme at its defaults, then the ablations behind the defaults
VARIANTS: tuple[tuple[str, str, dict[str, Any], bool], ...] = (
    ("float", "float", {}, True),
    ("mcq", "mcq", {}, True),
    ("fixed", "fixed", {}, True),
    ("codebook", "codebook", {}, True),
    ("ternary", "ternary", {}, True),
    ("binary", "binary", {}, True),
    ("prune+mcq", "prune+mcq", {}, True),
    ("prune+fixed", "prune+fixed", {}, True),
    ("prune+codebook", "prune+codebook", {}, True),
    ("codebook sampling=shared", "codebook", {"sampling": "shared"}, False),
    ("codebook shared f=0.25 (old default)", "codebook", {"sampling": "shared", "noise_fraction": 0.25}, False),
    ("codebook f=0.25", "codebook", {"noise_fraction": 0.25}, False),
    ("fixed f=0.25 (old default)", "fixed", {"noise_fraction": 0.25}, False),
    ("mcq f=0.25 (old default)", "mcq", {"noise_fraction": 0.25}, False),
)
MODES = ("baked", "baked-int8", "noise", "analytic", "shared")
REFERENCE_MODE = {"baked": "baked", "baked-int8": "baked", "noise": "noise", "analytic": "analytic",
                  "shared": "baked"}
WARNED = ("ternary", "binary")  # schemes that need their training recipe, and say so
WARNINGS = ("post-training", "sampling='shared'")  # how those warnings start in the lowering report's notes


def noise_blobs(n: int, seed: int) -> np.ndarray:
    """``n`` images (N, 1, 8, 8) of 1-3 Gaussian bumps each, scaled to a maximum of 1 (module docstring)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:8, 0:8].astype(np.float32)
    out = np.zeros((n, 1, 8, 8), np.float32)
    for img in out:
        for _ in range(int(rng.integers(1, 4))):
            cy, cx = rng.uniform(0, 8, 2)
            width = rng.uniform(0.8, 2.0)
            img[0] += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * width * width))
        img /= img.max()
    return out


LIBRARIES = ("edgebnn", "bayesian-torch")


def train_digits(seed: int, library: str = "edgebnn") -> Any:
    """The digits CNN of ``library``'s Bayesian layers trained on one torch thread, imported into the IR."""
    import torch

    from edgebnn.data import digits
    from edgebnn.importers import import_model
    from edgebnn.models import digits_cnn
    from edgebnn.train import train_bnn

    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if library == "edgebnn":
            model = digits_cnn()
            train_bnn(model, digits(seed), seed=seed, progress=False)
        else:
            model = _train_bayesian_torch(seed)
    finally:
        torch.set_num_threads(threads)
    return import_model(model, (1, 1, 8, 8), where=f"digits_cnn ({library})")


def _train_bayesian_torch(seed: int) -> Any:
    """digits_cnn's architecture in bayesian-torch layers, trained like ``train_bnn`` (ELBO, Adam, KL warm-up)."""
    import torch
    import torch.nn.functional as F
    from bayesian_torch.layers import Conv2dReparameterization, LinearReparameterization
    from torch import Tensor, nn

    from edgebnn.data import digits
    from edgebnn.train._loop import run_epochs, training_arrays

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = Conv2dReparameterization(1, 16, 3, padding=1)
            self.conv2 = Conv2dReparameterization(16, 32, 3, padding=1)
            self.fc1 = LinearReparameterization(128, 64)
            self.fc2 = LinearReparameterization(64, 10)
            self.kl = torch.zeros(())

        def forward(self, x: Tensor) -> Tensor:
            kls = []
            for conv in (self.conv1, self.conv2):
                x, kl = conv(x)
                kls.append(kl)
                x = F.max_pool2d(F.relu(x), 2)
            x, kl = self.fc1(x.flatten(1))
            kls.append(kl)
            x, kl = self.fc2(F.relu(x))
            self.kl = torch.stack([*kls, kl]).sum()
            return x

    model = Net()
    x, y, val = training_arrays(model, digits(seed), every_class=False)

    def loss_terms(xb: Tensor, yb: Tensor) -> tuple[Tensor, Tensor]:
        return F.cross_entropy(model(xb), yb), model.kl

    run_epochs(model, [{"params": list(model.parameters()), "lr": 3e-3}], x, y, val, loss_terms, recipe=None,
               epochs=60, batch_size=64, kl_warmup_epochs=10, seed=seed, val_samples=8, lr=3e-3, progress=False)
    return model


def evaluate(proto: Any, seed: int, x: np.ndarray, y: np.ndarray, ood: dict[str, np.ndarray]) -> dict[str, float]:
    """Accuracy, NLL, ECE, mean MI on ``x`` and the MI-AUROC of ``x`` against each OOD set."""
    from sklearn.metrics import roc_auc_score

    from edgebnn.metrics import accuracy, ece, nll
    from edgebnn.runtime import Session

    sess = Session(proto, seed=seed)
    pred = sess.predict(x)
    out = {"accuracy": accuracy(pred.probs, y), "nll": nll(pred.probs, y), "ece": ece(pred.probs, y),
           "mean_mi": float(pred.mutual_info.mean())}
    for name, images in ood.items():
        mi = sess.predict(images).mutual_info
        labels = np.r_[np.zeros(len(x)), np.ones(len(images))]
        out[f"auroc_{name}"] = float(roc_auc_score(labels, np.r_[pred.mutual_info, mi]))
    return out


def run_mode(model: Any, mode: str, samples: int, x: np.ndarray, y: np.ndarray,
             ood: dict[str, np.ndarray]) -> dict[str, float] | str:
    """The metrics of ``model`` exported in ``mode``, averaged over the sampling seeds; or why it does not apply."""
    from edgebnn.errors import InvalidOptionError
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model

    seeds = (0,) if mode == "analytic" else SAMPLING_SEEDS
    runs = []
    for seed in seeds:
        try:
            config = ExportConfig(samples, mode="baked" if mode == "baked-int8" else mode, seed=seed,
                                  weights="int8" if mode == "baked-int8" else "fp32", rng="host")
            proto = export_model(model, config).proto
        except InvalidOptionError as e:
            return str(e)
        runs.append(evaluate(proto, seed, x, y, ood))
    return {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}


def verdict(metrics: dict[str, float], ref: dict[str, float], ood: list[str]) -> dict[str, Any]:
    """Deltas against the reference and whether they are inside :data:`BUDGET`."""
    d = {"d_nll": metrics["nll"] - ref["nll"], "d_ece": metrics["ece"] - ref["ece"],
         **{f"d_auroc_{n}": metrics[f"auroc_{n}"] - ref[f"auroc_{n}"] for n in ood}}
    misses = [k for k, v in d.items() if (v > BUDGET[k[2:]] if k in ("d_nll", "d_ece") else v < -BUDGET["auroc"])]
    return {**{k: round(v, 4) for k, v in d.items()}, "within_budget": not misses, "misses": misses}


def run(seed: int = 0, samples: int = 16, library: str = "edgebnn") -> dict[str, Any]:
    from edgebnn.data import digits
    from edgebnn.passes import lower

    start = time.perf_counter()
    bnn = train_digits(seed, library)
    trained_s = time.perf_counter() - start
    data = digits(seed)
    x, y = data.x_test, data.y_test
    ood = {"flipped": np.ascontiguousarray(x[..., ::-1]), "blobs": noise_blobs(len(x), seed + 1)}
    rows: list[dict[str, Any]] = []
    reference: dict[str, dict[str, float]] = {}
    for label, scheme, options, default in VARIANTS:
        result = lower(bnn, scheme, seed=seed, **options) if scheme != "float" else None
        model = bnn if result is None else result.model
        notes = sorted({part for r in (result.report["layers"] if result else [])
                        for part in (r["note"] or "").split("; ") if part.startswith(WARNINGS)})
        for mode in MODES:
            metrics = run_mode(model, mode, samples, x, y, ood)
            row: dict[str, Any] = {"label": label, "scheme": scheme, "options": options, "default": default,
                                   "mode": mode, "compression_ratio": round(result.report["compression_ratio"], 2)
                                   if result else 1.0, "warnings": notes}
            if isinstance(metrics, str):
                rows.append({**row, "skipped": metrics})
                continue
            if scheme == "float" and mode in ("baked", "noise", "analytic"):
                reference[mode] = metrics
            ref = reference[REFERENCE_MODE[mode]]
            rows.append({**row, "skipped": None, "reference": f"float {REFERENCE_MODE[mode]}",
                         **{k: round(v, 4) for k, v in metrics.items()}, **verdict(metrics, ref, list(ood))})
    checked = [r for r in rows if r["default"] and not r["skipped"] and r["scheme"] != "float"]
    outside = [f"{r['label']} {r['mode']}" for r in checked if not r["within_budget"] and r["scheme"] not in WARNED]
    warned = [f"{r['label']} {r['mode']}" for r in checked if not r["within_budget"] and r["scheme"] in WARNED]
    return {
        "schema": SCHEMA,
        "library": library,
        "seed": seed,
        "samples": samples,
        "sampling_seeds": list(SAMPLING_SEEDS),
        "n_test": len(x),
        "ood_sets": {"flipped": "test digits mirrored left-right",
                     "blobs": "1-3 Gaussian bumps per image, widths 0.8-2 px, max 1"},
        "budget": BUDGET,
        "rows": rows,
        "outside_budget": outside,
        "warned": warned,
        "train_s": round(trained_s, 1),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def markdown(result: dict[str, Any]) -> str:
    """The table of docs/uncertainty.md: one row per scheme and mode."""
    head = ("| scheme | mode | ratio | acc | NLL | ECE | AUROC flipped | AUROC blobs | mean MI | dNLL | dECE "
            "| dAUROC flip / blobs | budget |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in result["rows"]:
        if r["skipped"]:
            continue
        ok = "ok" if r["within_budget"] else "**out** (" + ", ".join(m[2:] for m in r["misses"]) + ")"
        if r["scheme"] == "float":
            ok = "reference" if REFERENCE_MODE[r["mode"]] == r["mode"] else ok
        lines.append(
            f"| {r['label']} | {r['mode']} | {r['compression_ratio']:.1f}x | {r['accuracy']:.3f} | {r['nll']:.3f} "
            f"| {r['ece']:.3f} | {r['auroc_flipped']:.3f} | {r['auroc_blobs']:.3f} | {r['mean_mi']:.3f} "
            f"| {r['d_nll']:+.3f} | {r['d_ece']:+.3f} | {r['d_auroc_flipped']:+.3f} / {r['d_auroc_blobs']:+.3f} "
            f"| {ok} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="training, lowering and OOD-set seed")
    parser.add_argument("--samples", type=int, default=16, help="ensemble size S")
    parser.add_argument("--library", choices=LIBRARIES, default="edgebnn", help="Bayesian layers of the CNN")
    args = parser.parse_args(argv)
    result = run(args.seed, args.samples, args.library)
    print(json.dumps(result, sort_keys=True))
    print()
    print(markdown(result))
    print(f"\noutside the budget (defaults): {len(result['outside_budget'])} {result['outside_budget']}")
    print(f"warned (need their recipe): {len(result['warned'])} {result['warned']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
