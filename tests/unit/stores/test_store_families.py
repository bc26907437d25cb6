"""Stores of the lowered posterior families (``MemberSetFixedWeight``, ``LowRankFixedWeight``, ``KronFixedWeight``,
``DenseFixedWeight``): every coded tensor a draw reads (the mean, SWAG's σ and deviations, the Kronecker eigenvectors
and eigenvalue scale, a dense factor, the baked members) decodes in the graph to exactly the encoding's numpy
values, in a fraction of the fp32 bytes, and ``deployed_bytes`` counts the codes as codes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgebnn.exporters._graph import Builder, ExportFormat
from edgebnn.exporters.sizes import deployed_bytes
from edgebnn.exporters.stores import finish_stores, own_store, store_for
from edgebnn.exporters.stores.factors import FactorStore, factor
from edgebnn.families.ensemble import MemberSetFixedStore
from edgebnn.ir.encodings import (
    DenseFixedWeight,
    Encoding,
    KronFixedWeight,
    LowRankFixedWeight,
    MemberSetFixedWeight,
    RowCode,
    SigmaCode,
)

RNG = np.random.default_rng(0)
OUT, REST, K = 16, 24, 5


def _q(shape: tuple[int, ...], bits: int) -> np.ndarray:
    top = (1 << (bits - 1)) - 1
    return RNG.integers(-top, top + 1, shape).astype(np.int16)


def _orthonormal(n: int) -> np.ndarray:
    return np.linalg.qr(RNG.standard_normal((n, n)))[0].astype(np.float32)


def lowrank(out: int = OUT, rest: int = REST) -> LowRankFixedWeight:
    sigma = SigmaCode.fit(RNG.uniform(0.01, 0.2, out * rest), 4, RNG)
    return LowRankFixedWeight(_q((out, rest), 5), 0.013, 5, sigma,
                              RowCode.fit(0.1 * RNG.standard_normal((K * out, rest))), 0.5)


def kron(out: int = OUT, rest: int = REST) -> KronFixedWeight:
    d = (RNG.uniform(0.5, 50, (out, 1)) * RNG.uniform(0.5, 50, (1, rest)) + 1.0) ** -0.5
    return KronFixedWeight(_q((out, rest), 6), 0.02, 6, RowCode.fit(_orthonormal(out).T),
                           RowCode.fit(_orthonormal(rest).T), SigmaCode.fit(d, 6, RNG))


def dense(out: int = OUT, rest: int = REST) -> DenseFixedWeight:
    return DenseFixedWeight(_q((out,), 4), 0.05, 4, RowCode.fit(0.1 * RNG.standard_normal((out, out))))


FIELDS = {  # the factors each draw reads (exporters.draws), and their numpy values
    "LowRankFixedWeight": lambda e: {"sigma": e.sigma, "deviations": e.deviations},
    "KronFixedWeight": lambda e: {"q_out": e.q_out, "q_in_t": e.q_in.T, "scale": e.scale},
    "DenseFixedWeight": lambda e: {"scale_t": e.scale.T},
}


def _model(b: Builder, outs: list[str], shapes: list[tuple[int, ...]]) -> onnx.ModelProto:
    finish_stores(b)
    graph = helper.make_graph(b.nodes, "decode", [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(s))
                                                     for o, s in zip(outs, shapes, strict=True)], b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _run(b: Builder, outs: list[str], shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The decode graph of ``b`` (no inputs) run by onnxruntime with its optimizations off (the decode ops run)."""
    model = _model(b, outs, shapes)
    onnx.checker.check_model(model, full_check=True)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {})


def _factor_graph(enc: Encoding, choice: str) -> tuple[Builder, list[str], list[np.ndarray]]:
    b = Builder(fmt=ExportFormat(weights=choice))
    values = FIELDS[enc.op_type](enc)
    outs = [own_store(enc.op_type).mean(b, enc, "w/mean") if choice == "ir" else b.f32("w/mean", enc.mean())]
    outs += [factor(b, enc, field, f"w/{field}", np.ascontiguousarray(v)) for field, v in values.items()]
    return b, outs, [enc.mean(), *values.values()]


@pytest.mark.parametrize("make", [lowrank, kron, dense])
def test_family_codes_decode_exactly(make):
    enc = make()
    store = store_for(enc)
    assert isinstance(store, FactorStore) and store is own_store(enc.op_type)
    b, outs, want = _factor_graph(enc, "ir")
    for got, ref in zip(_run(b, outs, [w.shape for w in want]), want, strict=True):
        np.testing.assert_array_equal(got, ref)  # float32(q) · scale, levels[codes]: the numpy decode's operations
    assert set(b.stored.values()) == {enc.op_type}


@pytest.mark.parametrize("make, dims", [(lowrank, (64, 128)), (kron, (64, 128)), (dense, (192,))])
def test_family_codes_are_smaller_than_the_floats(make, dims):
    """The mean at B <= 6 bits, the factors at 8 bits or a log code: at most 35% of the fp32 constants' bytes on a
    64 x 128 layer (the decode graph included: its nodes and names are about 2 KB, fixed, next to tens of KB of
    codes; a dense factor [192, 192] of 36 KB codes against 147 KB fp32)."""
    enc = make(*dims)
    sizes = {}
    for choice in ("ir", "fp32"):
        b, outs, want = _factor_graph(enc, choice)
        sizes[choice] = _model(b, outs, [w.shape for w in want]).ByteSize()
    assert sizes["ir"] < 0.35 * sizes["fp32"], sizes
    assert own_store(enc.op_type).nbytes(enc) < enc.nbytes + 8  # the store writes the IR's own codes
    # the codes are codes to deployed_bytes (they feed the decode ops, not a layer)
    b, outs, want = _factor_graph(enc, "ir")
    split = deployed_bytes(_model(b, outs, [w.shape for w in want]))
    assert split.codes > split.float_weights


def test_fp32_writes_the_factors_as_floats_and_int8_codes_them():
    """--weights fp32: every factor an fp32 constant; int8 / int4: the factors' codes fitted at export (RowCode
    eigenvectors, a SigmaCode of D), decoded exactly to those codes' values, on a float posterior too."""
    from edgebnn.ir.encodings import KronGaussianWeight

    fixed = kron()
    enc = KronGaussianWeight(fixed.mean(), fixed.q_out, fixed.q_in, fixed.scale)
    b = Builder(fmt=ExportFormat(weights="fp32"))
    out = factor(b, enc, "q_in_t", "w/q_in_t", np.ascontiguousarray(enc.q_in.T))
    np.testing.assert_array_equal(_run(b, [out], [enc.q_in.T.shape])[0], enc.q_in.T)
    assert b.stored == {"w/q_in_t": "float"}
    for choice in ("int8", "int4"):
        b = Builder(fmt=ExportFormat(weights=choice))
        outs = [factor(b, enc, "q_in_t", "w/q_in_t", np.ascontiguousarray(enc.q_in.T)),
                factor(b, enc, "scale", "w/scale", enc.scale)]
        got = _run(b, outs, [enc.q_in.shape, enc.scale.shape])
        np.testing.assert_array_equal(got[0], RowCode.fit(enc.q_in.T).decode())
        d_bits = max(int(choice[3:]), 6)  # a Kronecker D takes at least 6 bits (edgebnn.families.laplace)
        np.testing.assert_array_equal(got[1].reshape(-1), SigmaCode.fit(enc.scale, d_bits,
                                                                        np.random.default_rng(0)).decode())
        assert set(b.stored.values()) == {choice}


def test_member_codes_decode_to_the_members():
    enc = MemberSetFixedWeight(_q((3, OUT, REST), 5), 0.03, 5)
    store = store_for(enc)
    assert isinstance(store, MemberSetFixedStore)
    value = np.ascontiguousarray(enc.values().transpose(0, 2, 1))  # a layer kind's layout: [S, in, out]
    b = Builder()
    out = store.members(b, enc, "W", value, enc.sample_grid())
    assert out is not None and b.stored == {"W": "MemberSetFixedWeight"}
    np.testing.assert_array_equal(_run(b, [out], [value.shape])[0], value)
    off_grid = value + np.float32(1e-3)
    assert store.members(Builder(), enc, "W", off_grid, enc.sample_grid()) is None  # the builder's fp32
    assert store.nbytes(enc) < 3 * OUT * REST  # 5 bits a member weight, not 32


@pytest.mark.parametrize("make", [lowrank, kron, dense])
def test_lowered_family_fields_round_trip_and_hostile_ones_are_refused(make):
    from edgebnn.errors import InvalidArtifactError

    enc = make()
    cls = type(enc)
    again = cls.from_fields(enc.fields(), enc.attributes(), enc.shape, "w")
    np.testing.assert_array_equal(again.mean(), enc.mean())
    np.testing.assert_array_equal(again.stddev(), enc.stddev())
    codes = next(name for name, a in enc.fields().items() if a.dtype == np.int8)
    bad = {**enc.fields(), codes: np.full_like(enc.fields()[codes], -128)}  # outside the symmetric ±127
    with pytest.raises(InvalidArtifactError, match="-128"):
        cls.from_fields(bad, enc.attributes(), enc.shape, "w")
    short = {**enc.fields(), "q": enc.fields()["q"][:-1]}
    with pytest.raises(InvalidArtifactError, match="packed uint8 bytes"):
        cls.from_fields(short, enc.attributes(), enc.shape, "w")
    with pytest.raises(InvalidArtifactError, match="'step'"):
        cls.from_fields(enc.fields(), {**enc.attributes(), "step": -1.0}, enc.shape, "w")
