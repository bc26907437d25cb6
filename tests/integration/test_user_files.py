"""Nothing a user gives is lost (issue 39): every command that writes refuses, in one line and before any work, an
output that is one of its inputs (the same path, a hard link, a symbolic link) or that has another format's
extension; two TensorRT builds never share companion files; an engine for another device is named as such.

The commands and their path options are read from the CLI itself (``edgebnn.cli._paths``: InputPath, OutputPath),
so a command or option added later is checked here too.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from synthetic import synthetic_cnn

from edgebnn import ir
from edgebnn.cli import main
from edgebnn.cli._paths import FORMATS, InputPath, OutputPath

# Options a command needs that are not paths: the least that lets click parse the command line.
REQUIRED = {"lower": ["--model", "edgebnn.models:digits_cnn", "--input-shape", "1,1,8,8"]}
# click.Path options that are neither a checked input nor a checked output, and why.
UNCHECKED = {("export", "timing_cache"): "TensorRT's timing cache: read and updated by the build, by design",
             ("demo", "out_dir"): "a folder the demo fills (its own file names)"}
CONTENT = b"a file the user gave: must survive byte for byte"


def run(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def one_line_error(r) -> str:
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def path_params(command: click.Command) -> tuple[list[click.Parameter], list[click.Parameter]]:
    inputs = [p for p in command.params if isinstance(p.type, InputPath)]
    outputs = [p for p in command.params if isinstance(p.type, OutputPath)]
    return inputs, outputs


def output_extension(param: click.Parameter) -> str:
    kind = param.type.kind
    kind = kind({}) if callable(kind) else kind
    return next(ext for ext, k in FORMATS.items() if k == kind)


def argv(name: str, command: click.Command, tmp: Path, override: dict[str, str]) -> list[str]:
    """A command line giving every path option a file in ``tmp`` (``override``: param name -> path)."""
    inputs, outputs = path_params(command)
    args = [name, *REQUIRED.get(name, [])]
    for param in [*inputs, *outputs]:
        if isinstance(param.type, OutputPath):
            value = override.get(param.name, str(tmp / f"out_{param.name}{output_extension(param)}"))
        else:
            value = override.get(param.name, str(tmp / f"in_{param.name}.npz"))
        if isinstance(param, click.Argument):
            args.append(value)
        else:
            args += [min(param.opts, key=len), value]
    return args


def writing_commands() -> list[str]:
    """Commands that write a file and read one (``plugins --json`` reads none: only its extension is checked)."""
    return [name for name, cmd in main.commands.items() if all(path_params(cmd))]


def outputs() -> list[tuple[str, str]]:
    return [(name, p.name or "") for name, cmd in main.commands.items() for p in path_params(cmd)[1]]


def test_every_path_option_is_checked():
    """A new option that reads or writes a file is typed InputPath/OutputPath, or listed with its reason."""
    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param.type, click.Path) and not isinstance(param.type, InputPath | OutputPath):
                assert (name, param.name) in UNCHECKED, f"{name} {param.name}: type it InputPath or OutputPath"
    assert set(writing_commands()) >= {"lower", "inspect", "export", "calibrate", "eval", "profile", "compare",
                                       "search"}


@pytest.mark.parametrize("name", writing_commands())
def test_no_output_may_be_an_input(name, tmp_path):
    """Every (output option, input option) pair of every writing command: refused, one line, nothing touched."""
    command = main.commands[name]
    inputs, outputs = path_params(command)
    assert inputs, f"{name} writes but reads no file?"
    for out in outputs:
        for inp in inputs:
            folder = tmp_path / f"{out.name}-{inp.name}"
            folder.mkdir()
            shared = folder / f"given{output_extension(out)}"
            shared.write_bytes(CONTENT)
            for other in inputs:
                if other is not inp:
                    (folder / f"in_{other.name}.npz").write_bytes(CONTENT)
            before = snapshot(folder)
            line = one_line_error(run(*argv(name, command, folder, {out.name: str(shared), inp.name: str(shared)})))
            assert f"which {name} reads" in line and "give" in line, line
            assert snapshot(folder) == before


@pytest.mark.parametrize("link", ["hard", "symbolic"])
@pytest.mark.parametrize("name", writing_commands())
def test_a_link_to_an_input_is_refused_too(name, link, tmp_path):
    command = main.commands[name]
    inputs, outputs = path_params(command)
    out, inp = outputs[0], inputs[0]
    given = tmp_path / "given.npz"
    given.write_bytes(CONTENT)
    alias = tmp_path / f"alias{output_extension(out)}"
    (os.link if link == "hard" else os.symlink)(given, alias)
    before = snapshot(tmp_path)
    line = one_line_error(run(*argv(name, command, tmp_path, {out.name: str(alias), inp.name: str(given)})))
    assert "(a link to the same file)" in line and f"which {name} reads" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(("name", "option"), outputs())
def test_every_output_refuses_another_formats_extension(name, option, tmp_path):
    command = main.commands[name]
    param = next(p for p in command.params if p.name == option)
    right = output_extension(param)
    wrong = ".ebnn" if right != ".ebnn" else ".onnx"
    for inp in path_params(command)[0]:
        (tmp_path / f"in_{inp.name}.npz").write_bytes(CONTENT)
    before = snapshot(tmp_path)
    line = one_line_error(run(*argv(name, command, tmp_path, {option: str(tmp_path / f"x{wrong}")})))
    assert f"{name} writes" in line and f"and {wrong} is the extension of" in line, line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(("args", "says"), [
    (["lower", "--model", "edgebnn.models:digits_cnn", "--weights", "w.safetensors", "--input-shape", "1,1,8,8",
      "-o", "m.onnx"], "-o m.onnx: lower writes an .ebnn IR there, and .onnx is the extension of an ONNX export; "
                       "give -o m.ebnn"),
    (["export", "m.ebnn", "-o", "x.ebnn"], "-o x.ebnn: export writes an ONNX export there, and .ebnn is the "
                                           "extension of an .ebnn IR; give -o x.onnx"),
    (["export", "m.ebnn", "--target", "tensorrt", "-o", "x.onnx"],
     "-o x.onnx: export writes a TensorRT engine there, and .onnx is the extension of an ONNX export; give -o "
     "x.engine (the ONNX it compiles is written beside it as x.engine.onnx)"),
    (["calibrate", "m.onnx", "-o", "x.ebnn"], "calibrate writes an ONNX export there"),
    (["eval", "m.onnx", "--json", "m2.onnx"], "--json m2.onnx: eval writes a JSON report there"),
    (["inspect", "m.ebnn", "--plot", "m2.ebnn"], "--plot m2.ebnn: inspect writes a PNG image there"),
    (["search", "m.ebnn", "--data", "digits", "--export-best", "b.ebnn"], "--export-best b.ebnn: search writes an "
                                                                          "ONNX export there"),
])
def test_an_output_with_another_formats_extension_is_refused(args, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("w.safetensors", "m.ebnn", "m.onnx"):
        Path(name).write_bytes(CONTENT)
    before = snapshot(tmp_path)
    line = one_line_error(run(*args))
    assert says in line, line
    assert snapshot(tmp_path) == before


def test_two_outputs_at_one_path_and_an_engine_companion_over_an_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("m.ebnn").write_bytes(CONTENT)
    line = one_line_error(run("eval", "m.ebnn", "--json", "r.json", "--plot", "r.json"))
    assert "two of eval's outputs at one path" in line
    # the engine's ONNX would be written as x.engine.onnx: the input of this very command
    Path("x.engine.onnx").write_bytes(CONTENT)
    line = one_line_error(run("export", "x.engine.onnx", "--target", "tensorrt", "-o", "x.engine"))
    assert "-o x.engine: its companion file x.engine.onnx is FILE x.engine.onnx" in line
    assert Path("x.engine.onnx").read_bytes() == CONTENT


@pytest.mark.parametrize(("args", "says"), [
    (["profile", "m.ebnn", "--onnx", "m.ebnn"], "--onnx m.ebnn: an .ebnn IR, not an export: profile exports the "
                                                ".ebnn it is given itself (drop --onnx)"),
    (["profile", "m.ebnn", "--device", "rtx", "--engine", "m.engine.onnx"],
     "--engine m.engine.onnx: the ONNX an engine is compiled from, not an engine: give --engine m.engine"),
    (["calibrate", "m.engine", "-o", "q.onnx"], "MODEL m.engine: a TensorRT engine: calibrate the .ebnn or an ONNX "
                                                "export"),
    (["lower", "--model", "edgebnn.models:digits_cnn", "--weights", "w.safetensors", "-o", "x.ebnn"],
     "error: Missing option '--input-shape'. (see edgebnn lower --help)"),
])
def test_a_file_of_the_wrong_kind_names_the_right_command(args, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("w.safetensors", "m.ebnn", "m.engine.onnx", "m.engine"):
        Path(name).write_bytes(CONTENT)
    assert says in one_line_error(run(*args))


def test_an_export_is_not_exported_again_but_can_become_an_engine(tmp_path, monkeypatch):
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.ensemble import save_onnx
    from edgebnn.exporters.export import export_model

    monkeypatch.chdir(tmp_path)
    save_onnx(export_model(synthetic_cnn(), ExportConfig(2, mode="baked")).proto, tmp_path / "m.onnx")
    line = one_line_error(run("export", "m.onnx", "-o", "again.onnx"))
    assert "already an ONNX export" in line and "edgebnn export m.onnx --target tensorrt -o model.engine" in line
    r = run("export", "m.onnx", "--target", "tensorrt", "--device", "jetson-orin-nano", "--dry-run", "-o", "m.engine")
    assert r.exit_code == 0, r.output
    assert "engine of m.onnx: baked, S=2" in r.output and Path("m.engine.manifest.json").is_file()


def test_a_dry_run_never_takes_over_a_built_engines_companions(tmp_path, monkeypatch):
    """The README's two TensorRT lines, to one name: the real engine keeps its ONNX and manifest."""
    pytest.importorskip("tensorrt_rtx")
    monkeypatch.chdir(tmp_path)
    ir.save(synthetic_cnn(), tmp_path / "m.ebnn")
    r = run("export", "m.ebnn", "--target", "tensorrt", "--device", "rtx", "--samples", 2, "-o", "model.engine")
    assert r.exit_code == 0, r.output
    before = snapshot(tmp_path)
    line = one_line_error(run("export", "m.ebnn", "--target", "tensorrt", "--device", "jetson-orin-nano",
                              "--samples", 2, "--dry-run", "-o", "model.engine"))
    assert "-o model.engine: an engine is there (built for rtx, its manifest says)" in line
    assert "give the dry run its own name, e.g. -o model-jetson-orin-nano.engine" in line
    assert snapshot(tmp_path) == before
    # the engine, asked for on another device, is named as built for rtx (not: TensorRT missing)
    line = one_line_error(run("profile", "m.ebnn", "--device", "jetson", "--engine", "model.engine", "--samples", 2))
    assert "model.engine: built for rtx, not jetson-orin-nano: profile it with --device rtx" in line
    # on its own device without a GPU: what running an engine needs, in one line
    line = one_line_error(run("profile", "m.ebnn", "--device", "rtx", "--engine", "model.engine", "--samples", 2,
                              "--runs", 2))
    assert "running a TensorRT engine needs an NVIDIA GPU" in line and "a CUDA build of PyTorch" in line
    # the dry run under its own name; profiling its (absent) engine says where it gets built
    r = run("export", "m.ebnn", "--target", "tensorrt", "--device", "jetson-orin-nano", "--samples", 2, "--dry-run",
            "-o", "jetson.engine")
    assert r.exit_code == 0, r.output
    line = one_line_error(run("profile", "m.ebnn", "--device", "jetson", "--engine", "jetson.engine"))
    assert "jetson.engine: engine file not found (jetson.engine.manifest.json is a dry run's" in line
    assert {k: v for k, v in snapshot(tmp_path).items() if k in before} == before


def test_session_predict_checks_the_input_range_as_eval_does(tmp_path):
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.runtime import Session

    model = synthetic_cnn()
    model.manifest.input_range = [0.0, 1.0]
    session = Session(export_model(model, ExportConfig(2, mode="baked")).proto)
    x = np.random.default_rng(0).uniform(0, 1, (4, 1, 6, 6)).astype(np.float32)
    session.predict(x)
    session.predict(x * 1.9 - 0.4)  # within one range width of [0, 1]: the same preprocessing, new data
    from edgebnn.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError, match=r"inputs span \[0\.\d+, 2\d\d\.\d+\], far outside \[0, 1\]"):
        session.predict(x * 255)
    model.manifest.input_range = None
    # nothing recorded: nothing to check against (eval says so)
    Session(export_model(model, ExportConfig(2, mode="baked")).proto).predict(x * 255)
