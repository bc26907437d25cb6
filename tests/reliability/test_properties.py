"""Property-based tests (hypothesis) of the IR loader/verifier and of every encoding's round trip.

Encodings: for random posteriors (seeded arrays of many scales and shapes, plus adversarial hand-drawn
values: zeros, ±0.0, ties, subnormals), ``decode(encode(x))`` stays within the quantisation step each
scheme states in its module docstring, and the encoding survives ``.ebnn`` serialization bit for bit.
Loader: corrupted bytes, hostile tensor headers and arbitrary manifests end in
:class:`InvalidArtifactError` or a model that verifies, never another exception.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import onnx
import pytest
from hostile import codebook_cnn, proto_of
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from scipy.special import ndtr
from synthetic import synthetic_cnn

from edgebnn import ir
from edgebnn.errors import InvalidArtifactError
from edgebnn.ir import DOMAIN, BNNModel, Encoding, GaussianWeight, Manifest, make_encoding_node
from edgebnn.ir.encodings import SigmaCode
from edgebnn.ir.encodings.packing import pack_int, pack_uint, packed_nbytes, unpack_int, unpack_uint
from edgebnn.passes import lower
from edgebnn.passes.binary import BinaryConfig, lower_binary
from edgebnn.passes.codebook import CodebookConfig, lower_codebook
from edgebnn.passes.fixed import lower_fixed
from edgebnn.passes.mcq import McqConfig, lower_mcq
from edgebnn.passes.ternary import TernaryConfig, lower_ternary


def cases(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


EPS32 = float(np.finfo(np.float32).eps)

# -- posteriors -----------------------------------------------------------------------------------------


@st.composite
def seeded_posterior(draw: st.DrawFn, max_n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(1, max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-6, 1e-3, 0.05, 1.0, 40.0]))
    kind = draw(st.sampled_from(["normal", "heavy", "some-zero", "all-zero", "constant", "two-values"]))
    if kind == "normal":
        mu = rng.normal(0, scale, n)
    elif kind == "heavy":
        mu = rng.standard_t(2, n) * scale
    elif kind == "some-zero":
        mu = rng.normal(0, scale, n) * (rng.random(n) < 0.5)
    elif kind == "all-zero":
        mu = np.zeros(n)
    elif kind == "constant":
        mu = np.full(n, scale * draw(st.sampled_from([-1.0, 1.0])))
    else:
        mu = rng.choice([-scale, 2 * scale], n)
    s_kind = draw(st.sampled_from(["ratio", "lognormal", "zero", "some-zero", "tiny", "wide"]))
    base = float(np.mean(np.abs(mu))) or scale
    if s_kind == "ratio":
        sigma = np.abs(mu) * rng.uniform(0.05, 1.0, n) + 1e-3 * base
    elif s_kind == "lognormal":
        sigma = base * 0.3 * np.exp(rng.normal(0, 1.5, n))
    elif s_kind == "zero":
        sigma = np.zeros(n)
    elif s_kind == "some-zero":
        sigma = base * 0.3 * rng.random(n) * (rng.random(n) < 0.5)
    elif s_kind == "tiny":
        sigma = np.full(n, base * 1e-6)
    else:
        sigma = base * 10 * rng.random(n)
    return mu.astype(np.float32), sigma.astype(np.float32)


finite32 = st.floats(-1e4, 1e4, width=32, allow_subnormal=True)
hand_posterior = st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.lists(finite32, min_size=n, max_size=n),
    st.lists(st.floats(0, 1e3, width=32, allow_subnormal=True), min_size=n, max_size=n),
)).map(lambda t: (np.array(t[0], np.float32), np.array(t[1], np.float32)))

posterior = st.one_of(seeded_posterior(), hand_posterior)


def slop(mu: np.ndarray, step: float) -> np.ndarray:
    """Float32 round-off of ``q·step`` against ``μ``: a few ulps of either."""
    return 4 * EPS32 * (np.abs(mu) + step)


# -- bit packing: exact ---------------------------------------------------------------------------------


@cases(800)
@given(bits=st.integers(1, 16), data=st.data())
def test_pack_uint_round_trip(bits, data):
    values = np.array(data.draw(st.lists(st.integers(0, (1 << bits) - 1), max_size=200)), np.int64)
    packed = pack_uint(values, bits)
    assert packed.dtype == np.uint8 and packed.size == packed_nbytes(values.size, bits)
    np.testing.assert_array_equal(unpack_uint(packed, bits, values.size), values)
    if bits <= 8 and values.size * bits % 8:
        assert packed[-1] >> (values.size * bits % 8) == 0  # padding bits are zero


@cases(800)
@given(bits=st.integers(2, 16), data=st.data())
def test_pack_int_round_trip(bits, data):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    values = np.array(data.draw(st.lists(st.integers(lo, hi), max_size=200)), np.int64)
    np.testing.assert_array_equal(unpack_int(pack_int(values, bits), bits, values.size), values)


# -- each encoding within its stated step -----------------------------------------------------------------


@cases(600)
@given(values=st.one_of(seeded_posterior().map(lambda p: p[1]), hand_posterior.map(lambda p: p[1])),
       bits=st.integers(0, 8), power=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_sigma_code_levels_stay_within_their_bin(values, bits, power, seed):
    code = SigmaCode.fit(values, bits, np.random.default_rng(seed), power=power)
    decoded = code.decode()
    assert decoded.shape == values.shape and code.levels.size <= max(1, 1 << bits)
    assert np.all(np.isfinite(code.levels)) and np.all(code.levels >= 0)
    if bits == 0 or not np.any(values > 0):
        mean = np.mean(values.astype(np.float64) ** power) ** (1 / power)
        np.testing.assert_allclose(decoded, mean, rtol=1e-5, atol=1e-30)
        return
    np.testing.assert_array_equal(decoded[values == 0], 0)  # exact zeros keep a zero level
    codes = unpack_uint(code.codes, code.bits, values.size) if code.bits else np.zeros(values.size, int)
    for level in np.unique(codes):
        members = values[codes == level].astype(np.float64)
        lo, hi = members.min(), members.max()
        got = float(code.levels[level])
        assert lo * (1 - 1e-5) <= got <= hi * (1 + 1e-5), (lo, got, hi)  # a power mean of its members


@cases(500)
# a subnormal step (3.66e-43 for 1.2e-38 at 16 bits) was stored with fewer bits than the codes: 43 steps off
@example(post=(np.array([1.2e-38, -4e-39], np.float32), np.zeros(2, np.float32)), bits=16, clip=False, seed=0)
@given(post=posterior, bits=st.sampled_from([None, 2, 3, 4, 8, 16]), clip=st.booleans(),
       seed=st.integers(0, 2**16))
def test_fixed_point_decodes_to_the_nearest_grid_value(post, bits, clip, seed):
    mu, sigma = post
    enc = lower_fixed(mu, sigma, mu.shape, np.random.default_rng(seed), bits=bits, noise_fraction=0.25,
                      sigma_bits=2, clip=clip).encoding
    step, limit = enc.scale, (1 << (enc.bits - 1)) - 1
    assert step > 0 and 2 <= enc.bits <= 16 and (bits is None or enc.bits == bits)
    err = np.abs(enc.mean().astype(np.float64) - mu)
    bound = np.maximum(step / 2, np.abs(mu) - limit * step)  # rounding, or clipping at ±L·Δ
    assert np.all(err <= bound * (1 + 1e-5) + slop(mu, step)), float(np.max(err - bound))
    if not clip and np.any(mu):
        assert np.all(err <= step / 2 * (1 + 1e-5) + slop(mu, step))  # the full-range grid never clips


@cases(500)
@example(post=(np.array([5017.0], np.float32), np.array([0.125], np.float32)), bits=None, seed=0)  # clipped
@example(post=(np.array([1.0], np.float32), np.array([1e-19], np.float32)), bits=None, seed=0)  # OverflowError
# found by the whole reliability lane: the scale ||mu||_1 / N = 3.70e-43 was subnormal, decoded 61 steps off
@example(post=(np.array([1.2099157e-38], np.float32), np.zeros(1, np.float32)), bits=None, seed=0)
@example(post=(np.array([5e-39, -1e-40], np.float32), np.zeros(2, np.float32)), bits=16, seed=0)  # all subnormal
@given(post=posterior, bits=st.sampled_from([None, 2, 4, 8, 16]), seed=st.integers(0, 2**16))
def test_mcq_counts_are_within_one_step(post, bits, seed):
    mu, sigma = post
    enc = lower_mcq(mu, sigma, mu.shape, np.random.default_rng(seed), McqConfig(bits=bits)).encoding
    s = enc.scale
    assert s > 0 and 2 <= enc.bits <= 16
    err = np.abs(enc.mean().astype(np.float64) - mu)
    assert np.all(err <= s * (1 + 1e-4) + slop(mu, s)), float(np.max(err / s))  # floor or ceil of N·p_i
    assert np.all((enc.q == 0) | (np.sign(enc.q) == np.sign(mu)))


@cases(500)
@given(post=posterior, prune=st.sampled_from([-2.0, 0.0, 2.0, 6.0]), seed=st.integers(0, 2**16))
def test_ternary_takes_the_nearest_level(post, prune, seed):
    mu, sigma = post
    enc = lower_ternary(mu, sigma, mu.shape, np.random.default_rng(seed), TernaryConfig(prune_log_alpha=prune)).encoding
    a = enc.scale
    pruned = np.square(sigma) >= np.float32(np.exp(prune)) * np.square(mu)
    assert set(np.unique(enc.q)) <= {-1, 0, 1}
    np.testing.assert_array_equal(enc.mean()[pruned], 0)
    np.testing.assert_array_equal(enc.stddev()[pruned], 0)  # pruned weights are deterministic zeros
    kept = ~pruned
    want = np.where(np.abs(mu) > np.float32(a / 2), np.sign(mu), 0)
    np.testing.assert_array_equal(enc.q[kept], want[kept])


@cases(400)
@given(post=posterior, flip_bits=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_binary_keeps_signs_and_flip_probabilities(post, flip_bits, seed):
    mu, sigma = post
    enc = lower_binary(mu, sigma, mu.shape, np.random.default_rng(seed), BinaryConfig(flip_bits=flip_bits)).encoding
    np.testing.assert_array_equal(enc.positive, mu >= 0)
    flips = enc.flip_probability()
    assert np.all((flips >= 0) & (flips <= 0.5)) and enc.scale > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(mu.astype(np.float64)) / sigma
    true = ndtr(-np.nan_to_num(z, nan=0.0))
    if flip_bits == 0:  # one level: the mean flip probability
        np.testing.assert_allclose(flips, true.mean(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(enc.mean(), enc._signed_scale() * (1 - 2 * flips), rtol=1e-6)


@cases(150)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(16, 400), k=st.sampled_from([None, 2, 3, 5]))
def test_codebook_outliers_exact_and_means_in_the_hull(seed, n, k):
    rng = np.random.default_rng(seed)
    mu = (rng.standard_t(3, n) * 0.05).astype(np.float32)
    sigma = (np.abs(rng.normal(0.02, 0.01, n)) + 1e-4).astype(np.float32)
    out = lower_codebook("w", mu, sigma, (n,), rng, CodebookConfig(clusters=k, min_cluster_size=2, steps=5))
    assume(not isinstance(out, str))
    enc = out.encoding
    np.testing.assert_array_equal(enc.mean().reshape(-1)[enc.outlier_index], mu[enc.outlier_index])
    np.testing.assert_array_equal(enc.stddev().reshape(-1)[enc.outlier_index], sigma[enc.outlier_index])
    inlier = np.ones(n, bool)
    inlier[enc.outlier_index] = False
    means = enc.mean().reshape(-1)
    entries = enc.codebook[:, 0]
    assert np.all(means[inlier] >= entries.min() - 1e-7) and np.all(means[inlier] <= entries.max() + 1e-7)
    plain = inlier.copy()
    plain[enc.blend_index] = False
    np.testing.assert_array_equal(means[plain], entries[enc.indices[plain]])
    assert entries.min() >= mu.min() - 1e-6 and entries.max() <= mu.max() + 1e-6  # entry = mean of members


# -- every encoding survives the .ebnn bit for bit --------------------------------------------------------


def linear_ir(enc: Encoding, n_in: int) -> BNNModel:
    """input [batch, n_in] -> Gemm(encoded W [n_out, n_in], transB=1) -> logits [batch, n_out]."""
    n_out = enc.shape[0]
    graph = helper.make_graph(
        [], "one_layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_out])],
    )
    graph.node.append(make_encoding_node(graph, "W", "fc", enc))
    graph.node.append(helper.make_node("Gemm", ["x", "W"], ["logits"], transB=1))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    return BNNModel(proto, Manifest("synthetic", "x", [1, n_in], n_out), "one_layer")


def encode(scheme: str, mu: np.ndarray, sigma: np.ndarray, rng: np.random.Generator) -> Encoding | None:
    shape = mu.shape
    mu, sigma = mu.reshape(-1), sigma.reshape(-1)
    if scheme == "gaussian":
        return GaussianWeight(mu.reshape(shape), sigma.reshape(shape))
    if scheme == "fixed":
        return lower_fixed(mu, sigma, shape, rng, bits=None, noise_fraction=0.25, sigma_bits=2).encoding
    if scheme == "mcq":
        return lower_mcq(mu, sigma, shape, rng, McqConfig()).encoding
    if scheme == "ternary":
        return lower_ternary(mu, sigma, shape, rng, TernaryConfig()).encoding
    if scheme == "binary":
        return lower_binary(mu, sigma, shape, rng, BinaryConfig()).encoding
    out = lower_codebook("W", mu, sigma, shape, rng, CodebookConfig(min_cluster_size=2, steps=5))
    return None if isinstance(out, str) else out.encoding


@cases(120)
@given(scheme=st.sampled_from(["gaussian", "fixed", "mcq", "ternary", "binary", "codebook"]),
       n_out=st.integers(1, 6), n_in=st.integers(1, 40), post_seed=st.integers(0, 2**32 - 1))
def test_encoding_round_trips_through_ebnn_bit_for_bit(scheme, n_out, n_in, post_seed):
    rng = np.random.default_rng(post_seed)
    mu = (rng.standard_t(3, (n_out, n_in)) * 0.1).astype(np.float32)
    sigma = (np.abs(mu) * rng.uniform(0.05, 1, mu.shape) + 1e-3).astype(np.float32)
    enc = encode(scheme, mu, sigma, rng)
    assume(enc is not None)
    model = linear_ir(enc, n_in)
    ir.verify(model)
    data = ir.to_bytes(model)
    loaded = ir.from_bytes(data, "round_trip")
    assert ir.to_bytes(loaded) == data
    back = loaded.encoded_weights()[0].encoding
    assert type(back) is type(enc) and back.shape == enc.shape and back.attributes() == enc.attributes()
    for (name, a), (name_b, b) in zip(enc.fields().items(), back.fields().items(), strict=True):
        assert name == name_b and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(back.mean(), enc.mean())
    np.testing.assert_array_equal(back.stddev(), enc.stddev())
    draws = [e.sample(np.random.default_rng(1), 2) for e in (enc, back)]
    np.testing.assert_array_equal(*draws)


# -- the loader and verifier: InvalidArtifactError or a valid model, nothing else -------------------------

BASES = {
    "gaussian": ir.to_bytes(synthetic_cnn()),
    "fixed": ir.to_bytes(lower(synthetic_cnn(), "fixed").model),
    "binary": ir.to_bytes(lower(synthetic_cnn(), "binary").model),
    "codebook": ir.to_bytes(codebook_cnn()),
}


def load_or_refuse(data: bytes) -> BNNModel | None:
    try:
        model = ir.from_bytes(data, "fuzzed.ebnn")
    except InvalidArtifactError as e:
        assert str(e).startswith("fuzzed.ebnn: ") and "\n" not in str(e), str(e)
        return None
    ir.verify(model)  # what loaded must verify again and write back
    ir.to_bytes(model)
    return model


@cases(500)
@given(base=st.sampled_from(sorted(BASES)), data=st.data())
def test_loader_survives_corrupted_bytes(base, data):
    raw = bytearray(BASES[base])
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), max_size=6))
    for pos, value in edits:
        raw[pos] = value
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    load_or_refuse(bytes(raw[:cut]))


TENSOR_TYPES = [t for t in range(1, 27) if t not in (TensorProto.STRING,)]


@cases(500)
@given(name=st.sampled_from(["conv.weight.mu", "fc.weight.sigma", "bn.scale", "fc.bias", "conv.bias.mu"]),
       dims=st.lists(st.one_of(st.integers(-2, 64), st.sampled_from([1 << 20, 1 << 31, 1 << 40, (1 << 62) + 27])),
                     max_size=4),
       dtype=st.one_of(st.none(), st.sampled_from(TENSOR_TYPES), st.integers(27, 40)),
       raw=st.one_of(st.none(), st.binary(max_size=600)))
def test_loader_survives_hostile_tensor_headers(name, dims, dtype, raw):
    proto = proto_of(synthetic_cnn())
    t = next(t for t in proto.graph.initializer if t.name == name)
    del t.dims[:]
    t.dims.extend(dims)
    if dtype is not None:
        t.data_type = dtype
    if raw is not None:
        t.raw_data = raw
    load_or_refuse(proto.SerializeToString())


attribute_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.floats(width=32), st.binary(max_size=6), st.text(max_size=6),
    st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=4),
    st.lists(st.floats(width=32), min_size=1, max_size=3),
    st.lists(st.binary(max_size=4), min_size=1, max_size=3),
)


@cases(500)
@given(base=st.sampled_from(sorted(BASES)), weight=st.sampled_from(["conv.weight", "fc.weight", "conv.bias"]),
       name=st.sampled_from(["shape", "bits", "scale", "level", "layer", "samples_per_weight", "extra"]),
       value=attribute_values)
def test_loader_survives_hostile_attributes(base, weight, name, value):
    proto = onnx.ModelProto()
    proto.ParseFromString(BASES[base])
    node = next(n for n in proto.graph.node if n.domain == DOMAIN and n.output[0] == weight)
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])
    load_or_refuse(proto.SerializeToString())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
FIELDS = ("source_library", "input_name", "input_shape", "num_classes", "scheme", "passes", "format_version",
          "edgebnn_version")


@cases(800)
@given(replace=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=3),
       drop=st.sets(st.sampled_from(FIELDS), max_size=2), extra=st.dictionaries(st.text(max_size=6), json_values,
                                                                                  max_size=1))
def test_manifest_parser_accepts_only_well_typed_manifests(replace, drop, extra):
    good = json.loads(Manifest("synthetic", "x", [1, 4], 3).to_json())
    raw = {k: v for k, v in {**good, **replace, **extra}.items() if k not in drop}
    try:
        text = json.dumps(raw)
    except ValueError:
        return
    try:
        man = Manifest.from_json(text, "m.ebnn")
    except InvalidArtifactError as e:
        assert str(e).startswith("m.ebnn: ")
        return
    assert isinstance(man.num_classes, int) and not isinstance(man.num_classes, bool) and man.num_classes >= 1
    assert all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in man.input_shape)
    assert all(isinstance(getattr(man, f), str) for f in ("source_library", "input_name", "scheme", "edgebnn_version"))
    assert isinstance(man.passes, list) and all(isinstance(p, dict) for p in man.passes)
    assert 1 <= man.format_version <= ir.FORMAT_VERSION


@cases(400)
@given(which=st.sampled_from(["mu", "sigma"]), layer=st.sampled_from(["conv.weight", "fc.weight", "conv.bias"]),
       poison=st.sampled_from([None, math.nan, math.inf, -math.inf, -1e-30, -1.0, 0.0]),
       reshape=st.booleans(), data=st.data())
def test_verifier_accepts_exactly_the_valid_gaussians(which, layer, poison, reshape, data):
    model = synthetic_cnn()
    t = next(t for t in model.proto.graph.initializer if t.name == f"{layer}.{which}")
    arr = onnx.numpy_helper.to_array(t).copy()
    index = data.draw(st.integers(0, arr.size - 1))
    if poison is not None:
        arr.reshape(-1)[index] = poison
    if reshape:
        arr = arr.reshape(-1)
    t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    invalid = (reshape and layer != "conv.bias") or (poison is not None and (  # a 1-D bias stays 1-D
        not math.isfinite(poison) or (which == "sigma" and poison < 0)))
    if invalid:
        with pytest.raises(InvalidArtifactError, match=r"layer '(conv|fc)'"):
            ir.verify(model)
    else:
        ir.verify(model)


def test_mcq_and_fixed_scales_stay_normal_float32():
    """A mean just above float32's smallest normal (1.18e-38): the scale of either pass is a normal float32, never the
    subnormal 3.7e-43 that 16 bits would ask for (stored with fewer bits than the counts: 61 steps off), and every
    weight decodes within one MCQ step / half a fixed-point step."""
    tiny = float(np.finfo(np.float32).tiny)
    mu, sigma = np.array([1.2099157e-38, -3e-39], np.float32), np.zeros(2, np.float32)
    for bits in (None, 16):
        mcq = lower_mcq(mu, sigma, mu.shape, np.random.default_rng(0), McqConfig(bits=bits))
        fixed = lower_fixed(mu, sigma, mu.shape, np.random.default_rng(0), bits=bits, noise_fraction=0.1,
                            sigma_bits=2, clip=False).encoding
        assert mcq.encoding.scale >= tiny and fixed.scale >= tiny
        assert "smallest normal" in mcq.note
        err = np.abs(mcq.encoding.mean().astype(np.float64) - mu)
        assert np.all(err <= mcq.encoding.scale), err / mcq.encoding.scale
        assert np.all(np.abs(fixed.mean().astype(np.float64) - mu) <= fixed.scale / 2)


def test_mcq_denormal_means_are_stored_as_zeros():
    """Found by hypothesis in CI: mu = 1e-45 made the scale ||mu||_1 / N underflow to 0."""
    out = lower_mcq(np.array([1e-45], np.float32), np.zeros(1, np.float32), (1,), np.random.default_rng(0),
                    McqConfig())
    assert out.encoding.scale > 0 and not out.encoding.mean().any()
    assert "below float32 resolution" in out.note


def test_the_cases_do_not_depend_on_the_modules_imported(tmp_path, monkeypatch):
    """The same property test draws the same cases before and after a module full of literals is imported
    (tests/conftest.py keeps Hypothesis from mining them), so a file alone and the whole lane test the same cases."""
    drawn: list[tuple[int, float]] = []

    @settings(max_examples=300, database=None, derandomize=True)
    @given(st.integers(0, 2**32 - 1), finite32)
    def draw(i, x):
        drawn.append((i, x))

    draw()
    first, drawn[:] = list(drawn), []
    (tmp_path / "eb_many_literals.py").write_text(
        "".join(f"C{k} = {v!r}\n" for k, v in enumerate([123456789, 987654321, 4242, 31337, 2.5e-3, 1234.5,
                                                          -777.25, 6.02e23, 3.3e-39])))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import eb_many_literals  # noqa: F401
        draw()
    finally:
        sys.modules.pop("eb_many_literals", None)
    assert drawn == first
