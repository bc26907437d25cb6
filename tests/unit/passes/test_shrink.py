"""``shrink``: units that are zero in every draw leave the graph (edgebnn.passes.shrink).

Every check compares the shrunk model with the same model before shrinking (the units zeroed but kept):

- shapes shrink by exactly the dead units, and the kept weights keep their codes (means and spreads equal);
- per draw: a member drawn from the unshrunk posterior, restricted to the kept units, computes the same outputs in
  the shrunk graph (float32 sums of the same non-zero terms: 1e-5);
- ``analytic`` exports (no draws) give the same predictive to 1e-5, and the deployed bytes shrink;
- ``baked`` exports of the shrunk model are the reference runtime's members (same seed, to 1e-5). They are not the
  unshrunk model's members: weight i's stream ``[seed, i]`` fills a smaller shape (edgebnn.passes.shrink).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.sizes import deployed_bytes
from edgebnn.ir import DOMAIN, MAX_IR_VERSION, BNNModel, GaussianWeight, Manifest, make_encoding_node, verify
from edgebnn.ir.encodings import MemberSetWeight, draw_weight
from edgebnn.passes import ShrinkPass, lower
from edgebnn.passes.config import DATA_OPTIONS, PASSES, pass_configs
from edgebnn.runtime.reference import Reference
from edgebnn.runtime.session import Session

SEED = 0
TOL = 1e-5  # float32 sums over at most a few hundred terms of order 1, reordered by the exporters


def _zeroed_mlp(build_mlp, bias_of_dead_row: float = -0.5, deterministic_last: bool = False) -> tuple[BNNModel, dict]:
    """16-32-24-10 MLP: W2's columns 3 and 5 are zero (fc1 units 3, 5 unused: rule a); W2's rows 7 and 11 are zero
    and b2 there is ``bias_of_dead_row`` (fc2 units 7, 11 are relu(b) at fc3: rule b, or rule c when
    ``deterministic_last``). Two units each: an even width stays even (shrink.EVEN_WIDTH)."""
    base = build_mlp((16, 32, 24, 10), seed=1)
    post = {w.name: (w.encoding.mean().copy(), w.encoding.stddev().copy()) for w in base.encoded_weights()}
    mu2, sd2 = post["W2"]
    mu2[:, [3, 5]] = sd2[:, [3, 5]] = 0
    mu2[[7, 11]] = sd2[[7, 11]] = 0
    sigma = {"W2": sd2}
    if deterministic_last:
        sigma["W3"] = np.zeros_like(post["W3"][1])
    model = build_mlp((16, 32, 24, 10), seed=1, mu={"W2": mu2}, sigma=sigma)
    _set_initializer(model, "b2", lambda b: _put(_put(b, 7, bias_of_dead_row), 11, bias_of_dead_row))
    _input_renamed(model)
    keep1, keep2 = np.setdiff1d(np.arange(32), [3, 5]), np.setdiff1d(np.arange(24), [7, 11])
    # weight name -> [(axis, kept indices)]
    slices = {"W1": [(0, keep1)], "b1": [(0, keep1)], "W2": [(0, keep2), (1, keep1)], "W3": [(1, keep2)]}
    return model, slices


def _input_renamed(model: BNNModel) -> BNNModel:
    """The MLP with its input named ``input``: at this branch's base an analytic export of a model whose input is
    ``x`` failed onnx's SSA check (its graph wrote a value ``x`` of its own; fixed on main since)."""
    model.proto.graph.input[0].name = model.manifest.input_name = "input"
    for node in model.proto.graph.node:
        node.input[:] = ["input" if i == "x" else i for i in node.input]
    verify(model)
    return model


def _put(a: np.ndarray, i: int, v: float) -> np.ndarray:
    a = a.copy()
    a[i] = v
    return a


def _set_initializer(model: BNNModel, name: str, fn) -> None:
    t = next(t for t in model.proto.graph.initializer if t.name == name)
    t.CopyFrom(numpy_helper.from_array(fn(numpy_helper.to_array(t)).astype(np.float32), name))


def _lowered(model: BNNModel, scheme: str, **options) -> BNNModel:
    """``model`` through the scheme's passes WITHOUT the shrink that ``lower`` ends with."""
    out = model
    data = {k: v for k, v in options.items() if k in DATA_OPTIONS}
    settings = {k: v for k, v in options.items() if k not in DATA_OPTIONS}
    for name, config in pass_configs(scheme, "auto", settings, data):
        out = PASSES[name](config)(out, seed=SEED).model
    return out


def _shapes(model: BNNModel) -> dict[str, tuple[int, ...]]:
    return {w.name: w.encoding.shape for w in model.encoded_weights()}


def _sliced(a: np.ndarray, cuts: list[tuple[int, np.ndarray]], lead: int = 0) -> np.ndarray:
    for axis, keep in cuts:
        a = np.take(a, keep, axis + lead)
    return a


def _check_same_posterior(zeroed: BNNModel, shrunk: BNNModel, slices: dict, x: np.ndarray) -> None:
    """Codes kept exactly, and every member of the unshrunk posterior, restricted, gives the same outputs."""
    before = {w.name: w.encoding for w in zeroed.encoded_weights()}
    for w in shrunk.encoded_weights():
        old, cuts = before[w.name], slices.get(w.name, [])
        assert w.encoding.op_type == old.op_type
        np.testing.assert_array_equal(w.encoding.mean(), _sliced(old.mean(), cuts))
        np.testing.assert_array_equal(w.encoding.stddev(), _sliced(old.stddev(), cuts))
    draws = {w.name: draw_weight(w.encoding, SEED, i, 3) for i, w in enumerate(zeroed.encoded_weights())}
    full, small = (onnx_session(m) for m in (zeroed, shrunk))
    name = zeroed.manifest.input_name
    for s in range(3):
        out_full = full.run(None, {name: x, **{k: v[s] for k, v in draws.items()}})[0]
        out_small = small.run(None, {name: x, **{k: _sliced(v[s], slices.get(k, [])) for k, v in draws.items()}})[0]
        np.testing.assert_allclose(out_small, out_full, rtol=0, atol=TOL)


def onnx_session(model: BNNModel):
    from edgebnn.runtime.reference import session

    return session(model.weights_as_inputs().SerializeToString())


def _check_exports(zeroed: BNNModel, shrunk: BNNModel, x: np.ndarray) -> None:
    """analytic: same predictive, fewer bytes; baked: the reference runtime's members, fewer bytes."""
    full = export_model(zeroed, ExportConfig(8, mode="analytic", seed=SEED)).proto
    small = export_model(shrunk, ExportConfig(8, mode="analytic", seed=SEED)).proto
    np.testing.assert_allclose(Session(small).predict(x).probs, Session(full).predict(x).probs, rtol=0, atol=TOL)
    assert deployed_bytes(small).file_bytes < deployed_bytes(full).file_bytes
    baked = export_model(shrunk, ExportConfig(4, mode="baked", seed=SEED)).proto
    np.testing.assert_allclose(Session(baked).predict(x).probs, Reference(shrunk).predict(x, 4, SEED).probs,
                               rtol=0, atol=TOL)
    assert deployed_bytes(baked).file_bytes < deployed_bytes(export_model(zeroed, ExportConfig(4, mode="baked",
                                                                                               seed=SEED)).proto).file_bytes


@pytest.mark.parametrize("scheme", ["float", "fixed", "codebook", "ternary", "mcq"])
def test_mlp_dead_units_leave_every_encoding_exactly(scheme, make_mlp) -> None:
    model, slices = _zeroed_mlp(make_mlp)
    zeroed = _lowered(model, scheme)
    result = ShrinkPass()(zeroed, seed=SEED)
    shrunk = result.model
    assert result.modified and shrunk.manifest.passes[-1]["name"] == "shrink"
    assert _shapes(shrunk) == {"W1": (30, 16), "b1": (30,), "W2": (22, 30), "W3": (10, 22)}
    assert numpy_helper.to_array(next(t for t in shrunk.proto.graph.initializer if t.name == "b2")).shape == (22,)
    edges = {(e["producer"], e["consumer"]): e for e in result.report["edges"]}
    assert edges["fc1", "fc2"]["zero_columns"] == 2 and edges["fc2", "fc3"]["constant_zero"] == 2
    x = np.random.default_rng(1).normal(size=(12, 16)).astype(np.float32)
    _check_same_posterior(zeroed, shrunk, slices, x)
    if scheme in ("float", "fixed"):
        _check_exports(zeroed, shrunk, x)
    # lower() ends with the same pass: shapes and units in its report
    report = lower(model, scheme, seed=SEED).report
    rows = {r["name"]: r for r in report["layers"]}
    assert rows["W2"]["shape"] == [22, 30] and rows["W2"]["units_removed"] == {"outputs": 2, "inputs": 2}
    assert rows["W3"]["n_weights"] == 220 and rows["b1"]["units_removed"] == {"outputs": 2, "inputs": 0}


def test_mlp_units_pruned_by_group_scales_leave_the_graph(make_mlp) -> None:
    model = _input_renamed(make_mlp((16, 32, 10), seed=2))
    mu_z, sigma_z = np.ones(32, np.float32), np.full(32, 0.01, np.float32)
    dead = [0, 4, 9, 31]
    sigma_z[dead] = 2.0  # log α = log 4 >= -3: fc2's input neurons 0, 4, 9, 31 are pruned, so fc1's units are unused
    scales = {"W2": (mu_z, sigma_z)}
    zeroed = _lowered(model, "prune", group_scales=scales, log_alpha_threshold=50.0)
    result = lower(model, "prune", group_scales=scales, log_alpha_threshold=50.0, seed=SEED)
    shrunk = result.model
    keep = np.setdiff1d(np.arange(32), dead)
    assert _shapes(shrunk) == {"W1": (28, 16), "b1": (28,), "W2": (10, 28)}
    assert [p["name"] for p in shrunk.manifest.passes] == ["prune", "shrink"]
    assert result.report["total_bytes"] < result.report["float_bnn_bytes"]
    x = np.random.default_rng(2).normal(size=(12, 16)).astype(np.float32)
    _check_same_posterior(zeroed, shrunk, {"W1": [(0, keep)], "b1": [(0, keep)], "W2": [(1, keep)]}, x)
    _check_exports(zeroed, shrunk, x)


def test_constant_unit_folds_into_a_deterministic_bias(make_mlp) -> None:
    # fc2 units 7, 11 are relu(0.7) = 0.7 everywhere; fc3 is deterministic, so 0.7 · W3[:, j] moves into b3
    model, slices = _zeroed_mlp(make_mlp, bias_of_dead_row=0.7, deterministic_last=True)
    result = ShrinkPass()(model)
    assert _shapes(result.model)["W3"] == (10, 22)
    assert {(e["producer"], e["folded"]) for e in result.report["edges"]} >= {("fc2", 2)}
    x = np.random.default_rng(3).normal(size=(12, 16)).astype(np.float32)
    _check_same_posterior(model, result.model, slices, x)
    # with a Bayesian fc3 the constant cannot fold: the unit stays
    model, _ = _zeroed_mlp(make_mlp, bias_of_dead_row=0.7)
    assert _shapes(ShrinkPass()(model).model)["W3"] == (10, 24)


def test_a_model_without_dead_units_is_returned_unrecorded(make_mlp) -> None:
    model = make_mlp((16, 32, 10), seed=2)
    result = ShrinkPass()(model)
    assert not result.modified and result.model.manifest.passes == [] and _shapes(result.model) == _shapes(model)


# -- a small CNN ------------------------------------------------------------------------------------------------
def _cnn(flatten: str, seed: int = 0, width: int = 96) -> BNNModel:
    """x [B,1,8,8] -> Conv c1 (8 filters, pad 1) -> BN -> Relu -> Conv c2 (6, pad 1) -> Relu -> MaxPool 2
    -> Flatten | Reshape [-1, width] -> Gemm fc (10). Conv biases and BN are deterministic initializers."""
    rng = np.random.default_rng(seed)

    def gauss(*shape: int) -> GaussianWeight:
        mu = rng.normal(0, 1 / np.sqrt(np.prod(shape[1:])), shape).astype(np.float32)
        return GaussianWeight(mu, (0.2 * np.abs(mu) + 0.01).astype(np.float32))

    graph = helper.make_graph([], "cnn",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])])
    enc = [make_encoding_node(graph, "c1.w", "c1", gauss(8, 1, 3, 3)),
           make_encoding_node(graph, "c2.w", "c2", gauss(6, 8, 3, 3)),
           make_encoding_node(graph, "fc.w", "fc", gauss(10, width))]
    inits = {"c1.b": rng.normal(0, 0.1, 8), "bn.scale": rng.uniform(0.5, 1.5, 8), "bn.bias": rng.normal(0, 0.1, 8),
             "bn.mean": rng.normal(0, 0.1, 8), "bn.var": rng.uniform(0.5, 1.5, 8), "c2.b": rng.normal(0, 0.1, 6),
             "fc.b": rng.normal(0, 0.1, 10)}
    graph.initializer.extend(numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items())
    ops = [helper.make_node("Conv", ["input", "c1.w", "c1.b"], ["h1"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
           helper.make_node("BatchNormalization", ["h1", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["n1"]),
           helper.make_node("Relu", ["n1"], ["r1"]),
           helper.make_node("Conv", ["r1", "c2.w", "c2.b"], ["h2"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
           helper.make_node("Relu", ["h2"], ["r2"]),
           helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2])]
    if flatten == "Flatten":
        ops.append(helper.make_node("Flatten", ["p2"], ["flat"], axis=1))
    else:
        graph.initializer.append(numpy_helper.from_array(np.array([-1, width], np.int64), "flat.shape"))
        ops.append(helper.make_node("Reshape", ["p2", "flat.shape"], ["flat"]))
    ops.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1))
    graph.node.extend(enc + ops)
    graph.value_info.append(helper.make_tensor_value_info("r1", TensorProto.FLOAT, ["batch", 8, 8, 8]))  # goes stale
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = MAX_IR_VERSION
    model = BNNModel(proto, Manifest(source_library="synthetic", input_name="input", input_shape=[1, 1, 8, 8],
                                     num_classes=10), "<cnn>")
    verify(model)
    return model


def _replace(model: BNNModel, name: str, fn) -> None:
    w = model.encoded_weight(name)
    mu, sd = fn(w.encoding.mean().copy(), w.encoding.stddev().copy())
    model.replace_encoding(w, GaussianWeight(mu, sd))


def _zero(a: np.ndarray, index) -> np.ndarray:
    a[index] = 0
    return a


@pytest.mark.parametrize("flatten", ["Flatten", "Reshape"])
def test_cnn_filters_and_channels_leave_through_batchnorm_pool_and_flatten(flatten) -> None:
    model = _cnn(flatten)
    _replace(model, "c1.w", lambda mu, sd: (_zero(mu, 2), _zero(sd, 2)))  # c1 filter 2: constant b = -0.3 ...
    _set_initializer(model, "c1.b", lambda b: _put(b, 2, -0.3))
    for name, value in (("bn.mean", 0.0), ("bn.bias", 0.0)):  # ... BN(-0.3) < 0, Relu -> 0 at c2 (rule b)
        _set_initializer(model, name, lambda b, v=value: _put(b, 2, v))
    _replace(model, "c2.w", lambda mu, sd: (_zero(mu, (slice(None), 5)), _zero(sd, (slice(None), 5))))  # rule a
    _replace(model, "c2.w", lambda mu, sd: (_zero(mu, 1), _zero(sd, 1)))  # c2 filter 1, bias 0: Relu(0) = 0 at fc
    _set_initializer(model, "c2.b", lambda b: _put(b, 1, 0.0))
    cols = np.arange(4 * 16, 5 * 16)  # c2 filter 4's 4x4 pooled map: 16 columns of fc (rule a through the flatten)
    _replace(model, "fc.w", lambda mu, sd: (_zero(mu, (slice(None), cols)), _zero(sd, (slice(None), cols))))
    verify(model)

    result = ShrinkPass()(model)
    shrunk = result.model
    assert _shapes(shrunk) == {"c1.w": (6, 1, 3, 3), "c2.w": (4, 6, 3, 3), "fc.w": (10, 64)}
    inits = {t.name: numpy_helper.to_array(t) for t in shrunk.proto.graph.initializer}
    assert all(inits[n].shape == (6,) for n in ("c1.b", "bn.scale", "bn.bias", "bn.mean", "bn.var"))
    assert inits["c2.b"].shape == (4,) and list(shrunk.proto.graph.value_info) == []
    if flatten == "Reshape":
        assert inits["flat.shape"].tolist() == [-1, 64]
    keep1, keep2 = np.setdiff1d(np.arange(8), [2, 5]), np.setdiff1d(np.arange(6), [1, 4])
    fc_cols = (keep2[:, None] * 16 + np.arange(16)).reshape(-1)
    slices = {"c1.w": [(0, keep1)], "c2.w": [(0, keep2), (1, keep1)], "fc.w": [(1, fc_cols)]}
    x = np.random.default_rng(4).normal(size=(6, 1, 8, 8)).astype(np.float32)
    _check_same_posterior(model, shrunk, slices, x)
    _check_exports(model, shrunk, x)


def test_cnn_filters_pruned_by_group_scales_leave_the_graph() -> None:
    model = _cnn("Reshape", seed=1)
    _set_initializer(model, "c2.b", lambda b: np.minimum(b, 0))  # a pruned filter's unit is relu(b <= 0) = 0
    mu_z, sigma_z = np.ones(6, np.float32), np.full(6, 0.01, np.float32)
    sigma_z[[0, 3]] = 2.0  # c2 filters 0 and 3 pruned (conv groups are filters)
    scales = {"c2.w": (mu_z, sigma_z)}
    zeroed = _lowered(model, "prune", group_scales=scales, log_alpha_threshold=50.0)
    shrunk = lower(model, "prune+fixed", group_scales=scales, log_alpha_threshold=50.0, seed=SEED).model
    assert _shapes(shrunk) == {"c1.w": (8, 1, 3, 3), "c2.w": (4, 8, 3, 3), "fc.w": (10, 64)}
    keep = np.array([1, 2, 4, 5])
    fc_cols = (keep[:, None] * 16 + np.arange(16)).reshape(-1)
    x = np.random.default_rng(5).normal(size=(6, 1, 8, 8)).astype(np.float32)
    _check_same_posterior(zeroed, ShrinkPass()(zeroed).model, {"c2.w": [(0, keep)], "fc.w": [(1, fc_cols)]}, x)
    assert deployed_bytes(export_model(shrunk, ExportConfig(8, mode="analytic")).proto).file_bytes < deployed_bytes(
        export_model(_lowered(model, "prune+fixed", group_scales=scales, log_alpha_threshold=50.0),
                     ExportConfig(8, mode="analytic")).proto).file_bytes


# -- what is left alone -------------------------------------------------------------------------------------------
def test_a_residual_join_is_left_untouched() -> None:
    """x -> fc1 -> Relu r1 -> fc2 -> Add(., r1) -> Relu -> fc3: r1 is read twice, so no unit of fc1 may go."""
    rng = np.random.default_rng(6)
    graph = helper.make_graph([], "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])])
    mu1, mu2, mu3 = rng.normal(size=(16, 8)), rng.normal(size=(16, 16)), rng.normal(size=(3, 16))
    mu1[4] = 0  # fc1 unit 4: row zero, bias -1 -> relu 0, and fc2's column 4 zero: dead to fc2, not to the Add
    mu2[:, 4] = 0
    enc = [make_encoding_node(graph, n, n[:3], GaussianWeight(m.astype(np.float32), (0.1 * (m != 0)).astype(
        np.float32))) for n, m in (("fc1.w", mu1), ("fc2.w", mu2), ("fc3.w", mu3))]
    graph.initializer.append(numpy_helper.from_array(_put(np.zeros(16, np.float32), 4, -1.0), "fc1.b"))
    graph.node.extend([*enc,
        helper.make_node("Gemm", ["x", "fc1.w", "fc1.b"], ["h1"], transB=1), helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node("Gemm", ["r1", "fc2.w"], ["h2"], transB=1), helper.make_node("Add", ["h2", "r1"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]), helper.make_node("Gemm", ["r2", "fc3.w"], ["logits"], transB=1)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = MAX_IR_VERSION
    model = BNNModel(proto, Manifest(source_library="synthetic", input_name="x", input_shape=[1, 8], num_classes=3))
    verify(model)
    result = lower(model, "float")
    assert _shapes(result.model) == _shapes(model)
    assert [p["name"] for p in result.model.manifest.passes] == ["float"]
    skipped = {s["layer"]: s["reason"] for s in result.report["shrink"]["skipped"]}
    assert "read by several nodes" in skipped["fc1"]


def test_an_encoding_that_cannot_be_sliced_is_left_alone(make_mlp) -> None:
    model, _ = _zeroed_mlp(make_mlp)
    w2 = model.encoded_weight("W2")
    members = np.stack([w2.encoding.mean(), w2.encoding.mean()])  # M = 2 identical members: columns 3, 5 still 0
    model.replace_encoding(w2, MemberSetWeight(members))
    result = ShrinkPass()(model)
    shapes = _shapes(result.model)
    assert shapes["W1"] == (32, 16) and shapes["W2"] == (24, 32) and shapes["W3"] == (10, 24)
    reasons = [s["reason"] for s in result.report["skipped"]]
    assert any("MemberSetWeight, which cannot be sliced exactly" in r for r in reasons), reasons


def test_the_last_unit_is_kept_and_an_even_width_stays_even(make_mlp) -> None:
    model = _input_renamed(make_mlp((16, 4, 10), seed=3, mu={"W2": np.zeros((10, 4), np.float32)},
                                    sigma={"W2": np.zeros((10, 4), np.float32)}))
    result = ShrinkPass()(model)
    assert _shapes(result.model) == {"W1": (2, 16), "b1": (2,), "W2": (10, 2)}  # 4 dead: 1 kept, 1 for evenness
    x = np.random.default_rng(7).normal(size=(5, 16)).astype(np.float32)
    probs, want = (Session(export_model(m, ExportConfig(4, mode="analytic")).proto).predict(x).probs
                   for m in (result.model, model))
    np.testing.assert_allclose(probs, want, atol=TOL)


def test_shrunk_model_round_trips_and_replays(tmp_path, make_mlp) -> None:
    from edgebnn.ir import load, save, to_bytes
    from edgebnn.passes import LowerConfig

    model, _ = _zeroed_mlp(make_mlp)
    result = lower(model, "prune+fixed", seed=SEED)
    save(result.model, tmp_path / "m.ebnn")
    loaded = load(tmp_path / "m.ebnn")
    assert to_bytes(loaded) == to_bytes(result.model) and _shapes(loaded)["W2"] == (22, 30)
    replay = lower(model, LowerConfig.from_dict(loaded.manifest.lower_config)).model
    assert to_bytes(replay) == to_bytes(result.model)
    assert isinstance(onnx.load_from_string(to_bytes(loaded)), onnx.ModelProto)


@pytest.mark.parametrize(("mode", "weights", "options"), [
    ("baked", "int8", {"form": "qdq"}), ("baked", "int4", {"form": "qdq"}), ("noise", "ir", {}),
    ("noise", "int8", {}), ("noise", "fp32", {"noise": "mixed"}), ("analytic", "ir", {}), ("analytic", "int8", {})])
def test_every_export_mode_takes_the_smaller_shapes(mode, weights, options) -> None:
    model = _cnn("Reshape", seed=2)
    _replace(model, "c2.w", lambda mu, sd: (_zero(mu, [1, 2]), _zero(sd, [1, 2])))
    _set_initializer(model, "c2.b", lambda b: _put(_put(b, 1, -1.0), 2, 0.0))
    zeroed = _lowered(model, "fixed")
    shrunk = ShrinkPass()(zeroed).model
    assert _shapes(shrunk)["fc.w"] == (10, 64)
    config = ExportConfig(4, mode=mode, weights=weights, seed=SEED, **{"rng": "host", **options})
    small, full = (export_model(m, config).proto for m in (shrunk, zeroed))
    assert deployed_bytes(small).file_bytes < deployed_bytes(full).file_bytes
    x = np.random.default_rng(8).normal(size=(5, 1, 8, 8)).astype(np.float32)
    probs = Session(small).predict(x).probs
    assert probs.shape == (5, 10) and np.allclose(probs.sum(axis=1), 1, atol=1e-5)
    # no draws and the IR's own codes: the same predictive (int8 re-quantizes σ on a log grid fitted to the whole
    # tensor, whose removed zeros were part of it, so only its bytes are compared)
    if mode == "analytic" and weights == "ir":
        np.testing.assert_allclose(probs, Session(full).predict(x).probs, atol=TOL)


def test_a_reshape_that_is_no_flatten_is_left_alone() -> None:
    # [B, 6, 4, 4] -> [2B, 48]: a row holds 3 channels, so fc's columns are not per channel; c2 filter 1 stays
    model = _cnn("Reshape", width=48)
    _replace(model, "c2.w", lambda mu, sd: (_zero(mu, [1, 4]), _zero(sd, [1, 4])))
    _set_initializer(model, "c2.b", lambda b: _put(_put(b, 1, -1.0), 4, -1.0))
    result = ShrinkPass()(model)
    assert _shapes(result.model) == _shapes(model) and not result.modified
    assert any("is not a flatten to 48 per example" in s["reason"] for s in result.report["skipped"])


def _graph_model(nodes, encodings: dict, inits: dict, n_in: int, n_out: int) -> BNNModel:
    graph = helper.make_graph([], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", n_in])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_out])])
    enc = [make_encoding_node(graph, name, name.split(".")[0], e) for name, e in encodings.items()]
    graph.initializer.extend(numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items())
    graph.node.extend([*enc, *nodes])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = MAX_IR_VERSION
    model = BNNModel(proto, Manifest(source_library="synthetic", input_name="input", input_shape=[1, n_in],
                                     num_classes=n_out), "<g>")
    verify(model)
    return model


def _gauss(rng: np.random.Generator, shape: tuple[int, ...], zero=None) -> GaussianWeight:
    mu = rng.normal(0, 0.3, shape).astype(np.float32)
    sd = (0.1 * np.abs(mu) + 0.01).astype(np.float32)
    if zero is not None:
        mu[zero] = sd[zero] = 0
    return GaussianWeight(mu, sd)


def test_matmul_with_an_add_bias_and_a_dropout_mask_between() -> None:
    """x -> MatMul W1 [16, 32] -> Add b1 -> Mul(mask [32]) -> Relu -> MatMul W2 [32, 10]: W2's rows 3, 8 are zero, so
    W1's columns, b1's entries and the mask's units 3, 8 go (the mask is a DropoutMask: 0 · any draw is 0)."""
    from edgebnn.ir.encodings import MASK_SUFFIX, DropoutMask

    rng = np.random.default_rng(9)
    mask = "fc1" + MASK_SUFFIX
    model = _graph_model(
        [helper.make_node("MatMul", ["input", "W1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
         helper.make_node("Mul", ["hb", mask], ["hm"]), helper.make_node("Relu", ["hm"], ["r"]),
         helper.make_node("MatMul", ["r", "W2"], ["logits"])],
        {"W1": _gauss(rng, (16, 32)), mask: DropoutMask((32,), 0.2), "W2": _gauss(rng, (32, 10), zero=[3, 8])},
        {"b1": rng.normal(0, 0.1, 32)}, 16, 10)
    result = ShrinkPass()(model)
    assert _shapes(result.model) == {"W1": (16, 30), mask: (30,), "W2": (30, 10)}
    keep = np.setdiff1d(np.arange(32), [3, 8])
    assert numpy_helper.to_array(next(t for t in result.model.proto.graph.initializer if t.name == "b1")).shape == (30,)
    x = np.random.default_rng(10).normal(size=(7, 16)).astype(np.float32)
    _check_same_posterior(model, result.model, {"W1": [(1, keep)], mask: [(0, keep)], "W2": [(0, keep)]}, x)
