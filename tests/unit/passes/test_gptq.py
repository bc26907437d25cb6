"""GPTQ rounding of fixed-point means (``edgebnn.passes.gptq``): the codes, the patches, the measured H, the pass."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebnn.errors import InvalidOptionError
from edgebnn.passes import lower
from edgebnn.passes.gptq import InputGram, _patches, compensated_codes, layer_grams, output_error


def _nearest(w: np.ndarray, step: float, limit: int) -> np.ndarray:
    return np.clip(np.rint(w / step), -limit, limit)


def test_a_diagonal_gram_gives_nearest_rounding():
    # uncorrelated inputs: moving another column cannot cancel an error, so each weight rounds to nearest
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 20))
    h = np.diag(rng.uniform(0.1, 3.0, 20))
    np.testing.assert_array_equal(compensated_codes(w, h, 0.3, 3), _nearest(w, 0.3, 3))


def test_correlated_inputs_cut_the_output_error():
    # inputs with a few strong directions (rank-4 signal + small noise): the compensated codes' output error is
    # a fraction of nearest rounding's (measured 0.027x here; bound 0.5x) and every code stays on the 3-bit grid
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 4)) @ rng.normal(size=(4, 24)) + 0.1 * rng.normal(size=(2000, 24))
    h = x.T @ x / len(x)
    w = rng.normal(0, 0.3, size=(8, 24))
    step, limit = 0.15, 3
    q = compensated_codes(w, h, step, limit)
    assert np.abs(q).max() <= limit
    assert output_error(w, q * step, h) < 0.5 * output_error(w, _nearest(w, step, limit) * step, h)


def test_an_input_that_is_never_active_does_not_break_the_inverse():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(500, 10))
    x[:, 3] = 0.0  # a dead unit: H has a zero row and column
    q = compensated_codes(rng.normal(size=(4, 10)), x.T @ x / 500, 0.2, 7)
    assert np.isfinite(q).all() and np.abs(q).max() <= 7


@pytest.mark.parametrize(("shape", "kernel", "strides", "pads", "dilations"), [
    ((2, 3, 9, 8), [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
    ((2, 4, 11, 10), [3, 2], [2, 1], [1, 0, 2, 1], [2, 1]),
    ((3, 2, 17), [5], [2], [2, 1], [1]),
])
def test_patches_times_the_weight_are_the_convolution(shape, kernel, strides, pads, dilations):
    """W.reshape(out, -1) @ patches reproduces onnxruntime's Conv: same patch order as the weight's columns."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=shape).astype(np.float32)
    w = rng.normal(size=(5, shape[1], *kernel)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=strides, pads=pads, dilations=dilations)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    cols = _patches(x, {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations})
    got = (w.reshape(5, -1) @ cols).reshape(5, shape[0], *y.shape[2:])
    np.testing.assert_allclose(got, np.moveaxis(y, 1, 0), rtol=1e-5, atol=1e-5)


def test_layer_grams_are_the_mean_networks_layer_inputs(make_mlp):
    model = make_mlp((16, 32, 10))
    x = np.random.default_rng(4).normal(size=(96, 16)).astype(np.float32)
    grams = layer_grams(model, [x[:40], x[40:]])  # two batches of different sizes
    assert set(grams) == {"W1", "W2"} and grams["W1"].inputs == 96
    # each batch's x xᵀ is a float32 product (then summed in float64): errors ~1e-7 of the diagonal (~1)
    np.testing.assert_allclose(grams["W1"].h, x.T.astype(np.float64) @ x / 96, rtol=1e-5, atol=1e-6)
    mean = {w.name: w.encoding.mean() for w in model.encoded_weights()}
    inits = {t.name: numpy_helper.to_array(t) for t in model.proto.graph.initializer}
    b1 = mean.get("b1", inits.get("b1"))
    hidden = np.maximum(x @ mean["W1"].T + b1, 0).astype(np.float64)
    np.testing.assert_allclose(grams["W2"].h, hidden.T @ hidden / 96, rtol=1e-4, atol=1e-6)
    assert not grams["W2"].transposed and grams["W2"].count == 96


def test_fixed_rounds_against_the_grams_and_reports_the_output_error(make_mlp):
    model = make_mlp((16, 32, 10))
    x = np.random.default_rng(5).normal(size=(256, 16)).astype(np.float32)
    grams = layer_grams(model, [x])
    plain = lower(model, "fixed", bits=3).report["layers"]
    rows = {r["name"]: r for r in lower(model, "fixed", bits=3, grams=grams).report["layers"]}
    assert {r["rounding"] for r in plain} == {"nearest"}
    for name in ("W1", "W2"):
        assert rows[name]["rounding"] == "gptq"
        assert rows[name]["output_error"] < rows[name]["output_error_nearest"]
    assert rows["b1"]["rounding"] == "nearest"  # a bias has no input to compensate through


def test_grams_of_another_model_are_refused_naming_the_weight(make_mlp):
    model = make_mlp((16, 32, 10))
    wrong = {"W1": InputGram(np.eye(8))}
    with pytest.raises(InvalidOptionError, match=r"grams\['W1'\]: a \(8, 8\) matrix"):
        lower(model, "fixed", bits=3, grams=wrong)
    with pytest.raises(InvalidOptionError, match="grams must map weight names to InputGram"):
        lower(model, "fixed", bits=3, grams={"W1": np.eye(16)})


def test_inputs_the_model_does_not_take_are_one_line(make_mlp):
    with pytest.raises(InvalidOptionError, match=r"calibration inputs \(4, 7\)"):
        layer_grams(make_mlp((16, 32, 10)), [np.zeros((4, 7), np.float32)])
    with pytest.raises(InvalidOptionError, match="no inputs"):
        layer_grams(make_mlp((16, 32, 10)), [])


def test_a_lowered_model_with_grams_saves_and_says_it_cannot_replay(make_mlp, tmp_path):
    from edgebnn import ir
    from edgebnn.api import lower_config_of

    model = make_mlp((16, 32, 10))
    grams = layer_grams(model, [np.ones((8, 16), np.float32)])
    out = lower(model, "fixed", bits=4, grams=grams).model
    ir.save(out, tmp_path / "m.ebnn")
    # the manifest names the weights rounded against data, not the matrices
    assert ir.load(tmp_path / "m.ebnn").manifest.passes[-1]["options"]["grams"] == ["W1", "W2"]
    with pytest.raises(InvalidOptionError, match="grams"):
        lower_config_of(tmp_path / "m.ebnn")


def test_pruned_weights_stay_zero_and_the_others_compensate():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(1000, 3)) @ rng.normal(size=(3, 12)) + 0.05 * rng.normal(size=(1000, 12))
    h = x.T @ x / len(x)
    w = rng.normal(0, 0.3, size=(5, 12))
    zero = rng.random(w.shape) < 0.4
    w[zero] = 0.0
    q = compensated_codes(w, h, 0.1, 7, zero)
    assert not q[zero].any()
    # the kept weights absorb the rounding error: well below nearest rounding's (which also keeps the zeros)
    assert output_error(w, q * 0.1, h) < 0.5 * output_error(w, _nearest(w, 0.1, 7) * 0.1, h)


def test_prune_then_calibrated_fixed_keeps_the_pruning(make_mlp):
    model = make_mlp((16, 32, 10), sigma_ratio=2.0)  # large σ/|μ|: prune finds weights to drop
    x = np.random.default_rng(7).normal(size=(128, 16)).astype(np.float32)
    grams = layer_grams(model, [x])
    pruned = {w.name: w.encoding.mean() == 0 for w in lower(model, "prune").model.encoded_weights()}
    calibrated = lower(model, "prune+fixed", bits=3, grams=grams)
    rows = {r["name"]: r for r in calibrated.report["layers"]}
    means = {w.name: w.encoding.mean() for w in calibrated.model.encoded_weights()}
    for name in ("W1", "W2"):
        assert rows[name]["rounding"] == "gptq" and pruned[name].mean() > 0.05
        assert means[name].shape == pruned[name].shape and not means[name][pruned[name]].any()
