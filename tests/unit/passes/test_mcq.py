"""``mcq``: counts are floor/ceil of N·p (unbiased, error < one step), bits formula, K, sparsity, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import to_bytes, verify
from edgebnn.ir.encodings import IntCountWeight, SigmaCode
from edgebnn.ir.encodings.packing import packed_nbytes
from edgebnn.passes import lower
from edgebnn.passes.mcq import McqConfig, mcq_counts


def _sigma2(model, name):
    sigma = next(w.encoding.sigma for w in model.encoded_weights() if w.name == name)
    return float(np.mean(sigma.astype(np.float64) ** 2))


def _mu(model, name):
    return next(w.encoding.mu for w in model.encoded_weights() if w.name == name)


def test_counts_are_floor_or_ceil_of_n_p_and_decode_within_one_step(mlp, report_keys) -> None:
    result = lower(mlp, "mcq")
    verify(result.model)
    for row, w in zip(result.report["layers"], result.model.encoded_weights(), strict=True):
        assert report_keys <= set(row) and row["kind"] == "IntCountWeight"
        enc, mu = w.encoding, _mu(mlp, w.name)
        n_samples = round(enc.samples_per_weight * mu.size)
        expected = n_samples * np.abs(mu.astype(np.float64)) / np.abs(mu.astype(np.float64)).sum()
        counts = np.abs(enc.q.astype(np.int64))
        assert np.all((counts == np.floor(expected)) | (counts == np.ceil(expected)))
        assert abs(int(counts.sum()) - n_samples) <= 1
        assert np.all(np.sign(enc.q) == np.where(counts > 0, np.sign(mu), 0))
        assert np.max(np.abs(enc.mean() - mu)) < enc.scale * (1 + 1e-5)
        assert enc.bits == 1 + int(np.floor(np.log2(counts.max()))) + 1 == row["bits"]
        sigma_bytes = enc.sigma.levels.nbytes + packed_nbytes(mu.size, enc.sigma.bits)
        assert row["bytes"] == enc.nbytes == packed_nbytes(mu.size, enc.bits) + sigma_bytes
        # the variance rule's N fixes the width; N is the most samples that width holds (finer, same bytes)
        p_max = np.abs(mu.astype(np.float64)).max() / np.abs(mu.astype(np.float64)).sum()
        assert n_samples == int((2 ** (enc.bits - 1) - 1) / p_max)
        # error e = U1 - U2 per weight: E e² = s²/6 <= f·mean σ²; the sd of the mean e² <= 1.18·sqrt(3/n)·s²/6
        want = enc.scale**2 / 6 / _sigma2(mlp, w.name)
        assert want <= McqConfig().noise_fraction * (1 + 1e-5)
        assert abs(row["noise_ratio"] / want - 1) < 6 * 1.18 * np.sqrt(3 / mu.size)


def test_counts_are_unbiased_over_the_jitter() -> None:
    mu = np.random.default_rng(0).normal(size=500).astype(np.float32)
    n_samples, trials = 700, 400
    mean = np.mean([mcq_counts(mu, n_samples, xi, sort=False) for xi in (np.arange(trials) + 0.5) / trials], axis=0)
    expected = n_samples * mu / np.abs(mu).sum()
    # count - N p lies in (-1, 1): the mean over the ξ grid has error <= 1/trials per weight (Riemann sum)
    np.testing.assert_allclose(mean, expected, atol=2 / trials)


def test_samples_per_weight_sort_and_forced_bits(make_mlp) -> None:
    model = make_mlp((16, 128, 10))
    k1 = lower(model, "mcq", samples_per_weight=1.0)
    for w in k1.model.encoded_weights():
        assert w.encoding.samples_per_weight == 1.0
        assert abs(int(np.abs(w.encoding.q.astype(np.int64)).sum()) - w.encoding.size) <= 1
    mu = np.random.default_rng(2).standard_t(4, 2000).astype(np.float32)
    plain, ordered = (mcq_counts(mu, 1000, 0.3, sort=s) for s in (False, True))
    expected = 1000 * np.abs(mu.astype(np.float64)) / np.abs(mu.astype(np.float64)).sum()
    for counts in (plain, ordered):  # any order: every count is floor or ceil of N p
        assert np.all((np.abs(counts) == np.floor(expected)) | (np.abs(counts) == np.ceil(expected)))
    assert not np.array_equal(plain, ordered)  # the order decides which weights round up
    forced = lower(model, "mcq", bits=3)
    for row, w in zip(forced.report["layers"], forced.model.encoded_weights(), strict=True):
        assert row["bits"] == 3 and np.abs(w.encoding.q).max() <= 3


def test_samples_round_trip_determinism_and_onnxruntime(mlp, sample_check, roundtrip, run_float, logits_bound):
    a = lower(mlp, "mcq", seed=5)
    assert to_bytes(a.model) == to_bytes(lower(mlp, "mcq", seed=5).model)
    assert to_bytes(a.model) != to_bytes(lower(mlp, "mcq", seed=6).model)  # another jitter ξ
    for w in a.model.encoded_weights():
        sample_check(w.encoding)
    roundtrip(a.model)
    x = np.random.default_rng(1).normal(size=(32, 16)).astype(np.float32)
    bound = logits_bound(mlp, x, {w.name: w.encoding.scale for w in a.model.encoded_weights()})
    assert np.all(np.abs(run_float(a.model, x) - run_float(mlp, x)) <= bound * (1 + 1e-4) + 1e-5)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"bits": 1}, "bits=1"),
        ({"bits": 17}, "bits=17"),
        ({"samples_per_weight": 0.0}, "samples_per_weight=0.0"),
        ({"samples_per_weight": 2.0, "bits": 4}, "give one"),
        ({"samples_per_weight": 1e6}, "wider than 16 bits"),
        ({"sigma_bits": 9}, "sigma_bits=9"),
    ],
)
def test_bad_options(mlp, options, match) -> None:
    with pytest.raises(InvalidOptionError, match=match):
        lower(mlp, "mcq", **options)


def test_all_zero_means_and_zero_sigma(make_mlp) -> None:
    model = make_mlp(mu={"W1": np.zeros((64, 16), np.float32)}, sigma={"W2": np.zeros((10, 64), np.float32)})
    result = lower(model, "mcq")
    rows = {r["name"]: r for r in result.report["layers"]}
    assert "all means are 0" in rows["W1"]["note"] and rows["W1"]["sparsity"] == 1.0
    assert "sigma is 0 everywhere" in rows["W2"]["note"] and rows["W2"]["bits"] <= 16
    w2 = next(w.encoding for w in result.model.encoded_weights() if w.name == "W2")
    assert not w2.stddev().any()


@settings(max_examples=30, deadline=None)
@given(
    q=hnp.arrays(np.int16, hnp.array_shapes(min_dims=1, max_dims=2, max_side=12), elements=st.integers(-511, 511)),
    k=st.floats(0.125, 128.0, width=32),
)
def test_int_count_field_round_trip(q, k) -> None:
    sigma = SigmaCode.fit(np.full(q.size, 0.5, np.float32), 1, np.random.default_rng(0))
    enc = IntCountWeight(q, 0.01, 11, sigma, samples_per_weight=k)
    again = IntCountWeight.from_fields(enc.fields(), enc.attributes(), q.shape, "w")
    np.testing.assert_array_equal(again.q, q)
    assert again.samples_per_weight == enc.samples_per_weight and again.bits == 11
