"""The posterior-family encodings (deep-ensemble member sets, SWAG's low-rank Gaussian) and their joint draws,
on hand-built IRs (no torch): moments, draws, decoding of hostile fields, the baked export and the reference
runtime drawing the same members."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.ir import BNNModel, from_bytes, gaussian_mlp, to_bytes, verify
from edgebnn.ir.encodings import (
    LowRankGaussianWeight,
    MemberSetFixedWeight,
    MemberSetWeight,
    draw_weight,
)
from edgebnn.passes import lower
from edgebnn.runtime.reference import sample_logits

ROUNDOFF = 1e-5  # float32 in another op order


def _replace_all(model: BNNModel, make) -> BNNModel:
    """``model`` with every GaussianWeight replaced by ``make(index, weight)``."""
    out = model.copy()
    for i, w in enumerate(out.encoded_weights()):
        out.replace_encoding(w, make(i, w))
    verify(out)
    return out


def _mlp() -> BNNModel:
    """x [B, 6] -> Gemm(W1 [5, 6], b1) -> Relu -> Gemm(W2 [4, 5], b2): four encoded weights."""
    rng = np.random.default_rng(0)
    layers = [(rng.standard_normal((o, i)).astype(np.float32), np.full((o, i), 0.1, np.float32),
               rng.standard_normal(o).astype(np.float32), np.full(o, 0.1, np.float32)) for i, o in ((6, 5), (5, 4))]
    return gaussian_mlp(layers)


def _members_ir(m: int = 3) -> BNNModel:
    rng = np.random.default_rng(0)
    return _replace_all(_mlp(),
                        lambda i, w: MemberSetWeight(rng.standard_normal((m, *w.encoding.shape)).astype(np.float32)))


def _lowrank_ir(k: int = 4) -> BNNModel:
    rng = np.random.default_rng(1)

    def make(i, w):
        shape = w.encoding.shape
        n = int(np.prod(shape))
        return LowRankGaussianWeight(rng.standard_normal(shape).astype(np.float32),
                                     rng.uniform(0.05, 0.2, shape).astype(np.float32),
                                     (0.3 * rng.standard_normal((k, n))).astype(np.float32), 0.5)

    return _replace_all(_mlp(), make)


def test_member_set_moments_draws_and_round_trip():
    ir = _members_ir()
    again = from_bytes(to_bytes(ir), "again")
    for w, v in zip(ir.encoded_weights(), again.encoded_weights(), strict=True):
        enc = w.encoding
        assert isinstance(enc, MemberSetWeight)
        np.testing.assert_array_equal(enc.members, v.encoding.members)
        np.testing.assert_allclose(enc.mean(), enc.members.mean(0), atol=1e-6)
        np.testing.assert_allclose(enc.stddev() ** 2, enc.members.var(0), atol=1e-5)
        # sample s is member s mod M, whatever the stream
        np.testing.assert_array_equal(draw_weight(enc, 7, 0, 5), enc.members[[0, 1, 2, 0, 1]])


def test_baked_members_are_joint_and_equal_the_reference():
    """S = M: one member per sample in every layer, the same in the baked graph and the reference runtime."""
    ir = _members_ir()
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    logits = sample_logits(ir, x, 3)
    ws = [w.encoding.members for w in ir.encoded_weights()]  # W1, b1, W2, b2
    for k in range(3):  # member k of layer 1 with member k of layer 2
        h = np.maximum(x @ ws[0][k].T + ws[1][k], 0)
        np.testing.assert_allclose(logits[k], h @ ws[2][k].T + ws[3][k], atol=ROUNDOFF)
    sess_probs = _run(export_model(ir, ExportConfig(3, mode="baked")).proto, x)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(sess_probs, (p / p.sum(-1, keepdims=True)).mean(0), atol=ROUNDOFF)
    with pytest.raises(InvalidOptionError, match="--samples 3"):
        sample_logits(ir, x, 4)


def test_fixed_member_set_is_on_one_grid_and_exports_int8_exactly():
    ir = _members_ir()
    low = lower(ir, "fixed", bits=6).model
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    for w in low.encoded_weights():
        enc = w.encoding
        assert isinstance(enc, MemberSetFixedWeight) and enc.bits == 6 and np.abs(enc.q).max() <= 31
    again = from_bytes(to_bytes(low), "again")
    np.testing.assert_array_equal(sample_logits(again, x, 3), sample_logits(low, x, 3))
    ref = _run(export_model(low, ExportConfig(3, mode="baked")).proto, x)
    np.testing.assert_allclose(_run(export_model(low, ExportConfig(3, mode="baked", weights="int8", form="qdq")).proto,
                                    x), ref, atol=ROUNDOFF)


def test_lowrank_moments_and_joint_z2():
    ir = _lowrank_ir()
    encs = [w.encoding for w in ir.encoded_weights()]
    enc = encs[0]
    assert isinstance(enc, LowRankGaussianWeight)
    draws = enc.sample(np.random.default_rng(0), 20000)
    # Monte Carlo: the sample variance of 20000 draws is within ~4 standard errors (sqrt(2/n) relative) of it
    np.testing.assert_allclose(draws.var(0), enc.stddev() ** 2, rtol=4 * np.sqrt(2 / 20000))
    np.testing.assert_allclose(draws.mean(0), enc.mean(), atol=4 * float(enc.stddev().max()) / np.sqrt(20000))
    # joint: every layer reads the same z2 per sample (the group's draw for the seed)
    z2 = encs[0].joint_group().draw(3, 5)
    for i, e in enumerate(encs):
        z1 = np.random.default_rng([3, i]).standard_normal((5, *e.shape), dtype=np.float32)
        np.testing.assert_allclose(draw_weight(e, 3, i, 5), e._draw(z1, z2), atol=1e-6)


def test_lowrank_baked_equals_reference():
    ir = _lowrank_ir()
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    logits = sample_logits(ir, x, 8, seed=5)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(_run(export_model(ir, ExportConfig(8, mode="baked", seed=5)).proto, x),
                               (p / p.sum(-1, keepdims=True)).mean(0),
                               atol=ROUNDOFF)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("members", np.zeros((2, 5, 6), np.float32), "members must be float32"),
    ("members", np.full((3, 5, 6), np.nan, np.float32), "NaN"),
    ("members", np.zeros((3, 5, 6), np.float64), "members must be float32"),
])
def test_hostile_member_set_fields(field, value, message):
    _check_hostile(_members_ir(), field, value, message)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("deviations", np.zeros((1, 30), np.float32), "deviations must be"),
    ("deviations", np.zeros((4, 29), np.float32), "deviations must be"),
    ("sigma", -np.ones((5, 6), np.float32), "negative"),
])
def test_hostile_lowrank_fields(field, value, message):
    _check_hostile(_lowrank_ir(), field, value, message)


def _check_hostile(ir: BNNModel, field: str, value: np.ndarray, message: str) -> None:
    proto = onnx.ModelProto()
    proto.CopyFrom(ir.proto)
    name = f"W1.{field}"
    t = next(t for t in proto.graph.initializer if t.name == name)
    t.CopyFrom(onnx.numpy_helper.from_array(value, name))
    with pytest.raises(InvalidArtifactError, match=message):
        verify(BNNModel(proto, ir.manifest, "hostile.ebnn"))


def _run(proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["probs"], {sess.get_inputs()[0].name: x})[0]


def test_member_count_attribute_is_checked():
    ir = _members_ir()
    proto = onnx.ModelProto()
    proto.CopyFrom(ir.proto)
    node = next(n for n in proto.graph.node if n.op_type == "MemberSetWeight")
    for a in node.attribute:
        if a.name == "members":
            a.CopyFrom(helper.make_attribute("members", 0))
    with pytest.raises(InvalidArtifactError, match="'members'"):
        verify(BNNModel(proto, ir.manifest, "hostile.ebnn"))


def test_budget_search_moves_a_family_only_among_its_registered_schemes():
    """--budget on a family: its layers start at their fixed lowering and move among fixed widths and float (their
    registered lowerings; no codebook, prune or σ-code move), a deep ensemble judged at S = M. The data are the float
    model's own predictions, so the float BNN keeps any budget."""
    from edgebnn.api import lower_within_budget
    from edgebnn.passes import LowerConfig
    from edgebnn.runtime.reference import Reference

    x = np.random.default_rng(5).standard_normal((64, 6)).astype(np.float32)
    for ir, samples, kind in ((_members_ir(), 3, "MemberSetFixedWeight"), (_lowrank_ir(), 16, "LowRankFixedWeight")):
        y = Reference(ir).predict(x, 3, 0).probs.argmax(1)
        low = lower_within_budget(ir, LowerConfig(scheme="float"), "nll=+0.5", data=(x, y))
        budget = low.lowering_report["budget"]
        assert budget["met"] and budget["measured_on"]["samples"] == samples
        assert budget["start"]["scheme"] == "fixed" and not budget["start"]["overrides"]
        assert {row["scheme"] for row in budget["layers"]} <= {"fixed", "float"}, budget["layers"]
        assert all(s["change"].endswith(" bits") or s["change"] == "float" for s in budget["steps"]), budget["steps"]
        assert not any("σ" in row["reason"] for row in budget["layers"])  # a family codes its covariance itself
        assert all(t["candidate"].startswith("fixed") for t in budget["certification"]["tested"])
        assert {r["kind"] for r in low.lowering_report["layers"]} <= {kind, ir.encoded_weights()[0].encoding.op_type}


def test_hoisting_never_replaces_members_by_their_mean():
    """Members closer than the grid step would be 'quiet' by σ alone; hoisting them would run their mean, which is
    no member: a jointly drawn weight is never hoisted, so hoist=auto still gives the ensemble."""
    rng = np.random.default_rng(3)
    base = _mlp()
    ir = _replace_all(base, lambda i, w: MemberSetWeight(
        w.encoding.mean()[None] + 0.02 * rng.standard_normal((3, *w.encoding.shape)).astype(np.float32)))
    low = lower(ir, "fixed", bits=3).model  # step ~ max|w| / 3 >> the members' spread
    assert all(float(w.encoding.stddev().max()) <= w.encoding.step() for w in low.encoded_weights())
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(export_model(low, ExportConfig(3, mode="baked", hoist="auto")).proto, x),
                               _run(export_model(low, ExportConfig(3, mode="baked")).proto, x),
                               atol=ROUNDOFF)


def test_search_space_of_a_family_is_what_varies_for_it(tmp_path):
    """A deep ensemble is searched at S = M, baked, without σ codes, over its registered schemes; SWAG over S and
    its exact modes (baked, noise); an explicitly given axis that cannot be exact for the family is one line."""
    import dataclasses

    from edgebnn.ir import save
    from edgebnn.search.run import SearchSettings, validate
    from edgebnn.search.space import SearchSpace

    path = save(_members_ir(), tmp_path / "ens.ebnn")
    settings = SearchSettings(model=str(path), data=str(_npz(tmp_path)))
    space = validate(settings)[2]
    assert (space.schemes, space.samples, space.modes, space.family) == (("fixed", "float"), (3,), ("baked",),
                                                                         "deep ensemble")
    assert space.weights == ("ir", "fp32", "int8", "int4")  # the member-code store besides the device's formats
    given = dataclasses.replace(settings, space=SearchSpace(weights=("int8",)))
    assert validate(given)[2].weights == ("int8",)  # given explicitly: kept as given
    swag = validate(dataclasses.replace(settings, model=str(save(_lowrank_ir(), tmp_path / "swag.ebnn"))))[2]
    assert (swag.schemes, swag.samples, swag.modes) == (("fixed", "float"), SearchSpace().samples, ("baked", "noise"))
    assert swag.sigma_bits == (4,)  # its σ code takes at least FAMILY_SIGMA_BITS: the defaults 2, 1, 0 are all 4
    from edgebnn.search.space import TrialConfig
    from edgebnn.search.trial import TrialJob, run_trial

    for scheme, sigma_bits in (("float", None), ("fixed", 4)):
        for mode in ("baked", "noise"):  # SWAG's noise trial exports with per-weight noise (the exact variant)
            job = TrialJob(0, TrialConfig(scheme, "auto", sigma_bits, 4, mode, "fp32", "off"),
                           str(tmp_path / "swag.ebnn"), settings.data, None, 0, "cpu", runs=0)
            result = run_trial(job)
            assert result["state"] == "complete", result["error"]
    for axis, value, message in (("schemes", ("fixed", "codebook"), "--schemes codebook: a deep ensemble lowers with "
                                                                    "fixed or float only"),
                                 ("samples", (3, 8), "--samples 3,8: a deep ensemble of 3 members exports exactly "
                                                     "with S = 3 only"),
                                 ("modes", ("baked", "noise"), "--modes noise: not exact for a deep ensemble"),
                                 ("sigma_bits", (1,), "--sigma-bits: a deep ensemble's lowering codes no σ")):
        bad = dataclasses.replace(settings, space=dataclasses.replace(SearchSpace(), **{axis: value}))
        with pytest.raises(InvalidOptionError, match=message):
            validate(bad)


def _npz(tmp_path) -> object:
    """Labelled inputs [N, 6] for the hand-built MLPs (4 classes)."""
    rng = np.random.default_rng(4)
    path = tmp_path / "val.npz"
    np.savez(path, x=rng.standard_normal((32, 6)).astype(np.float32), y=rng.integers(0, 4, 32))
    return path
