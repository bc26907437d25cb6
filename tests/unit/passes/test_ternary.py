"""``ternary``: VNQ pruning at log α >= 2, Lloyd or given level, nearest-level codes, σ kept, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import to_bytes, verify
from edgebnn.ir.encodings import SigmaCode, TernaryWeight
from edgebnn.ir.encodings.packing import packed_nbytes
from edgebnn.passes import lower


def _post(model):
    return {
        w.name: (w.encoding.mu.astype(np.float64), w.encoding.sigma.astype(np.float64))
        for w in model.encoded_weights()
    }


def _max_error(mu, sigma, a, threshold=2.0):
    """Worst |decode - μ|: a pruned weight loses μ; a kept one is off by at most a/2 or by |μ| - a."""
    pruned = sigma**2 >= np.exp(threshold) * mu**2
    kept = np.abs(mu[~pruned])
    return max(np.abs(mu[pruned]).max(initial=0), a / 2, (kept - a).max(initial=0))


def test_prune_then_nearest_level(mlp, report_keys) -> None:
    result = lower(mlp, "ternary")
    verify(result.model)
    post = _post(mlp)
    for row, w in zip(result.report["layers"], result.model.encoded_weights(), strict=True):
        assert report_keys <= set(row)
        mu, sigma = post[w.name]
        if mu.ndim == 1:
            assert row["kind"] == "FixedPointWeight" and "bias (1-D): lowered with fixed" in row["note"]
            continue
        enc = w.encoding
        assert row["kind"] == "TernaryWeight" and row["bits"] == 2
        a = enc.scale
        pruned = sigma**2 >= np.exp(2.0) * mu**2
        assert row["pruned"] == pytest.approx(pruned.mean())
        mean, std = enc.mean(), enc.stddev()
        assert np.all(mean[pruned] == 0) and np.all(std[pruned] == 0)  # pruned: exact, deterministic zeros
        levels = np.array([-a, 0.0, a])
        nearest = levels[np.argmin(np.abs(mu[~pruned][:, None] - levels), axis=1)]
        np.testing.assert_array_equal(mean[~pruned], nearest.astype(np.float32))
        kept = np.abs(mu[~pruned])
        assert a == pytest.approx(kept[kept > a / 2].mean(), rel=1e-5)  # Lloyd's fixed point
        n = mu.size
        assert row["bytes"] == packed_nbytes(n, 2) + 4 * enc.sigma.levels.size + packed_nbytes(n, enc.sigma.bits)


def test_samples_round_trip_determinism_and_onnxruntime(mlp, sample_check, roundtrip, run_float, logits_bound):
    result = lower(mlp, "ternary", seed=2)
    assert to_bytes(result.model) == to_bytes(lower(mlp, "ternary", seed=2).model)
    for w in result.model.encoded_weights():
        sample_check(w.encoding)
    roundtrip(result.model)
    post = _post(mlp)
    err = {}
    for w in result.model.encoded_weights():
        mu, sigma = post[w.name]
        if mu.ndim == 2:
            err[w.name] = _max_error(mu, sigma, w.encoding.scale)
        else:  # the bias went to fixed: its own decode error
            err[w.name] = float(np.abs(w.encoding.mean() - mu).max())
    x = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
    bound = logits_bound(mlp, x, err)
    assert np.all(np.abs(run_float(result.model, x) - run_float(mlp, x)) <= bound * (1 + 1e-4) + 1e-5)


def test_given_levels_replace_lloyds_fit(mlp) -> None:
    """A level in ``levels`` is used as given (VNQ's learned a); a weight it does not name keeps Lloyd's fit."""
    lloyd = {r["name"]: r["level"] for r in lower(mlp, "ternary").report["layers"] if r["kind"] == "TernaryWeight"}
    given = 0.7 * lloyd["W1"]  # far enough from the fit that the codes change
    result = lower(mlp, "ternary", levels={"W1": given})
    rows = {r["name"]: r for r in result.report["layers"]}
    assert rows["W1"]["level_from"] == "levels" and rows["W2"]["level_from"] == "lloyd"
    assert rows["W2"]["level"] == lloyd["W2"]
    enc = {w.name: w.encoding for w in result.model.encoded_weights()}["W1"]
    assert enc.scale == np.float32(given)
    mu, sigma = _post(mlp)["W1"]
    pruned = sigma**2 >= np.exp(2.0) * mu**2
    codes = np.where(pruned, 0, np.where(np.abs(mu) > np.float32(given / 2), np.sign(mu), 0))
    np.testing.assert_array_equal(enc.mean(), (codes * np.float32(given)).astype(np.float32))
    fitted = {w.name: w.encoding for w in lower(mlp, "ternary").model.encoded_weights()}["W1"]
    assert np.count_nonzero(enc.mean()) > np.count_nonzero(fitted.mean())  # a lower level keeps more weights
    assert "levels" not in result.report["config"]["options"]  # data, like gradients: not in the stored config


@pytest.mark.parametrize(("options", "match"), [({"bits": 3}, "bits=3"), ({"prune_log_alpha": float("nan")}, "prune"),
                                                ({"levels": {"W1": 0.0}}, r"levels\['W1'\]=0.0"),
                                                ({"levels": {"W1": float("inf")}}, r"levels\['W1'\]=inf"),
                                                ({"levels": {"W1": True}}, r"levels\['W1'\]=True"),
                                                ({"levels": {"W1": 1e39}}, r"levels\['W1'\]=1e\+39"),
                                                ({"levels": [0.3]}, "levels must map"),
                                                ({"levels": {"fc9": 0.3}}, r"levels names unknown weights \['fc9'\]")])
def test_bad_options(mlp, options, match) -> None:
    with pytest.raises(InvalidOptionError, match=match):
        lower(mlp, "ternary", **options)


def test_all_zero_means_prune_everything_and_zero_sigma_prunes_nothing(make_mlp) -> None:
    model = make_mlp(mu={"W1": np.zeros((64, 16), np.float32)}, sigma={"W2": np.zeros((10, 64), np.float32)})
    rows = {r["name"]: r for r in lower(model, "ternary").report["layers"]}
    assert rows["W1"]["pruned"] == 1.0 and "level set to 1 (unused)" in rows["W1"]["note"]
    assert rows["W2"]["pruned"] == 0.0 and "sigma is 0 everywhere" in rows["W2"]["note"]


@settings(max_examples=30, deadline=None)
@given(t=hnp.arrays(np.int16, hnp.array_shapes(min_dims=1, max_dims=3, max_side=10), elements=st.integers(-1, 1)),
       a=st.floats(0.125, 8.0, width=32))
def test_ternary_field_round_trip(t, a) -> None:
    sigma = SigmaCode.fit(np.where(t == 0, 0, 0.1).astype(np.float32), 1, np.random.default_rng(0))
    enc = TernaryWeight(t, a, 2, sigma)
    assert enc.attributes() == {"level": a}
    again = TernaryWeight.from_fields(enc.fields(), enc.attributes(), t.shape, "w")
    np.testing.assert_array_equal(again.mean(), enc.mean())
    np.testing.assert_array_equal(again.stddev(), enc.stddev())
    assert enc.fields()["codes"].nbytes == packed_nbytes(t.size, 2)


def test_the_unused_two_bit_code_is_rejected() -> None:
    from edgebnn.errors import InvalidArtifactError
    from edgebnn.ir.encodings.packing import pack_int

    sigma = SigmaCode.fit(np.zeros(4, np.float32), 0, np.random.default_rng(0))
    enc = TernaryWeight(np.zeros(4, np.int16), 1.0, 2, sigma)
    fields = {**enc.fields(), "codes": pack_int(np.array([0, -2, 0, 1]), 2)}
    with pytest.raises(InvalidArtifactError, match="w: codes holds a value outside ±1"):
        TernaryWeight.from_fields(fields, enc.attributes(), (4,), "w")
