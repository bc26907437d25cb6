"""``LowerConfig``: JSON round trip, validation naming the key, per-layer overrides, exact replay."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgebnn import ir
from edgebnn.errors import InvalidOptionError
from edgebnn.ir import to_bytes
from edgebnn.passes import LayerOverride, LowerConfig, lower
from edgebnn.passes.config import merge_sets

# W1/b1 are layer fc1, W2 is layer fc2 (edgebnn.ir.gaussian_mlp); the second bias is deterministic.
FULL = LowerConfig(
    scheme="prune+fixed", bits="auto", seed=3, options={"noise_fraction": 0.5, "log_alpha_threshold": 2.5},
    overrides=(LayerOverride("fc2", scheme="codebook", options={"clusters": 4}), LayerOverride("fc1", bits=6)),
)


def _encodings(model: ir.BNNModel) -> dict[str, str]:
    return {w.name: w.encoding.op_type for w in model.encoded_weights()}


def _tensors(model: ir.BNNModel, weight: str) -> list[bytes]:
    node = next(n for n in model.proto.graph.node if n.domain == ir.DOMAIN and n.output[0] == weight)
    inits = model.initializers()
    return [inits[i].SerializeToString() for i in node.input]


def test_round_trips_through_dict_and_json() -> None:
    raw = FULL.to_dict()
    assert json.loads(json.dumps(raw)) == raw
    assert LowerConfig.from_dict(raw) == FULL
    assert LowerConfig.from_json(FULL.to_json()) == FULL
    assert raw["overrides"] == [{"pattern": "fc2", "scheme": "codebook", "options": {"clusters": 4}},
                                {"pattern": "fc1", "bits": 6}]
    assert LowerConfig.from_dict({}) == LowerConfig()  # every key has a default
    assert LowerConfig(scheme=" prune + fixed ").scheme == "prune+fixed"  # stored normalised


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ([], "config must be a JSON object, got list"),
        ({"colour": 1}, "unknown key(s) ['colour']"),
        ({"version": 2}, "reads lowering configs up to version 1"),
        ({"version": "1"}, "version='1'"),
        ({"scheme": "quux"}, "unknown scheme 'quux'"),
        ({"bits": "many"}, "bits='many': give 'auto' or an integer"),
        ({"scheme": "prune", "bits": 4}, "the prune scheme has no bit width to set"),
        ({"scheme": "fixed", "bits": 40}, "bits=40"),
        ({"seed": -1}, "seed=-1"),
        ({"options": [1]}, "options=[1]: must be an object"),
        ({"scheme": "fixed", "options": {"clusters": 4}}, "unknown option(s) ['clusters']"),
        ({"scheme": "fixed", "options": {"noise_fraction": -1}}, "noise_fraction=-1"),
        ({"scheme": "fixed", "options": {"bits": 4}}, "options.bits: give bits as the config's bits"),
        ({"scheme": "codebook", "options": {"gradients": [1.0]}}, "options.gradients=[1.0]: a setting is a number"),
        ({"overrides": {"pattern": "fc*"}}, "overrides="),
        ({"overrides": [{"bits": 8}]}, "overrides[0]={'bits': 8}: must be an object with a pattern"),
        ({"overrides": [{"pattern": "fc*", "colour": 1}]}, "overrides[0] has unknown key(s) ['colour']"),
        ({"overrides": [{"pattern": ""}]}, "pattern='': must be a non-empty fnmatch pattern"),
        ({"scheme": "fixed", "overrides": [{"pattern": "fc2", "scheme": "prune", "bits": 4}]},
         "the prune scheme has no bit width to set"),
        ({"scheme": "fixed", "overrides": [{"pattern": "fc2", "options": {"clusters": 3}}]},
         "unknown option(s) ['clusters']"),
    ],
)
def test_bad_configs_are_one_line_naming_the_key(raw, needle) -> None:
    with pytest.raises(InvalidOptionError) as e:
        LowerConfig.from_dict(raw, "cfg.json")
    assert str(e.value).startswith("cfg.json: ") and needle in str(e.value) and "\n" not in str(e.value)


def test_a_string_scheme_is_sugar_for_its_config(mlp) -> None:
    by_string = lower(mlp, "fixed", seed=3, bits=4, noise_fraction=0.5)
    by_config = lower(mlp, LowerConfig(scheme="fixed", seed=3, bits=4, options={"noise_fraction": 0.5}))
    assert to_bytes(by_string.model) == to_bytes(by_config.model)
    assert by_string.report["config"] == by_config.report["config"] == by_config.model.manifest.lower_config
    with pytest.raises(InvalidOptionError, match="the config holds seed, bits and options"):
        lower(mlp, LowerConfig(), seed=1)


def test_overrides_lower_matching_layers_differently(mlp) -> None:
    plain = lower(mlp, "prune+fixed", seed=3, noise_fraction=0.5, log_alpha_threshold=2.5).model
    result = lower(mlp, FULL)
    model = result.model
    # fc2 takes the codebook override; fc1 keeps prune+fixed but at the forced 6 bits
    assert _encodings(model) == {"W1": "FixedPointWeight", "b1": "FixedPointWeight", "W2": "CodebookWeight"}
    rows = {r["name"]: r for r in result.report["layers"]}
    assert list(rows) == ["W1", "b1", "W2"]  # graph order, one row each
    assert rows["W1"]["bits"] == rows["b1"]["bits"] == 6 and rows["W2"]["clusters"] <= 4
    assert [(p["name"], p["weights"]) for p in model.manifest.passes] == [
        ("prune", ["W1", "b1"]), ("fixed", ["W1", "b1"]), ("codebook", ["W2"])]
    assert model.manifest.scheme == "prune+fixed"
    # an override that changes nothing gives the same bytes as no override: each layer is seeded by its index
    same = LowerConfig.from_dict({**plain.manifest.lower_config, "overrides": [{"pattern": "fc2", "bits": "auto"}]})
    assert lower(mlp, same).model.encoded_weight_names() == plain.encoded_weight_names()
    for name in plain.encoded_weight_names():
        assert _tensors(lower(mlp, same).model, name) == _tensors(plain, name)
    assert mlp.manifest.passes == []  # the input is untouched


def test_the_last_matching_override_wins_and_inherits(mlp) -> None:
    cfg = LowerConfig(scheme="fixed", bits=4, overrides=(LayerOverride("fc*", bits=8), LayerOverride("fc2")))
    rows = {r["name"]: r for r in lower(mlp, cfg).report["layers"]}
    # fc1: only 'fc*' matches (8 bits); fc2: 'fc2' is the last match and inherits the config's 4 bits
    assert (rows["W1"]["bits"], rows["b1"]["bits"], rows["W2"]["bits"]) == (8, 8, 4)
    # a different scheme does not inherit the config's bits (float has none to set) but does its options
    cfg = LowerConfig(scheme="fixed", bits=4, options={"noise_fraction": 0.5},
                      overrides=(LayerOverride("fc1", scheme="float"), LayerOverride("fc2", scheme="mcq")))
    result = lower(mlp, cfg)
    assert _encodings(result.model) == {"W1": "GaussianWeight", "b1": "GaussianWeight", "W2": "IntCountWeight"}
    mcq = next(p for p in result.model.manifest.passes if p["name"] == "mcq")
    assert mcq["options"]["noise_fraction"] == 0.5 and mcq["options"]["bits"] is None


def test_replaying_the_stored_config_gives_the_same_bytes(mlp, tmp_path) -> None:
    first = ir.save(lower(mlp, FULL).model, tmp_path / "a.ebnn")
    stored = ir.load(first).manifest.lower_config
    assert stored == FULL.to_dict()
    again = ir.save(lower(mlp, LowerConfig.from_dict(stored)).model, tmp_path / "b.ebnn")
    assert first.read_bytes() == again.read_bytes()
    other = ir.save(lower(mlp, LowerConfig.from_dict({**stored, "seed": 4})).model, tmp_path / "c.ebnn")
    assert other.read_bytes() != first.read_bytes()


def test_array_options_are_data_not_config(make_mlp) -> None:
    model = make_mlp((4, 8, 3))
    scales = {"W1": (np.ones(4, np.float32), np.full(4, 0.01, np.float32))}
    result = lower(model, "prune+fixed", group_scales=scales)
    assert "group_scales" not in result.report["config"]["options"]
    assert result.model.manifest.passes[0]["options"]["group_scales"] == ["W1"]
    with pytest.raises(InvalidOptionError, match=r"unknown option\(s\) \['group_scales'\]"):
        lower(model, "fixed", group_scales=scales)


def test_set_assignments_merge_left_to_right() -> None:
    cfg = merge_sets(LowerConfig(), ["scheme=prune+fixed", "bits=6", "options.noise_fraction=0.5",
                                     'overrides=[{"pattern": "fc*", "bits": 8}]', "bits=auto"])
    assert cfg == LowerConfig(scheme="prune+fixed", options={"noise_fraction": 0.5},
                              overrides=(LayerOverride("fc*", bits=8),))


@pytest.mark.parametrize(
    ("assignment", "needle"),
    [
        ("noise_fraction", "--set noise_fraction: expected KEY=VALUE"),
        ("=3", "--set =3: expected KEY=VALUE"),
        ("options.=3", "name the option"),
        ("colour=red", "unknown key 'colour'"),
        ("options.clusters=4", "unknown option(s) ['clusters']"),
        ("overrides=[{", "overrides='[{': must be a list"),
        ("seed=-2", "seed=-2"),
    ],
)
def test_malformed_sets_are_one_line(assignment, needle) -> None:
    with pytest.raises(InvalidOptionError) as e:
        merge_sets(LowerConfig(scheme="fixed"), [assignment])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_one_default_noise_fraction_for_every_scheme() -> None:
    """The variance rule has one default f (docs/uncertainty.md: 0.1), whichever scheme (or fallback) applies it."""
    import dataclasses

    from edgebnn.passes import PASSES
    from edgebnn.passes.base import DEFAULT_NOISE_FRACTION

    defaults = {name: f.default for name, p in PASSES.items() for f in dataclasses.fields(p.config_type)
                if f.name == "noise_fraction"}
    assert {"fixed", "codebook", "mcq", "ternary", "binary"} <= set(defaults)
    assert DEFAULT_NOISE_FRACTION == 0.1
    assert defaults == dict.fromkeys(defaults, DEFAULT_NOISE_FRACTION)
