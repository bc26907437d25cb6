"""edgebnn compare: agrees on artifacts of the same posterior, flags a different posterior, and says "cannot tell"
where its power does not reach the tolerance."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper
from synthetic import synthetic_cnn

from edgebnn import ir
from edgebnn.compare import calls_needed, compare_artifacts, critical_value, detectable_difference
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import save_onnx
from edgebnn.exporters.export import export_model
from edgebnn.runtime.reference import predict

NULL_RUNS = 39  # p-values down to 0.025; alpha 0.05 keeps the test fast and still decisive


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    return rng.normal(size=(60, 1, 6, 6)).astype(np.float32), rng.integers(0, 3, 60)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    model = synthetic_cnn(sigma=0.3)
    ir.save(model, d / "m.ebnn")
    for mode, seed in (("baked", 11), ("noise", 0), ("analytic", 0)):
        save_onnx(export_model(model, ExportConfig(16, mode=mode, seed=seed, rng="host")).proto, d / f"{mode}.onnx")
    # The same skeleton with every sigma tripled: a different posterior.
    wider = synthetic_cnn(sigma=0.3)
    for t in wider.proto.graph.initializer:
        if t.name.endswith(".sigma"):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 3, t.name))
    save_onnx(export_model(wider, ExportConfig(16, mode="baked", seed=11)).proto, d / "wider.onnx")
    ir.save(wider, d / "wider.ebnn")
    return d


def _compare(files, data, a, b, **options):
    return compare_artifacts(str(files / a), str(files / b), data, ir=str(files / "m.ebnn"), null_runs=NULL_RUNS,
                             alpha=0.05, **options)


@pytest.mark.parametrize("other", ["baked.onnx", "noise.onnx"])
def test_same_posterior_is_same_only_where_the_test_can_see_the_tolerance(files, data, other):
    """The same posterior is never called different here; at S = 16 of a sigma = 0.3 net the test detects only RMS
    differences far above 0.01, so at that tolerance it cannot tell; at a tolerance above what it detects and what
    it saw, it says same."""
    report = _compare(files, data, "m.ebnn", other)
    assert report["p_value"] > 0.05, report
    assert report["a"]["samples"] == report["b"]["samples"] == 16
    assert report["detectable_diff"] > 0.01 and report["verdict"] == "cannot tell" and not report["same_distribution"]
    wide = 1.5 * max(report["detectable_diff"], report["observed_diff"])
    again = _compare(files, data, "m.ebnn", other, tolerance=wide)
    assert again["detectable_diff"] == report["detectable_diff"]  # the same draws: only the tolerance moved
    assert again["verdict"] == "same" and again["same_distribution"]


def test_one_baked_file_twice_cannot_tell_and_more_calls_do_not_help(files, data):
    """Two copies of one baked draw agree exactly, yet its 16 members are one draw: at 0.01 the test cannot tell,
    and calls cannot change it."""
    report = _compare(files, data, "baked.onnx", "baked.onnx")
    assert report["observed_diff"] == 0 and report["p_value"] == 1
    assert report["verdict"] == "cannot tell" and report["calls_needed"] is None
    assert not report["a"]["redraws"] and report["a"]["draws"] == 16


def test_wider_posterior_is_different(files, data):
    """Sigma tripled: the true RMS difference of the mean probabilities (4096-member predictives of both, Monte Carlo
    error about 0.5 / 64 per entry) is above what the test detects, and the test calls it different."""
    report = _compare(files, data, "baked.onnx", "wider.onnx")
    assert report["verdict"] == "different" and not report["same_distribution"], report
    assert report["p_value"] == pytest.approx(1 / (NULL_RUNS + 1))
    x = data[0]
    wide, plain = (predict(ir.load(files / name), x, 4096, seed=seed).probs
                   for name, seed in (("wider.ebnn", 1), ("m.ebnn", 2)))
    true = np.sqrt(np.mean((wide - plain) ** 2))
    assert true > report["detectable_diff"] + 2 * 0.5 / 64, (true, report["detectable_diff"])
    assert report["observed_diff"] > report["detectable_diff"]


def test_detectable_difference_shrinks_with_calls(files, data):
    """16 calls of the noise export against 16·16 reference members: the detectable difference's factor sqrt(mean v)
    shrinks 4x; the null's relative spread shrinks too (measured ratio 4.7-5.4 over 5 seeds). Bounds: 4 / 1.33 and
    4 · 1.6 cover the 80% quantile's own error over 2·39 simulated pairs."""
    one, many = (_compare(files, data, "m.ebnn", "noise.onnx", calls=calls) for calls in (1, 16))
    assert many["a"]["draws"] == many["b"]["draws"] == 256 and many["calls"] == 16
    assert 3.0 < one["detectable_diff"] / many["detectable_diff"] < 6.4, (one, many)
    assert one["calls_needed"] is not None and one["calls_needed"] > 16  # 0.01 is out of reach of 16 calls here


def test_detectable_difference_is_exactly_one_over_sqrt_draws():
    """Null errors and variances scaled as N times the draws scale them (e / sqrt(N), v / N) leave every T_r as it
    is and divide the detectable shift by exactly sqrt(N); a shift of that size is detected in at least 80% of the
    simulated pairs, one a tenth of it in far fewer."""
    rng = np.random.default_rng(0)
    var = rng.uniform(0.001, 0.01, size=(50, 3))
    errors = rng.normal(size=(99, 50, 3)) * np.sqrt(var) * (1 + rng.normal(size=(99, 1, 1)) * 0.3)  # correlated

    def detect(scale: float) -> tuple[float, np.ndarray, np.ndarray]:
        e, v = errors / np.sqrt(scale), var / scale
        null = np.mean(e ** 2 / v, axis=(1, 2))
        return detectable_difference(null, np.mean(e / np.sqrt(v), axis=(1, 2)), v, 0.01), null, e
    base, null, _ = detect(1)
    for n in (4, 16):
        assert detect(n)[0] == pytest.approx(base / np.sqrt(n), rel=1e-9)
    c = critical_value(null, 0.01)
    assert c == null.max()  # 99 pairs at alpha 0.01: only a T above every null one has p <= 0.01
    unit = np.sqrt(var / var.mean())
    for lam, least, most in ((base * (1 + 1e-9), 0.8, 1.0), (base / 10, 0.0, 0.3)):
        shifted = [np.mean((e + sign * lam * unit) ** 2 / var) for e in errors for sign in (1, -1)]
        assert least <= np.mean(np.array(shifted) > c) <= most


def test_calls_needed_follows_the_sides_that_redraw():
    """detectable ∝ sqrt(Σ 1/draws): two redrawn S = 16 sides at 4x the tolerance need 16 calls; with a baked side
    the floor 1/16 of its own members stays, so 4x is out of reach, 1.2x is not."""
    assert calls_needed(0.04, 0.01, 1, [(16, True), (16, True)]) == 16
    assert calls_needed(0.04, 0.01, 4, [(16, True), (16, True)]) == 64
    assert calls_needed(0.04, 0.01, 1, [(16, True), (16, False)]) is None
    assert calls_needed(0.012, 0.01, 1, [(16, True), (16, False)]) == 3  # 1/16 + 1/(16 N) <= (2/16) / 1.44
    assert calls_needed(0.008, 0.01, 1, [(16, True), (16, True)]) is None  # already within


def test_compare_command_says_cannot_tell_and_how_to_sample_more(files, data, tmp_path):
    """exit 3, the detectable difference and the --calls that would reach the tolerance; a baked pair names the
    export to redo with more samples."""
    from click.testing import CliRunner

    from edgebnn.cli import main

    np.savez(tmp_path / "d.npz", x=data[0], y=data[1])
    args = ["--data", str(tmp_path / "d.npz"), "--null-runs", str(NULL_RUNS), "--alpha", "0.05"]
    ran = CliRunner().invoke(main, ["compare", str(files / "m.ebnn"), str(files / "noise.onnx"), *args])
    assert ran.exit_code == 3, ran.output
    line = " ".join(ran.output.split())
    assert "cannot tell (no significant difference, but the test cannot see a difference as small as the " \
           "tolerance 0.01)" in line and "with 80% power" in line and "sample more: --calls " in line, line
    ran = CliRunner().invoke(main, ["compare", str(files / "baked.onnx"), str(files / "baked.onnx"),
                                    "--ir", str(files / "m.ebnn"), *args])
    line = " ".join(ran.output.split())
    assert ran.exit_code == 3 and "more calls cannot get there" in line and "baked.onnx" in line, line
    ran = CliRunner().invoke(main, ["compare", str(files / "m.ebnn"), str(files / "noise.onnx"), *args,
                                    "--tolerance", "1"])
    assert ran.exit_code == 0 and "same predictive distribution (within 1)" in ran.output, ran.output


def test_two_exports_need_the_ir(files, data):
    with pytest.raises(InvalidOptionError, match="--ir"):
        compare_artifacts(str(files / "baked.onnx"), str(files / "noise.onnx"), data)
