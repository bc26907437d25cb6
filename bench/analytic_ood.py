"""Analytic mode against the float ensemble on three OOD sets (issue 23, docs/uncertainty.md "analytic mode").

Trains the digits CNN (``bench/uncertainty_fidelity.py``'s ``train_digits``: edgebnn or bayesian-torch layers,
seeded, one torch thread), exports the float BNN as the baked S-member ensemble (sampling seeds 0, 1, 2,
metrics averaged) and in ``analytic`` mode (S quadrature points, deterministic), and reports the MI-AUROC of
the digits test split (360 images) against each OOD set:

- **flipped**: the test digits mirrored left-right;
- **blobs**: 1-3 Gaussian bumps per image (``uncertainty_fidelity.noise_blobs``, seed + 1);
- **permuted**: the test digits with their 64 pixels permuted by one fixed permutation (seed + 2).

Goal: analytic at least the float ensemble's AUROC − 0.02 on every set. Prints one JSON line
(schema ``edgebnn.bench.analytic_ood/1``). About a minute per model on 2 free cores:

    .venv/bin/python bench/analytic_ood.py [--seed 0] [--samples 16] [--library edgebnn|bayesian-torch]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from uncertainty_fidelity import LIBRARIES, noise_blobs, train_digits

SCHEMA = "edgebnn.bench.analytic_ood/1"
SAMPLING_SEEDS = (0, 1, 2)
GOAL = 0.02


def ood_sets(x: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """The three OOD sets of the module docstring, built from the test images ``x`` [N, 1, 8, 8]."""
    perm = np.random.default_rng(seed + 2).permutation(x[0].size)
    return {"flipped": np.ascontiguousarray(x[..., ::-1]), "blobs": noise_blobs(len(x), seed + 1),
            "permuted": np.ascontiguousarray(x.reshape(len(x), -1)[:, perm].reshape(x.shape))}


def aurocs(proto: Any, seed: int, x: np.ndarray, ood: dict[str, np.ndarray]) -> dict[str, float]:
    """MI-AUROC of ``x`` (negatives) against each OOD set (positives), and the mean MI on ``x``."""
    from sklearn.metrics import roc_auc_score

    from edgebnn.runtime import Session

    sess = Session(proto, seed=seed)
    mi_in = sess.predict(x).mutual_info
    out = {"mean_mi": float(mi_in.mean())}
    for name, images in ood.items():
        mi = sess.predict(images).mutual_info
        out[name] = float(roc_auc_score(np.r_[np.zeros(len(x)), np.ones(len(images))], np.r_[mi_in, mi]))
    return out


def run(seed: int = 0, samples: int = 16, library: str = "edgebnn") -> dict[str, Any]:
    from edgebnn.data import digits
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model

    bnn = train_digits(seed, library)
    x = digits(seed).x_test
    ood = ood_sets(x, seed)
    runs = [aurocs(export_model(bnn, ExportConfig(samples, mode="baked", seed=s)).proto, s, x,
                   ood) for s in SAMPLING_SEEDS]
    ensemble = {k: round(float(np.mean([r[k] for r in runs])), 4) for k in runs[0]}
    analytic = {k: round(v, 4) for k, v in aurocs(export_model(bnn, ExportConfig(samples, mode="analytic")).proto, 0, x,
                                                  ood).items()}
    deltas = {k: round(analytic[k] - ensemble[k], 4) for k in ood}
    return {"schema": SCHEMA, "library": library, "seed": seed, "samples": samples, "n_test": len(x),
            "float_ensemble": ensemble, "analytic": analytic, "d_auroc": deltas,
            "goal_met": all(d >= -GOAL for d in deltas.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="training, OOD-set seed")
    parser.add_argument("--samples", type=int, default=16, help="ensemble size S = analytic quadrature points")
    parser.add_argument("--library", choices=LIBRARIES, default="edgebnn", help="Bayesian layers of the CNN")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.seed, args.samples, args.library), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
