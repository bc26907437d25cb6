"""``codebook`` (2DGBNN): outliers, mixture, W2 merging, ellipse blending, shared sampling, packing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import sqrtm

from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.ir import to_bytes, verify
from edgebnn.ir.encodings import CodebookWeight
from edgebnn.ir.encodings.packing import bits_for, packed_nbytes
from edgebnn.passes import lower
from edgebnn.passes.codebook import blend_candidates, merge_components, merge_pair, wasserstein2_sq

CODEBOOK_KEYS = {"clusters", "outliers", "outlier_threshold", "blended", "unmatched", "merged", "dropped_clusters"}


def _post(model):
    return {w.name: (w.encoding.mu.reshape(-1), w.encoding.sigma.reshape(-1)) for w in model.encoded_weights()}


def _enc(result, name):
    return next(w.encoding for w in result.model.encoded_weights() if w.name == name)


@pytest.fixture
def wide(make_mlp):
    return make_mlp((16, 256, 32), seed=7)


def test_entries_are_member_means_and_rms_sigma(wide, report_keys) -> None:
    result = lower(wide, "codebook")
    verify(result.model)
    post = _post(wide)
    for row in result.report["layers"]:
        assert report_keys <= set(row)
        if row["name"] == "b1":
            assert row["kind"] == "FixedPointWeight" and "bias (1-D)" in row["note"]
            continue
        assert row["kind"] == "CodebookWeight" and set(row) >= CODEBOOK_KEYS
        enc = _enc(result, row["name"])
        mu, sigma = post[row["name"]]
        assert row["clusters"] == enc.k and row["bits"] == enc.bits == bits_for(enc.k)
        special = np.zeros(mu.size, bool)
        special[enc.outlier_index] = special[enc.blend_index] = True
        for k in range(enc.k):
            members = (enc.indices == k) & ~special
            if members.any():
                assert enc.codebook[k, 0] == pytest.approx(mu[members].mean(dtype=np.float64), rel=1e-5, abs=1e-7)
                assert enc.codebook[k, 1] == pytest.approx(np.sqrt(np.mean(sigma[members].astype(np.float64) ** 2)),
                                                           rel=1e-5)
        np.testing.assert_array_equal(enc.mean().reshape(-1)[enc.outlier_index], mu[enc.outlier_index])
        np.testing.assert_array_equal(enc.stddev().reshape(-1)[enc.outlier_index], sigma[enc.outlier_index])
        n_b, j = enc.blend_components.shape
        idx_bytes = 2  # uint16 flat indices for layers of <= 65536 weights
        assert row["bytes"] == (packed_nbytes(mu.size, enc.bits) + 8 * enc.k
                                + enc.outlier_index.size * (idx_bytes + 8) + n_b * (idx_bytes + 2 * j))
    assert result.report["compression_ratio"] > 6


def test_outliers_by_magnitude_and_by_gradient(wide) -> None:
    post = _post(wide)
    mu = post["W1"][0]
    grads = {"W1": np.arange(mu.size, dtype=np.float32)}  # the last 1% of the flat indices have the top |∇|
    result = lower(wide, "codebook", outlier_threshold=0.6, gradients=grads, max_outlier_fraction=0.5)
    enc = _enc(result, "W1")
    top = np.arange(mu.size - int(np.ceil(0.01 * mu.size)), mu.size)
    assert np.isin(top, enc.outlier_index).all()
    assert np.isin(np.flatnonzero(np.abs(mu) > 0.6), enc.outlier_index).all()
    row = next(r for r in result.report["layers"] if r["name"] == "W1")
    assert row["outlier_threshold"] == 0.6 and row["note"] is None
    capped = next(r for r in lower(wide, "codebook", outlier_threshold=0.01).report["layers"] if r["name"] == "W1")
    assert "outlier threshold raised" in capped["note"]
    assert capped["outliers"] <= 0.02 * mu.size + capped["dropped_clusters"] * 30  # + members of dropped clusters


def test_wasserstein_closed_form_and_merge_formula_match_matrix_square_roots() -> None:
    rng = np.random.default_rng(0)
    for _ in range(10):
        a, b = rng.normal(size=(2, 2)), rng.normal(size=(2, 2))
        s1, s2 = a @ a.T + 0.1 * np.eye(2), b @ b.T + 0.1 * np.eye(2)
        m1, m2 = rng.normal(size=2), rng.normal(size=2)
        r1 = np.real(sqrtm(s1))
        cross = np.real(sqrtm(r1 @ s2 @ r1))
        want = np.sum((m1 - m2) ** 2) + np.trace(s1 + s2 - 2 * cross)
        assert wasserstein2_sq(m1, s1, m2, s2) == pytest.approx(want, rel=1e-9)
        mean, cov = merge_pair(m1, s1, m2, s2)
        d = (m1 - m2)[:, None]
        np.testing.assert_allclose(mean, (m1 + m2) / 2)
        np.testing.assert_allclose(cov, (s1 + s2) / 2 + d @ d.T / 8 + cross / 2, rtol=1e-9)


def test_merging_joins_components_below_the_threshold() -> None:
    means = np.array([[0.0, 0.01], [1e-5, 0.01], [0.5, 0.02]])
    covs = np.tile(np.eye(2) * 1e-6, (3, 1, 1))
    merged, _, label = merge_components(means, covs, 1.5e-7)
    assert len(merged) == 2 and label.tolist() == [0, 0, 1]
    assert merge_components(means, covs, 1e-12)[2].tolist() == [0, 1, 2]


def test_blend_candidates_pass_the_mahalanobis_test_and_rank_by_density() -> None:
    means = np.array([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0]])
    covs = np.tile(np.eye(2), (3, 1, 1))
    comps, logp = blend_candidates(np.array([0.4, 5.0]), np.array([0.0, 0.0]), means, covs, 5.991, 2)
    assert comps[0].tolist() == [0, 1] and np.all(np.isfinite(logp[0]))  # both within the 95% ellipse
    assert not np.isfinite(logp[1]).any()  # 5 units from everything: no component passes


@pytest.fixture
def two_sigma_groups(make_mlp):
    """W1's σ falls in two groups a decade apart: clusters split along σ, their ellipses overlap."""
    rng = np.random.default_rng(1)
    mu = rng.normal(0, 0.25, (256, 16)).astype(np.float32)
    sigma = (np.where(rng.random((256, 16)) < 0.5, 0.02, 0.2) * np.exp(rng.normal(0, 0.1, (256, 16))))
    return make_mlp((16, 256, 32), seed=7, mu={"W1": mu}, sigma={"W1": sigma.astype(np.float32)})


def test_blending_in_the_pass_gives_mixture_means(two_sigma_groups) -> None:
    result = lower(two_sigma_groups, "codebook", clusters=16)
    verify(result.model)
    enc = _enc(result, "W1")
    row = next(r for r in result.report["layers"] if r["name"] == "W1")
    assert row["blended"] == enc.blend_index.size > 0 and enc.blend_components.shape[1] == 2
    alpha = enc.blend_alpha.astype(np.float64)
    alpha /= alpha.sum(axis=1, keepdims=True)
    m, s = enc.codebook[enc.blend_components, 0], enc.codebook[enc.blend_components, 1]
    mean = (alpha * m).sum(axis=1)
    np.testing.assert_allclose(enc.mean().reshape(-1)[enc.blend_index], mean, rtol=1e-5, atol=1e-7)
    sd = np.sqrt((alpha * (s**2 + m**2)).sum(axis=1) - mean**2)  # the mixture of eq. 7
    np.testing.assert_allclose(enc.stddev().reshape(-1)[enc.blend_index], sd, rtol=1e-4, atol=1e-6)


def test_shared_sampling_shares_one_draw_per_entry(two_sigma_groups, zbound) -> None:
    """``sampling="shared"`` keeps the 2DGBNN semantics (the default before independent draws)."""
    enc = _enc(lower(two_sigma_groups, "codebook", clusters=16, sampling="shared"), "W1")
    assert enc.sampling == "shared" and enc.noise_needs()[0].dims == (enc.k,)
    assert enc.blend_index.size and enc.outlier_index.size
    draws = 400
    x = enc.sample(np.random.default_rng(0), draws).reshape(draws, -1)
    special = np.zeros(enc.size, bool)
    special[enc.outlier_index] = special[enc.blend_index] = True
    z_means = []
    for k in range(enc.k):
        members = np.flatnonzero((enc.indices == k) & ~special)
        if members.size == 0:
            continue
        shared = x[:, members[0]]
        assert np.all(x[:, members] == shared[:, None])  # one value per entry per draw
        m, s = enc.codebook[k]
        z_means.append((shared.mean() - m) / (s / np.sqrt(draws)))
    assert np.abs(z_means).max() < zbound(len(z_means))
    # blended and outlier weights: per-weight mean against the encoding's mixture mean and sd
    both = np.concatenate([enc.blend_index, enc.outlier_index]).astype(np.int64)
    mean, sd = enc.mean().reshape(-1)[both], enc.stddev().reshape(-1)[both]
    z = (x[:, both].mean(axis=0) - mean) / (sd / np.sqrt(draws))
    assert np.abs(z).max() < zbound(both.size)
    # outliers draw independently of each other
    o = enc.outlier_index[:2].astype(np.int64)
    assert abs(np.corrcoef(x[:, o[0]], x[:, o[1]])[0, 1]) < 5 / np.sqrt(draws)


def test_independent_sampling_is_the_mean_field_gaussian_of_the_entries(two_sigma_groups) -> None:
    """The default draws every weight on its own from N(E_i, sd_i²): the same ε stream as a Gaussian weight
    (so a lowered model shares the float model's draws for a seed), entry members uncorrelated."""
    result = lower(two_sigma_groups, "codebook", clusters=16)
    assert result.report["passes"][-1]["options"]["sampling"] == "independent"  # recorded in the manifest
    enc = _enc(result, "W1")
    assert enc.sampling == "independent" and enc.GAUSSIAN and enc.blend_index.size and enc.outlier_index.size
    assert [(n.suffix, n.dims, n.dist) for n in enc.noise_needs()] == [("", enc.shape, "normal")]
    draws = 400
    eps = np.random.default_rng(0).standard_normal((draws, *enc.shape), dtype=np.float32)
    x = enc.sample(np.random.default_rng(0), draws)
    np.testing.assert_array_equal(x, enc.mean() + enc.stddev() * eps)
    flat = x.reshape(draws, -1)
    special = np.zeros(enc.size, bool)
    special[enc.outlier_index] = special[enc.blend_index] = True
    members = np.flatnonzero((enc.indices == np.bincount(enc.indices[~special]).argmax()) & ~special)[:2]
    assert abs(np.corrcoef(flat[:, members[0]], flat[:, members[1]])[0, 1]) < 5 / np.sqrt(draws)
    again = CodebookWeight.from_fields(enc.fields(), enc.attributes(), enc.shape, "w")
    assert again.sampling == "independent"


def test_sampling_attribute_reads_old_files_as_shared_and_rejects_others(two_sigma_groups) -> None:
    enc = _enc(lower(two_sigma_groups, "codebook", clusters=16), "W1")
    attrs = enc.attributes()
    assert attrs["sampling"] == "independent"
    old = {k: v for k, v in attrs.items() if k != "sampling"}  # written before the attribute existed
    assert CodebookWeight.from_fields(enc.fields(), old, enc.shape, "w").sampling == "shared"
    with pytest.raises(InvalidArtifactError, match="w: attribute 'sampling' must be one of"):
        CodebookWeight.from_fields(enc.fields(), {**attrs, "sampling": "sometimes"}, enc.shape, "w")


def test_auto_bits_follow_the_variance_budget_and_forced_bits(wide) -> None:
    loose = {r["name"]: r for r in lower(wide, "codebook", noise_fraction=1.0).report["layers"]}
    tight = {r["name"]: r for r in lower(wide, "codebook", noise_fraction=0.05).report["layers"]}
    assert tight["W1"]["clusters"] > loose["W1"]["clusters"]
    assert tight["W1"]["noise_ratio"] < loose["W1"]["noise_ratio"]
    forced = lower(wide, "codebook", bits=3)
    assert all(r["clusters"] <= 8 for r in forced.report["layers"] if r["kind"] == "CodebookWeight")
    assert _enc(lower(wide, "codebook", clusters=5), "W1").k <= 5


def test_round_trip_determinism_and_onnxruntime(wide, roundtrip, run_float, logits_bound) -> None:
    a = lower(wide, "codebook", seed=11)
    assert to_bytes(a.model) == to_bytes(lower(wide, "codebook", seed=11).model)
    roundtrip(a.model)
    post = _post(wide)
    err = {w.name: float(np.abs(w.encoding.mean().reshape(-1) - post[w.name][0]).max())
           for w in a.model.encoded_weights()}
    x = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
    bound = logits_bound(wide, x, err)
    assert np.all(np.abs(run_float(a.model, x) - run_float(wide, x)) <= bound * (1 + 1e-4) + 1e-5)


def test_too_small_layers_and_too_many_clusters_fall_back_to_fixed(make_mlp, wide) -> None:
    small = lower(make_mlp((4, 8, 3)), "codebook")
    for row in small.report["layers"]:
        assert row["kind"] == "FixedPointWeight" and "lowered with fixed instead" in row["note"]
    rows = {r["name"]: r for r in lower(wide, "codebook", clusters=4096).report["layers"]}
    assert "cannot fill 4096 clusters" in rows["W1"]["note"] and rows["W1"]["kind"] == "FixedPointWeight"


@pytest.mark.parametrize(
    ("options", "match"),
    [({"bits": 13}, "bits=13"), ({"bits": 3, "clusters": 4}, "give one"), ({"mahalanobis": 0.0}, "mahalanobis"),
     ({"gradients": {"W1": np.ones(3)}}, "gradients\\['W1'\\] has 3 elements"),
     ({"sampling": "sometimes"}, "sampling='sometimes': choose independent or shared")],
)
def test_bad_options(wide, options, match) -> None:
    with pytest.raises(InvalidOptionError, match=match):
        lower(wide, "codebook", **options)


def test_all_zero_means_and_zero_sigma(make_mlp) -> None:
    model = make_mlp((16, 256, 32), mu={"W1": np.zeros((256, 16), np.float32)},
                     sigma={"W2": np.zeros((32, 256), np.float32)})
    result = lower(model, "codebook")
    verify(result.model)
    rows = {r["name"]: r for r in result.report["layers"]}
    assert "all means are 0" in rows["W1"]["note"] and rows["W1"]["distortion_mean"] == 0
    assert "sigma is 0 everywhere" in rows["W2"]["note"]
    assert not _enc(result, "W2").stddev().any()


def test_decoding_rejects_bad_tensors() -> None:
    enc = CodebookWeight((4,), np.array([0, 1, 0, 1]), np.array([[0, 1], [1, 1]], np.float32),
                         [], [], [], [], np.zeros((0, 2)), np.zeros((0, 2)))
    bad = {**enc.fields(), "outlier_index": np.array([3, 1], np.uint16), "outlier_mu": np.zeros(2, np.float32),
           "outlier_sigma": np.zeros(2, np.float32)}
    with pytest.raises(InvalidArtifactError, match="w: outlier_index must be strictly increasing"):
        CodebookWeight.from_fields(bad, enc.attributes(), (4,), "w")
    with pytest.raises(InvalidArtifactError, match="do not fit 0-bit indices"):
        CodebookWeight.from_fields(enc.fields(), {"bits": 0}, (4,), "w")


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 300), k=st.integers(1, 40), data=st.data())
def test_codebook_field_round_trip(n, k, data) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    flat = rng.permutation(n)
    n_out, n_blend = data.draw(st.integers(0, n // 3)), data.draw(st.integers(0, n // 3))
    outliers, blends = np.sort(flat[:n_out]), np.sort(flat[n_out : n_out + n_blend])
    codebook = np.stack([rng.normal(size=k), rng.random(k)], axis=1).astype(np.float32)
    alpha = rng.integers(1, 256, (n_blend, 2))
    enc = CodebookWeight((n,), rng.integers(0, k, n), codebook, outliers, rng.normal(size=n_out),
                         rng.random(n_out), blends, rng.integers(0, k, (n_blend, 2)), alpha)
    again = CodebookWeight.from_fields(enc.fields(), enc.attributes(), (n,), "w")
    np.testing.assert_array_equal(again.mean(), enc.mean())
    np.testing.assert_array_equal(again.stddev(), enc.stddev())
    assert enc.fields()["indices"].nbytes == packed_nbytes(n, bits_for(k))
