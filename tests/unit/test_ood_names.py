"""``eval --ood-data`` names a task's OOD scores as the task does (issue 42): a regression's epistemic score is its
epistemic variance, never "MI"; a classifier keeps entropy and MI. The report's keys stay the same for every task
(``auroc_mutual_info``, ``mean_mutual_info_in``, ...: reports and the budget read them) and ``ood.scores`` says what
they are."""

from __future__ import annotations

import io

import numpy as np
import torch
from rich.console import Console
from synthetic import synthetic_linear

import edgebnn
from edgebnn.nn import BayesLinear
from edgebnn.tables import print_eval


def _table(report: dict) -> str:
    out = io.StringIO()
    print_eval(Console(file=out, width=200), [report])
    return out.getvalue()


def test_a_regressions_ood_scores_are_named_as_its_own(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(BayesLinear(3, 8), torch.nn.ReLU(), BayesLinear(8, 2))
    path = edgebnn.export(edgebnn.from_torch(net, (1, 3), task="regression"), tmp_path / "r.onnx", samples=8,
                          mode="baked")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((64, 3)).astype(np.float32),
             y=rng.standard_normal((64, 1)).astype(np.float32))
    np.savez(tmp_path / "o.npz", x=8 * rng.standard_normal((64, 3)).astype(np.float32))
    report = edgebnn.evaluate(path, data=tmp_path / "d.npz", ood_data=tmp_path / "o.npz")
    ood = report["ood"]
    assert ood["scores"] == {"total": "Gaussian entropy", "epistemic": "epistemic variance",
                             "short": ["entropy", "epi. var"]}
    assert 0 <= ood["auroc_mutual_info"] <= 1 and ood["mean_mutual_info_ood"] > 0  # the key names kept
    table = _table(report)
    assert "AUROC epi. var" in table and "epi. var OOD" in table and "MI" not in table


def test_a_classifier_keeps_entropy_and_mi(tmp_path):
    path = edgebnn.export(synthetic_linear(), tmp_path / "c.onnx", samples=8, mode="baked")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((64, 5)).astype(np.float32), y=rng.integers(0, 4, 64))
    np.savez(tmp_path / "o.npz", x=8 * rng.standard_normal((64, 5)).astype(np.float32))
    report = edgebnn.evaluate(path, data=tmp_path / "d.npz", ood_data=tmp_path / "o.npz")
    assert report["ood"]["scores"]["epistemic"] == "mutual information"
    assert "AUROC MI" in _table(report) and "AUROC entropy" in _table(report)
