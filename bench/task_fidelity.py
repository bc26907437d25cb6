"""Regression and segmentation exports against torch's own Monte Carlo predictive (prints JSON).

For the models of tests/integration/test_tasks.py (bayesian-torch LinearReparameterization / Conv2dReparameterization,
MC nn.Dropout2d): the RMS error of the exported S = 64 predictive (mean and relative total variance; per-pixel
probs) against a 4000-pass torch reference, beside torch's own S = 64 error (62 blocks of the 4000 passes).

    PYTHONPATH=$PWD .venv/bin/python bench/task_fidelity.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import test_tasks as T

from edgebnn import from_torch
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.runtime import Session
from edgebnn.tasks import predictive_from_samples

S, BLOCKS = T.S, T.BLOCKS


def _rms(a: Any) -> float:
    return round(float(np.sqrt(np.mean(np.square(a)))), 5)


def regression(name: str, factory: Any, options: dict[str, Any], modes: list[str], seed: int) -> list[dict]:
    T._seed(seed)
    model = factory()
    x = T._inputs()
    ir = from_torch(model, (1, 3), task="regression", **options)
    task = ir.manifest.task_spec()
    draws = T._torch_draws(model, x, T.REF)
    mean, var = T._regression_moments(task, draws)
    blocks = [T._regression_moments(task, draws[i * S:(i + 1) * S]) for i in range(BLOCKS)]
    torch_mean = _rms([m - mean for m, _ in blocks])
    torch_var = _rms([(v - var) / var for _, v in blocks])
    rows = []
    for mode in modes:
        p = Session(export_model(ir, ExportConfig(S, mode=mode, seed=3, rng="host")).proto, seed=5).predict(x)
        rows.append({"model": name, "mode": mode, "mean_rms_error": _rms(p.mean - mean),
                     "torch_s64_mean_rms_error": torch_mean, "variance_rel_rms_error": _rms((p.variance - var) / var),
                     "torch_s64_variance_rel_rms_error": torch_var})
    return rows


def segmentation(name: str, factory: Any, options: dict[str, Any], modes: list[str], seed: int,
                 train: bool = False) -> list[dict]:
    T._seed(seed)
    model = factory()
    x = np.random.default_rng(2).random((6, 1, 6, 6), dtype=np.float32)
    ir = from_torch(model, (1, 1, 6, 6), **options)
    task = ir.manifest.task_spec()
    draws = T._torch_draws(model, x, T.REF, train=train)
    ref = predictive_from_samples(task, draws).probs
    torch_err = _rms([predictive_from_samples(task, draws[i * S:(i + 1) * S]).probs - ref for i in range(BLOCKS)])
    rows = []
    for mode in modes:
        p = Session(export_model(ir, ExportConfig(S, mode=mode, seed=3, rng="host")).proto, seed=5).predict(x)
        rows.append({"model": name, "mode": mode, "probs_rms_error": _rms(p.probs - ref),
                     "torch_s64_probs_rms_error": torch_err})
    return rows


def main() -> None:
    torch.set_num_threads(1)
    rows = [
        *regression("mean+logvar MLP", T.MeanLogVar, {}, ["baked", "noise"], 0),
        *regression("mean-only MLP, noise_var 0.05", T.MeanOnly, {"noise_var": 0.05}, ["baked", "noise"], 1),
        *regression("last-layer Bayes, mean+logvar", T.LastLayerBayes, {}, ["analytic"], 2),
        *segmentation("Conv2dReparameterization", T.SegNet, {}, ["baked", "noise", "analytic"], 4),
        *segmentation("MC Dropout2d", T.DropoutSeg, {"mc_dropout": True}, ["baked", "noise", "analytic"], 5,
                      train=True),
    ]
    print(json.dumps({"samples": S, "reference_passes": T.REF, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
