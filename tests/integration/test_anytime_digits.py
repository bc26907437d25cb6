"""Anytime ensembles on a trained model (issue 36): the session's digits CNN (``trained_digits``, seed 0) and the OOD
sets of ``bench/analytic_ood.py`` (mirrored digits, noise blobs, pixel-permuted digits).

The rule's guarantee assumes Gaussian members; here it meets real ones. 64 posterior draws per input (the reference
runtime) are a population from which 100 random 16-member orders are taken, each run through the rule as the
reference runtime runs it: the share of (order, input) pairs that stop with a class probability ε or more away from
that order's 16-member predictive, or another class, must stay below δ; the quality of the stopped predictive must
stay within the issue's goals of the 16-member one on the same orders; OOD inputs must draw at least 1.5x the samples
of the test digits. Then the command line end to end.
"""

from __future__ import annotations

import json
from types import ModuleType

import numpy as np
import pytest
from click.testing import CliRunner
from scripts import script_module

from edgebnn.cli import main
from edgebnn.metrics import ece
from edgebnn.runtime.reference import Reference
from edgebnn.stopping import RunningPredictive, StoppingRule

pytestmark = pytest.mark.slow
POPULATION, ORDERS, S_MAX = 64, 100, 16


def _bench() -> ModuleType:
    return script_module("bench/analytic_ood.py")


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _anytime(rule: StoppingRule, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(probs, mutual information, samples) of the rule over members ``p`` [S_max, N, K] in order."""
    state = RunningPredictive(p.shape[1], p.shape[2])
    rows = np.arange(p.shape[1])
    for i in range(rule.chunks):
        state.add(rows, p[i * rule.chunk:(i + 1) * rule.chunk, rows])
        rows = rows[~rule.settled(state.mean[rows], state.m2[rows], i, p.shape[2])]
    probs, _, mi, used = state.outputs()
    return probs, mi, used


def _fixed(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    probs = p.mean(0)
    h = -(probs * np.log(np.maximum(probs, 1e-12))).sum(-1)
    return probs, np.maximum(h - (-(p * np.log(np.maximum(p, 1e-12))).sum(-1)).mean(0), 0)


@pytest.fixture(scope="module")
def members(digits_ir, digits_data) -> dict[str, np.ndarray]:
    x, y = digits_data.split("test")
    sets = {"in": x, **_bench().ood_sets(x, 0)}
    ref = Reference(digits_ir)
    return {"y": y, **{k: _softmax(ref.logits(v, POPULATION, seed=0).astype(np.float64)) for k, v in sets.items()}}


def test_rule_keeps_its_promise_and_the_quality_of_16_samples(members) -> None:
    from sklearn.metrics import roc_auc_score

    rule = StoppingRule()
    y = members["y"]
    sets = [k for k in members if k not in ("y", "in")]
    rng = np.random.default_rng(0)
    bad, used = [], {k: [] for k in ("in", *sets)}
    quality = {"anytime": [], "fixed": []}
    for _ in range(ORDERS):
        order = rng.permutation(POPULATION)[:S_MAX]
        outs = {}
        for k in ("in", *sets):
            p = members[k][order]
            probs, mi, n = _anytime(rule, p)
            full, full_mi = _fixed(p)
            used[k].append(n.mean())
            bad.append((np.abs(probs - full).max(-1) >= rule.epsilon) | (probs.argmax(-1) != full.argmax(-1)))
            outs[k] = ((probs, mi), (full, full_mi))
        for which, index in (("anytime", 0), ("fixed", 1)):
            probs, mi_in = outs["in"][index]
            aurocs = [roc_auc_score(np.r_[np.zeros(len(mi_in)), np.ones(len(outs[k][index][1]))],
                                    np.r_[mi_in, outs[k][index][1]]) for k in sets]
            quality[which].append([float((probs.argmax(1) == y).mean()),
                                   float(-np.log(np.maximum(probs[np.arange(len(y)), y], 1e-12)).mean()),
                                   ece(probs, y), *aurocs])
    # the promise, on real members: at most δ of (order, input) pairs stop badly (the rule's bound; measured far below)
    assert float(np.mean(bad)) <= rule.delta
    # quality: the goals against 16 samples on the same orders (means over the 100 orders)
    a, f = np.mean(quality["anytime"], 0), np.mean(quality["fixed"], 0)
    assert a[0] >= f[0] - 0.005 and a[1] <= f[1] + 0.01 and a[2] <= f[2] + 0.005
    assert np.all(a[3:] >= f[3:] - 0.01), (a, f)
    # unfamiliar inputs draw more: at least 1.5x the test digits' mean on every OOD set, and the test digits < 8
    mean_in = float(np.mean(used["in"]))
    assert mean_in < 8
    for k in sets:
        assert np.mean(used[k]) >= 1.5 * mean_in, (k, np.mean(used[k]), mean_in)


def test_cli_export_eval_profile(digits_ir, digits_data, tmp_path) -> None:
    import edgebnn

    ir = tmp_path / "m.ebnn"
    edgebnn.save(digits_ir, ir)
    x, _ = digits_data.split("test")
    np.savez(tmp_path / "ood.npz", x=_bench().ood_sets(x, 0)["blobs"])

    def run(*args: object) -> object:
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)

    r = run("export", ir, "--samples", "auto", "--mode", "baked", "--epsilon", "0.05", "-o", tmp_path / "a.onnx",
            "--json", tmp_path / "x.json")
    assert r.exit_code == 0, r.output
    assert "anytime: samples 4..16" in r.output
    assert json.loads((tmp_path / "x.json").read_text())["export"]["anytime"]["epsilon"] == 0.05
    r = run("eval", tmp_path / "a.onnx", "--data", "digits", "--ood-data", tmp_path / "ood.npz", "--json",
            tmp_path / "e.json")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["samples"] == 16 and report["anytime"]["rule"] == "t-prediction/1"
    used, ood = report["samples_used"], report["ood"]["samples_used"]
    assert 4 <= used["mean"] <= 16 and abs(sum(used["at"].values()) - 1) < 1e-9
    assert report["ood"]["samples_ratio"] == pytest.approx(ood["mean"] / used["mean"])
    assert "samples used: mean" in r.output
    r = run("eval", ir, "--samples", "auto", "--data", "digits", "--json", tmp_path / "r.json")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "r.json").read_text())["runtime"] == "reference (anytime)"
    r = run("profile", ir, "--onnx", tmp_path / "a.onnx", "--data", "digits", "--ood-data", tmp_path / "ood.npz",
            "--inputs", 5, "--runs", 1, "--warmup", 0, "--json", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    prof = json.loads((tmp_path / "p.json").read_text())
    assert prof["schema"] == "edgebnn.profile/1" and prof["edgebnn_version"]
    for tag in ("in", "ood"):
        part = prof["per_input"][tag]
        assert set(part["latency_ms"]) == {"ensemble", "fixed", "det_16", "float_deterministic", "float_bnn"}
        assert part["ratios"]["vs_fixed"] > 0 and part["n"] == 5
    # bad input: one line, exit 2, nothing written
    for args, needle in [(("export", ir, "--samples", "auto", "--chunk", "3", "-o", tmp_path / "b.onnx"),
                          "--chunk 3: must divide --max-samples 16"),
                         (("export", ir, "--samples", "auto", "--mode", "analytic", "-o", tmp_path / "b.onnx"),
                          "analytic mode draws no samples"),
                         (("export", ir, "--samples", "8", "--epsilon", "0.1", "-o", tmp_path / "b.onnx"),
                          "--epsilon: only with --samples auto"),
                         (("profile", ir, "--samples", "auto"), "give --data")]:
        r = CliRunner().invoke(main, [str(a) for a in args])
        assert r.exit_code == 2, r.output
        assert needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "b.onnx").exists()
