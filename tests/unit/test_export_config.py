"""The export configuration (edgebnn.exporters.config): its validation, defaults, JSON round trip, resolution against
models of different families, and the config an export's metadata records, which reproduces the export."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn import ir
from edgebnn.cli import main
from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.exporters import DEFAULT_SAMPLES
from edgebnn.exporters.config import DEFAULT_EXPORT, ExportConfig, rule_for
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import EXPORT_KEY, read_metadata
from edgebnn.ir import BNNModel, gaussian_mlp, verify
from edgebnn.ir.encodings import MemberSetWeight
from edgebnn.passes import lower
from edgebnn.stopping import StoppingRule


def _ensemble(m: int = 3) -> BNNModel:
    """A deep ensemble of ``m`` members: an MLP whose four weights are member sets."""
    rng = np.random.default_rng(0)
    layers = [(rng.standard_normal((o, i)).astype(np.float32), np.full((o, i), 0.1, np.float32),
               rng.standard_normal(o).astype(np.float32), np.full(o, 0.1, np.float32)) for i, o in ((6, 5), (5, 4))]
    model = gaussian_mlp(layers)
    for w in model.encoded_weights():
        model.replace_encoding(w, MemberSetWeight(rng.standard_normal((m, *w.encoding.shape)).astype(np.float32)))
    verify(model)
    return model


def test_the_defaults_are_the_documented_ones() -> None:
    config = ExportConfig()
    assert (config.samples, config.rule, config.mode, config.noise, config.weights, config.rng, config.hoist,
            config.form, config.seed, config.device, config.version) == (
        None, None, "auto", "auto", "ir", "auto", "off", "auto", 0, None, 1)
    assert DEFAULT_SAMPLES == 16 and ExportConfig(device="cpu") == DEFAULT_EXPORT
    assert ExportConfig(rule=StoppingRule()).samples == "auto"  # a rule alone asks for an anytime ensemble


@pytest.mark.parametrize(("options", "message"), [
    ({"samples": 0}, "--samples 0: must be a positive integer"),
    ({"samples": True}, "--samples True: must be a positive integer"),
    ({"samples": 5000}, "--samples 5000: more than 4096 is not supported"),
    ({"samples": "twelve"}, "samples='twelve': a positive integer, or 'auto'"),
    ({"samples": 8, "rule": StoppingRule()}, "samples=8 with a stopping rule: give samples='auto'"),
    ({"weights": "int3"}, "--weights int3: choose one of ir, fp32, int8, int4"),
    ({"device": "tpu"}, "--device tpu: choose one of cpu, "),
    ({"rng": "cloud"}, "--rng cloud: choose one of auto, host, graph"),
    ({"mode": "magic"}, "--mode magic: choose one of auto, baked, noise, shared, analytic"),
    ({"noise": "sideways"}, "--noise sideways: choose auto or local or weight or shared or mixed or flipout"),
    ({"form": "dense"}, "--form dense: choose one of auto, qdq, folded, integer"),
    ({"hoist": -1.0}, "--hoist -1.0: use auto, off or a non-negative sigma"),
    ({"hoist": "sometimes"}, "--hoist sometimes: use auto, off or a non-negative sigma"),
    ({"seed": -1}, "--seed -1: must be a non-negative integer"),
    ({"samples": "auto", "mode": "analytic"}, "--samples auto --mode analytic: analytic mode draws no samples"),
    ({"version": 2}, "export config version=2: this edgebnn reads export configs up to version 1"),
])
def test_a_bad_option_is_refused_in_one_line_naming_it(options: dict, message: str) -> None:
    with pytest.raises(InvalidOptionError) as e:
        ExportConfig(**options)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("config", [
    ExportConfig(),
    ExportConfig(8, mode="baked", weights="int8", form="qdq", seed=3, device="rtx", hoist=0.05),
    ExportConfig("auto", rule=StoppingRule(min_samples=2, max_samples=8, chunk=2, epsilon=0.05), mode="noise",
                 noise="weight", rng="host", device="arm64"),
])
def test_to_dict_round_trips_through_json(config: ExportConfig) -> None:
    text = json.dumps(config.to_dict(), sort_keys=True)
    assert ExportConfig.from_dict(json.loads(text)) == config


def test_from_dict_takes_defaults_and_names_what_it_refuses() -> None:
    assert ExportConfig.from_dict({"samples": 4}) == ExportConfig(4)
    with pytest.raises(InvalidOptionError, match=r"^m\.onnx: unknown key\(s\) \['sample'\]"):
        ExportConfig.from_dict({"sample": 4}, "m.onnx")
    with pytest.raises(InvalidOptionError, match=r"^m\.onnx: --mode magic: choose one of"):
        ExportConfig.from_dict({"mode": "magic"}, "m.onnx")
    with pytest.raises(InvalidOptionError, match="must be a JSON object"):
        ExportConfig.from_dict([4], "m.onnx")


def test_resolve_takes_s_and_the_mode_order_from_the_model_and_the_device() -> None:
    cnn = synthetic_cnn()
    auto = ExportConfig().resolve(cnn)
    assert auto.samples == DEFAULT_SAMPLES and auto.rule is None and auto.profile is None
    # no device: the cpu's default order (noise, noise --noise weight, baked), noise drawn in the graph
    assert auto.candidates == (("noise", "auto"), ("noise", "weight"), ("baked", "auto"))
    assert auto.rng_for("noise") == "graph" and auto.rng_for("baked") == "host"
    rtx = ExportConfig(7, device="rtx").resolve(cnn)
    assert rtx.samples == 7 and rtx.candidates == (("baked", "auto"),) and rtx.rng_for("noise") == "host"
    assert ExportConfig(mode="shared", noise="local").resolve(cnn).candidates == (("shared", "local"),)
    with pytest.raises(InvalidOptionError, match=r"^--rng graph: only --mode noise and shared draw at run time \("
                                                 r"got --mode baked\)$"):
        ExportConfig(rng="graph").resolve(cnn).spec("baked", "auto")
    anytime = ExportConfig("auto").resolve(cnn)
    assert anytime.rule == rule_for(cnn) and anytime.samples == anytime.rule.max_samples == 16


def test_a_deep_ensemble_resolves_to_its_m_members_baked() -> None:
    ensemble = _ensemble(3)
    resolved = ExportConfig().resolve(ensemble)
    assert resolved.samples == 3 and resolved.candidates == (("baked", "auto"),)
    result = export_model(ensemble, ExportConfig())
    assert result.choice.mode == "baked" and result.choice.reason == "a deep ensemble's only exact mode: its M members"
    assert ExportConfig("auto").resolve(ensemble).rule == StoppingRule(min_samples=2, max_samples=3, chunk=1)
    with pytest.raises(InvalidOptionError, match=r"--max-samples 16: a deep ensemble of 3 members draws each member "
                                                 r"once \(--max-samples 3\)$"):
        ExportConfig(rule=StoppingRule()).resolve(ensemble)


@pytest.mark.parametrize(("config", "message"), [
    (ExportConfig(5, mode="baked"), "--samples 5: a deep ensemble of 3 members exports exactly with --samples 3 "
                                    "(each member once)"),
    (ExportConfig(mode="noise"), "--mode noise has no noise to draw (the members are constants); export a deep "
                                 "ensemble with --mode baked"),
])
def test_a_mode_the_family_refuses_says_why_in_one_line(config: ExportConfig, message: str) -> None:
    with pytest.raises(InvalidOptionError) as e:
        export_model(_ensemble(3), config)
    assert str(e.value) == f"<mlp>: {message}"


def test_an_anytime_ensemble_takes_a_regression_model() -> None:
    """--samples auto has a rule for regression too (the members' means settled to a fraction of the predictive
    std, docs/anytime.md): it resolves instead of being refused as it was for every task but classification."""
    regression = synthetic_linear()
    regression.manifest.task, regression.manifest.task_options = "regression", {"head": "mean", "dims": 4,
                                                                                "noise_var": 0.1}
    resolved = ExportConfig("auto").resolve(regression)
    assert resolved.config.samples == "auto"


@pytest.mark.parametrize("config", [
    ExportConfig(),  # mode auto without a device
    ExportConfig(8, device="cpu", seed=5),
    ExportConfig(4, mode="baked", weights="int8", seed=2),
    ExportConfig(4, mode="noise", noise="weight", rng="host", hoist="auto"),
    ExportConfig(4, mode="analytic", weights="fp32"),
    ExportConfig("auto", mode="baked", device="cpu", seed=7),
    ExportConfig(rule=StoppingRule(epsilon=0.05), mode="noise", rng="graph"),
], ids=["auto", "cpu", "baked-int8", "noise-weight-host", "analytic", "anytime-baked", "anytime-noise"])
@pytest.mark.parametrize("lowered", [False, True], ids=["float", "fixed"])
def test_the_recorded_config_reproduces_the_export(config: ExportConfig, lowered: bool) -> None:
    """export -> read the config from its metadata -> export again: the same bytes, every ``auto`` decided."""
    model = lower(synthetic_cnn(), "fixed", seed=0).model if lowered else synthetic_cnn()
    first = export_model(model, config)
    recorded = read_metadata(first.proto, "m.onnx").config
    assert recorded is not None and recorded == first.config.to_dict()
    again = ExportConfig.from_dict(recorded, "m.onnx")
    assert again.mode != "auto" and again.rng in ("host", "graph") and (again.samples == "auto") == (
        first.resolved.rule is not None)
    assert export_model(model, again).proto.SerializeToString() == first.proto.SerializeToString()


def test_the_metadata_key_holds_the_config_as_a_dict_and_is_validated() -> None:
    proto = export_model(synthetic_cnn(), ExportConfig(4, mode="baked")).proto
    (entry,) = [p for p in proto.metadata_props if p.key == EXPORT_KEY]
    config = json.loads(entry.value)["config"]
    assert config == {"device": None, "form": "auto", "hoist": "off", "mode": "baked", "noise": "auto", "rng": "host",
                      "rule": None, "samples": 4, "seed": 0, "version": 1, "weights": "ir"}
    bad = onnx.ModelProto()
    bad.CopyFrom(proto)
    entry = next(p for p in bad.metadata_props if p.key == EXPORT_KEY)
    entry.value = entry.value.replace('"mode": "baked"', '"mode": "sometimes"', 1)  # "config" sorts before "mode"
    with pytest.raises(InvalidArtifactError, match=r"m\.onnx: edgebnn\.export metadata: config .* is not an export "
                                                   r"configuration"):
        read_metadata(bad, "m.onnx")


def test_export_json_and_inspect_show_the_config(tmp_path) -> None:
    src = ir.save(synthetic_cnn(), tmp_path / "m.ebnn")
    out, report = tmp_path / "m.onnx", tmp_path / "m.json"
    r = CliRunner().invoke(main, ["export", str(src), "-S", "4", "-o", str(out), "--json", str(report)])
    assert r.exit_code == 0, r.output
    config = json.loads(report.read_text())["export"]["config"]
    assert config["samples"] == 4 and config["mode"] == "noise" and config["device"] == "cpu"
    r = CliRunner().invoke(main, ["inspect", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["export"]["config"] == config
    replay = export_model(ir.load(src), ExportConfig.from_dict(config)).proto  # the file's config, through the API
    assert replay.SerializeToString(deterministic=True) == out.read_bytes()
