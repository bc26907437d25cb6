"""Export modes noise and analytic, and the Session that runs every mode, against the reference runtime."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.exporters.analytic import quadrature_points
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import float_bnn
from edgebnn.exporters.export import export_model
from edgebnn.exporters.noise import fill_noise
from edgebnn.metrics import predictive_from_logits
from edgebnn.runtime import Session
from edgebnn.runtime.reference import sample_logits

REF_SAMPLES = 4096
RANDOM = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike")


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(1).normal(size=(5, 1, 6, 6)).astype(np.float32)


def _mc_bound(n_draws: int) -> float:
    # A probability estimated from n independent draws has sd <= 0.5/sqrt(n); two estimates are compared,
    # over 15 (row, class) entries: 4 standard deviations of the difference bounds the max.
    return 4 * 0.5 * np.sqrt(2 / n_draws)


@pytest.mark.parametrize("variant", ["auto", "weight"])
def test_noise_mode_samples_the_posterior(x, variant):
    """Averaged over R calls, the noise graph's probs converge to the reference predictive."""
    model = synthetic_cnn(sigma=0.3)
    ref = predictive_from_logits(sample_logits(model, x, REF_SAMPLES, seed=5)).probs
    S, R = 64, 64
    # calls are averaged as independent estimates: fresh noise per call (a NoisePool's calls share numbers)
    sess = Session(export_model(model, ExportConfig(S, mode="noise", noise=variant, rng="host")).proto, seed=0,
                   noise_pool=False)
    got = np.mean([sess.predict(x).probs for _ in range(R)], axis=0)
    assert np.abs(got - ref).max() < _mc_bound(min(S * R, REF_SAMPLES))


def test_local_noise_is_exact_for_linear_layers():
    model = synthetic_linear()
    xl = np.random.default_rng(2).normal(size=(6, 5)).astype(np.float32)
    ref = predictive_from_logits(sample_logits(model, xl, REF_SAMPLES, seed=5)).probs
    sess = Session(export_model(model, ExportConfig(64, mode="noise", noise="local", rng="host")).proto, seed=0,
                   noise_pool=False)  # independent calls
    got = np.mean([sess.predict(xl).probs for _ in range(64)], axis=0)
    assert np.abs(got - ref).max() < 4 * 0.5 * np.sqrt(2 / REF_SAMPLES) * np.sqrt(24 / 15)  # 24 entries


def test_noise_session_is_seedable(x):
    proto = export_model(synthetic_cnn(), ExportConfig(8, mode="noise", rng="host")).proto
    a, b, c = (Session(proto, seed=s).predict(x).probs for s in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def _draws(proto, seed, x, calls=3):
    """``calls`` successive predictions of one fresh Session with ``seed``."""
    sess = Session(proto, seed=seed)
    return np.stack([sess.predict(x).probs for _ in range(calls)])


def _graph_noise_exports():
    """In-graph-noise exports: a fixed one, an anytime Loop (one body drawing per iteration) and an anytime If chain
    (mixed noise: each chunk's copy of the random ops)."""
    from edgebnn.stopping import StoppingRule

    model = synthetic_cnn(sigma=0.3)
    off = StoppingRule(epsilon=0)
    loop = export_model(model, ExportConfig(rule=off, mode="noise", rng="graph", device="cpu")).proto
    chain = export_model(model, ExportConfig(rule=off, mode="noise", rng="graph", noise="mixed", device="cpu")).proto
    fixed = export_model(model, ExportConfig(8, mode="noise", rng="graph", device="cpu")).proto
    return {"fixed": fixed, "anytime-loop": loop, "anytime-if": chain}


@pytest.mark.parametrize("kind", ["fixed", "anytime-loop", "anytime-if"])
def test_graph_noise_session_is_seedable(x, kind):
    """``Session(seed=s)`` reseeds the in-graph random ops (Loop bodies and If branches too): seed 0 twice gives the
    same draws over several calls, seed 1 others; no seed keeps the export's own seeds, as before."""
    from edgebnn.runtime.session import random_nodes

    proto = _graph_noise_exports()[kind]
    assert len(list(random_nodes(proto.graph))) >= 2  # at the top or inside If branches: every one reseeded
    first, again, other = _draws(proto, 0, x), _draws(proto, 0, x), _draws(proto, 1, x)
    np.testing.assert_array_equal(first, again)
    assert np.abs(first[1:] - first[:1]).max() > 1e-3  # successive calls draw afresh
    # each seed-1 call differs from the seed-0 call at its position: a probability of an S >= 4 ensemble of a
    # sigma = 0.3 net moves by far more than float round-off when its noise changes
    assert (np.abs(first - other).max(axis=(1, 2)) > 1e-3).all()
    np.testing.assert_array_equal(_draws(proto, None, x), _draws(proto, None, x))
    plain = ort_probs(proto, x, 3)  # the file as written: what Session() ran before seeds were honoured
    np.testing.assert_allclose(_draws(proto, None, x), plain, atol=1e-6, rtol=0)


def ort_probs(proto, x, calls):
    """``calls`` successive probs of one onnxruntime session of the file as written."""
    import onnxruntime as ort

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.stack([sess.run(["probs"], {"input": x})[0] for _ in range(calls)])


def test_session_seed_is_checked_and_host_noise_is_unchanged(x):
    """A seed is a non-negative int (one line naming the file); host noise still draws numpy's default_rng(seed),
    and no seed draws what seed 0 draws."""
    proto = export_model(synthetic_cnn(), ExportConfig(8, mode="noise", rng="host")).proto
    for bad in (-1, 1.5, "0"):
        with pytest.raises(InvalidOptionError, match="<model>: seed") as e:
            Session(proto, seed=bad)
        assert "\n" not in str(e.value)
    sess = Session(proto, seed=4, noise_pool=False)
    noise = fill_noise(sess.noise_inputs, len(x), 8, np.random.default_rng(4))
    np.testing.assert_array_equal(sess.predict(x).probs, Session(proto).predict(x, noise=noise).probs)
    np.testing.assert_array_equal(Session(proto).predict(x).probs, Session(proto, seed=0).predict(x).probs)


def test_noise_graph_has_no_random_ops_and_declares_its_inputs():
    proto = export_model(synthetic_cnn(), ExportConfig(8, mode="noise", rng="host")).proto
    assert not [n for n in proto.graph.node if n.op_type.startswith("Random")]
    assert {i.name for i in proto.graph.input} == {"input", "noise/conv.weight", "noise/conv.bias", "noise/fc.weight"}


def test_analytic_is_exact_for_a_gaussian_linear_layer():
    """Linear logits are exactly Gaussian, so analytic = quadrature of the true logit distribution."""
    model = synthetic_linear()
    xl = np.random.default_rng(2).normal(size=(6, 5)).astype(np.float32)
    ref = predictive_from_logits(sample_logits(model, xl, REF_SAMPLES, seed=5))
    got = Session(export_model(model, ExportConfig(1024, mode="analytic")).proto).predict(xl)
    bound = _mc_bound(REF_SAMPLES) * np.sqrt(24 / 15)  # QMC error of 1024 Sobol points is far smaller
    assert np.abs(got.probs - ref.probs).max() < bound
    assert np.abs(got.mutual_info - ref.mutual_info).max() < 0.02  # MI is a difference of two such means


def test_analytic_approximates_a_cnn_with_small_noise(x):
    # Moment propagation is exact per layer for Gaussian inputs; what it drops (non-Gaussian ReLU and
    # max-pool outputs, correlations) grows with sigma. With sigma 0.05 the probabilities agree to 0.01.
    model = synthetic_cnn(sigma=0.05)
    ref = predictive_from_logits(sample_logits(model, x, REF_SAMPLES, seed=5)).probs
    got = Session(export_model(model, ExportConfig(64, mode="analytic")).proto).predict(x).probs
    assert np.abs(got - ref).max() < 0.01


def test_quadrature_points_are_standard_normal():
    z = quadrature_points(1024, 3)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01  # scrambled Sobol: error far below MC's 0.03
    np.testing.assert_array_equal(z, quadrature_points(1024, 3))


@pytest.mark.parametrize(("q", "k"), [(16, 10), (64, 10), (8, 10)])
def test_quadrature_points_match_the_first_two_moments(q, k):
    """Mean 0 and second moment I exactly (per column when Q <= K): the MI's quadratic term integrates exactly."""
    z = quadrature_points(q, k).astype(np.float64)
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-6)  # float32 round-off
    second = z.T @ z / q
    np.testing.assert_allclose(np.diag(second), 1.0, atol=1e-5)
    if q > k:
        np.testing.assert_allclose(second, np.eye(k), atol=1e-5)


def test_sixteen_point_mutual_information_is_close_to_the_integral():
    """The analytic head's MI at the default S = 16 on 200 random Gaussian logit rows (K = 10, variances
    0.01-2): median relative error against 20 000 Monte Carlo draws. Raw Sobol points: 0.11; matched: 0.07;
    the reference's own error is about 1% (20 000 draws), so 0.09 separates the two."""
    rng = np.random.default_rng(0)
    m = rng.normal(0, 3, (200, 10))
    v = np.exp(rng.uniform(np.log(0.01), np.log(2.0), (200, 10)))

    def mi(z):
        return predictive_from_logits(m[None] + np.sqrt(v)[None] * z[:, None, :]).mutual_info.astype(np.float64)

    ref = mi(rng.standard_normal((20_000, 10)))
    got = mi(quadrature_points(16, 10).astype(np.float64))
    assert np.median(np.abs(got - ref) / ref) < 0.09


@pytest.mark.parametrize("mode", ["baked", "noise", "analytic"])
def test_session_refuses_bad_inputs(mode, x):
    sess = Session(export_model(synthetic_cnn(), ExportConfig(4, mode=mode, rng="host")).proto)
    with pytest.raises(InvalidOptionError, match=r"input has shape \(5, 6, 6\), the model takes \(batch, 1, 6"):
        sess.predict(x[:, 0])
    with pytest.raises(InvalidOptionError, match="not floating point"):
        sess.predict(x.astype(np.int32))
    pred = sess.predict(x.astype(np.float64))  # any float dtype is accepted and cast
    assert pred.probs.shape == (5, 3)


def test_session_refuses_bad_noise(x):
    sess = Session(export_model(synthetic_cnn(), ExportConfig(4, mode="noise", rng="host")).proto)
    good = {r["name"]: np.zeros((20 if r["per"] == "row" else 4, *r["shape"][1:]), np.float32)
            for r in sess.noise_inputs}
    sess.predict(x, noise=good)
    bad = dict(good)
    bad["noise/fc.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(InvalidOptionError, match=r"'noise/fc\.weight' has shape \(3, 3\), expected \(20, 3\)"):
        sess.predict(x, noise=bad)
    bad["noise/fc.weight"] = good["noise/fc.weight"].astype(np.float64)
    with pytest.raises(InvalidOptionError, match="must be float32"):
        sess.predict(x, noise=bad)
    with pytest.raises(InvalidOptionError, match=r"'noise/conv\.weight' is missing"):
        sess.predict(x, noise={})


def test_session_refuses_non_ensembles(tmp_path):
    with pytest.raises(InvalidArtifactError, match="float baseline"):
        Session(float_bnn(synthetic_cnn()))
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x01junk")
    with pytest.raises(InvalidArtifactError, match=r"junk\.onnx"):
        Session(tmp_path / "junk.onnx")


def test_unknown_noise_variant():
    with pytest.raises(InvalidOptionError, match="--noise sideways"):
        export_model(synthetic_cnn(), ExportConfig(4, mode="noise", noise="sideways", rng="host"))


@pytest.fixture(scope="module")
def codebook_model():
    from edgebnn.passes import lower

    model = lower(synthetic_linear(n_in=128, classes=8, sigma=0.2), "codebook", seed=0, sampling="shared").model
    assert any(w.encoding.op_type == "CodebookWeight" for w in model.encoded_weights())
    return model


@pytest.mark.parametrize("variant", ["weight", "local"])
def test_noise_mode_draws_an_independent_codebook_per_weight(variant):
    """The default codebook draws each weight on its own: one normal per weight in the graph (from K entries and
    the indices, outliers and blended weights overwritten), matching the reference runtime's draws."""
    from edgebnn.passes import lower

    model = lower(synthetic_linear(n_in=128, classes=8, sigma=0.2), "codebook", seed=0).model
    weight = next(w for w in model.encoded_weights() if w.encoding.op_type == "CodebookWeight")
    assert weight.encoding.outlier_index.size  # the overwrite path is exercised
    xl = np.random.default_rng(4).normal(size=(6, 128)).astype(np.float32)
    sess = Session(export_model(model, ExportConfig(32, mode="noise", noise=variant, rng="host")).proto, seed=0)
    rec = next(r for r in sess.noise_inputs if r["name"] == f"noise/{weight.name}")
    assert rec["shape"] == ([32, *weight.encoding.shape] if variant == "weight" else [-1, 8])
    ref = predictive_from_logits(sample_logits(model, xl, REF_SAMPLES, seed=5)).probs
    got = np.mean([sess.predict(xl).probs for _ in range(64)], axis=0)
    assert np.abs(got - ref).max() < _mc_bound(REF_SAMPLES) * np.sqrt(48 / 15)  # 48 (row, class) entries


def test_shared_mode_draws_k_numbers_per_sample_and_matches_the_reference(codebook_model):
    xl = np.random.default_rng(4).normal(size=(6, 128)).astype(np.float32)
    sess = Session(export_model(codebook_model, ExportConfig(32, mode="shared", rng="host")).proto, seed=0)
    weight = next(w for w in codebook_model.encoded_weights() if w.encoding.op_type == "CodebookWeight")
    shared = next(r for r in sess.noise_inputs if r["name"] == f"noise/{weight.name}")
    assert shared["shape"] == [32, weight.encoding.k]  # K numbers per sample, not one per weight
    ref = predictive_from_logits(sample_logits(codebook_model, xl, REF_SAMPLES, seed=5)).probs
    got = np.mean([sess.predict(xl).probs for _ in range(64)], axis=0)
    assert np.abs(got - ref).max() < _mc_bound(REF_SAMPLES) * np.sqrt(48 / 15)  # 48 (row, class) entries


def test_shared_needs_a_codebook():
    with pytest.raises(InvalidOptionError, match="--mode shared needs codebook layers"):
        export_model(synthetic_cnn(), ExportConfig(4, mode="shared", rng="host"))


def test_noise_draws_a_shared_codebook_with_its_own_draw(codebook_model):
    """A codebook with shared draws is not Gaussian weight by weight: ``--mode noise`` draws it with its family's
    draw, the graph ``--mode shared`` writes (same noise in, same predictive out)."""
    xl = np.random.default_rng(2).normal(size=(3, *codebook_model.manifest.input_shape[1:])).astype(np.float32)
    noise_sess, shared_sess = (Session(export_model(codebook_model, ExportConfig(4, mode=m, rng="host")).proto)
                               for m in ("noise", "shared"))
    assert noise_sess.noise_inputs == shared_sess.noise_inputs
    noise = fill_noise(noise_sess.noise_inputs, len(xl), 4, np.random.default_rng(0))
    np.testing.assert_array_equal(noise_sess.predict(xl, noise=noise).probs, shared_sess.predict(xl, noise=noise).probs)


def test_noise_refuses_an_encoding_without_a_draw():
    from edgebnn.passes import lower

    binary = lower(synthetic_cnn(), "binary", seed=0).model
    with pytest.raises(InvalidOptionError, match=r"BinaryWeight, which --mode noise cannot draw \(its family has no "
                                                 r"in-graph draw\): use --mode baked, or analytic"):
        export_model(binary, ExportConfig(4, mode="noise", rng="host"))


@pytest.mark.parametrize(("mode", "noise"), [("baked", "auto"), ("noise", "weight"), ("noise", "local"),
                                             ("analytic", "auto")])
def test_gemm_with_untransposed_weight(mode, noise):
    """Gemm transB=0 (weight [in, out]; torch writes transB=1): found in review for the weight-noise bias."""
    model = synthetic_linear(n_in=6, classes=3, trans_b=False)
    xl = np.random.default_rng(2).normal(size=(4, 6)).astype(np.float32)
    ref = predictive_from_logits(sample_logits(model, xl, REF_SAMPLES, seed=5)).probs
    sess = Session(export_model(model, ExportConfig(64, mode=mode, noise=noise, rng="host")).proto, seed=0)
    got = np.mean([sess.predict(xl).probs for _ in range(16 if mode == "noise" else 1)], axis=0)
    # baked: one 64-member draw; noise: 16 x 64; analytic: exact for a linear layer (QMC head)
    draws = {"baked": 64, "noise": 1024, "analytic": REF_SAMPLES}[mode]
    assert np.abs(got - ref).max() < _mc_bound(min(draws, REF_SAMPLES)) * np.sqrt(12 / 15)
