"""Synthetic IR models for the pass tests (edgebnn.ir.gaussian_mlp, no torch).

``make_mlp(sizes)`` builds ``x [batch, sizes[0]] -> Gemm(W1, b1, transB=1) -> Relu -> ... -> logits``
with every weight a ``GaussianWeight`` (μ ~ N(0, 1/fan_in), σ = ratio·std·lognormal); the first bias is
Gaussian too, the others are deterministic fp32 initializers, so both kinds of parameter are exercised.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgebnn.ir import BNNModel, gaussian_mlp, verify


def build_mlp(
    sizes: tuple[int, ...] = (16, 64, 10),
    *,
    seed: int = 0,
    sigma_ratio: float = 0.3,
    mu: dict[str, np.ndarray] | None = None,
    sigma: dict[str, np.ndarray] | None = None,
) -> BNNModel:
    """A verified MLP IR; ``mu`` / ``sigma`` override the posterior of named weights (``"W1"``, ``"b1"``...)."""
    rng = np.random.default_rng(seed)
    mu, sigma = mu or {}, sigma or {}
    layers = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes), start=1):
        std = 1 / np.sqrt(fan_in)
        w_mu = rng.normal(0, std, (fan_out, fan_in)).astype(np.float32)
        w_sigma = (sigma_ratio * std * np.exp(rng.normal(0, 0.4, (fan_out, fan_in)))).astype(np.float32)
        b_mu = rng.normal(0, 0.1, fan_out).astype(np.float32)
        b_sigma = np.full(fan_out, 0.02, np.float32) if i == 1 else None  # the first bias is Bayesian
        layers.append((mu.get(f"W{i}", w_mu), sigma.get(f"W{i}", w_sigma), mu.get(f"b{i}", b_mu),
                       sigma.get(f"b{i}", b_sigma) if b_sigma is not None else None))
    model = gaussian_mlp(layers, name="synthetic mlp")
    verify(model)
    return model


@pytest.fixture
def make_mlp() -> Callable[..., BNNModel]:
    return build_mlp


@pytest.fixture
def mlp() -> BNNModel:
    return build_mlp()


def run_onnx(proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x.astype(np.float32)})[0]


@pytest.fixture
def run_float() -> Callable[[BNNModel, np.ndarray], np.ndarray]:
    """Run ``model.float_model()`` (posterior means) in onnxruntime."""
    return lambda model, x: run_onnx(model.float_model(), x)


def output_bound(model: BNNModel, x: np.ndarray, err: dict[str, float]) -> np.ndarray:
    """Worst-case |Δlogits| of the MLP when each weight/bias moves by at most ``err[name]`` per element.

    Layer by layer, with h the reference activations and W the reference means: Relu is 1-Lipschitz, so
    |Δz| <= |W| |Δh| + e_W ||h + Δh||₁-style terms; we bound |Δh| elementwise by
    e_W · sum(|h| + |Δh|) + |W| |Δh| + e_b.
    """
    weights = {w.name: w.encoding.mean() for w in model.encoded_weights()}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.proto.graph.initializer}
    h = x.astype(np.float64)
    dh = np.zeros_like(h)
    i = 1
    while f"W{i}" in weights:
        w = weights[f"W{i}"].astype(np.float64)
        b = weights.get(f"b{i}", inits.get(f"b{i}"))
        z = h @ w.T + b
        dz = err.get(f"W{i}", 0.0) * (np.abs(h) + dh).sum(axis=1, keepdims=True) + dh @ np.abs(w).T
        dz = dz + err.get(f"b{i}", 0.0)
        i += 1
        h, dh = (np.maximum(z, 0), dz) if f"W{i}" in weights else (z, dz)
    return dh


@pytest.fixture
def logits_bound() -> Callable[[BNNModel, np.ndarray, dict[str, float]], np.ndarray]:
    return output_bound


REPORT_KEYS = {
    "name", "layer", "kind", "n_weights", "bits", "bits_per_weight", "sparsity", "bytes", "distortion",
    "distortion_mean", "distortion_std", "noise_ratio", "skipped", "note",
}


def z_bound(n_tests: int, alpha: float = 1e-4) -> float:
    """Two-sided normal quantile with a Bonferroni correction: all n_tests z-scores stay below it w.p. 1-alpha."""
    from scipy.stats import norm

    return float(norm.isf(alpha / (2 * max(n_tests, 1))))


def gaussian_sample_check(enc, draws: int = 400, seed: int = 123) -> None:
    """Draws of a mean + σ·ε encoding: per-weight means and the pooled variance match, within MC error.

    Per weight, (x̄ - m)/(sd/√S) ~ N(0, 1) (Bonferroni-bounded over the weights); for the variance,
    Σ s_i² has mean Σ sd_i² and variance Σ 2 sd_i⁴/(S-1) (s_i² ~ sd_i² χ²_{S-1}/(S-1)).
    """
    x = enc.sample(np.random.default_rng(seed), draws).astype(np.float64)
    assert x.shape == (draws, *enc.shape)
    mean, sd = enc.mean().astype(np.float64), enc.stddev().astype(np.float64)
    noisy = sd > 0
    assert np.all(x[:, ~noisy] == mean[~noisy]), "a weight with sd 0 must equal its mean in every draw"
    z = (x.mean(axis=0)[noisy] - mean[noisy]) / (sd[noisy] / np.sqrt(draws))
    assert np.abs(z).max() < z_bound(z.size)
    s2 = x.var(axis=0, ddof=1)[noisy]
    z_var = (s2.sum() - (sd[noisy] ** 2).sum()) / np.sqrt((2 * sd[noisy] ** 4 / (draws - 1)).sum())
    assert abs(z_var) < z_bound(1)


@pytest.fixture
def roundtrip(tmp_path):
    """Save to an .ebnn and load back; the reloaded model serialises to the same bytes."""
    from edgebnn.ir import load, save, to_bytes

    def check(model: BNNModel) -> BNNModel:
        path = tmp_path / "model.ebnn"
        save(model, path)
        loaded = load(path)
        assert to_bytes(loaded) == to_bytes(model)
        assert path.stat().st_size >= model.nbytes()
        for a, b in zip(model.encoded_weights(), loaded.encoded_weights(), strict=True):
            assert a.encoding.op_type == b.encoding.op_type
            np.testing.assert_array_equal(a.encoding.mean(), b.encoding.mean())
            np.testing.assert_array_equal(a.encoding.stddev(), b.encoding.stddev())
        return loaded

    return check


@pytest.fixture
def sample_check() -> Callable[..., None]:
    return gaussian_sample_check


@pytest.fixture
def zbound() -> Callable[..., float]:
    return z_bound


@pytest.fixture
def report_keys() -> set[str]:
    return set(REPORT_KEYS)
