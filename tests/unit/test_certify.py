"""``edgebnn.budget.certify``: per-input evidence to per-metric bounds (no model runs: predictives are made up)."""

from __future__ import annotations

import numpy as np
import pytest

from edgebnn.budget import Budget, Evidence, certify
from edgebnn.metrics import Predictive, RegressionPredictive, ece, ood_report
from edgebnn.tasks import Classification, Regression

ROUNDOFF = 1e-9  # float64 sums of a few hundred terms, in another order


def _probs(rng: np.random.Generator, n: int, sharp: float) -> np.ndarray:
    logits = rng.normal(0, sharp, (n, 10))
    p = np.exp(logits - logits.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


def _classifier(probs: np.ndarray, mi: np.ndarray, ood_mi: np.ndarray | None, draws: int = 1) -> Evidence:
    entropy = -(probs * np.log(probs)).sum(1)
    return Evidence(Classification(), 10, draws, Predictive(probs, entropy, mi), mi, ood_mi, "test")


@pytest.fixture(scope="module")
def pair():
    """A float BNN's and a slightly worse lowering's evidence on 300 inputs and 100 OOD inputs (seeded); the
    lowering is run twice per input (draws=2), its two rows differing as two device calls would."""
    rng = np.random.default_rng(0)
    n, m = 300, 100
    y = rng.integers(0, 10, n)
    pf = _probs(rng, n, 3.0)
    pf[np.arange(n), y] += 0.5  # mostly right
    pf /= pf.sum(1, keepdims=True)
    mi_f, ood_f = rng.gamma(2, 0.02, n), rng.gamma(2, 0.05, m)
    pl = np.repeat(pf, 2, axis=0) * rng.uniform(0.8, 1.2, (2 * n, 10))
    pl /= pl.sum(1, keepdims=True)
    mi_l = np.repeat(mi_f, 2) * rng.uniform(0.5, 1.5, 2 * n)
    ood_l = np.repeat(ood_f, 2) * rng.uniform(0.5, 1.5, 2 * m)
    return y, _classifier(pf, mi_f, ood_f), _classifier(pl, mi_l, ood_l, draws=2)


def test_the_changes_are_the_metrics_of_the_device_rows(pair) -> None:
    from sklearn.metrics import roc_auc_score

    y, ref, low = pair
    cert = certify(Budget.parse("nll=+1,brier=+1,accuracy=-1,ece=+1,auroc=-1"), ref, low, y)
    d = cert.deltas
    y2 = np.repeat(y, 2)
    pl, pf = low.pred.probs, ref.pred.probs  # type: ignore[union-attr]
    nll = lambda p, t: -np.log(p[np.arange(len(t)), t]).mean()  # noqa: E731
    assert d["nll"] == pytest.approx(nll(pl, y2) - nll(pf, y), abs=ROUNDOFF)
    assert d["accuracy"] == pytest.approx((pl.argmax(1) == y2).mean() - (pf.argmax(1) == y).mean(), abs=ROUNDOFF)
    # ECE of every device row, each input's two rows weighted a half (the same as ECE over the 600 rows)
    assert d["ece"] == pytest.approx(ece(pl, y2) - ece(pf, y), abs=ROUNDOFF)
    # the MI-AUROC of single device calls: every (in row, OOD row) pair, each a quarter of an input pair
    auroc_low = roc_auc_score(np.r_[np.zeros(600), np.ones(200)], np.r_[low.in_scores, low.ood_scores])
    auroc_ref = ood_report(ref.pred.entropy, ref.in_scores, np.zeros(100), ref.ood_scores)["auroc_mutual_info"]
    assert d["auroc"] == pytest.approx(auroc_low - auroc_ref, abs=ROUNDOFF)
    # each bound is on the metric's worse side of its change; AUROC resamples in- and OOD inputs apart
    by = {b.metric: b for b in cert.bounds}
    assert by["nll"].bound > d["nll"] and by["ece"].bound > d["ece"] and by["accuracy"].bound < d["accuracy"]
    assert by["auroc"].bound < d["auroc"] and (by["auroc"].rows, by["auroc"].ood_rows) == (300, 100)
    assert cert.kept


def test_identical_evidence_keeps_any_resolvable_budget(pair) -> None:
    y, ref, _ = pair
    cert = certify(Budget.parse("nll=+0,ece=+0,auroc=-0,accuracy=-0.01"), ref, ref, y)
    by = {b.metric: b for b in cert.bounds}
    assert by["nll"].bound == 0 and by["ece"].bound == 0 and by["auroc"].bound == 0
    # accuracy agreeing on all 300 inputs: Agresti-Min keeps the bound off 0 (about t / 301.5)
    assert -0.006 < by["accuracy"].bound < -0.003 and cert.kept


def test_a_regression_is_bounded_through_its_own_metrics() -> None:
    rng = np.random.default_rng(3)
    n = 120
    y = rng.normal(0, 1, (n, 1))
    task = Regression(head="mean", dims=1)

    def evidence(mean: np.ndarray, var: np.ndarray) -> Evidence:
        pred = RegressionPredictive(mean, var, var * 0.8, var * 0.2)
        return Evidence(task, 1, 1, pred, pred.ood_scores()[1], None, "test")

    ref = evidence(y + rng.normal(0, 0.3, (n, 1)), np.full((n, 1), 0.1))
    low = evidence(y + rng.normal(0, 0.4, (n, 1)), np.full((n, 1), 0.12))
    cert = certify(Budget.parse("nll=+5,rmse=+1"), ref, low, y, seed=1)

    def report(ev: Evidence) -> dict:
        acc = task.metrics(1)
        acc.add_predictive(ev.pred, y)
        return acc.report()

    by = {b.metric: b for b in cert.bounds}
    for k in ("nll", "rmse"):
        assert by[k].delta == pytest.approx(report(low)[k] - report(ref)[k], abs=ROUNDOFF)
        assert by[k].bound > by[k].delta
    assert by["nll"].method.startswith("t") and by["rmse"].method == "bootstrap"
