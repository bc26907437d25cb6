"""What a new user meets following the README: the default export keeps the compression, every command the tool
suggests is one the CLI accepts, one ratio per measurement, and wrong input ends in one line (exit 2)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from synthetic import synthetic_cnn

import edgebnn
from edgebnn import ir
from edgebnn.cli import main
from edgebnn.exporters.metadata import read_metadata
from edgebnn.exporters.sizes import deployed_bytes

S = 4


def run(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def suggested(output: str) -> list[list[str]]:
    """Every ``edgebnn ...`` command line the output names, as argv without the program."""
    flat = " ".join(output.split())  # a console may wrap a long line
    found = re.findall(r"(edgebnn (?:export|profile|lower|eval|inspect) [^();`]*?)(?= \(|`|;|$)", flat)
    return [shlex.split(c)[1:] for c in found]


@pytest.fixture(scope="module")
def lowered(tmp_path_factory) -> Path:
    """A fixed-point lowering of a wider synthetic CNN, so the codes, not the graph, dominate the file."""
    path = tmp_path_factory.mktemp("newcomer") / "model.ebnn"
    small = edgebnn.lower(synthetic_cnn(sigma=0.05), "fixed", seed=0)
    small.manifest.input_range = [0.0, 1.0]  # as lower --eval on data in [0, 1] records it
    ir.save(small, path)
    return path


def test_the_default_export_on_the_cpu_is_the_compact_self_contained_graph(lowered, tmp_path):
    out = tmp_path / "m.onnx"
    r = run("export", lowered, "--samples", S, "-o", out)
    assert r.exit_code == 0, r.output
    meta = read_metadata(onnx.load(str(out)), str(out))
    assert meta.mode == "noise" and meta.rng == "graph" and meta.stores  # the IR's codes, noise drawn inside
    assert "mode: noise (the default on cpu" in r.output
    size = deployed_bytes(out)
    assert size.inputs == (meta.input_name,)  # self-contained: the data is its only input
    baked = tmp_path / "b.onnx"
    assert run("export", lowered, "--samples", S, "--mode", "baked", "-o", baked).exit_code == 0
    assert size.file_bytes < baked.stat().st_size  # the baked fp32 members are what the default avoids
    # the Python API writes the same graph by default; its recorded config names no device (the command line's: cpu)
    api = onnx.load(str(edgebnn.export(ir.load(lowered), tmp_path / "api.onnx", samples=S)))
    cli = onnx.load(str(out))
    configs = [dict(read_metadata(p, "m.onnx").config or {}) for p in (api, cli)]
    assert configs[0].pop("device") is None and configs[1].pop("device") == "cpu" and configs[0] == configs[1]
    for p in (api, cli):
        del p.metadata_props[:]
    assert api.SerializeToString() == cli.SerializeToString()
    # TensorRT devices keep baked (docs/tensorrt.md: exact, deterministic, runs on the data alone)
    rtx = tmp_path / "rtx.engine"
    r = run("export", lowered, "--target", "tensorrt", "--device", "rtx", "--samples", S, "--dry-run", "-o", rtx)
    assert r.exit_code == 0, r.output
    assert read_metadata(onnx.load(str(tmp_path / "rtx.engine.onnx")), "rtx").mode == "baked"


def test_a_file_larger_than_the_fp32_bnn_names_a_command_that_runs_and_is_smaller(lowered, tmp_path):
    out = tmp_path / "big.onnx"
    r = run("export", lowered, "--samples", 16, "--mode", "baked", "--weights", "int8", "-o", out)
    assert r.exit_code == 0, r.output
    assert "larger than the fp32 BNN" in r.output
    assert "--weights int8: folded back to fp32 constants on cpu" in r.output and "--form qdq" in r.output
    commands = suggested(r.output)
    assert commands, r.output
    for argv in commands:
        target = tmp_path / "suggested.onnx"
        argv[argv.index("-o") + 1] = str(target)
        again = run(*argv)
        assert again.exit_code == 0, (argv, again.output)
        assert target.stat().st_size < out.stat().st_size
        assert "larger than the fp32 BNN" not in again.output or "still larger" in r.output
    # the flag the fold line names is accepted too, and stores int8
    qdq = tmp_path / "qdq.onnx"
    again = run("export", lowered, "--samples", 16, "--mode", "baked", "--weights", "int8", "--form", "qdq", "-o", qdq)
    assert again.exit_code == 0, again.output
    assert qdq.stat().st_size < out.stat().st_size


def test_lower_budgets_deployed_line_names_a_command_the_cli_accepts(lowered, tmp_path):
    from rich.console import Console

    from edgebnn.budget import budget_sizes
    from edgebnn.tables import print_budget_sizes

    console = Console(width=80, record=True)
    print_budget_sizes(console, budget_sizes(edgebnn.lower(synthetic_cnn(sigma=0.05), "fixed", seed=0)), str(lowered))
    text = console.export_text()
    assert "--form fp32" not in text and "--weights fp32" not in text
    commands = suggested(text)
    assert len(commands) == 1, text
    argv = commands[0]
    argv[argv.index("-o") + 1] = str(tmp_path / "d.onnx")
    r = run(*argv)
    assert r.exit_code == 0, r.output


def test_profile_has_one_ratio_per_comparison_from_interleaved_medians(lowered, tmp_path):
    onnx_path = tmp_path / "m.onnx"
    assert run("export", lowered, "--samples", S, "-o", onnx_path).exit_code == 0
    r = run("profile", onnx_path, "--samples", S, "--runs", 5, "--warmup", 1)
    assert r.exit_code == 2 and f"edgebnn profile MODEL.ebnn --onnx {onnx_path}" in r.output
    ebnn_beside = onnx_path.with_suffix(".ebnn")
    ebnn_beside.write_bytes(lowered.read_bytes())
    r = run("profile", onnx_path, "--samples", S, "--runs", 5)
    argv = suggested(r.output)[0]
    assert argv == ["profile", str(ebnn_beside), "--onnx", str(onnx_path)]
    json_out = tmp_path / "p.json"
    r = run(*argv, "--samples", S, "--runs", 7, "--warmup", 1, "--json", json_out)
    assert r.exit_code == 0, r.output
    import json

    report = json.loads(json_out.read_text())
    ratios, base = report["ratios"], report["baselines"]
    assert ratios["of"] == "p50s of interleaved runs" and "ratios of the p50s of interleaved runs" in r.output
    assert ratios["vs_float_deterministic"] == pytest.approx(
        report["latency_ms"]["p50"] / base["float_deterministic"]["latency_ms"]["p50"], rel=1e-12)
    assert ratios["speedup_vs_float_bnn"] == pytest.approx(
        base["float_bnn"]["latency_ms"]["p50"] / report["latency_ms"]["p50"], rel=1e-12)
    assert f"{ratios['vs_float_deterministic']:.2f}x one float pass" in r.output


def one_line_error(r) -> str:
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


def test_wrong_input_is_refused_in_one_line_that_names_the_fix(lowered, tmp_path):
    onnx_path = tmp_path / "m.onnx"
    assert run("export", lowered, "--samples", S, "-o", onnx_path).exit_code == 0
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (20, 1, 6, 6)).astype(np.float32)
    y = rng.integers(0, 3, 20)
    np.savez(tmp_path / "ok.npz", x=x, y=y)
    np.savez(tmp_path / "raw.npz", x=x * 16, y=y)  # the raw 0..16 pixel scale
    np.savez(tmp_path / "f64.npz", x=x.astype(np.float64), y=y)
    assert run("eval", onnx_path, "--data", tmp_path / "ok.npz").exit_code == 0
    assert run("eval", onnx_path, "--data", tmp_path / "ok.npz", "--samples", S).exit_code == 0  # its own S
    line = one_line_error(run("eval", onnx_path, "--data", tmp_path / "ok.npz", "--samples", 64))
    assert f"S = {S} built in" in line and "drop --samples" in line
    line = one_line_error(run("eval", onnx_path, "--data", tmp_path / "f64.npz"))
    assert "dtype float64" in line and "x.astype(np.float32)" in line
    for artifact in (onnx_path, lowered):  # the export carries the range the IR recorded
        line = one_line_error(run("eval", artifact, "--data", tmp_path / "raw.npz", "--json", tmp_path / "e.json"))
        assert "far outside [0, 1]" in line and "preprocess" in line
    assert not (tmp_path / "e.json").exists()


def test_a_wrong_input_shape_names_the_shape_the_model_takes(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from edgebnn.models import digits_cnn

    torch.manual_seed(0)
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in digits_cnn().state_dict().items()}, str(weights))
    line = one_line_error(run("lower", "--model", "edgebnn.models:digits_cnn", "--weights", weights,
                              "--input-shape", "1,8,8", "-o", tmp_path / "x.ebnn"))
    assert "(probed as a batch of shape 2,8,8)" in line  # the shape torch's message speaks of
    assert "takes 1 channel(s) in 2-d: --input-shape 1,1,8,8 (batch, channels, 2 spatial dims)" in line
    assert not (tmp_path / "x.ebnn").exists()
    # lowered with data, the model records the inputs' range (digits: pixels / 16 in [0, 1]); a replay keeps it
    good = tmp_path / "good.ebnn"
    r = run("lower", "--model", "edgebnn.models:digits_cnn", "--weights", weights, "--input-shape", "1,1,8,8",
            "--scheme", "fixed", "--eval", "digits", "-o", good)
    assert r.exit_code == 0, r.output
    assert ir.load(good).manifest.input_range == [0.0, 1.0]
    replay = tmp_path / "replay.ebnn"
    assert run("lower", "--model", "edgebnn.models:digits_cnn", "--weights", weights, "--input-shape", "1,1,8,8",
               "--config", good, "-o", replay).exit_code == 0
    assert replay.read_bytes() == good.read_bytes()


def test_search_refuses_a_lowered_ir_and_takes_weights_ir(lowered, tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "val.npz", x=rng.uniform(0, 1, (16, 1, 6, 6)).astype(np.float32), y=rng.integers(0, 3, 16))
    line = one_line_error(run("search", lowered, "--data", tmp_path / "val.npz", "--trials", 2, "--runs", 0,
                              "--objectives", "bytes,nll", "--study", tmp_path / "s.jsonl"))
    assert "already lowered (fixed)" in line and "without --scheme" in line
    float_ir = ir.save(synthetic_cnn(), tmp_path / "float.ebnn")
    r = run("search", float_ir, "--data", tmp_path / "val.npz", "--trials", 2, "--runs", 0, "--population", 2,
            "--objectives", "bytes,nll", "--modes", "noise", "--weights", "ir", "--schemes", "fixed",
            "--samples", 4, "--study", tmp_path / "s2.jsonl")
    assert r.exit_code == 0, r.output


def test_a_tensorrt_engine_larger_than_the_fp32_bnn_says_what_would_be_smaller(lowered, tmp_path):
    """The engine line's "Nx larger" comes with a line that names the smallest export the device runs, as a
    --target tensorrt command that builds a smaller engine, or says that none is smaller and what would be
    (TensorRT-RTX, a real build; on this small model the engine's fixed part dominates, so the second)."""
    pytest.importorskip("tensorrt_rtx")
    engine = tmp_path / "big.engine"
    r = run("export", lowered, "--target", "tensorrt", "--device", "rtx", "--samples", 16, "--mode", "baked",
            "-o", engine)
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "the engine is larger than the fp32 BNN" in flat, r.output
    commands = [c for c in suggested(flat.split("the engine is larger", 1)[1]) if c[0] == "export"]
    if not commands:
        assert "no export rtx runs is smaller" in flat and "--bits 4" in flat, r.output
        return
    argv = commands[0]
    assert argv[argv.index("--target") + 1] == "tensorrt", r.output
    argv[argv.index("-o") + 1] = str(tmp_path / "small.engine")
    again = run(*argv)
    assert again.exit_code == 0, (argv, again.output)
    assert (tmp_path / "small.engine").stat().st_size < engine.stat().st_size
