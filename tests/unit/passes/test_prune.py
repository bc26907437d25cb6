"""``prune``: weight pruning by log α, group pruning with group scales, composition with other schemes."""

from __future__ import annotations

import numpy as np
import pytest

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import to_bytes, verify
from edgebnn.passes import lower


def _post(model):
    return {w.name: (w.encoding.mu, w.encoding.sigma) for w in model.encoded_weights()}


def test_weight_pruning_zeroes_exactly_the_noisy_weights(mlp, report_keys, roundtrip, run_float, logits_bound):
    result = lower(mlp, "prune", log_alpha_threshold=1.0)
    verify(result.model)
    before, after = _post(mlp), _post(result.model)
    err = {}
    for row in result.report["layers"]:
        assert report_keys <= set(row) and row["kind"] == "GaussianWeight"
        mu, sigma = before[row["name"]]
        cut = sigma.astype(np.float64) ** 2 >= np.exp(1.0) * mu.astype(np.float64) ** 2
        new_mu, new_sigma = after[row["name"]]
        assert np.all(new_mu[cut] == 0) and np.all(new_sigma[cut] == 0)
        np.testing.assert_array_equal(new_mu[~cut], mu[~cut])
        np.testing.assert_array_equal(new_sigma[~cut], sigma[~cut])
        assert row["pruned"] == pytest.approx(cut.mean()) and row["sparsity"] == pytest.approx(cut.mean())
        err[row["name"]] = float(np.abs(mu[cut]).max(initial=0))
    # dense fp32 storage: pruning alone does not shrink the file
    assert result.report["total_bytes"] == result.report["float_bnn_bytes"]
    roundtrip(result.model)
    x = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
    bound = logits_bound(mlp, x, err)
    assert np.all(np.abs(run_float(result.model, x) - run_float(mlp, x)) <= bound * (1 + 1e-4) + 1e-5)


def test_nothing_to_prune_leaves_the_model_unmodified(mlp) -> None:
    result = lower(mlp, "prune", log_alpha_threshold=50.0)
    assert not result.modified and to_bytes(result.model).count(b"GaussianWeight") == to_bytes(mlp).count(
        b"GaussianWeight"
    )
    assert all(r["pruned"] == 0.0 for r in result.report["layers"])


def test_group_scales_fold_the_marginal_moments_and_prune_groups(mlp) -> None:
    mu_z = np.linspace(0.5, 1.5, 16).astype(np.float32)
    sigma_z = np.full(16, 0.05, np.float32)
    sigma_z[[2, 7]] = 0.5 * mu_z[[2, 7]]  # log α = log 0.25 = -1.39 >= -3: these input neurons are pruned
    result = lower(mlp, "prune", group_scales={"W1": (mu_z, sigma_z)}, log_alpha_threshold=50.0)
    row = next(r for r in result.report["layers"] if r["name"] == "W1")
    assert row["groups_pruned"] == 2
    mu, sigma = (a.astype(np.float64) for a in _post(mlp)["W1"])
    new_mu, new_sigma = _post(result.model)["W1"]
    assert np.all(new_mu[:, [2, 7]] == 0) and np.all(new_sigma[:, [2, 7]] == 0)
    keep = np.setdiff1d(np.arange(16), [2, 7])
    mz, sz = mu_z[keep].astype(np.float64), sigma_z[keep].astype(np.float64)
    np.testing.assert_allclose(new_mu[:, keep], mz * mu[:, keep], rtol=1e-6)
    var = sz**2 * (sigma[:, keep] ** 2 + mu[:, keep] ** 2) + sigma[:, keep] ** 2 * mz**2
    np.testing.assert_allclose(new_sigma[:, keep], np.sqrt(var), rtol=1e-5)


@pytest.mark.parametrize(
    ("scales", "match"),
    [
        ({"nope": (np.ones(16), np.ones(16))}, "unknown weights \\['nope'\\]"),
        ({"W1": (np.ones(3), np.ones(3))}, "need two arrays of 16 entries"),
        ({"W1": (np.ones(16), -np.ones(16))}, "sigma_z >= 0"),
        ({"b1": (np.ones(64), np.ones(64))}, "need two arrays of \\?"),
    ],
)
def test_bad_group_scales(mlp, scales, match) -> None:
    with pytest.raises(InvalidOptionError, match=match):
        lower(mlp, "prune", group_scales=scales)


def test_prune_composes_with_codebook(make_mlp, sample_check) -> None:
    model = make_mlp((16, 256, 10), seed=4)
    result = lower(model, "prune+codebook", log_alpha_threshold=0.0, seed=4)
    assert result.model.manifest.scheme == "prune+codebook"
    assert [p["name"] for p in result.model.manifest.passes] == ["prune", "codebook"]
    assert [p["pass"] for p in result.report["passes"]] == ["prune", "codebook"]
    pruned = {r["name"]: r["pruned"] for r in result.report["passes"][0]["layers"]}
    w1 = next(w.encoding for w in result.model.encoded_weights() if w.name == "W1")
    assert w1.op_type == "CodebookWeight" and w1.codebook[0].tolist() == [0.0, 0.0]  # the reserved zero entry
    zeros = (w1.mean() == 0) & (w1.stddev() == 0)
    assert zeros.mean() == pytest.approx(pruned["W1"])
    draws = w1.sample(np.random.default_rng(0), 50)
    assert np.all(draws[:, zeros] == 0)  # pruned weights are zero in every draw
    sample_check(next(w.encoding for w in result.model.encoded_weights() if w.name == "b1"))
    assert to_bytes(result.model) == to_bytes(lower(model, "prune+codebook", log_alpha_threshold=0.0, seed=4).model)
