"""``lower()``: scheme parsing and composition, option routing, the report, the manifest, pass errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.ir import EncodedWeight, GaussianWeight, to_bytes
from edgebnn.passes import SCHEMES, FixedConfig, PassError, float_bnn_bytes, lower, parse_scheme
from edgebnn.passes.base import LayerOutcome, LayerPass, PassConfig
from edgebnn.passes.mcq import McqPass

REPORT = {"scheme", "seed", "layers", "passes", "total_bytes", "float_bnn_bytes", "compression_ratio", "ebnn_bytes"}


@pytest.mark.parametrize("scheme", [*SCHEMES, "prune+codebook", "prune+mcq"])
def test_consuming_lower_rewrites_the_input_into_the_same_result(mlp, scheme) -> None:
    kept = lower(mlp, scheme, seed=3)
    before = to_bytes(mlp)
    assert to_bytes(lower(mlp, scheme, seed=3).model) == to_bytes(kept.model)
    assert to_bytes(mlp) == before  # without consume the input is left as it was
    consumed = lower(mlp, scheme, seed=3, consume=True)
    assert consumed.model.proto is mlp.proto  # lowered in place: no copy
    assert to_bytes(consumed.model) == to_bytes(kept.model)
    assert json.dumps(consumed.report, sort_keys=True) == json.dumps(kept.report, sort_keys=True)


@pytest.mark.parametrize("scheme", [*SCHEMES, "prune+codebook", "prune+mcq", "prune+fixed", "prune+ternary"])
def test_every_scheme_reports_and_records_itself(mlp, scheme, report_keys) -> None:
    result = lower(mlp, scheme, seed=4)
    report = result.report
    assert set(report) >= REPORT and report["scheme"] == scheme and report["seed"] == 4
    assert report["total_bytes"] == result.model.nbytes()
    assert report["ebnn_bytes"] == len(to_bytes(result.model)) > report["total_bytes"]
    assert report["float_bnn_bytes"] == float_bnn_bytes(mlp) == 8 * (16 * 64 + 64 + 64 * 10) + 4 * 10
    assert report["compression_ratio"] == pytest.approx(report["float_bnn_bytes"] / report["total_bytes"])
    assert all(report_keys <= set(row) for row in report["layers"])
    json.dumps(report)  # JSON-ready as it is
    names = scheme.split("+")
    assert result.model.manifest.scheme == scheme
    assert [(p["name"], p["seed"]) for p in result.model.manifest.passes] == [(n, 4) for n in names]
    assert all(p["options"]["version"] == 1 for p in result.model.manifest.passes)
    assert mlp.manifest.passes == [] and mlp.manifest.scheme == "float"  # the input is untouched


@pytest.mark.parametrize(
    ("scheme", "match"),
    [
        ("", "give one of"),
        ("quux", "unknown scheme 'quux'"),
        ("codebook+mcq", "only prune composes"),
        ("mcq+prune", "prune may appear once, first"),
        ("prune+prune", "prune may appear once, first"),
        ("prune+binary", "a binary weight cannot be 0"),
    ],
)
def test_bad_schemes(mlp, scheme, match) -> None:
    with pytest.raises(InvalidOptionError, match=match):
        lower(mlp, scheme)


def test_options_go_to_the_passes_that_take_them(mlp) -> None:
    result = lower(mlp, "prune+mcq", log_alpha_threshold=2.5, samples_per_weight=1.5)
    prune, mcq = result.model.manifest.passes
    assert prune["options"]["log_alpha_threshold"] == 2.5 and mcq["options"]["samples_per_weight"] == 1.5
    with pytest.raises(InvalidOptionError, match=r"unknown option\(s\) \['clusters'\]"):
        lower(mlp, "mcq", clusters=4)
    with pytest.raises(InvalidOptionError, match="the prune scheme has no bit width to set"):
        lower(mlp, "prune", bits=4)
    assert parse_scheme(" prune + fixed ") == ["prune", "fixed"]


def test_lowering_a_lowered_model_skips_with_reasons(mlp) -> None:
    once = lower(mlp, "mcq").model
    twice = lower(once, "codebook")
    assert twice.model.manifest.scheme == "mcq+codebook" and not twice.modified
    for row in twice.report["layers"]:
        assert row["kind"] == "IntCountWeight"
        assert row["skipped"] == ("kept as IntCountWeight: codebook lowers mean-field Gaussian posteriors, and the "
                                  "quantized family declares no codebook lowering for it")


def test_configs_are_frozen_and_validated() -> None:
    cfg = FixedConfig(bits=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.bits = 5  # type: ignore[misc]
    with pytest.raises(InvalidOptionError, match="noise_fraction=0"):
        FixedConfig(noise_fraction=0)
    with pytest.raises(InvalidOptionError, match="takes a McqConfig, got FixedConfig"):
        McqPass(cfg)


class _Broken(LayerPass):
    name = "broken"
    config_type = PassConfig

    def lower_weight(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        raise ZeroDivisionError("boom")


class _NaN(LayerPass):
    name = "nan"
    config_type = PassConfig

    def lower_weight(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        mu = np.full(weight.encoding.shape, np.nan, np.float32)
        return LayerOutcome(GaussianWeight(mu, np.ones_like(mu)))


def test_pass_failures_name_the_pass_and_those_before(mlp) -> None:
    pruned = lower(mlp, "prune").model
    with pytest.raises(PassError, match=r"pass 'broken' \(after prune\) failed on <synthetic mlp>: ZeroDivision"):
        _Broken()(pruned)
    with pytest.raises(PassError, match=r"pass 'nan' produced an invalid model: .*mu has NaN"):
        _NaN()(mlp)
    broken = mlp.copy()
    broken.manifest.input_name = "y"
    with pytest.raises(InvalidArtifactError, match="pass 'broken': input model is invalid"):
        _Broken()(broken)
    with pytest.raises(InvalidOptionError, match=r"pass 'mcq': weight 'W1': .*wider than 16 bits"):
        McqPass(McqPass.config_type(samples_per_weight=1e6))(mlp)


def test_progress_ticks_once_per_weight_per_pass_up_to_the_total(mlp):
    calls: list[tuple[int, int]] = []
    lower(mlp, "prune+fixed", progress=lambda done, total: calls.append((done, total)))
    n = len(mlp.encoded_weight_names())
    assert calls == [(i, 2 * n) for i in range(1, 2 * n + 1)]  # two passes (prune, fixed), every weight each
