"""bench/anytime.py in ``--quick`` mode on the bayesian-torch digits CNN (baked): the JSON it prints has what the
issue's goal is checked on (samples used in and OOD, latency of the anytime and fixed exports at batch 1 and 8,
quality of auto against S = 16), with values in their possible ranges. Timings are printed, never asserted."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from scripts import script_module

pytest.importorskip("torch")
pytest.importorskip("bayesian_torch")


def test_quick_run_prints_the_goals_figures() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert script_module("bench/anytime.py", "bench_anytime").main(
            ["--quick", "--models", "bt", "--modes", "baked"]) == 0
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["schema"] == "edgebnn.bench.anytime/2" and result["quick"]
    m = result["models"]["bt"]["baked"]
    rule = m["rule"]
    used = m["samples"]
    for k in ("in", "flipped", "blobs", "permuted"):  # counts a row can end at: 4, 8, 12 or 16
        assert rule["min_samples"] <= used[k] <= rule["max_samples"], (k, used)
    assert used["ood_over_in"] == pytest.approx(used["ood_mean"] / used["in"])
    for batch in ("batch1", "batch8"):
        graphs = m["latency"][batch]["graphs"]
        assert set(graphs) == {"auto", "S4", "S8", "S16"}
        assert graphs["S16"]["ratio_mean"] == 1.0
        assert all(g["p50_ms"] > 0 and g["mean_ms"] > 0 for g in graphs.values())
    assert m["latency"]["batch1"]["calls"] == 16 and m["latency"]["batch8"]["calls"] == 2
    q = m["quality"]
    # baked: auto's members are the first of S = 16's, and a row stops only when its predictive is within ε = 0.1
    # of the 16-member one with the same class for >= 1 - δ of inputs (Gaussian members): on 360 test digits the
    # accuracies differ by a few rows at most
    assert abs(q["auto_minus_S16"]["accuracy"]) <= 0.03, q
    assert q["auto_minus_S16"]["nll"] == pytest.approx(q["auto"]["nll"] - q["S16"]["nll"])


def test_unknown_model_is_refused() -> None:
    with pytest.raises(SystemExit):
        script_module("bench/anytime.py", "bench_anytime").main(["--models", "vgg"])
