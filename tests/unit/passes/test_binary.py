"""``binary``: sign bits, P(W = +a) = Φ(μ/σ) through a coded flip probability, least-squares scale."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import ndtr
from scipy.stats import binomtest

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import to_bytes, verify
from edgebnn.ir.encodings import BinaryWeight, SigmaCode
from edgebnn.ir.encodings.packing import packed_nbytes
from edgebnn.passes import lower


def _post(model):
    return {
        w.name: (w.encoding.mu.astype(np.float64), w.encoding.sigma.astype(np.float64))
        for w in model.encoded_weights()
    }


def test_signs_flips_and_scale(mlp, report_keys) -> None:
    result = lower(mlp, "binary")
    verify(result.model)
    post = _post(mlp)
    for row, w in zip(result.report["layers"], result.model.encoded_weights(), strict=True):
        assert report_keys <= set(row)
        mu, sigma = post[w.name]
        if mu.ndim == 1:
            assert row["kind"] == "FixedPointWeight" and "bias (1-D)" in row["note"]
            continue
        enc = w.encoding
        assert row["kind"] == "BinaryWeight" and row["bits"] == 1
        np.testing.assert_array_equal(enc.positive, mu >= 0)
        f_true, f_code = ndtr(-np.abs(mu) / sigma), enc.flip_probability().astype(np.float64)
        # each coded level is the mean flip probability of its bin: the layer mean is kept
        assert f_code.mean() == pytest.approx(f_true.mean(), rel=1e-5)
        assert np.all((f_code >= 0) & (f_code <= 0.5))
        keep = 1 - 2 * f_code
        assert enc.scale == pytest.approx(np.sum(np.abs(mu) * keep) / np.sum(keep * keep), rel=1e-5)
        np.testing.assert_allclose(enc.mean(), enc.scale * np.where(mu >= 0, 1, -1) * keep, rtol=1e-5)
        assert row["bytes"] == packed_nbytes(mu.size, 1) + enc.flip.levels.nbytes + enc.flip.codes.nbytes


def test_draws_are_plus_minus_scale_with_the_coded_flip_rate(mlp) -> None:
    enc = next(w.encoding for w in lower(mlp, "binary").model.encoded_weights() if w.name == "W1")
    draws = 2000
    x = enc.sample(np.random.default_rng(0), draws)
    sign = np.where(enc.positive, 1, -1) * np.float32(enc.scale)
    assert np.all((x == sign) | (x == -sign))
    flipped = (x != sign).sum(axis=0)
    f = enc.flip_probability()
    levels = np.unique(f)
    for level in levels:  # weights sharing a coded level flip as one Binomial(draws · count, level)
        members = f == level
        k, n = int(flipped[members].sum()), draws * int(members.sum())
        if level == 0:
            assert k == 0
            continue
        assert binomtest(k, n, float(level)).pvalue > 1e-4 / levels.size  # Bonferroni over the levels


def test_round_trip_determinism_and_onnxruntime(mlp, roundtrip, run_float, logits_bound) -> None:
    result = lower(mlp, "binary", seed=1)
    assert to_bytes(result.model) == to_bytes(lower(mlp, "binary", seed=1).model)
    roundtrip(result.model)
    post = _post(mlp)
    err = {w.name: float(np.abs(w.encoding.mean() - post[w.name][0]).max()) for w in result.model.encoded_weights()}
    x = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
    bound = logits_bound(mlp, x, err)
    assert np.all(np.abs(run_float(result.model, x) - run_float(mlp, x)) <= bound * (1 + 1e-4) + 1e-5)


@pytest.mark.parametrize(("options", "match"), [({"bits": 2}, "bits=2"), ({"flip_bits": 9}, "flip_bits=9")])
def test_bad_options(mlp, options, match) -> None:
    with pytest.raises(InvalidOptionError, match=match):
        lower(mlp, "binary", **options)


def test_prune_cannot_carry_over_to_binary(mlp) -> None:
    with pytest.raises(InvalidOptionError, match="a binary weight cannot be 0"):
        lower(mlp, "prune+binary")


def test_all_zero_means_and_zero_sigma(make_mlp) -> None:
    model = make_mlp(mu={"W1": np.zeros((64, 16), np.float32)}, sigma={"W2": np.zeros((10, 64), np.float32)})
    result = lower(model, "binary")
    rows = {r["name"]: r for r in result.report["layers"]}
    assert "no weight has a preferred sign" in rows["W1"]["note"]
    w1 = next(w.encoding for w in result.model.encoded_weights() if w.name == "W1")
    sigma1 = next(w.encoding.sigma for w in model.encoded_weights() if w.name == "W1")
    assert w1.scale == pytest.approx(np.sqrt(np.mean(sigma1.astype(np.float64) ** 2)), rel=1e-5)
    assert np.all(w1.flip_probability() == 0.5) and not w1.mean().any()
    w2 = next(w.encoding for w in result.model.encoded_weights() if w.name == "W2")
    assert not w2.flip_probability().any() and not w2.stddev().any()  # σ = 0: deterministic signs


@settings(max_examples=30, deadline=None)
@given(signs=hnp.arrays(bool, hnp.array_shapes(min_dims=1, max_dims=3, max_side=10)),
       flips=st.lists(st.floats(0, 0.5, width=32), min_size=1, max_size=4))
def test_binary_field_round_trip(signs, flips) -> None:
    f = np.resize(np.array(flips, np.float32), signs.size)
    enc = BinaryWeight(signs, 0.25, SigmaCode.fit(f, 2, np.random.default_rng(0), power=1))
    again = BinaryWeight.from_fields(enc.fields(), enc.attributes(), signs.shape, "w")
    np.testing.assert_array_equal(again.positive, signs)
    np.testing.assert_array_equal(again.mean(), enc.mean())
    assert enc.fields()["signs"].nbytes == packed_nbytes(signs.size, 1)
