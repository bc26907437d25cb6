"""examples/deploy_bayesian_torch.py runs end to end on small data, as a user would run it (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "deploy_bayesian_torch.py"


@pytest.mark.slow
def test_deploy_bayesian_torch_on_digits_npz(tmp_path):
    pytest.importorskip("bayesian_torch")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--demo-data", str(tmp_path / "data"), "--out", str(out), "--epochs", "3",
         "--samples", "4", "--runs", "10"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["model"].endswith("dnn_to_bnn") and summary["scheme"] == "fixed"
    # 3 epochs reach about 0.8 on the digits test split; 0.5 (chance is 0.1) only catches a broken chain
    assert summary["accuracy"] > 0.5
    assert set(summary["ood"]) >= {"auroc_mutual_info", "auroc_entropy", "aupr_mutual_info", "fpr_at_95_tpr"}
    for name in ("model.ebnn", "model.onnx", "eval.json", "eval.png", "profile.json"):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "eval.json").read_text())["data"] == str(tmp_path / "data" / "test.npz")
