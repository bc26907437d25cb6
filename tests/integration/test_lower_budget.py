"""``edgebnn lower --eval --budget``: the smallest lowering certified to keep an uncertainty budget on new data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgebnn import ir
from edgebnn.cli import main

MODEL = "edgebnn.models:digits_cnn"
BUDGET = "nll=+0.05,ece=+0.02,auroc=-0.02"


def lower(weights: Path, out: Path, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["lower", "--model", MODEL, "--weights", str(weights), "--input-shape", "1,1,8,8",
                                  *args, "-o", str(out)])
    return r.exit_code, r.output


@pytest.fixture(scope="module")
def ood(tmp_path_factory) -> Path:
    """Inputs no digit looks like: uniform noise over the range the model was lowered with, [0, 1] (fixed seed; inputs
    far outside it are refused, as every export refuses them)."""
    path = tmp_path_factory.mktemp("ood") / "noise.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.uniform(0.0, 1.0, size=(200, 1, 8, 8)).astype(np.float32))
    return path


@pytest.mark.slow
def test_the_budget_is_certified_on_every_metric_and_replays(trained_digits, ood, tmp_path) -> None:
    weights = trained_digits[1]
    out, report_path = tmp_path / "b.ebnn", tmp_path / "b.json"
    code, output = lower(weights, out, "--eval", "digits", "--ood-data", str(ood), "--budget", BUDGET,
                         "--confidence", "0.9", "--report", str(report_path))
    assert code == 0, output
    report = json.loads(report_path.read_text())
    budget = report["budget"]
    assert budget["met"] and budget["violations"] == [] and budget["confidence"] == 0.9
    # every metric's one-sided bound lies within its budget, on all 360 validation rows (the chain order selects on
    # none of them) and the 200 OOD inputs for AUROC; the deltas the report gives are the certificate's
    on = budget["measured_on"]
    assert on["certification_rows"] == on["rows"] == 360 and on["selection_rows"] == 0
    bounds = {b["metric"]: b for b in budget["bounds"]}
    assert set(bounds) == {"nll", "ece", "auroc"} and all(b["kept"] for b in bounds.values())
    assert bounds["nll"]["bound"] <= 0.05 and bounds["ece"]["bound"] <= 0.02 and bounds["auroc"]["bound"] >= -0.02
    assert bounds["auroc"]["ood_rows"] == 200 and bounds["auroc"]["method"] == "bootstrap"
    for b in bounds.values():  # a bound is on the worse side of its change
        assert (b["bound"] >= b["delta"]) if b["metric"] != "auroc" else (b["bound"] <= b["delta"])
    assert budget["deltas"] == {k: b["delta"] for k, b in bounds.items()}
    # fixed-sequence testing: every candidate before the chosen one was certified, and the test stopped at the first
    # that was not (or ran out of candidates)
    tested = budget["certification"]["tested"]
    assert all(t["kept"] for t in tested[:-1])
    chosen = next(i for i in reversed(range(len(tested))) if tested[i]["kept"])
    assert chosen == len(tested) - 1 - (not tested[-1]["kept"])
    assert (budget["certification"]["stopped"] is None) == tested[-1]["kept"]
    sizes = [t["file_bytes"] for t in tested]
    assert sizes == sorted(sizes, reverse=True)  # largest deployed file first
    # the deployed bytes: what the certified candidate was tested as is the file the default export writes
    assert budget["sizes"]["deployed"]["file_bytes"] == tested[chosen]["file_bytes"]
    assert budget["sizes"]["deployed"]["file_bytes"] < budget["sizes"]["float_bnn_bytes"] / 5
    # the float BNN's own weights, sampled again, keep it: the budget is resolvable on these rows
    assert all(b["kept"] for b in budget["floor"]["bounds"])
    for text in ("bound (90%)", "guarantee: with probability >= 90%", "MI-AUROC", "deployed"):
        assert text in output, text
    # the manifest stores the chosen config: replaying it gives the same bytes
    code, output = lower(weights, tmp_path / "replay.ebnn", "--config", str(out))
    assert code == 0, output
    assert (tmp_path / "replay.ebnn").read_bytes() == out.read_bytes()
    assert ir.load(out).manifest.lower_config == report["config"]


@pytest.mark.slow
def test_a_budget_finer_than_the_rows_resolve_says_how_many_it_needs(trained_digits, digits_data, tmp_path) -> None:
    val = tmp_path / "val100.npz"
    np.savez(val, x=digits_data.x_val[:100], y=digits_data.y_val[:100])
    out = tmp_path / "x.ebnn"
    code, output = lower(trained_digits[1], out, "--eval", str(val), "--budget", "nll=+0.05,accuracy=-0.005",
                         "--report", str(tmp_path / "x.json"))
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --budget nll=+0.05,accuracy=-0.005: ")
    # a lowering agreeing with the float BNN on all 100 rows is bounded near -1.29 / 101.5 = -0.0127: the accuracy
    # budget needs at least 1.29 / 0.005 = 257 rows
    assert "accuracy=-0.005 is finer than 100 rows resolve at 90% confidence" in lines[0]
    needed = int(lines[0].split("about ")[1].split()[0])
    assert needed >= 257
    assert "nothing was written" in lines[0] and not out.exists() and not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_a_budget_only_an_improvement_keeps_is_never_resolvable(trained_digits, tmp_path) -> None:
    out = tmp_path / "x.ebnn"
    code, output = lower(trained_digits[1], out, "--eval", "digits", "--budget", "nll=-1")
    assert code == 2, output
    assert "nll=-1 is finer than 360 rows resolve" in output
    assert "no number of rows would: it asks the lowering to do better than the float BNN itself" in output
    assert not out.exists()


def test_budget_without_eval_or_a_bad_confidence_is_one_line(tmp_path) -> None:
    code, output = lower(tmp_path / "never-read.safetensors", tmp_path / "x.ebnn", "--budget", "nll=+0.02")
    assert code == 2
    assert output.strip().splitlines() == [
        "error: --budget nll=+0.02: needs validation data to be measured on: add --eval DATA"]
    code, output = lower(tmp_path / "never-read.safetensors", tmp_path / "x.ebnn", "--eval", "digits",
                         "--budget", "nll=+0.02", "--confidence", "1")
    assert code == 2
    assert output.strip().splitlines() == [
        "error: --confidence 1.0: give the probability that the budget holds on new data, at least 0.5 and below 1 "
        "(e.g. 0.9)"]
    assert not (tmp_path / "x.ebnn").exists()


@pytest.mark.slow
def test_post_training_ternary_that_breaks_the_budget_falls_back_and_says_so(trained_digits, tmp_path) -> None:
    code, output = lower(trained_digits[1], tmp_path / "t.ebnn", "--scheme", "ternary", "--eval", "digits",
                         "--budget", "nll=+0.05,ece=+0.02", "--report", str(tmp_path / "t.json"))
    assert code == 0, output
    budget = json.loads((tmp_path / "t.json").read_text())["budget"]
    assert budget["met"] and budget["chosen"].startswith("fixed")
    assert any(w.startswith("post-training ternary breaks the budget") and "edgebnn.train.vnq" in w
               for w in budget["warnings"])
    assert "warning: post-training ternary breaks the budget" in " ".join(output.split())


@pytest.mark.slow
def test_only_the_first_rows_are_read_and_the_split_order_certifies_on_others(digits_ir, digits_data) -> None:
    from edgebnn.api import BudgetOptions, lower_within_budget
    from edgebnn.passes import LowerConfig

    x, y = digits_data.x_val, digits_data.y_val
    noise = np.random.default_rng(1).uniform(-1.0, 3.0, size=(150, 1, 8, 8)).astype(np.float32)
    lowered = lower_within_budget(digits_ir, LowerConfig(scheme="fixed", seed=3), "nll=+0.1,auroc=-0.05",
                                  data=(x, y), ood_data=noise,
                                  options=BudgetOptions(samples=4, max_rows=120, order="split", max_steps=2))
    budget, ev = lowered.lowering_report["budget"], lowered.lowering_report["eval"]
    on = budget["measured_on"]
    assert (on["rows"], on["of"], on["ood_rows"], on["samples"], on["seed"]) == (120, len(y), 120, 4, 3)
    # 20% of the rows read, at random, select; the other 80% certify
    assert (on["selection_rows"], on["certification_rows"], on["ood_certification_rows"]) == (24, 96, 96)
    assert budget["order"] == "split" and len(budget["steps"]) <= 2 and budget["met"]
    assert ev["n"] == len(y) and ev["float_bnn"]["ood"]["n"] == 150  # the eval table uses all of the data
    assert lowered.lowering_report["config"]["seed"] == 3


@pytest.mark.slow
def test_search_returns_a_certified_export_where_lower_budget_certifies(trained_digits, tmp_path) -> None:
    """The budget lower --budget certifies on the digits validation rows, given to a search whose trials all break
    it (post-training 1-bit binary): the search still ends with a certified export, a candidate of lower --budget's
    own chain, certified on the rows no trial was measured on (issue 45)."""
    pytest.importorskip("optuna")
    weights = trained_digits[1]
    budget = "nll=+0.1,ece=+0.05"
    code, output = lower(weights, tmp_path / "lowered.ebnn", "--eval", "digits", "--budget", budget)
    assert code == 0, output
    code, output = lower(weights, tmp_path / "float.ebnn")
    assert code == 0, output
    out, best = tmp_path / "search.json", tmp_path / "best.onnx"
    r = CliRunner().invoke(main, ["search", str(tmp_path / "float.ebnn"), "--data", "digits", "--trials", "2",
                                  "--population", "2", "--schemes", "binary", "--bits", "1", "--samples", "4",
                                  "--modes", "baked", "--runs", "0", "--budget", budget, "--json", str(out),
                                  "--export-best", str(best)])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    cert = report["certification"]
    assert cert["trial_candidates"] == 0  # no trial is within the budget, even on the selection rows
    chosen = report["best"]
    assert chosen["source"] == "chain" and best.stat().st_size == chosen["bytes"]
    tested = next(t for t in cert["tested"] if t.get("label") == chosen["label"])
    assert tested["kept"] and all(b["kept"] for b in tested["bounds"]) and tested["level"] <= 0.1 + 1e-12
    assert chosen["bytes"] < report["baseline"]["bytes"] / 2  # smaller than the float BNN's weights, by far
