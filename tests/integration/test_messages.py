"""Every label and message on the README's paths says what is true (issue 39, item 5): a ratio says larger when the
file is larger, a lowered IR is not told to be lowered first, a deep ensemble's mode says why it is baked, a search
without a budget does not speak of one, and `profile --help` says one thing about `--mode auto`."""

from __future__ import annotations

import inspect

import click
import pytest
from click.testing import CliRunner
from rich.console import Console
from synthetic import synthetic_linear

import edgebnn
from edgebnn import ir
from edgebnn.cli import main


def run(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_lower_size_is_the_ir_tensors_and_says_larger_when_larger():
    from edgebnn.tables import print_lower_report

    console = Console(width=200, record=True)
    report = {"scheme": "float", "seed": 0, "layers": [], "total_bytes": 93_000, "float_bnn_bytes": 46_600,
              "compression_ratio": 46_600 / 93_000}
    print_lower_report(console, report, "m.ebnn")
    text = flat(console.export_text())
    assert "90.8 KiB of IR tensors" in text and "2.00x larger than the fp32 BNN (45.5 KiB)" in text
    assert "0.5x smaller" not in text and "smaller" not in text


def test_a_lowered_ir_larger_than_the_fp32_bnn_is_not_told_to_lower_first(tmp_path):
    # a 5 -> 4 linear layer: 192 bytes of fp32 BNN, less than any ONNX graph around it
    lowered = ir.save(edgebnn.lower(synthetic_linear(), "fixed", seed=0), tmp_path / "tiny.ebnn")
    r = run("export", lowered, "--samples", 4, "-o", tmp_path / "t.onnx")
    assert r.exit_code == 0, r.output
    text = flat(r.output)
    assert "larger than the fp32 BNN" in text
    assert "lower the IR first" not in text and "the IR is lowered already (fixed)" in text
    float_ir = ir.save(synthetic_linear(), tmp_path / "float.ebnn")
    text = flat(run("export", float_ir, "--samples", 4, "-o", tmp_path / "f.onnx").output)
    assert "lower the IR first (edgebnn lower --scheme fixed)" in text


def test_a_deep_ensemble_says_why_it_is_baked(tmp_path):
    torch = pytest.importorskip("torch")
    from torch import nn

    torch.manual_seed(0)
    members = [nn.Sequential(nn.Flatten(), nn.Linear(16, 3)) for _ in range(3)]
    ensemble = ir.save(edgebnn.from_torch(members, (1, 1, 4, 4)), tmp_path / "ens.ebnn")
    r = run("export", ensemble, "-o", tmp_path / "ens.onnx")
    assert r.exit_code == 0, r.output
    assert "mode: baked (a deep ensemble's only exact mode: its M members)" in flat(r.output)
    assert "the default on cpu" not in r.output
    rtx = run("export", ensemble, "--target", "tensorrt", "--dry-run", "-o", tmp_path / "ens.engine")
    assert "mode: baked (the default on rtx)" in flat(rtx.output)


def test_a_search_without_a_budget_does_not_speak_of_one():
    from edgebnn.search.objectives import choose_best

    trials = [{"state": "complete", "number": n, "bytes": b, "metrics": {"nll": 0.1}, "config": {"scheme": "fixed"}}
              for n, b in ((0, 900), (1, 500))]
    best, reason, _ = choose_best(trials, {"nll": 0.1}, {})
    assert best is not None and best["number"] == 1
    assert "within the budget" not in reason and "no --budget" in reason
    _, with_budget, _ = choose_best(trials, {"nll": 0.1}, {"nll": 0.05})
    assert "within the budget" in with_budget


def test_profile_help_says_one_thing_about_auto():
    text = flat(run("profile", "--help").output)
    assert "auto means baked" not in text
    assert text.count("what edgebnn export writes by default") == 2  # --mode and --bench-results agree
    assert "Running an engine needs an NVIDIA GPU, the engine's TensorRT (rtx: tensorrt_rtx) and a CUDA build of " \
           "PyTorch" in text


def test_eval_and_lower_say_when_no_input_range_is_recorded(tmp_path):
    import numpy as np

    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.ensemble import save_onnx
    from edgebnn.exporters.export import export_model

    model = synthetic_linear()
    save_onnx(export_model(model, ExportConfig(2, mode="baked")).proto, tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.uniform(0, 255, (8, 5)).astype(np.float32), y=rng.integers(0, 4, 8))
    r = run("eval", tmp_path / "m.onnx", "--data", tmp_path / "d.npz")
    assert r.exit_code == 0, r.output
    assert "records no input range (lowered without --eval or --calibrate data)" in flat(r.output)
    model.manifest.input_range = [0.0, 1.0]
    save_onnx(export_model(model, ExportConfig(2, mode="baked")).proto, tmp_path / "r.onnx")
    r = run("eval", tmp_path / "r.onnx", "--data", tmp_path / "d.npz")
    assert r.exit_code == 2 and "far outside [0, 1]" in r.output


# -- issue 45, item 6 -------------------------------------------------------------------------------------------


def _bayesian_torch_cnn():
    """A bayesian-torch CNN on 1x8x8 inputs (Conv2d 3x3, then Linear; each returns (out, kl))."""
    pytest.importorskip("bayesian_torch")
    import torch
    from bayesian_torch.layers import Conv2dReparameterization, LinearReparameterization

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = Conv2dReparameterization(1, 4, 3)
            self.fc1 = LinearReparameterization(4 * 6 * 6, 10)

        def forward(self, x):
            x, _ = self.conv1(x)
            x, _ = self.fc1(torch.relu(x).flatten(1))
            return x

    torch.manual_seed(0)
    return Net()


@pytest.mark.parametrize(("shape", "hint"), [
    ("1,8,8", "takes 1 channel(s) in 2-d: --input-shape 1,1,8,8 (batch, channels, 2 spatial dims)"),
    ("1,3,8,8", "takes 1 channel(s) in 2-d: --input-shape 1,1,8,8 (batch, channels, 2 spatial dims)"),
    ("1,64", "takes 1 channel(s) in 2-d: --input-shape 1,1,H,W (batch, channels, 2 spatial dims)"),
    ("1,1,9,9", "takes 1 channel(s) in 2-d, as --input-shape 1,1,9,9 gives it: a later layer refused its size"),
])
def test_a_conv2d_shape_hint_is_2d_and_built_from_what_was_typed(tmp_path, shape, hint):
    """bayesian-torch gives a Conv2d's kernel_size as one int: the rank comes from its kernel tensor (2-d, not 1-d),
    and the shape offered keeps the sizes the user typed; torch's message speaks of the probe batch, named."""
    net = _bayesian_torch_cnn()
    with pytest.raises(edgebnn.errors.InvalidOptionError) as e:
        edgebnn.from_torch(net, tuple(int(d) for d in shape.split(",")))
    line = str(e.value)
    assert "\n" not in line and hint in line, line
    assert f"--input-shape {shape} failed (probed as a batch of shape 2,{shape.split(',', 1)[1]})" in line, line
    assert "in 1-d" not in line and ",L" not in line


def test_a_nan_rho_names_the_weights_file_and_the_state_dict_key(tmp_path, monkeypatch):
    """lower --weights with a NaN in bayesian-torch's fc1.rho_weight: the file and that key, not edgebnn's σ."""
    from safetensors.torch import save_file

    net = _bayesian_torch_cnn()
    state = net.state_dict()
    state["fc1.rho_weight"][0, 3] = float("nan")
    save_file(state, str(tmp_path / "w.safetensors"))
    source = inspect.getsource(_bayesian_torch_cnn).replace("pytest.importorskip", "__import__")
    (tmp_path / "bt_cnn.py").write_text(f"{source}\n\ndef net():\n    return _bayesian_torch_cnn()\n")
    monkeypatch.chdir(tmp_path)  # --model finds a module in the working folder
    r = run("lower", "--model", "bt_cnn:net", "--weights", tmp_path / "w.safetensors", "--input-shape", "1,1,8,8",
            "-o", tmp_path / "m.ebnn")
    line = flat(r.output)
    assert r.exit_code == 2, r.output
    assert "w.safetensors): parameter fc1.rho_weight has 1 NaN or infinite value(s) of 1440" in line, line
    assert "weight_sigma" not in line


def test_eval_without_data_says_it_ran_on_digits_or_asks_for_data(tmp_path):
    """No --data: a digits-shaped model is evaluated on the built-in digits and eval says so in one line; a model of
    other inputs gets one error line asking for --data (not just the shape mismatch)."""
    pytest.importorskip("torch")
    from edgebnn.models import digits_cnn

    digits_ir = ir.save(edgebnn.from_torch(digits_cnn(), (1, 1, 8, 8)), tmp_path / "d.ebnn")
    r = run("eval", digits_ir, "-S", 2)
    assert r.exit_code == 0, r.output
    assert "data: the built-in digits test split (no --data given; --data FILE evaluates yours)" in flat(r.output)
    r = run("eval", digits_ir, "-S", 2, "--data", "digits")
    assert r.exit_code == 0 and "no --data given" not in flat(r.output)
    other = ir.save(synthetic_linear(), tmp_path / "o.ebnn")
    r = CliRunner().invoke(main, ["eval", str(other), "-S", "2"])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "takes inputs (5,), digits has (1, 8, 8): no --data was given" in lines[0] and "give --data FILE" in lines[0]


def test_an_mi_auroc_below_chance_is_warned_in_one_line(tmp_path):
    """synthetic_linear's logit variance is x²σ² + b_σ²: inputs near 0 (the 'OOD' set here) give the members less to
    disagree on than the in-distribution ones, so MI ranks them below: AUROC < 0.5 and one warning line; the
    opposite sets give AUROC > 0.5 and no warning."""
    import numpy as np

    rng = np.random.default_rng(0)
    model = ir.save(synthetic_linear(), tmp_path / "m.ebnn")
    np.savez(tmp_path / "in.npz", x=rng.normal(size=(200, 5)).astype(np.float32), y=rng.integers(0, 4, 200))
    np.savez(tmp_path / "near0.npz", x=(0.01 * rng.normal(size=(200, 5))).astype(np.float32))
    np.savez(tmp_path / "far.npz", x=(5 * rng.normal(size=(200, 5))).astype(np.float32))
    r = run("eval", model, "--data", tmp_path / "in.npz", "--ood-data", tmp_path / "near0.npz", "--json",
            tmp_path / "e.json")
    assert r.exit_code == 0, r.output
    import json

    auroc = json.loads((tmp_path / "e.json").read_text())["ood"]["auroc_mutual_info"]
    assert auroc < 0.5, auroc
    warnings = [line for line in r.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"MI-AUROC {auroc:.3f} is below 0.5, worse than chance" in flat(r.output), r.output
    assert "disagree less on the OOD inputs" in flat(r.output)
    r = run("eval", model, "--data", tmp_path / "in.npz", "--ood-data", tmp_path / "far.npz")
    assert r.exit_code == 0 and "warning:" not in r.output, r.output


@pytest.mark.parametrize("command", ["eval", "profile", "compare", "demo", "search"])
def test_every_option_of_the_measuring_commands_has_help(command):
    """profile --batch and demo --seed had none; --help of these commands explains every option."""
    options = [p for p in main.commands[command].params if isinstance(p, click.Option)]
    assert options and all((p.help or "").strip() for p in options), [p.opts for p in options if not p.help]


def _arrays(tmp_path, n: int = 60):
    import numpy as np

    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(n, 5)).astype(np.float32), y=rng.integers(0, 4, n))
    return tmp_path / "d.npz"


def test_progress_is_lines_on_stderr_when_not_a_terminal(tmp_path, monkeypatch):
    """Under CliRunner (a pipe) the bars are lines on stderr once a step runs past the grace time (0 here): a
    'running' line, one per tenth of a long step (99 null pairs: the first, 9 tenths, the last), a done line, each
    with the elapsed time; stdout keeps only the report. Within the grace time (the default 10 s) nothing: an early
    error stays alone."""
    import re

    from edgebnn.cli._common import _ProgressLines

    model = ir.save(synthetic_linear(), tmp_path / "m.ebnn")
    data = str(_arrays(tmp_path))
    r = CliRunner().invoke(main, ["eval", str(model), "-S", "2", "--data", data])
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    monkeypatch.setattr(_ProgressLines, "GRACE_S", 0.0)
    r = CliRunner().invoke(main, ["compare", str(model), str(model), "--data", data])
    assert r.exit_code in (0, 3), r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("comparing: simulated null pairs: ")]
    assert re.fullmatch(r".*: running for \d+\.\d s", lines[0]) and re.search(r": done in \d+\.\d s$", lines[-1])
    steps = lines[1:-1]
    assert 10 <= len(steps) <= 11 and all(re.search(r": \d+/99 \(\d+\.\d s\)$", s) for s in steps), steps
    assert "comparing" not in r.stdout
    r = CliRunner().invoke(main, ["eval", str(model), "-S", "2", "--data", data])
    lines = r.stderr.splitlines()
    assert lines[0].startswith("evaluating m.ebnn: running for ") and lines[1].startswith("evaluating m.ebnn: 60/60 ")
    assert re.fullmatch(r"evaluating m\.ebnn: done in \d+\.\d s", lines[-1]) and len(lines) == 3, lines


def test_an_interrupted_search_says_how_to_resume(tmp_path, monkeypatch):
    import edgebnn.search

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(edgebnn.search, "run_search", interrupted)
    model = ir.save(synthetic_linear(), tmp_path / "m.ebnn")
    study = tmp_path / "s.study.jsonl"
    r = CliRunner().invoke(main, ["search", str(model), "--data", str(_arrays(tmp_path)), "--study", str(study)])
    assert r.exit_code == 130, r.output
    line = flat(r.stderr)
    assert f"interrupted: the trials finished so far are kept in the study {study}" in line, line
    assert f"re-run the same command (with --study {study}) to resume" in line
    assert "no artifact was written" not in line


def test_export_shows_its_layers_and_bytes_written_on_stderr_and_keeps_the_json_report_clean(tmp_path, monkeypatch):
    """export's progress: the layers rewritten, then the bytes written (rising to the file's size), as lines on
    stderr under a pipe (past the grace time: 0 here); stdout and the --json report hold none of it."""
    import json
    import re

    from synthetic import synthetic_cnn

    from edgebnn.cli._common import _ProgressLines

    model = ir.save(synthetic_cnn(), tmp_path / "m.ebnn")
    out, report = tmp_path / "m.onnx", tmp_path / "m.json"
    r = CliRunner().invoke(main, ["export", str(model), "--mode", "baked", "-S", "4", "-o", str(out),
                                  "--json", str(report)])
    assert r.exit_code == 0 and r.stderr == "", r.stderr  # within the grace time (10 s off a terminal): no lines
    monkeypatch.setattr(_ProgressLines, "GRACE_S", 0.0)
    r = CliRunner().invoke(main, ["export", str(model), "--mode", "baked", "-S", "4", "-o", str(out),
                                  "--json", str(report)])
    assert r.exit_code == 0, r.output
    layers = [line for line in r.stderr.splitlines() if line.startswith("exporting the ensemble, S=4: layers: ")]
    done = [int(m.group(1)) for line in layers if (m := re.search(r": (\d+)/2 \(", line))]
    assert done == [1, 2] and re.search(r": done in \d+\.\d s$", layers[-1]), layers  # its conv and fc, then done
    written = [line for line in r.stderr.splitlines() if line.startswith(f"writing {out}: ")]
    sizes = [float(m.group(1)) for line in written if (m := re.search(r": (\d+\.\d) KiB of ", line))]
    assert len(sizes) > 2 and sizes == sorted(sizes) and re.search(r": done in \d+\.\d s$", written[-1]), written
    assert "exporting" not in r.stdout and "writing" not in r.stdout
    doc = json.loads(report.read_text())  # the report: the schema's keys, no progress text anywhere
    assert doc["deployed"]["file_bytes"] == out.stat().st_size
    assert "exporting" not in report.read_text() and "writing" not in report.read_text()


def test_a_terminal_bar_shows_only_once_a_step_runs_past_its_grace_time(monkeypatch):
    """On a terminal the bar is rich's; a step quicker than BAR_GRACE_S (2 s; 0.3 s here) draws nothing."""
    import io
    import time

    from edgebnn.cli import _common

    buf = io.StringIO()
    monkeypatch.setattr(_common, "err_console", Console(file=buf, force_terminal=True, width=100))
    monkeypatch.setattr(_common, "BAR_GRACE_S", 0.3)
    with _common._progress_bar("quick step") as update:
        update(1, 2)
    assert buf.getvalue() == ""
    with _common._progress_bar("writing m.onnx", unit="bytes") as update:
        for i in range(1, 9):
            update(i * 100_000, 800_000)
            time.sleep(0.1)
    assert "writing m.onnx" in buf.getvalue() and "kB" in buf.getvalue()
