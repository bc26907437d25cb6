"""A posterior family defined outside the package, in this file only (docs/extending.md walks through it).

Rank-1 multiplicative Gaussian (Dusenberry et al. 2020) on a dense weight [out, in]:

    W = M ⊙ (r sᵀ),   r = 1 + σ_r ⊙ ε_r [out],  s = 1 + σ_s ⊙ ε_s [in],  ε standard normal

    E[W] = M,   Var[W] = M² ⊙ ((1 + σ_r²)(1 + σ_s²)ᵀ − 1)   (r and s independent)

The family (its encoding: stored fields, validation, draws, moments; its in-graph draw; what analytic mode does with
it) is registered with the public ``edgebnn.families.register_family`` (for each test, in a registry scope: the
``registry`` fixture); every export mode then takes it: ``baked`` draws members with the encoding's ``sample`` (the
reference runtime's streams), ``noise`` draws it in the graph from host noise (every variant draws it whole: it is
not Gaussian weight by weight), ``analytic`` reads its moments, which drop the correlation of a row's and a column's
weights: the family states that approximation and its measured bound, and the export records it. Only
public names are imported (the plug-in interface).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgebnn.errors import InvalidArtifactError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import read_metadata
from edgebnn.families import (
    Analytic,
    Encoding,
    Family,
    GraphBuilder,
    NoiseNeed,
    check_finite,
    check_shape,
    register_family,
)
from edgebnn.ir import DOMAIN, BNNModel, GaussianWeight, Manifest, from_bytes, make_encoding_node, to_bytes
from edgebnn.runtime import Session
from edgebnn.runtime.reference import predict

ROUNDOFF = 1e-5  # the same float32 products in another order


class Rank1GaussianWeight(Encoding):
    """W = M ⊙ (r sᵀ) with r ~ N(1, σ_r²) per output row and s ~ N(1, σ_s²) per input column (module docstring)."""

    op_type: ClassVar[str] = "Rank1GaussianWeight"
    FIELDS: ClassVar[tuple[str, ...]] = ("mean", "r_sigma", "s_sigma")

    def __init__(self, mean: np.ndarray, r_sigma: np.ndarray, s_sigma: np.ndarray) -> None:
        super().__init__(mean.shape)
        self.m, self.r_sigma, self.s_sigma = (np.asarray(a, np.float32) for a in (mean, r_sigma, s_sigma))

    @classmethod
    def from_fields(cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...],
                    where: str) -> Encoding:
        if len(shape) != 2:
            raise InvalidArtifactError(f"{where}: a rank-1 weight is [out, in], got shape {list(shape)}")
        check_shape(fields["mean"], shape, "mean", where)
        check_shape(fields["r_sigma"], (shape[0],), "r_sigma", where)
        check_shape(fields["s_sigma"], (shape[1],), "s_sigma", where)
        for name in cls.FIELDS:
            check_finite(fields[name], name, where)
        if (fields["r_sigma"] < 0).any() or (fields["s_sigma"] < 0).any():
            raise InvalidArtifactError(f"{where}: rank-1 sigmas must be >= 0")
        return cls(fields["mean"], fields["r_sigma"], fields["s_sigma"])

    def fields(self) -> dict[str, np.ndarray]:
        return {"mean": self.m, "r_sigma": self.r_sigma, "s_sigma": self.s_sigma}

    def mean(self) -> np.ndarray:
        return self.m

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        factor = np.outer(1 + self.r_sigma**2, 1 + self.s_sigma**2) - 1
        return self.m, (self.m**2 * factor).astype(np.float32)

    def stddev(self) -> np.ndarray:
        return np.sqrt(self.moments()[1])

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        eps = rng.standard_normal((n, self.shape[0] + self.shape[1])).astype(np.float32)
        return self.draw(eps[:, :self.shape[0]], eps[:, self.shape[0]:])

    def draw(self, eps_r: np.ndarray, eps_s: np.ndarray) -> np.ndarray:
        """The draws for standard noise ε_r [n, out], ε_s [n, in]."""
        r, s = 1 + self.r_sigma * eps_r, 1 + self.s_sigma * eps_s
        return (self.m * r[:, :, None] * s[:, None, :]).astype(np.float32)

    def noise_needs(self) -> tuple[NoiseNeed, ...]:
        return NoiseNeed(".r", (self.shape[0],)), NoiseNeed(".s", (self.shape[1],))


def rank1_draw(b: GraphBuilder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """W_s = M ⊙ (1 + σ_r ε_r)[S, out, 1] ⊙ (1 + σ_s ε_s)[S, 1, in], from the host noise ``eps[".r"]``,
    ``eps[".s"]``."""
    assert isinstance(enc, Rank1GaussianWeight)
    p += tag
    one = b.f32(p + "one", 1.0)
    r = b.add("Add", [one, b.add("Mul", [b.f32(p + "r_sigma", enc.r_sigma), eps[".r"]], p + "r_scaled")], p + "r")
    s = b.add("Add", [one, b.add("Mul", [b.f32(p + "s_sigma", enc.s_sigma), eps[".s"]], p + "s_scaled")], p + "s")
    r3 = b.add("Unsqueeze", [r, b.i64(p + "ax2", 2)], p + "r3")
    s3 = b.add("Unsqueeze", [s, b.i64(p + "ax1", 1)], p + "s3")
    rs = b.add("Mul", [r3, s3], p + "rs")
    return b.add("Mul", [b.f32(p + "mean", enc.m), rs], p + (tag + "s" if tag else "W_s"))


# measured by test_analytic_states_its_approximation (mean |Δp| 0.019 against S = 1000, its Monte Carlo error 0.007)
BOUND = "per-weight moments drop the row and column correlation: mean |Δp| <= 0.04 on the test MLP (S = 1000)"


def _model(seed: int = 0, n_in: int = 5, hidden: int = 6, classes: int = 4) -> BNNModel:
    """input [B, n_in] -> Gemm(rank-1 weight, Gaussian bias) -> Relu -> Gemm(Gaussian weight and bias) -> logits."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [], "rank1_mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])])

    def gaussian(shape: tuple[int, ...]) -> GaussianWeight:
        return GaussianWeight(rng.normal(0, 1, shape).astype(np.float32),
                              rng.uniform(0.05, 0.3, shape).astype(np.float32))

    rank1 = Rank1GaussianWeight(rng.normal(0, 1, (hidden, n_in)), rng.uniform(0.1, 0.5, hidden),
                                rng.uniform(0.1, 0.5, n_in))
    for name, layer, enc in (("fc1.weight", "fc1", rank1), ("fc1.bias", "fc1", gaussian((hidden,))),
                             ("fc2.weight", "fc2", gaussian((classes, hidden))),
                             ("fc2.bias", "fc2", gaussian((classes,)))):
        graph.node.append(make_encoding_node(graph, name, layer, enc))
    graph.node.extend([
        helper.make_node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["logits"], transB=1),
    ])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    manifest = Manifest(source_library="rank1-test", input_name="input", input_shape=[1, n_in], num_classes=classes)
    return BNNModel(proto, manifest, "rank1_mlp")


def _x(n: int = 8) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((n, 5)).astype(np.float32)


def test_the_encoding_round_trips_and_its_moments_are_its_draws():
    ir = _model()
    again = from_bytes(to_bytes(ir), "again")
    enc = again.encoded_weight("fc1.weight").encoding
    assert isinstance(enc, Rank1GaussianWeight)
    np.testing.assert_array_equal(enc.m, ir.encoded_weight("fc1.weight").encoding.mean())
    draws = enc.sample(np.random.default_rng(0), 20000)
    mean, var = enc.moments()
    # Monte Carlo error of 20000 draws: 5 standard errors of the mean and (for a product of Gaussians, kurtosis
    # below 9) of the variance
    np.testing.assert_allclose(draws.mean(0), mean, atol=5 * np.sqrt(var.max() / 20000))
    np.testing.assert_allclose(draws.var(0), var, rtol=5 * np.sqrt(8 / 20000), atol=1e-6)


def test_hostile_fields_are_one_line():
    proto = _model().proto
    for init in proto.graph.initializer:
        if init.name.endswith("r_sigma"):
            init.CopyFrom(onnx.numpy_helper.from_array(-np.ones(6, np.float32), init.name))
    with pytest.raises(InvalidArtifactError, match="rank-1 sigmas must be >= 0"):
        from_bytes(to_bytes(BNNModel(proto, _model().manifest, "m")), "m")


def test_baked_export_is_the_reference_runtimes_predictive():
    ir, x = _model(), _x()
    proto = export_model(ir, ExportConfig(16, mode="baked", seed=3)).proto
    got = Session(proto).predict(x)
    want = predict(ir, x, 16, seed=3)
    np.testing.assert_allclose(got.probs, want.probs, atol=ROUNDOFF)
    np.testing.assert_allclose(got.mutual_info, want.mutual_info, atol=ROUNDOFF)


def test_noise_export_draws_the_weight_in_the_graph():
    """``--noise weight``: the graph's draw from host noise is the encoding's ``draw`` of the same noise."""
    ir, x = _model(), _x(3)
    samples = 4
    sess = Session(export_model(ir, ExportConfig(samples, mode="noise", noise="weight", rng="host")).proto, seed=0)
    rng = np.random.default_rng(5)
    assert all(rec["per"] == "sample" for rec in sess.noise_inputs)  # weight noise: one draw per sample
    noise = {rec["name"]: rng.standard_normal((samples, *rec["shape"][1:])).astype(np.float32)
             for rec in sess.noise_inputs}
    got = sess.predict(x, noise=noise)
    enc = ir.encoded_weight("fc1.weight").encoding
    w1 = enc.draw(noise["noise/fc1.weight.r"], noise["noise/fc1.weight.s"])
    rest = {name: ir.encoded_weight(name).encoding for name in ("fc1.bias", "fc2.weight", "fc2.bias")}
    draws = {name: e.mean() + e.stddev() * noise[f"noise/{name}"] for name, e in rest.items()}
    h = np.maximum(np.einsum("bi,soi->bso", x, w1) + draws["fc1.bias"][None], 0)
    logits = np.einsum("bsh,sch->bsc", h, draws["fc2.weight"]) + draws["fc2.bias"][None]
    p = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(got.probs, (p / p.sum(-1, keepdims=True)).mean(1), atol=ROUNDOFF)


def test_analytic_states_its_approximation():
    """``analytic`` propagates the moments: close to the S = 1000 reference predictive. Measured mean |Δp| 0.019:
    the moment matching through the ReLU and the softmax quadrature (0.018 against S = 4000 too), plus the
    reference's own Monte Carlo error (0.007 between two S = 1000 seeds); 0.04 is twice that. The family states the
    approximation, and the export records it."""
    ir, x = _model(), _x(64)
    proto = export_model(ir, ExportConfig(64, mode="analytic")).proto
    got = Session(proto).predict(x).probs
    ref = predict(ir, x, 1000, seed=0).probs
    assert np.abs(got - ref).mean() < 0.04
    assert read_metadata(proto, "m").approximations == (f"rank1: {BOUND}",)


def test_every_noise_variant_draws_it_whole():
    """Not Gaussian weight by weight, so ``local`` and ``auto`` draw it with its own draw (one r and s per sample),
    as ``weight`` does, where they run the Gaussian fc2 on its moments (one ε per row of B·S); ``mixed`` too: it
    bakes only mean-field Gaussian kernels, never a family's weight."""
    ir = _model()
    for variant in ("local", "auto", "weight", "mixed"):
        records = {r["name"]: r for r in read_metadata(export_model(ir, ExportConfig(4, mode="noise", noise=variant,
                                                                                     rng="host")).proto, "m")
                   .noise_inputs or ()}
        assert records["noise/fc1.weight.r"]["shape"] == [4, 6] and records["noise/fc1.weight.s"]["shape"] == [4, 5]
        assert records["noise/fc1.weight.r"]["per"] == "sample"
        assert records["noise/fc2.weight"]["per"] == ("sample" if variant == "weight" else "row")


def test_a_family_that_states_no_analytic_rule_is_refused_there():
    """A family registered without ``analytic`` is never treated as independent weights: one line naming it."""

    class Rank1Silent(Rank1GaussianWeight):
        op_type = "Rank1SilentWeight"

    register_family(Family("rank1-silent", (Rank1Silent,), draws={"Rank1SilentWeight": rank1_draw}))
    rank1 = _model().encoded_weight("fc1.weight").encoding
    assert isinstance(rank1, Rank1GaussianWeight)
    ir = _model()
    ir.replace_encoding(ir.encoded_weight("fc1.weight"), Rank1Silent(rank1.m, rank1.r_sigma, rank1.s_sigma))
    with pytest.raises(Exception, match=r"rank1-silent.*--mode analytic.*states no analytic rule") as e:
        export_model(ir, ExportConfig(4, mode="analytic"))
    assert "\n" not in str(e.value)


class Rank1Undrawn(Rank1GaussianWeight):
    """The same posterior in a family that gives no draw and declares only a ``fixed`` lowering."""

    op_type = "Rank1UndrawnWeight"


def _keep_rank1(pass_, weight, rng):
    from edgebnn.families import LayerOutcome

    return LayerOutcome(weight.encoding, "rank-1: kept")




@pytest.fixture(autouse=True)
def rank1_families(registry):
    """The test's two families, registered for each test in a registry scope (so every test here, and those that
    register more, run again in one process)."""
    register_family(Family("rank1", (Rank1GaussianWeight,), "rank-1 multiplicative Gaussian (test)",
                           draws={"Rank1GaussianWeight": rank1_draw}, analytic=Analytic("approximate", bound=BOUND)))
    register_family(Family("rank1-undrawn", (Rank1Undrawn,),
                           lowerings={"Rank1UndrawnWeight": {"fixed": _keep_rank1}},
                           analytic=Analytic("approximate", bound=BOUND)))
    return registry


def _undrawn() -> BNNModel:
    ir = _model()
    rank1 = ir.encoded_weight("fc1.weight").encoding
    assert isinstance(rank1, Rank1GaussianWeight)
    ir.replace_encoding(ir.encoded_weight("fc1.weight"), Rank1Undrawn(rank1.m, rank1.r_sigma, rank1.s_sigma))
    return ir


def test_mixed_noise_refuses_a_family_it_cannot_draw_naming_it():
    """``--noise mixed`` on a family with no draw: one line naming the layer, the encoding and the family (it
    never bakes the weight while the file says ``noise``)."""
    from edgebnn.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError) as e:
        export_model(_undrawn(), ExportConfig(4, mode="noise", noise="mixed", rng="host"))
    assert ("layer 'fc1' is Rank1UndrawnWeight, which --noise mixed cannot draw in the graph (the rank1-undrawn "
            "family declares no draw for it, Family.draws): use --mode baked, or analytic") in str(e.value)
    assert "\n" not in str(e.value)


def test_float_keeps_a_family_that_declares_other_lowerings_and_others_are_refused():
    from edgebnn.errors import InvalidOptionError
    from edgebnn.passes import lower

    ir = _undrawn()
    kept = lower(ir, "float").model.encoded_weight("fc1.weight").encoding
    assert kept.op_type == "Rank1UndrawnWeight"
    assert lower(ir, "fixed").model.encoded_weight("fc1.weight").encoding.op_type == "Rank1UndrawnWeight"
    with pytest.raises(InvalidOptionError, match=r"Rank1UndrawnWeight, which mcq cannot lower; use --scheme fixed "
                                                 r"or float"):
        lower(ir, "mcq")


def test_a_lowering_refuses_the_settings_it_does_not_declare_it_honours(registry):
    """A plain lowering function honours neither a forced ``--bits`` nor ``--calibrate``'s grams: one line naming
    the layer, the family and what to drop; ``Lowering(fn, {"bits"})`` takes the width (and keeps refusing grams)."""
    from edgebnn.errors import InvalidOptionError
    from edgebnn.families import Lowering
    from edgebnn.passes import lower
    from edgebnn.passes.gptq import InputGram

    ir = _undrawn()
    with pytest.raises(InvalidOptionError) as e:
        lower(ir, "fixed", bits=4)
    assert str(e.value) == ("pass 'fixed': layer 'fc1' is a Rank1UndrawnWeight, whose fixed lowering (the "
                            "rank1-undrawn family's) cannot honour --bits 4: it declares honours=[] "
                            "(edgebnn.families.Lowering); drop --bits")

    class Rank1Bits(Rank1GaussianWeight):
        op_type = "Rank1BitsWeight"

    widths = []

    def lower_bits(pass_, weight, rng):
        widths.append(pass_.config.bits)
        return _keep_rank1(pass_, weight, rng)

    register_family(Family("rank1-bits", (Rank1Bits,), lowerings={"Rank1BitsWeight": {"fixed": Lowering(lower_bits,
                                                                                                        {"bits"})}}))
    rank1 = ir.encoded_weight("fc1.weight").encoding
    ir.replace_encoding(ir.encoded_weight("fc1.weight"), Rank1Bits(rank1.m, rank1.r_sigma, rank1.s_sigma))
    lower(ir, "fixed", bits=4)
    assert widths == [4]
    gram = InputGram(np.eye(5), count=10, inputs=10)
    with pytest.raises(InvalidOptionError, match=r"cannot honour --calibrate \(its input second moments\): it "
                                                 r"declares honours=\['bits'\] .*; drop --calibrate$"):
        lower(ir, "fixed", grams={"fc1.weight": gram})
    with pytest.raises(ValueError, match="Lowering honours \\['width'\\]"):
        Lowering(lower_bits, {"width"})


def test_the_default_mode_says_why_it_is_not_the_devices_default():
    """A family without a draw cannot export ``noise`` (cpu's default): ``--mode auto`` writes ``baked`` and its
    reason names the default it could not take, never calls baked the default."""
    choice = export_model(_undrawn(), ExportConfig(4, device="cpu")).choice
    assert choice.mode == "baked"
    assert choice.reason is not None and choice.reason.startswith(
        "the default on cpu is --mode noise, which cannot export it: --mode noise: ")
    assert "Rank1UndrawnWeight, which --mode noise cannot draw (its family has no in-graph draw)" in choice.reason


def test_a_larger_export_names_the_lowering_that_exists(tmp_path):
    """``export`` of a file larger than the fp32 BNN suggests ``lower --scheme fixed`` only where fixed lowers every
    layer; this family's fixed lowering keeps it, so the hint says which layers no scheme shrinks."""
    from click.testing import CliRunner

    from edgebnn.cli import main
    from edgebnn.ir import save

    class Rank1Kept(Rank1GaussianWeight):
        op_type = "Rank1KeptWeight"

    register_family(Family("rank1-kept", (Rank1Kept,), draws={"Rank1KeptWeight": rank1_draw}, analytic=Analytic(
        "approximate", bound=BOUND)))
    ir = _model()
    rank1 = ir.encoded_weight("fc1.weight").encoding
    assert isinstance(rank1, Rank1GaussianWeight)
    ir.replace_encoding(ir.encoded_weight("fc1.weight"), Rank1Kept(rank1.m, rank1.r_sigma, rank1.s_sigma))
    save(ir, tmp_path / "m.ebnn")
    r = CliRunner().invoke(main, ["export", str(tmp_path / "m.ebnn"), "--mode", "baked", "--samples", "64", "-o",
                                  str(tmp_path / "m.onnx")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "larger than the fp32 BNN" in flat and "lower the IR first" not in flat
    assert "its Rank1KeptWeight layers have no fixed lowering" in flat


def test_noise_suggests_analytic_only_where_the_family_takes_it():
    """The refusal of ``--mode noise`` for a family with no draw names ``analytic`` only where the family's rule is
    not "refused" (this one states an approximation; the silent family below states none)."""
    from edgebnn.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError, match=r"cannot draw \(its family has no in-graph draw\): use --mode "
                                                 r"baked, or analytic$"):
        export_model(_undrawn(), ExportConfig(4, mode="noise", rng="host"))

    class Rank1Closed(Rank1GaussianWeight):
        op_type = "Rank1ClosedWeight"

    register_family(Family("rank1-closed", (Rank1Closed,), analytic=Analytic("refused", "its rows share a draw")))
    ir = _model()
    rank1 = ir.encoded_weight("fc1.weight").encoding
    assert isinstance(rank1, Rank1GaussianWeight)
    ir.replace_encoding(ir.encoded_weight("fc1.weight"), Rank1Closed(rank1.m, rank1.r_sigma, rank1.s_sigma))
    with pytest.raises(InvalidOptionError, match=r"use --mode baked$"):
        export_model(ir, ExportConfig(4, mode="noise", rng="host"))


def test_float_is_a_lowering_of_every_family():
    """``float`` keeps a family's weights whether or not its table names it (what the CLI's size hint asks)."""
    from edgebnn.passes.base import lowers

    assert lowers("Rank1UndrawnWeight", "float") and lowers("Rank1UndrawnWeight", "fixed")
    assert not lowers("Rank1UndrawnWeight", "mcq")
    assert lowers("GaussianWeight", "mcq")


def test_a_refused_family_registers_nothing():
    """A family refused for one of its encodings leaves none of the others registered."""
    from edgebnn.ir import encoding_class
    from edgebnn.plugins import PluginError, family_of

    class Fresh(Rank1GaussianWeight):
        op_type = "Rank1FreshWeight"

    with pytest.raises(PluginError, match="Rank1UndrawnWeight already belongs to family 'rank1-undrawn'"):
        register_family(Family("rank1-greedy", (Fresh, Rank1Undrawn)))
    assert encoding_class("Rank1FreshWeight") is None and family_of("Rank1FreshWeight") is None


def test_a_plugin_that_failed_is_tried_again_and_the_later_ones_too(rank1_families, monkeypatch, tmp_path):
    """A failed plug-in does not mark loading done: the next lookup tries again, so every later source is loaded
    once the broken one is fixed (here: removed from $EDGEBNN_PLUGINS), never skipped in silence. The registry's
    scope forgets the loading when the test ends."""
    from edgebnn import plugins
    from edgebnn.plugins import PluginError

    (tmp_path / "eb_broken_plugin.py").write_text("raise ImportError('no such thing')\n")
    (tmp_path / "eb_later_plugin.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(rank1_families, "_loaded", False)  # as in a fresh process, with the built-ins imported
    monkeypatch.setenv(plugins.ENV, "eb_broken_plugin,eb_later_plugin")
    for _ in range(2):  # the same one-line error each time, not a silent success the second time
        with pytest.raises(PluginError, match=r"plug-in 'eb_broken_plugin'.*failed to import: ImportError"):
            plugins.load()
        assert not rank1_families.loaded
    assert "eb_later_plugin" not in plugins.LOADED
    monkeypatch.setenv(plugins.ENV, "eb_later_plugin")
    plugins.load()
    assert "eb_later_plugin" in plugins.LOADED and rank1_families.loaded


def test_the_lowering_helpers_are_public_and_are_fixeds_own():
    """``edgebnn.families.variance_grid`` is ``fixed``'s variance rule (the smallest width within f·mean σ², or the
    forced one), and ``SigmaCode`` the σ code; a family's lowering needs nothing else (docs/extending.md)."""
    from edgebnn.families import FixedConfig, SigmaCode, variance_grid

    rng = np.random.default_rng(0)
    mu = rng.standard_normal((16, 32)).astype(np.float32)
    sigma = np.full_like(mu, 0.05)
    f = FixedConfig().noise_fraction
    grid = variance_grid(FixedConfig(), mu, sigma, np.random.default_rng(1))
    assert grid.q.shape == mu.shape and np.abs(grid.q).max() <= (1 << (grid.bits - 1)) - 1

    def noise(g):
        return float(np.mean((mu - g.step * g.q.astype(np.float64)) ** 2))

    assert noise(grid) <= f * 0.05**2 < noise(variance_grid(FixedConfig(bits=grid.bits - 1), mu, sigma,
                                                             np.random.default_rng(1)))
    assert grid.extra["variance_bits"] == grid.bits and grid.note is None
    forced = variance_grid(FixedConfig(bits=3), mu, sigma, np.random.default_rng(1))
    assert forced.bits == 3 and np.abs(forced.q).max() <= 3
    code = SigmaCode.fit(np.geomspace(1e-3, 1.0, 512), 4, np.random.default_rng(0))
    assert code.levels.size <= 16 and code.decode().shape == (512,)
    assert np.all(np.abs(np.log(code.decode() / np.geomspace(1e-3, 1.0, 512))) < np.log(1000) / 16)  # a log bin


def test_the_budget_walk_never_forces_bits_on_a_lowering_that_does_not_honour_them(registry):
    """``lower --budget``'s greedy walk (``order="split"``) moves a layer by bits only where its family's lowering
    declares it honours a forced width: a lowering declaring ``honours={"grams"}`` is never handed ``bits`` (that
    would be refused), and the walk completes and never moves this layer by bits. The data are the float model's
    own predictions, so the float BNN keeps the budget."""
    from edgebnn.api import lower_within_budget
    from edgebnn.budget import BudgetOptions
    from edgebnn.families import Lowering
    from edgebnn.passes import LowerConfig
    from edgebnn.runtime.reference import Reference

    class Rank1NoBits(Rank1GaussianWeight):
        op_type = "Rank1NoBitsWeight"
        bits = 6  # what the lowering report reads as its width: the walk would try 5 bits

    asked = []

    def lower_nobits(pass_, weight, rng):
        asked.append(pass_.config.bits)
        return _keep_rank1(pass_, weight, rng)

    register_family(Family("rank1-nobits", (Rank1NoBits,),
                           lowerings={"Rank1NoBitsWeight": {"fixed": Lowering(lower_nobits, {"grams"})}}))
    ir = _model()
    rank1 = ir.encoded_weight("fc1.weight").encoding
    ir.replace_encoding(ir.encoded_weight("fc1.weight"), Rank1NoBits(rank1.m, rank1.r_sigma, rank1.s_sigma))
    x = np.random.default_rng(5).standard_normal((64, 5)).astype(np.float32)
    y = Reference(ir).predict(x, 16, 0).probs.argmax(1)
    low = lower_within_budget(ir, LowerConfig(scheme="float"), "nll=+0.5", data=(x, y),
                              options=BudgetOptions(order="split"))
    budget = low.lowering_report["budget"]
    assert budget["met"] and asked and set(asked) == {None}, asked
    row = next(r for r in budget["layers"] if r["layer"] == "fc1")
    assert "5 bits" not in row["reason"], row
    assert not [s for s in budget["steps"] if s["layer"] == "fc1" and s["change"].endswith(" bits")]
