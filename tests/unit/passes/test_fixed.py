"""``fixed``: step from the posterior variance, exact decode bounds, sampling, bytes, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import to_bytes, verify
from edgebnn.ir.encodings import FixedPointWeight, SigmaCode
from edgebnn.ir.encodings.packing import packed_nbytes
from edgebnn.passes import lower
from edgebnn.passes.fixed import FixedConfig, best_step


def _gaussians(model):
    return {w.name: (w.encoding.mu, w.encoding.sigma) for w in model.encoded_weights()}


def _max_error(enc, mu) -> float:
    """Rounding error is at most Δ/2; a clipped weight is off by |μ| - L·Δ."""
    limit = 2 ** (enc.bits - 1) - 1
    return max(enc.scale / 2, float(np.abs(mu).max()) - limit * enc.scale)


def test_auto_width_is_the_smallest_grid_within_the_variance_budget(mlp, report_keys) -> None:
    result = lower(mlp, "fixed")
    verify(result.model)
    post = _gaussians(mlp)
    budget_f = FixedConfig().noise_fraction
    for row, w in zip(result.report["layers"], result.model.encoded_weights(), strict=True):
        assert report_keys <= set(row) and row["kind"] == "FixedPointWeight" and row["skipped"] is None
        enc = w.encoding
        mu, sigma = (a.astype(np.float64).reshape(-1) for a in post[w.name])
        budget = budget_f * np.mean(sigma**2)
        assert enc.bits == row["variance_bits"] == row["bits"]
        # the layers are smaller than the fitting sample, so the rule saw every weight: noise within budget...
        noise = np.mean((enc.mean().reshape(-1) - mu) ** 2)
        assert noise <= budget * (1 + 1e-5) and row["noise_ratio"] == pytest.approx(noise / np.mean(sigma**2))
        # ...and one bit less cannot do it
        if enc.bits > 2:
            assert best_step(mu, float(np.abs(mu).max()), enc.bits - 1, True)[1] > budget
        assert np.max(np.abs(enc.mean().reshape(-1) - mu)) <= _max_error(enc, mu) * (1 + 1e-5)
        assert row["clipped"] == pytest.approx(np.mean(np.abs(mu) > (2 ** (enc.bits - 1) - 0.5) * enc.scale))


def test_forced_bits_and_the_papers_full_range_grid(make_mlp) -> None:
    model = make_mlp((16, 64, 10))
    full = lower(model, "fixed", bits=3, sigma_bits=1, clip=False)
    for row, w in zip(full.report["layers"], full.model.encoded_weights(), strict=True):
        mu = _gaussians(model)[w.name][0]
        enc = w.encoding
        assert enc.bits == 3 and enc.scale == pytest.approx(np.abs(mu).max() / 3, rel=1e-6)
        assert row["clipped"] == 0 and np.max(np.abs(enc.mean() - mu)) <= enc.scale / 2 * (1 + 1e-5)
        n = mu.size
        want = packed_nbytes(n, 3) + 4 * enc.sigma.levels.size + packed_nbytes(n, enc.sigma.bits)
        assert row["bytes"] == enc.nbytes == want
    deterministic = 4 * 10  # b2 stays fp32
    assert full.report["total_bytes"] == sum(r["bytes"] for r in full.report["layers"]) + deterministic
    assert full.report["float_bnn_bytes"] == 8 * (16 * 64 + 64 + 64 * 10) + deterministic
    clipped = lower(model, "fixed", bits=3, sigma_bits=1)
    for a, b in zip(full.report["layers"], clipped.report["layers"], strict=True):
        assert b["bytes"] == a["bytes"] and b["noise_ratio"] <= a["noise_ratio"] * (1 + 1e-6)


def test_samples_match_the_encoding(mlp, sample_check) -> None:
    for w in lower(mlp, "fixed").model.encoded_weights():
        sample_check(w.encoding)


def test_round_trip_determinism_and_onnxruntime(mlp, roundtrip, run_float, logits_bound) -> None:
    a, b = lower(mlp, "fixed", seed=3), lower(mlp, "fixed", seed=3)
    assert to_bytes(a.model) == to_bytes(b.model)
    roundtrip(a.model)
    x = np.random.default_rng(0).normal(size=(32, 16)).astype(np.float32)
    post = _gaussians(mlp)
    err = {w.name: _max_error(w.encoding, post[w.name][0]) for w in a.model.encoded_weights()}
    bound = logits_bound(mlp, x, err)
    diff = np.abs(run_float(a.model, x) - run_float(mlp, x))
    assert np.all(diff <= bound * (1 + 1e-4) + 1e-5)


@pytest.mark.parametrize("bits", [1, 17, "seven", 2.5])
def test_bits_out_of_range(mlp, bits) -> None:
    with pytest.raises(InvalidOptionError, match="bits"):
        lower(mlp, "fixed", bits=bits)


def test_all_zero_means_and_zero_sigma_are_reported(make_mlp) -> None:
    zeros = make_mlp(mu={"W1": np.zeros((64, 16), np.float32)}, sigma={"W2": np.zeros((10, 64), np.float32)})
    rows = {r["name"]: r for r in lower(zeros, "fixed").report["layers"]}
    assert "all means are 0" in rows["W1"]["note"] and rows["W1"]["sparsity"] == 1.0
    assert "sigma is 0 everywhere" in rows["W2"]["note"] and rows["W2"]["bits"] == 16
    assert rows["W2"]["distortion_mean"] < 1e-4  # 16 bits over the range


@settings(max_examples=30, deadline=None)
@given(
    q=hnp.arrays(np.int16, hnp.array_shapes(min_dims=1, max_dims=3, max_side=9), elements=st.integers(-7, 7)),
    scale=st.floats(2**-20, 1024.0, width=32),
)
def test_fixed_point_field_round_trip(q, scale) -> None:
    sigma = SigmaCode.fit(np.abs(q).astype(np.float32) * 0.1, 2, np.random.default_rng(0))
    enc = FixedPointWeight(q, scale, 4, sigma)
    again = FixedPointWeight.from_fields(enc.fields(), enc.attributes(), q.shape, "w")
    np.testing.assert_array_equal(again.mean(), enc.mean())
    np.testing.assert_array_equal(again.stddev(), enc.stddev())
    assert again.nbytes == enc.nbytes
