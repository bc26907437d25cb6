"""``edgebnn lower --eval --budget``: a per-layer search that keeps an uncertainty budget on validation data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgebnn import ir
from edgebnn.cli import main

MODEL = "edgebnn.models:digits_cnn"
BUDGET = "nll=+0.05,ece=+0.01,auroc=-0.02"


def lower(weights: Path, out: Path, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["lower", "--model", MODEL, "--weights", str(weights), "--input-shape", "1,1,8,8",
                                  *args, "-o", str(out)])
    return r.exit_code, r.output


@pytest.fixture(scope="module")
def ood(tmp_path_factory) -> Path:
    """Inputs no digit looks like: uniform noise over the digits' scaled range (fixed seed)."""
    path = tmp_path_factory.mktemp("ood") / "noise.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.uniform(-1.0, 3.0, size=(200, 1, 8, 8)).astype(np.float32))
    return path


@pytest.mark.slow
def test_budget_search_keeps_the_budget_and_replays(trained_digits, ood, tmp_path) -> None:
    weights = trained_digits[1]
    out, report_path = tmp_path / "b.ebnn", tmp_path / "b.json"
    code, output = lower(weights, out, "--eval", "digits", "--ood-data", str(ood), "--budget", BUDGET,
                         "--report", str(report_path))
    assert code == 0, output
    report = json.loads(report_path.read_text())
    ev, budget = report["eval"], report["budget"]
    # the deltas the report claims are the ones measured on the validation data (digits val, all of it)
    assert ev["split"] == "val" and budget["measured_on"]["rows"] == budget["measured_on"]["of"] == ev["n"]
    assert "ood" in ev["float_bnn"] and "ood" in ev["lowered"]
    measured = {"nll": ev["lowered"]["nll"] - ev["float_bnn"]["nll"],
                "ece": ev["lowered"]["ece"] - ev["float_bnn"]["ece"],
                "auroc": ev["lowered"]["ood"]["auroc_mutual_info"] - ev["float_bnn"]["ood"]["auroc_mutual_info"]}
    assert budget["deltas"] == pytest.approx(measured)
    assert measured["nll"] <= 0.05 and measured["ece"] <= 0.01 and measured["auroc"] >= -0.02
    assert budget["met"] and budget["violations"] == []
    # the search went below the variance rule's bits somewhere, and says why per layer
    start = {row["layer"]: int(row["reason"].split(";")[0].split()[-2]) for row in budget["layers"]}
    assert any(row["bits"] < start[row["layer"]] for row in budget["layers"]), budget["layers"]
    # without --scheme the search starts from the variance rule after pruning
    assert all(row["reason"].startswith("variance rule: prune+fixed") for row in budget["layers"])
    assert report["config"]["overrides"], "the chosen per-layer settings are overrides of the config"
    # it is smaller than the variance rule alone
    code, _ = lower(weights, tmp_path / "rule.ebnn", "--scheme", "prune+fixed", "--report",
                    str(tmp_path / "rule.json"))
    assert code == 0
    assert report["total_bytes"] < json.loads((tmp_path / "rule.json").read_text())["total_bytes"]
    assert "MI-AUROC (OOD)" in output and "budget kept" in output
    # Both sizes: the IR the budget minimized and the file the default export deploys.
    sizes = budget["sizes"]
    assert sizes["ir_bytes"] == report["total_bytes"] and sizes["deployed"]["file_bytes"] > 0
    assert "deployed" in output
    # the manifest stores the chosen config: replaying it gives the same bytes
    code, output = lower(weights, tmp_path / "replay.ebnn", "--config", str(out))
    assert code == 0, output
    assert (tmp_path / "replay.ebnn").read_bytes() == out.read_bytes()
    assert ir.load(out).manifest.lower_config == report["config"]


@pytest.mark.slow
def test_a_budget_nothing_meets_exits_2_with_the_closest_and_writes_nothing(trained_digits, tmp_path) -> None:
    out = tmp_path / "x.ebnn"
    code, output = lower(trained_digits[1], out, "--scheme", "ternary", "--eval", "digits", "--budget", "nll=-1",
                         "--report", str(tmp_path / "x.json"))
    assert code == 2, output
    error = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(error) == 1
    assert "--budget nll=-1: no configuration tried keeps it" in error[0] and "closest: nll" in error[0]
    assert '"scheme":"ternary"' in error[0] or '"scheme":"float"' in error[0]
    assert "closest" in output and "config" in output
    assert not out.exists() and not (tmp_path / "x.json").exists()


def test_budget_without_eval_is_one_line(tmp_path) -> None:
    code, output = lower(tmp_path / "never-read.safetensors", tmp_path / "x.ebnn", "--budget", "nll=+0.02")
    assert code == 2
    assert output.strip().splitlines() == [
        "error: --budget nll=+0.02: needs validation data to be measured on: add --eval DATA"]
    assert not (tmp_path / "x.ebnn").exists()


@pytest.mark.slow
def test_post_training_ternary_that_breaks_the_budget_says_so(trained_digits, tmp_path) -> None:
    code, output = lower(trained_digits[1], tmp_path / "t.ebnn", "--scheme", "ternary", "--eval", "digits",
                         "--budget", "nll=+0.05,ece=+0.01", "--report", str(tmp_path / "t.json"))
    assert code == 0, output
    budget = json.loads((tmp_path / "t.json").read_text())["budget"]
    assert budget["met"]
    assert any(w.startswith("post-training ternary breaks the budget") and "edgebnn.train.vnq" in w
               for w in budget["warnings"])
    assert "warning: post-training ternary breaks the budget" in " ".join(output.split())
    assert any("raised to" in row["reason"] for row in budget["layers"])


@pytest.mark.slow
def test_large_validation_data_is_subsampled_for_the_search_and_measured_in_full(digits_ir, digits_data) -> None:
    from edgebnn.api import lower_within_budget
    from edgebnn.passes import LowerConfig

    x, y = digits_data.x_val, digits_data.y_val
    noise = np.random.default_rng(1).uniform(-1.0, 3.0, size=(150, 1, 8, 8)).astype(np.float32)
    lowered = lower_within_budget(digits_ir, LowerConfig(scheme="fixed", seed=3), "nll=+0.1,auroc=-0.05",
                                  data=(x, y), ood_data=noise, samples=4, max_rows=100, max_steps=2)
    budget, ev = lowered.lowering_report["budget"], lowered.lowering_report["eval"]
    assert budget["measured_on"] == {"rows": 100, "of": len(y), "ood_rows": 100, "samples": 4, "seed": 3}
    assert ev["n"] == len(y) and ev["float_bnn"]["ood"]["n"] == 150  # the final figures use all of the data
    assert len(budget["steps"]) <= 2
    # what the report calls met is what the full data says
    full = {"nll": ev["delta"]["nll"], "auroc": ev["delta"]["auroc"]}
    assert budget["deltas"] == pytest.approx(full)
    assert budget["met"] == (full["nll"] <= 0.1 and full["auroc"] >= -0.05)
    assert budget["met"] or any("on all 360 rows" in w for w in budget["warnings"])
    assert lowered.lowering_report["config"]["seed"] == 3
