"""bench/scale.py at reduced width on its smallest model (the TCN at 0.1 width: 790 Bayesian weights), for its shape:
every stage reported, each mode exported and timed, its fidelity within a few torch Monte Carlo deviations. The
full-size numbers are in docs/results/2026-12-07-scale.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("bayesian_torch")
ROOT = Path(__file__).resolve().parents[2]


def test_scale_prints_one_json_line_per_model_with_every_mode():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "bench/scale.py", "--models", "tcn", "--width", "0.1", "--rounds", "1",
                        "--calls", "1", "--draws", "16", "--inputs", "2", "--batches", "1,2"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["schema"] == "edgebnn.bench.scale/1" and rows[0]["model"] == "tcn"
    row = rows[0]
    assert row["lower"]["seconds"] > 0 and row["lower"]["peak_rss"] > row["lower"]["stage_bytes"] > 0
    for mode in ("baked", "noise", "analytic"):
        export = row["export"][mode]
        assert "error" not in export, (mode, export)
        assert export["bytes"] > 0 and export["peak_over_bytes"] == round(export["peak_rss"] / export["bytes"], 2)
        # the mean difference over the Monte Carlo deviation of the difference: ~0.8 within MC error, a posterior-
        # mean net would be several; 3 leaves room for 2 inputs x 10 classes of 16 draws
        assert 0 < row["fidelity"][mode]["mean_diff_over_mc_sd"] < 3, (mode, row["fidelity"][mode])
        for batch in ("1", "2"):
            ratios = row["latency"][batch][mode]
            assert ratios["over_float"] > 0 and ratios["over_det16"] > 0
    assert set(row["latency"]["1"]["p50_ms"]) == {"float", "det16", "baked", "noise", "analytic"}
