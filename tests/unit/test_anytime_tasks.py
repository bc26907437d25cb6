"""Anytime ensembles for regression and segmentation (issue 44 item 2): each rule's stated guarantee, checked on
Gaussian members with bounds from the number of trials, and the exported graphs against the fixed export and
across their two forms (docs/anytime.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import edgebnn
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.runtime import Session
from edgebnn.stopping import StoppingRule

torch = pytest.importorskip("torch")
REPS = 20_000


def _margin(p: float, n: int) -> float:
    """4 standard errors of a rate p estimated from n trials."""
    return 4 * math.sqrt(p * (1 - p) / n)


def _sequential(rule: StoppingRule, x: np.ndarray, settled) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rule over member values ``x`` [S_max, B, ...] in order: (stopped mean, stopped M2, samples [B]);
    ``settled(mean, m2, i)`` -> [B] bool for the rows given."""
    b = x.shape[1]
    mean, m2, n = np.zeros(x.shape[1:]), np.zeros(x.shape[1:]), np.zeros(b, int)
    rows = np.arange(b)
    for i in range(rule.chunks):
        k = (i + 1) * rule.chunk
        first = x[:k, rows]
        mean[rows], m2[rows], n[rows] = first.mean(0), ((first - first.mean(0)) ** 2).sum(0), k
        if i < rule.chunks - 1:
            rows = rows[~settled(mean[rows], m2[rows], i)]
    return mean, m2, n


@pytest.mark.parametrize("spread", [0.01, 0.03, 0.1])
def test_regression_rule_keeps_its_guarantee_for_gaussian_members(spread: float) -> None:
    """3 output dims, aleatoric variance 1 (a mean head's stated noise), members' means Gaussian with std
    ``spread``: the share of inputs that stop with some dim's mean ε·σ̂ or more from its 16-member value (σ̂ the
    predictive std reported at the stop) is at most δ (+4 standard errors); at S_max there is no miss; every
    spread stops some inputs early (first look, across the looks, rarely)."""
    rule = StoppingRule(epsilon=0.1, delta=0.1)
    rng = np.random.default_rng(3)
    mu = rng.normal(0, 1, (1, REPS, 3)) + spread * rng.standard_normal((16, REPS, 3))
    mean, m2, used = _sequential(rule, mu, lambda m, v, i: rule.settled_regression(m, v, 1.0, i, 3))
    sd = np.sqrt(1.0 + m2 / used[:, None])
    bad = (np.abs(mean - mu.mean(0)) >= rule.epsilon * sd).any(-1)
    assert bad.mean() <= rule.delta + _margin(rule.delta, REPS)
    assert not bad[used == 16].any()
    assert (used < 16).mean() > 0.05


def test_regression_rule_fails_without_the_t_quantile() -> None:
    """The check can fail: with no aleatoric variance and ε = 1 (stop when the mean is settled to one predictive std)
    the same rule with a normal quantile and no union bound (each dim and look at level δ) stops at 4 and misses
    far more than δ; the rule itself keeps δ there."""

    class Naive(StoppingRule):
        def quantile(self, n: int, classes: int) -> float:
            from scipy.stats import norm

            return float(norm.ppf(1 - self.delta / 2))

    rng = np.random.default_rng(4)
    mu = 0.05 * rng.standard_normal((16, REPS, 3))
    rates = {}
    for rule in (Naive(epsilon=1.0, delta=0.1), StoppingRule(epsilon=1.0, delta=0.1)):
        mean, m2, used = _sequential(rule, mu, lambda m, v, i, rule=rule: rule.settled_regression(m, v, 0.0, i, 3))
        rates[type(rule)] = (np.abs(mean - mu.mean(0)) >= rule.epsilon * np.sqrt(m2 / used[:, None])).any(-1).mean()
    assert rates[Naive] > 0.1 + 10 * _margin(0.1, REPS)
    assert rates[StoppingRule] <= 0.1 + _margin(0.1, REPS)


@pytest.mark.parametrize("spread", [0.002, 0.008, 0.03])
def test_segmentation_rule_keeps_its_per_pixel_guarantee(spread: float) -> None:
    """3 classes at 16 pixels, Gaussian members (correlated classes, pixels of one image sharing their draws'
    direction half the time): the share of pixels whose probabilities end ε or more from their 16-member values is
    at most δ (+4 standard errors over the images: the guarantee is per pixel, so on average over pixels); an image
    stops only when every pixel has settled."""
    rule = StoppingRule(epsilon=0.05, delta=0.1)
    rng = np.random.default_rng(5)
    base = rng.dirichlet(np.ones(3), (1, REPS // 4, 1, 16)).transpose(0, 1, 4, 2, 3)[..., 0]  # [1, B, 3, 16]
    shared = rng.standard_normal((16, REPS // 4, 3, 1))
    p = base + spread * (0.7 * shared + 0.7 * rng.standard_normal((16, REPS // 4, 3, 16)))
    mean, _, used = _sequential(rule, p, lambda m, v, i: rule.settled_pixels(v, i, 3))
    miss = (np.abs(mean - p.mean(0)) >= rule.epsilon).any(1)  # [B, pixels]
    assert miss.mean() <= rule.delta + _margin(rule.delta, REPS // 4)
    assert (used < 16).mean() > 0.05


# -- the graphs -----------------------------------------------------------------------------------------------


def _model(task: str):
    from edgebnn import nn as bnn
    from edgebnn.models import synthetic_posterior

    torch.manual_seed(0)
    if task == "regression":
        net = torch.nn.Sequential(torch.nn.Flatten(), bnn.BayesLinear(8, 16), torch.nn.ReLU(), bnn.BayesLinear(16, 2))
        return edgebnn.from_torch(synthetic_posterior(net), (1, 8), task="regression"), (8,)
    net = torch.nn.Sequential(bnn.BayesConv2d(1, 4, 3, padding=1), torch.nn.ReLU(), bnn.BayesConv2d(4, 3, 1))
    return edgebnn.from_torch(synthetic_posterior(net), (1, 1, 6, 6), task="segmentation"), (1, 6, 6)


@pytest.mark.parametrize("task", ["regression", "segmentation"])
def test_rule_off_equals_the_fixed_export(task: str) -> None:
    """``--epsilon 0``: baked, the same 16 members as the fixed export, so the same outputs (float32 round-off of
    sums of 16 terms); every row draws 16."""
    model, shape = _model(task)
    x = np.random.default_rng(0).normal(size=(5, *shape)).astype(np.float32)
    anytime = Session(export_model(model, ExportConfig(rule=StoppingRule(epsilon=0), mode="baked", seed=2)).proto)
    fixed = Session(export_model(model, ExportConfig(16, mode="baked", seed=2)).proto)
    got, want = anytime.predict(x), fixed.predict(x)
    assert got.samples is not None and got.samples.tolist() == [16] * 5
    for name in anytime.task.outputs:
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("task", ["regression", "segmentation"])
def test_rows_stop_at_their_own_counts_in_both_forms(task: str) -> None:
    """With a loose ε rows stop at different counts; a row that stops at 4 has the 4-member predictive (the fixed
    S = 4 export of the first members); the TensorRT form (Ifs in sequence, Where) equals the compressed one."""
    model, shape = _model(task)
    x = np.random.default_rng(1).normal(size=(24, *shape)).astype(np.float32) * np.linspace(0.1, 3, 24).reshape(
        24, *([1] * len(shape))).astype(np.float32)
    rule = StoppingRule(epsilon=0.3 if task == "regression" else 0.1, delta=0.1)
    got = {d: Session(export_model(model, ExportConfig(rule=rule, mode="baked", seed=2, weights="fp32",
                                                       device=d)).proto).predict(x) for d in ("cpu", "rtx")}
    used = got["cpu"].samples
    assert used is not None and got["rtx"].samples is not None
    assert len(set(used.tolist())) >= 2, used
    np.testing.assert_array_equal(used, got["rtx"].samples)
    names = Session(export_model(model, ExportConfig(4, mode="baked", seed=2)).proto).task.outputs
    for name in names:
        np.testing.assert_allclose(getattr(got["cpu"], name), getattr(got["rtx"], name), atol=1e-5, rtol=1e-5)
