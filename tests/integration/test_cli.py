"""The command line end to end, and its contract for bad input: one line, exit status 2, nothing written."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
from click.testing import CliRunner

from edgebnn.api._lower import QUALITY_LIMITS
from edgebnn.cli import main

pytestmark = pytest.mark.slow
MODEL = "edgebnn.models:digits_cnn"


def run(*args, debug=False):
    result = CliRunner().invoke(main, [*(["--debug"] if debug else []), *map(str, args)], catch_exceptions=False)
    return result


@pytest.fixture(scope="module")
def ebnn(tmp_path_factory, trained_digits):
    out = tmp_path_factory.mktemp("cli") / "digits.ebnn"
    report = out.with_suffix(".json")
    r = run("lower", "--model", MODEL, "--weights", trained_digits[1], "--input-shape", "1,1,8,8", "-o", out,
            "--report", report)
    assert r.exit_code == 0, r.output
    body = json.loads(report.read_text())
    assert body["schema"] == "edgebnn.lower/1" and body["edgebnn_version"]
    for key in ("scheme", "layers", "total_bytes", "float_bnn_bytes", "compression_ratio"):
        assert key in body
    assert {"name", "kind", "n_weights", "bits", "sparsity", "bytes"} <= set(body["layers"][0])
    return out


def test_lower_is_byte_reproducible(ebnn, trained_digits, tmp_path):
    again = tmp_path / "again.ebnn"
    r = run("lower", "--model", MODEL, "--weights", trained_digits[1], "--input-shape", "1,1,8,8", "-o", again)
    assert r.exit_code == 0, r.output
    assert again.read_bytes() == ebnn.read_bytes()


def test_inspect_json(ebnn):
    r = run("inspect", ebnn, "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["manifest"]["source_library"] == "edgebnn"
    assert info["manifest"]["input_shape"] == [1, 1, 8, 8]
    assert [w["layer"] for w in info["layers"]][::2] == ["conv1", "conv2", "fc1", "fc2"]


def test_export_eval_profile(ebnn, tmp_path):
    onnx_path = tmp_path / "m.onnx"
    r = run("export", ebnn, "--target", "onnx", "--samples", 8, "-o", onnx_path)
    assert r.exit_code == 0, r.output
    r = run("eval", onnx_path, "--data", "digits", "--json", tmp_path / "eval.json")
    assert r.exit_code == 0, r.output
    ev = json.loads((tmp_path / "eval.json").read_text())
    # the trained CNN scores 0.97-0.98 (test_digits_chain); 0.9 only catches a broken export or eval
    assert ev["samples"] == 8 and ev["n"] == 360 and ev["accuracy"] > 0.9
    assert {"accuracy", "nll", "ece", "brier", "schema", "edgebnn_version"} <= set(ev)
    r = run("profile", ebnn, "--device", "cpu", "--samples", 8, "--runs", 5, "--warmup", 1,
            "--power-meter", "none", "--json", tmp_path / "p.json", "--plot", tmp_path / "p.png")
    assert r.exit_code == 0, r.output
    prof = json.loads((tmp_path / "p.json").read_text())
    for key in ("device", "runner", "batch", "latency_ms", "throughput_per_s", "energy_source", "baselines"):
        assert key in prof
    assert prof["energy_mj_per_inference"] is None and prof["energy_reason"]
    assert set(prof["baselines"]) == {"float_deterministic", "float_bnn"}
    assert {"p50", "p90", "p99", "mean"} <= set(prof["baselines"]["float_bnn"]["latency_ms"])
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def _bad_inputs(tmp_path, weights):
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(256))
    trunc = tmp_path / "trunc.safetensors"
    trunc.write_bytes(weights.read_bytes()[:1000])
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    evil = tmp_path / "evil.pt"
    with evil.open("wb") as f:
        pickle.dump({"conv1.weight_mu": Payload()}, f)
    return {
        "missing weights": (["--weights", tmp_path / "nope.pt"], "no such file"),
        "empty weights": (["--weights", empty], "empty"),
        "random bytes": (["--weights", garbage], "garbage.pt"),
        "truncated": (["--weights", trunc], "trunc.safetensors"),
        "pickle payload": (["--weights", evil], "evil.pt"),
        "unknown factory": (["--weights", weights, "--model", "edgebnn.models:nope"], "no callable 'nope'"),
        "unknown module": (["--weights", weights, "--model", "nopkg.nomod:f"], "cannot import module"),
        "wrong input shape": (["--weights", weights, "--input-shape", "1,3,32,32"], "--input-shape 1,3,32,32"),
        "garbage input shape": (["--weights", weights, "--input-shape", "a,b"], "--input-shape a,b"),
    }, marker


def test_lower_bad_input_is_one_line_exit_2_and_writes_nothing(trained_digits, tmp_path):
    cases, marker = _bad_inputs(tmp_path, trained_digits[1])
    for label, (args, needle) in cases.items():
        out = tmp_path / "out.ebnn"
        full = ["lower", "--model", MODEL, "--input-shape", "1,1,8,8", "-o", out, *args]
        # later options win in click, so --model/--input-shape in args override the defaults above
        r = run(*full)
        assert r.exit_code == 2, (label, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), (label, r.output)
        assert needle in r.output, (label, r.output)
        assert "Traceback" not in r.output
        assert not out.exists(), label
    assert not marker.exists()  # the pickle payload never ran


def test_nan_sigma_names_the_file_and_the_parameter(trained_digits, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(str(trained_digits[1]))
    state["fc1.weight_rho"][0, 0] = float("nan")
    bad = tmp_path / "nan.safetensors"
    save_file(state, str(bad))
    r = run("lower", "--model", MODEL, "--weights", bad, "--input-shape", "1,1,8,8", "-o", tmp_path / "o.ebnn")
    line = " ".join(r.output.split())
    assert r.exit_code == 2 and f"({bad}): parameter fc1.weight_rho has 1 NaN or infinite value(s)" in line, line
    assert "weight_sigma" not in line


def test_misshapen_parameter_is_named(trained_digits, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(str(trained_digits[1]))
    state["fc2.weight_mu"] = state["fc2.weight_mu"][:, :10].contiguous()
    bad = tmp_path / "shape.safetensors"
    save_file(state, str(bad))
    r = run("lower", "--model", MODEL, "--weights", bad, "--input-shape", "1,1,8,8", "-o", tmp_path / "o.ebnn")
    assert r.exit_code == 2 and "fc2.weight_mu" in r.output, r.output


@pytest.mark.parametrize("samples", [0, -1])
def test_export_bad_samples(ebnn, tmp_path, samples):
    out = tmp_path / "x.onnx"
    r = run("export", ebnn, "--samples", samples, "-o", out)
    assert r.exit_code == 2 and "--samples" in r.output and not out.exists()


def test_export_to_missing_directory(ebnn, tmp_path):
    r = run("export", ebnn, "-o", tmp_path / "no" / "x.onnx")
    assert r.exit_code == 2 and "does not exist" in r.output


def test_debug_shows_traceback(tmp_path):
    r = CliRunner().invoke(main, ["--debug", "inspect", str(tmp_path / "none.ebnn")])
    assert r.exit_code == 2 and "Traceback" in r.output


def test_console_script_runs_from_a_shell(ebnn):
    # The installed entry point, as a user types it (not the click test runner).
    r = subprocess.run([sys.executable, "-m", "edgebnn", "inspect", str(ebnn), "--json"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["layers"][0]["name"] == "conv1.weight"


def test_lower_eval_compares_with_the_float_bnn(trained_digits, tmp_path):
    out, report = tmp_path / "f.ebnn", tmp_path / "f.json"
    r = run("lower", "--model", MODEL, "--weights", trained_digits[1], "--input-shape", "1,1,8,8", "--scheme",
            "fixed", "--eval", "digits", "-o", out, "--report", report)
    assert r.exit_code == 0, r.output
    ev = json.loads(report.read_text())["eval"]
    assert ev["split"] == "val" and ev["n"] == 360 and ev["samples"] == 16
    for side in ("float_bnn", "lowered"):
        assert {"accuracy", "nll", "ece", "brier"} <= set(ev[side])
    assert ev["delta"]["nll"] == pytest.approx(ev["lowered"]["nll"] - ev["float_bnn"]["nll"])
    assert ev["float_bnn"]["accuracy"] > 0.9  # the float side is the trained model, not the lowered one
    # a warning exactly where a change passes its limit (QUALITY_LIMITS), each naming the certified path
    notes = json.loads(report.read_text())["quality_notes"]
    past = [k for k, limit in QUALITY_LIMITS.items()
            if (ev["delta"][k] < limit if limit < 0 else ev["delta"][k] > limit)]
    assert [n.split()[0] for n in notes] == past and all("--budget" in n for n in notes)


def test_lower_without_data_says_the_lowerings_effect_is_unmeasured(trained_digits, tmp_path):
    """No silent loss: a lossy scheme without --eval says in one line that accuracy and calibration are unmeasured
    and names the certified path; the float scheme (nothing rounded) says nothing of it."""
    lowered = run("lower", "--model", MODEL, "--weights", trained_digits[1], "--input-shape", "1,1,8,8", "--scheme",
                  "fixed", "-o", tmp_path / "fixed.ebnn", "--report", tmp_path / "fixed.json")
    assert lowered.exit_code == 0, lowered.output
    flat = " ".join(lowered.output.split())
    assert "fixed lowering's effect on accuracy and calibration is unmeasured (no data)" in flat
    assert "--eval DATA --budget nll=+0.02,ece=+0.01" in flat
    assert len(json.loads((tmp_path / "fixed.json").read_text())["quality_notes"]) == 1
    kept = run("lower", "--model", MODEL, "--weights", trained_digits[1], "--input-shape", "1,1,8,8",
               "-o", tmp_path / "float.ebnn")
    assert kept.exit_code == 0 and "unmeasured" not in kept.output, kept.output
