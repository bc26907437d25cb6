"""The README and the guides in docs/ are tests: every command and Python snippet in README.md and in the guides
docs/ holds runs, in order, as a reader types it, and what it prints that a reader can check is checked; a page that
drifts from the code fails here.

How a line is read and filled is :mod:`readme_harness` (optional parts typed, the first of ``a|b``, ``...`` from
the command above, a few options set smaller so a page runs in seconds: :data:`readme_harness.SMALL`). Each ``## ``
section of README.md, and every page of docs/ not in :data:`DOCS_NOT_RUN` (a guide is followed top to bottom), runs
in its own folder, in order, as one test (a README section or a guide added is a new test); what a reader brings is
made by :class:`Reader` the way a reader would have it: the trained digits weights are the demo's (``make demo``
runs first), ``val.npz``/``test.npz`` the digits splits, ``ood.npz`` the test digits upside down and inverted,
``my/module.py`` a module with the factories the pages name, fitted to the input shapes they give them (trained
briefly where the commands measure the model: :data:`TRAINED`). A file no command writes and no reader would have
fails the test, naming the line.

The pages not run are in :data:`DOCS_NOT_RUN`, each with its reason: the contracts (docs/design.md), and pages whose
commands are benchmarks or training runs of minutes; docs/results/ holds measurements, not steps to follow. Their
commands are checked all the same. What cannot run here is said in the tables below, each with its reason, and the
tables are checked to be short and used: make targets that run this suite, ssh to a Jetson, a Ray cluster, running
an engine (no GPU: the command runs and its one-line refusal is checked), scripts of minutes. Every ``edgebnn``
command in README.md and docs/ (results included), in a fenced block or quoted in a sentence, run or not, is checked
against the CLI: its subcommand and every ``--option`` it or its comments name exist; every script a page runs or
quotes exists with the flags the line gives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest
import readme_harness as harness
from click.testing import CliRunner
from scripts import script_module

from edgebnn.cli import main
from edgebnn.cli._paths import InputPath, OutputPath

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
"""Every page of docs/, results included: their commands are checked against the CLI."""
DOCS_NOT_RUN = {
    "design.md": "the contracts: its commands are benchmarks, which docs/results/ records",
    "speed.md": "its commands are latency benchmarks of minutes (bench/ensemble_latency.py, bench/layer_kernels.py)",
    "uncertainty.md": "its commands are benchmarks that train and evaluate every scheme and mode: minutes",
    "recipes.md": "its commands train the papers' recipes (minutes each); tests/integration/test_recipes.py runs them "
                  "at a smaller size",
}
"""docs/ pages whose sections are not run, and why (docs/results/ is never run: measurements, not steps)."""
PYTHON_NOT_RUN = {
    "docs/extending.md": "excerpts of examples/plugin's modules, not a script: "
                         "tests/integration/test_plugin_example.py runs the installed package through every command",
}
"""Pages whose ```python blocks are not run, and why (their shell commands are)."""
RUN_PAGES = [README, *(p for p in DOCS if p.parent.name == "docs" and p.name not in DOCS_NOT_RUN)]

MAKE_RUNS = {"demo": "edgebnn demo"}
"""make targets whose recipe the test runs (the edgebnn command the dry run prints)."""
MAKE_DRY_ONLY = {"test": "runs this very suite (and the linters)", "test-fast": "runs the unit lane of this suite",
                 "lint": "the linters: make test runs them first, before this suite (CI: .ci/run)",
                 "install": "pip installs into .venv: the test runs in the installed environment",
                 "fuzz": "10,000 mutants: minutes", "bench": "a benchmark: minutes"}
"""make targets only dry-run (``make -n``: the rule exists), and why."""
EXPECTED_REFUSALS = {
    r"^edgebnn profile \S+ --device jetson --engine (\S+)": (
        "engine file not found ({}.manifest.json is a dry run's",
        "a Jetson engine is built on the board from the dry run's trtexec command; none exists here"),
}
"""Commands that need hardware this machine lacks: they run, and must refuse in one line for this reason."""
PLACEHOLDER_ARTIFACTS = {"seg.onnx": "a segmentation export the reader made (the README shows its eval only)"}
"""Artifacts a line reads that no README command writes, which the reader is taken to have, and why."""
NOT_RUN_SCRIPTS = {"pip"}
"""Command words not run: pip installs from the network."""
NOT_RUN_COMMANDS = {r"--ray-address HEAD:": "needs a Ray cluster: ray start on the machines the page names"}
"""Commands not run (a pattern of the command as written), and why: they are checked against the CLI all the same."""
SLOW_SCRIPTS = {"tests/fuzz/campaign.py": "1,000 mutants take minutes; tests/fuzz runs a seeded corpus of them"}
"""Scripts a page runs that are not run here, and why (they exist with their flags: checked)."""
RUN_ELSEWHERE = {
    "examples/deploy_mc_dropout.py": ("tests/integration/test_mc_dropout.py", "test_deploy_example_meets_the_goals"),
}
"""Scripts the README runs that another test runs as written, checking more than this one would (the test is named
and checked to run the script)."""

RATIO = re.compile(r"([\d,]+) bytes\): (\d+\.\d+)x (smaller|larger) than the (fp32 BNN|\.ebnn) "
                   r"\(([\d.]+) (B|KiB|MiB)\)")
UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2}


@dataclass
class Ran:
    step: harness.Step
    argv: list[str]
    output: str
    exit_code: int
    outputs: list[Path] = field(default_factory=list)

    @property
    def flat(self) -> str:
        return " ".join(self.output.split())  # a console of 80 columns wraps long lines


# -- what a reader brings ----------------------------------------------------------------------------------

MODULE_HEAD = """import torch
from torch import nn

from edgebnn.nn import BayesLinear
"""
FACTORIES = {
    # name: (input dims it is written for, source template using {c}, {h}, {w} / {n}): a reader's own models
    "plain_cnn": (3, "def plain_cnn():\n    return nn.Sequential(nn.Conv2d({c}, 8, 3, padding=1), nn.ReLU(), "
                     "nn.Dropout2d(0.2), nn.MaxPool2d(2), nn.Flatten(), nn.Linear({flat}, 32), nn.ReLU(), "
                     "nn.Dropout(0.3), nn.Linear(32, 10))\n"),
    "regressor": (1, "def regressor():\n    return nn.Sequential(BayesLinear({n}, 16), nn.ReLU(), "
                     "BayesLinear(16, 2))\n"),
    "mlp": (3, "def mlp():\n    return nn.Sequential(nn.Flatten(), nn.Linear({chw}, 32), nn.ReLU(), "
               "nn.Linear(32, 10))\n"),
    "five_mlps": (3, "def five_mlps():\n    return [nn.Sequential(nn.Flatten(), nn.Linear({chw}, 32), nn.ReLU(), "
                     "nn.Linear(32, 10)) for _ in range(5)]\n"),
    # a bayesian-torch CNN whose layers and forward return (out, kl): the README's own model
    "bayes_cnn": (3, "from bayesian_torch.layers import Conv2dReparameterization, LinearReparameterization\n\n\n"
                     "class BayesCNN(nn.Module):\n"
                     "    def __init__(self):\n"
                     "        super().__init__()\n"
                     "        self.conv = Conv2dReparameterization({c}, 8, 3, padding=1)\n"
                     "        self.fc1 = LinearReparameterization({flat}, 32)\n"
                     "        self.fc2 = LinearReparameterization(32, 10)\n\n"
                     "    def forward(self, x):\n"
                     "        x, kl1 = self.conv(x)\n"
                     "        x, kl2 = self.fc1(torch.flatten(torch.max_pool2d(torch.relu(x), 2), 1))\n"
                     "        x, kl3 = self.fc2(torch.relu(x))\n"
                     "        return x, kl1 + kl2 + kl3\n\n\n"
                     "def bayes_cnn():\n    return BayesCNN()\n"),
    # a ViT whose encoder's MLP blocks are bayesian-torch layers (docs/your-model.md, "Transformers")
    "bayes_vit": (3, "from bayesian_torch.layers import LinearReparameterization\n\n\n"
                     "class BayesViT(nn.Module):\n"
                     "    def __init__(self):\n"
                     "        super().__init__()\n"
                     "        self.patch = nn.Linear({c} * 16, 32)\n"
                     "        self.cls = nn.Parameter(torch.zeros(1, 1, 32))\n"
                     "        self.pos = nn.Parameter(torch.zeros(1, {h} // 4 * ({w} // 4) + 1, 32))\n"
                     "        block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation='gelu', "
                     "batch_first=True, norm_first=True)\n"
                     "        self.encoder = nn.TransformerEncoder(block, 2, enable_nested_tensor=False)\n"
                     "        for layer in self.encoder.layers:\n"
                     "            layer.linear1 = LinearReparameterization(32, 64)\n"
                     "            layer.linear2 = LinearReparameterization(64, 32)\n"
                     "            layer.linear1.dnn_to_bnn_flag = layer.linear2.dnn_to_bnn_flag = True\n"
                     "        self.head = nn.Linear(32, 10)\n\n"
                     "    def forward(self, x):\n"
                     "        b = x.shape[0]\n"
                     "        p = x.reshape(b, {c}, {h} // 4, 4, {w} // 4, 4).permute(0, 2, 4, 1, 3, 5)"
                     ".reshape(b, -1, {c} * 16)\n"
                     "        t = torch.cat([self.cls.expand(b, -1, -1), self.patch(p)], 1) + self.pos\n"
                     "        return self.head(self.encoder(t)[:, 0])\n\n\n"
                     "def bayes_vit():\n    return BayesViT()\n"),
}
TRAINED = {"bayes_cnn": 30}
"""Factories whose weights a reader has trained (epochs of ELBO on the digits train split, a few seconds), where the
README's commands measure them (``--budget`` certifies on what the model predicts); the others' weights are their
seeded initialisation: the commands that read them only run them."""


def digits_split(name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """What a reader's ``train.npz``/``val.npz``/``calib.npz``/``test.npz``/``ood.npz`` hold, for the digits CNN."""
    from edgebnn.data import digits

    data = digits(0)
    stem = Path(name).stem
    if stem.startswith("ood"):  # the test digits upside down and inverted (examples/deploy_bayesian_torch.py)
        x = data.split("test")[0]
        return np.ascontiguousarray(1.0 - x[:, :, ::-1, :]), None
    split = "train" if stem.startswith("train") else "test" if stem.startswith("test") else "val"
    return data.split(split)


class Reader:
    """Follows the README section by section; makes what a reader brings (module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._weights: Path | None = None
        self.ran: list[Ran] = []
        self.refusals_used: set[str] = set()
        self.seconds: dict[str, float] = {}  # per README line: what a slow run spends its time on (-s prints it)
        self.done: list[list[str]] = []
        self.sections: set[str] = set()  # the sections run to their end
        self.not_run_used: set[str] = set()  # NOT_RUN_COMMANDS and SLOW_SCRIPTS that matched a line
        self.demos: dict[tuple[str, ...], Path] = {}  # an edgebnn demo argv -> the --out folder it wrote

    # the demo's trained digits CNN: "your trained weights" wherever the README's digits CNN needs some
    def digits_weights(self) -> Path:
        if self._weights is None:
            folder = self.root / "demo"
            folder.mkdir(exist_ok=True)
            with _chdir(folder):
                r = CliRunner().invoke(main, ["demo", "--out", "demo-out", "--runs", "20"], catch_exceptions=False)
            assert r.exit_code == 0, r.output
            self._weights = folder / "demo-out" / "digits_cnn.safetensors"
        return self._weights

    def adopt_demo(self, folder: Path) -> None:
        weights = folder / "demo-out" / "digits_cnn.safetensors"
        if self._weights is None and weights.is_file():
            self._weights = weights

    # -- a section -------------------------------------------------------------------------------------

    def run_section(self, name: str, steps: list[harness.Step]) -> None:
        folder = self.root / re.sub(r"\W+", "-", name).strip("-").lower()
        python = steps[0].doc not in PYTHON_NOT_RUN if steps else True
        folder.mkdir()
        for mod in [m for m in sys.modules if m == "my" or m.startswith("my.")]:
            del sys.modules[mod]
        self._module(folder, steps)
        previous: dict[str, list[str]] = {}
        self.done: list[list[str]] = []  # a command run twice in a section (make demo, then edgebnn demo) runs once
        with _chdir(folder):
            for step in steps:
                if step.kind == "python":
                    if python:
                        self._snippet(step, folder)
                    continue
                filled = harness.fill(step, previous)
                argv = filled.argv
                if argv[0] == "edgebnn" and len(argv) > harness.sub_index(argv):
                    previous[argv[harness.sub_index(argv)]] = argv  # what the next "..." of this command copies
                self._command(step, argv, folder, filled.env)

    def _module(self, folder: Path, steps: list[harness.Step]) -> None:
        """``my/module.py`` with the factories the section names, for the input shapes it gives them."""
        wanted: dict[str, tuple[int, ...]] = {}
        for step in steps:
            if step.kind != "shell":
                continue
            text = step.text
            for m in re.finditer(r"--model my\.module:(\w+)", text):
                shape = re.search(r"--input-shape ([\d,]+)", text)
                wanted[m.group(1)] = tuple(int(v) for v in shape.group(1).split(",")[1:]) if shape else (1, 8, 8)
        if not wanted:
            return
        source = MODULE_HEAD
        for name, dims in wanted.items():
            assert name in FACTORIES, f"README names my.module:{name}: add the reader's model to FACTORIES"
            rank, template = FACTORIES[name]
            assert len(dims) == rank, f"my.module:{name} for input {dims}: the template takes {rank} dims"
            if rank == 3:
                c, h, w = dims
                source += "\n\n" + template.format(c=c, h=h, w=w, flat=8 * (h // 2) * (w // 2), chw=c * h * w)
            else:
                source += "\n\n" + template.format(n=dims[0])
        (folder / "my").mkdir()
        (folder / "my" / "__init__.py").write_text("")
        (folder / "my" / "module.py").write_text(source)

    def _provide(self, argv: list[str], command: click.Command, where: str) -> None:
        """Make the inputs of an ``edgebnn`` command that no earlier command wrote, as a reader would have them."""
        sub = harness.sub_index(argv)
        ctx = command.make_context(argv[sub], argv[sub + 1 :], resilient_parsing=True)
        params = ctx.params
        for param in command.params:
            if not isinstance(param.type, InputPath):
                continue
            value = params.get(param.name or "")
            for path in (value if isinstance(value, tuple) else (value,)):
                if path is None or str(path) in param.type.keywords or Path(path).exists():
                    continue
                self._make(Path(path), param.name or "", params, argv[sub], where)

    def _make(self, path: Path, option: str, params: dict[str, Any], command: str, where: str) -> None:
        import torch
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)  # demo-out/digits_cnn.safetensors: what make demo wrote
        if option == "weights":
            spec = str(params["model_spec"])
            if spec == "edgebnn.models:digits_cnn":
                shutil.copy(self.digits_weights(), path)
                return
            assert spec.startswith("my.module:"), f"{where}: weights for {spec}: what would the reader have?"
            factory = _factory(spec)
            torch.manual_seed(0)
            model = factory()
            model = torch.nn.ModuleList(model) if isinstance(model, list) else model
            name = spec.split(":")[1]
            if name in TRAINED:
                _train_elbo(model, TRAINED[name])
            state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
            if path.suffix in (".pt", ".pth"):  # torch.save(model.state_dict(), ...), as the README says
                torch.save(state, path)
            else:
                save_file(state, str(path))
            return
        if option == "laplace_state":
            self._laplace(path, params)
            return
        if path.suffix == ".npz":
            shape, task = self._consumer(params, command)
            self._data(path, shape, task, labels=option not in ("ood_data", "calibrate_data"))
            return
        assert path.name in PLACEHOLDER_ARTIFACTS, (
            f"{where}: reads {path}, which no command above writes and a reader is not told how to make")
        _segmentation_export(path)

    def _consumer(self, params: dict[str, Any], command: str) -> tuple[tuple[int, ...], str]:
        """The input shape and task of the model a data file is for."""
        if command == "lower":
            shape = tuple(int(v) for v in str(params["input_shape"]).split(",")[1:])
            return shape, str(params.get("task") or "classification")
        artifact = next(str(params[k]) for k in ("artifact", "model", "file", "a") if params.get(k))
        if not Path(artifact).exists():
            self._make(Path(artifact), "artifact", params, command, artifact)
        if artifact.endswith(".onnx"):
            from edgebnn.runtime.session import read_export

            meta = read_export(artifact)[1]
            return tuple(meta.input_shape[1:]), str(meta.task or "classification")
        from edgebnn import ir

        manifest = ir.load(artifact).manifest
        return tuple(manifest.input_shape[1:]), str(getattr(manifest, "task", None) or "classification")

    def _data(self, path: Path, shape: tuple[int, ...], task: str, *, labels: bool) -> None:
        if shape == (1, 8, 8) and task == "classification":
            x, y = digits_split(path.name)
        else:  # a reader's own data of the model's shape: the values do not matter to the commands
            rng = np.random.default_rng(0)
            x = rng.uniform(0, 1, (48, *shape)).astype(np.float32)
            y = (rng.normal(size=(48, 1)).astype(np.float32) if task == "regression" else
                 rng.integers(0, 3, (48, *shape[1:])) if task in ("segmentation", "dense") else
                 rng.integers(0, 10, 48))
        if labels and y is not None:
            np.savez(path, x=x, y=y)
        else:
            np.savez(path, x=x)

    def _laplace(self, path: Path, params: dict[str, Any]) -> None:
        """``torch.save(la.state_dict(), "la.pt")`` after ``la.fit`` on the MAP network of ``--weights``."""
        import torch
        from laplace import Laplace
        from safetensors.torch import load_file
        from torch.utils.data import DataLoader, TensorDataset

        from edgebnn.data import digits

        weights = Path(str(params["weights"]))
        if not weights.exists():
            self._make(weights, "weights", params, "lower", str(path))
        net = _factory(str(params["model_spec"]))()
        net.load_state_dict(load_file(str(weights)))
        data = digits(0)
        la = Laplace(net, "classification", subset_of_weights="last_layer", hessian_structure="kron")
        la.fit(DataLoader(TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
                          batch_size=256))
        torch.save(la.state_dict(), path)

    # -- steps -----------------------------------------------------------------------------------------

    def _snippet(self, step: harness.Step, folder: Path) -> None:
        import torch
        from safetensors.torch import load_file

        from edgebnn.models import digits_cnn

        assert "(1, 1, 8, 8)" in step.text, f"{step.where}: the snippet's model is the digits CNN here"
        model = digits_cnn()
        model.load_state_dict(load_file(str(self.digits_weights())))
        model.eval()
        for name in re.findall(r"\"([\w-]+\.npz)\"", step.text):
            if not Path(name).exists():
                self._data(Path(name), (1, 8, 8), "classification", labels=not name.startswith("ood"))
        x = digits_split("test.npz")[0][:8]
        namespace: dict[str, Any] = {"model": model, "x": x, "torch": torch}
        exec(compile(step.text, step.where, "exec"), namespace)  # the README's own snippet
        for name in re.findall(r"\"([\w-]+\.(?:ebnn|onnx|png))\"", step.text):
            assert (folder / name).is_file(), f"{step.where}: the snippet writes {name}"
        pred = namespace.get("pred")
        if pred is not None:  # pred.probs [B, K], pred.entropy, pred.mutual_info, as the comment says
            assert pred.probs.shape == (len(x), 10) and pred.entropy.shape == pred.mutual_info.shape == (len(x),)
        report = namespace.get("report")
        if isinstance(report, dict):
            assert report["accuracy"] > 0.9 and "ood" in report, report

    def _command(self, step: harness.Step, argv: list[str], folder: Path, env: dict[str, str]) -> None:
        import time

        start = time.perf_counter()
        try:
            self._run(step, argv, folder, env)
        finally:
            self.seconds[step.where] = time.perf_counter() - start

    def _run(self, step: harness.Step, argv: list[str], folder: Path, env: dict[str, str]) -> None:
        word = argv[0]
        if word in NOT_RUN_SCRIPTS:
            return
        skip = next((p for p in (*NOT_RUN_COMMANDS, *SLOW_SCRIPTS) if re.search(p, step.text)), None)
        if skip is not None:  # checked against the CLI by test_every_documented_command_names_options_that_exist
            self.not_run_used.add(skip)
            return
        if word == "make":
            self._make_target(step, argv[1], folder)
        elif word == "edgebnn":
            self._edgebnn(step, argv, folder, env)
        else:
            self._script(step, argv, folder)

    def _make_target(self, step: harness.Step, target: str, folder: Path) -> None:
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=False)
        assert dry.returncode == 0, f"{step.where}: make {target}: {dry.stderr.strip()}"
        if target in MAKE_RUNS:
            line = next(line for line in dry.stdout.splitlines() if MAKE_RUNS[target] in line)
            edgebnn_argv = ["edgebnn", *line.split("/bin/edgebnn", 1)[1].split()]
            self._edgebnn(step, harness.fill(harness.Step(step.doc, step.line, step.section, "shell",
                                                          " ".join(edgebnn_argv)), {}).argv, folder)
            self.adopt_demo(folder)
        else:
            assert target in MAKE_DRY_ONLY, f"{step.where}: make {target}: add it to MAKE_RUNS or MAKE_DRY_ONLY"

    def _script(self, step: harness.Step, argv: list[str], folder: Path) -> None:
        script = next(a for a in argv if a.endswith(".py"))
        args = argv[argv.index(script) + 1 :]
        if script in RUN_ELSEWHERE:
            path, test = RUN_ELSEWHERE[script]
            source = (ROOT / path).read_text()
            assert f"def {test}(" in source and Path(script).name in source, (step.where, RUN_ELSEWHERE[script])
            assert all(a == "--out" or not a.startswith("--") for a in args), (
                f"{step.where}: {script} is run by {path} with --out only; the README gives it more: run it here")
            return
        for i, arg in enumerate(args):  # the reader's own data files the example reads (--train train.npz ...)
            if arg.endswith(".npz") and not Path(arg).exists() and i and args[i - 1] != "--out":
                x, y = digits_split(arg)
                np.savez(arg, **({"x": x} if y is None else {"x": x, "y": y}))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, str(ROOT / script), *args], cwd=folder, capture_output=True,
                              text=True, env=env, timeout=600, check=False)
        assert proc.returncode == 0, f"{step.where}: {' '.join(argv)}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        last = [line for line in proc.stdout.splitlines() if line.strip()][-1]
        json.loads(last)  # the examples print their result as the last JSON line (README)
        for flag in ("--out",):
            if flag in args:
                assert (folder / args[args.index(flag) + 1]).is_dir(), f"{step.where}: {flag} folder not written"
        self.ran.append(Ran(step, argv, proc.stdout + proc.stderr, 0))

    def _edgebnn(self, step: harness.Step, argv: list[str], folder: Path, env: dict[str, str] | None = None) -> None:
        if argv in self.done:
            return
        self.done.append(argv)
        command = main.commands[argv[harness.sub_index(argv)]]
        if self._demo_again(step, argv, folder):
            return
        check_options(step, argv)
        text = " ".join(argv)
        refusal = next(((p, m, says) for p, (says, _why) in EXPECTED_REFUSALS.items()
                        for m in [re.search(p, text)] if m), None)
        if refusal is None:  # a command that must refuse is given what the README gives it, nothing more
            self._provide(argv, command, step.where)
        outputs = _outputs(argv, command)
        r = CliRunner().invoke(main, argv[1:], catch_exceptions=False, env=env or None)
        ran = Ran(step, argv, r.output, r.exit_code, outputs)
        self.ran.append(ran)
        if refusal is not None:
            pattern, m, says = refusal
            self.refusals_used.add(pattern)
            lines = [line for line in r.output.splitlines() if line.strip()]
            assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (step.where, r.output)
            assert says.format(*m.groups()) in ran.flat, (step.where, r.output)
            return
        # compare's documented exit status 3: the test cannot tell at this S (its verdict says what would)
        assert r.exit_code == 0 or (r.exit_code == 3 and argv[1] == "compare"), f"{step.where}: {text}\n{r.output}"
        assert "Traceback" not in r.output and "error:" not in r.output, (step.where, r.output)
        for path in outputs:
            assert path.exists(), f"{step.where}: {text} did not write {path}"
            if path.suffix == ".json" and not path.name.endswith(".manifest.json"):  # every --json/--report
                assert {"schema", "edgebnn_version"} <= set(json.loads(path.read_text())), (step.where, path)
        check_ratios(ran)
        for pattern, claim in CLAIMS:
            if re.search(pattern, text):
                claim(ran)


    def _demo_again(self, step: harness.Step, argv: list[str], folder: Path) -> bool:
        """A demo run as an earlier section ran it: its outputs copied, not trained again (30 s a run; the first run
        was checked). Returns whether it was one."""
        if argv[harness.sub_index(argv)] != "demo" or "--out" not in argv:
            return False
        out = argv[argv.index("--out") + 1]
        key = tuple(argv)
        if key not in self.demos:
            self.demos[key] = folder / out
            return False
        shutil.copytree(self.demos[key], folder / out, dirs_exist_ok=True)
        with _chdir(folder):
            _demo_files()
        return True

@contextlib.contextmanager
def _chdir(folder: Path):
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _factory(spec: str) -> Any:
    import importlib

    module, name = spec.split(":")
    importlib.invalidate_caches()
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return getattr(importlib.import_module(module), name)
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(Path.cwd()))


def _train_elbo(model: Any, epochs: int) -> None:
    """Train a model whose forward returns ``(logits, kl)`` on the digits train split: cross-entropy + kl / N."""
    import torch

    from edgebnn.data import digits

    x, y = (torch.from_numpy(a) for a in digits(0).split("train"))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # batches of 64 on a tiny CNN: 2 threads on a loaded 2-core machine took 10x longer
    try:
        for _ in range(epochs):
            for idx in torch.randperm(len(x)).split(64):
                out, kl = model(x[idx])
                loss = torch.nn.functional.cross_entropy(out, y[idx].long()) + kl / len(x)
                opt.zero_grad()
                loss.backward()
                opt.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()


def _segmentation_export(path: Path) -> None:
    """A reader's segmentation export: a Bayesian 1x1 conv head on 8x8 images, 3 classes, S = 8."""
    import torch

    import edgebnn
    from edgebnn.nn import BayesConv2d

    torch.manual_seed(0)
    net = torch.nn.Sequential(BayesConv2d(1, 4, 3, padding=1), torch.nn.ReLU(), BayesConv2d(4, 3, 1))
    edgebnn.export(edgebnn.from_torch(net, (1, 1, 8, 8), task="segmentation"), path, samples=8)


def _outputs(argv: list[str], command: click.Command) -> list[Path]:
    """The files the command says it writes (its OutputPath options and their companions)."""
    sub = harness.sub_index(argv)
    ctx = command.make_context(argv[sub], argv[sub + 1 :], resilient_parsing=True)
    found = []
    for param in command.params:
        if isinstance(param.type, OutputPath) and ctx.params.get(param.name or ""):
            path = str(ctx.params[param.name or ""])
            companions = [Path(c) for c in param.type.companions(path, ctx.params)] if param.type.companions else []
            dry = bool(companions) and bool(ctx.params.get("dry_run"))  # a dry run writes the companions only
            found += [*([] if dry else [Path(path)]), *companions]
    return found


def check_options(step: harness.Step, argv: list[str]) -> None:
    """The subcommand exists, and so does every option the line, its brackets and its comments name."""
    sub = harness.sub_index(argv)
    name = argv[sub] if len(argv) > sub else ""
    assert name in main.commands, f"{step.where}: edgebnn {name}: no such command"
    group = {o for p in main.params for o in (*p.opts, *p.secondary_opts)}
    assert all(a in group for a in argv[1:sub] if a.startswith("-")), (step.where, argv[1:sub])
    for owner, option in [(name, a) for a in argv[sub:] if a.startswith("--")] + harness.options_in(step.comment):
        command = main.commands.get(owner or name)
        assert command is not None, f"{step.where}: edgebnn {owner}: no such command"
        known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"} | group
        assert option in known, f"{step.where}: {option} is not an option of edgebnn {owner or name}"


def check_ratios(ran: Ran) -> None:
    """Every "N.NNx smaller/larger than the fp32 BNN (R)" with its byte count: the word and the figure are right."""
    for m in RATIO.finditer(ran.flat):
        size = int(m.group(1).replace(",", ""))
        ratio, word = float(m.group(2)), m.group(3)
        reference = float(m.group(5)) * UNITS[m.group(6)]
        assert ratio >= 1.0, (ran.step.where, m.group(0))
        assert (word == "smaller") == (reference >= size), (ran.step.where, m.group(0))
        true = max(reference, size) / min(reference, size)
        assert abs(true - ratio) <= 0.01 * true + 0.01, (ran.step.where, m.group(0), true)
    for m in re.finditer(r"(\d+(?:\.\d+)?)x (smaller|larger)", ran.flat):
        assert float(m.group(1)) >= 1.0, (ran.step.where, m.group(0))


# -- what the README says each command does ------------------------------------------------------------


def _default_export(ran: Ran) -> None:
    # "cpu: the IR's codes in one self-contained noise graph"
    assert "mode: noise (the default on cpu: the IR's codes in one graph)" in ran.flat
    assert "graph inputs: 1 (the data): self-contained, runs on the data alone" in ran.flat


def _engine(ran: Ran) -> None:
    engine = next(p for p in ran.outputs if p.suffix == ".engine")
    assert engine.read_bytes()[:4] == b"vtrt"  # a TensorRT-RTX engine (docs/tensorrt.md)
    manifest = json.loads(Path(f"{engine}.manifest.json").read_text())
    assert manifest["device"] == "rtx" and manifest["engine"] == engine.name and not manifest["dry_run"]


def _dry_run(ran: Ran) -> None:
    engine = Path(ran.argv[ran.argv.index("-o") + 1])
    assert "dry run: engine not built" in ran.flat and not engine.exists()
    assert json.loads(Path(f"{engine}.manifest.json").read_text())["dry_run"] is True


def _calibrated(ran: Ran) -> None:
    from edgebnn.runtime.session import read_export

    assert re.search(r"on (\d+) of \1 inputs", ran.flat), ran.flat  # every calibration input used
    meta = read_export(ran.argv[ran.argv.index("-o") + 1])[1]
    assert meta.precision == "int8" and meta.mode == "baked"


def _engine_of_export(ran: Ran) -> None:
    assert re.search(r"engine of \S+: baked, S=\d+, int8 \(\w+ calibration\), as exported", ran.flat), ran.flat
    _engine(ran)


def _same(ran: Ran) -> None:
    """compare's verdict: the same distribution, or 'cannot tell' with the difference its test detects."""
    assert "same predictive distribution" in ran.flat or "cannot tell" in ran.flat, ran.flat
    assert "the test detects" in ran.flat, ran.flat


def _faster(ran: Ran) -> None:
    # fixed S: "... faster than 16 sampled float-BNN passes"; anytime (per input): "... faster than the float BNN"
    m = re.search(r"(\d+\.\d+)x faster than (?:\d+ sampled float-BNN passes|the float BNN)", ran.flat)
    assert m and float(m.group(1)) > 1.0, ran.flat  # one graph beats S passes, on any load


def _budget(ran: Ran) -> None:
    assert re.search(r"deployed", ran.flat), ran.flat  # "prints the IR and the deployed bytes"


def _demo(ran: Ran) -> None:
    assert "stored as int8 + DequantizeLinear: edgebnn export --mode baked --weights int8 --form qdq" in ran.flat
    _demo_files()


def _demo_files() -> None:
    demo = json.loads(Path("demo-out/demo.json").read_text())
    # the compact artifact is the smallest file and smaller than the fp32 BNN's baked ensemble
    assert demo["compact_artifact_bytes"] < demo["small_artifact_bytes"] < demo["artifact_bytes"]
    from edgebnn.runtime.session import read_export

    for name in ("digits_cnn_S16.onnx", "digits_cnn_fixed_S16_int8.onnx", "digits_cnn_fixed_S16_noise.onnx"):
        assert read_export(f"demo-out/{name}")[1].input_range == (0.0, 1.0)  # every file the demo writes


CLAIMS = [
    (r"^edgebnn export \S+\.ebnn --target onnx(?!.*--mode)(?!.*--device (?!cpu))", _default_export),
    (r"^edgebnn export \S+\.ebnn --target tensorrt --device rtx", _engine),
    (r"--dry-run", _dry_run),
    (r"^edgebnn calibrate", _calibrated),
    (r"^edgebnn export \S+\.onnx --target tensorrt --device rtx", _engine_of_export),
    (r"^edgebnn compare", _same),
    (r"^edgebnn profile .*--device cpu", _faster),
    (r"^edgebnn profile \S+ --onnx", _faster),
    (r"^edgebnn lower .*--budget", _budget),
    (r"^edgebnn demo", _demo),
]


# -- the tests -------------------------------------------------------------------------------------------


def _page(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _sections() -> dict[str, list[harness.Step]]:
    """README.md's ``## `` sections (``README.md: SECTION``), each run on its own, then each docs/ page that runs
    (``docs/PAGE.md``), run whole: a guide's later sections use what its earlier ones wrote, as its reader does."""
    found: dict[str, list[harness.Step]] = {}
    for path in RUN_PAGES:
        for step in harness.steps(path, _page(path)):
            key = f"{step.doc}: {step.section}" if path == README else step.doc
            found.setdefault(key, []).append(step)
    return found


SECTIONS = _sections()


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    return Reader(tmp_path_factory.mktemp("readme"))


@pytest.mark.parametrize("section", list(SECTIONS))
def test_readme_section_runs_as_written(section, reader):
    reader.run_section(section, SECTIONS[section])
    reader.sections.add(section)
    slowest = sorted(((t, w) for w, t in reader.seconds.items() if w in {s.where for s in SECTIONS[section]}),
                     reverse=True)[:5]
    print(f"{section}: " + ", ".join(f"{w} {t:.1f} s" for t, w in slowest))


def test_the_tables_of_what_cannot_run_are_short_and_used(reader):
    """Run after the sections (file order): every expected refusal, command not run and placeholder matched a line
    of a page that runs; every page named in DOCS_NOT_RUN and PYTHON_NOT_RUN exists."""
    assert len(EXPECTED_REFUSALS) <= 3 and len(PLACEHOLDER_ARTIFACTS) <= 3
    assert len(NOT_RUN_COMMANDS) <= 3 and len(SLOW_SCRIPTS) <= 3
    assert all((ROOT / "docs" / name).is_file() for name in DOCS_NOT_RUN), DOCS_NOT_RUN
    assert all((ROOT / name).is_file() for name in PYTHON_NOT_RUN), PYTHON_NOT_RUN
    if reader.sections != set(SECTIONS):
        pytest.skip("the sections did not all run in this session (-k?)")
    assert set(EXPECTED_REFUSALS) <= reader.refusals_used, set(EXPECTED_REFUSALS) - reader.refusals_used
    assert {*NOT_RUN_COMMANDS, *SLOW_SCRIPTS} <= reader.not_run_used, (
        {*NOT_RUN_COMMANDS, *SLOW_SCRIPTS} - reader.not_run_used)
    texts = [" ".join(r.argv) for r in reader.ran]
    for name in PLACEHOLDER_ARTIFACTS:
        assert any(name in t for t in texts), f"PLACEHOLDER_ARTIFACTS: no command reads {name} any more"


def _all_commands() -> list[harness.Step]:
    found = []
    for path in (README, *DOCS):
        found += [s for s in harness.steps(path, _page(path)) if s.kind == "shell"]
    return found


def _check_script(where: str, argv: list[str], named: list[str]) -> None:
    """A script a page runs exists, and so does every flag the line (and ``named``: its comments) gives it."""
    script = next(a for a in argv if a.endswith(".py"))
    assert (ROOT / script).is_file(), f"{where}: no script {script}"
    source = (ROOT / script).read_text()
    for flag in [a for a in argv[argv.index(script) + 1 :] if a.startswith("--")] + named:
        assert f'"{flag}"' in source, f"{where}: {script} has no option {flag}"


@pytest.mark.parametrize("step", _all_commands(), ids=lambda s: s.where)
def test_every_documented_command_names_options_that_exist(step):
    """README.md and docs/ (results too): every edgebnn command's options exist; every script exists with its flags."""
    argv = harness.fill(step, {}).argv
    word = argv[0]
    if word == "edgebnn":
        check_options(step, argv)
    elif word.endswith("python") or word.startswith(".venv"):
        _check_script(step.where, argv, [o for _, o in harness.options_in(step.comment)])


INLINE_SCRIPT = re.compile(r"`(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:\.venv/bin/)?python3?\s+([^`]*\.py(?:\s[^`]*)?)`")


@pytest.mark.parametrize("path", [README, *DOCS], ids=_page)
def test_inline_commands_in_the_prose_name_options_that_exist(path):
    """`edgebnn COMMAND ...` and `python SCRIPT --flag ...` quoted in the sentences of README.md and docs/ (results
    too): the command and its options exist, the script and its flags exist."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    group = {o for p in main.params for o in (*p.opts, *p.secondary_opts)}
    for m in re.finditer(r"`(edgebnn (?:-[-\w]+ (?:[^\s`]+ )?)*[a-z]+[^`]*)`", text):
        words = m.group(1).split()
        sub = harness.sub_index(words)
        if words[sub] in ("COMMAND",):
            continue
        assert words[sub] in main.commands, f"{_page(path)}: `{m.group(1)}`"
        command = main.commands[words[sub]]
        known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"} | group
        for word in words[sub + 1 :]:
            if word.startswith("--"):
                assert word.split("=")[0] in known, f"{_page(path)}: `{m.group(1)}`: {word} is not an option"
    for m in INLINE_SCRIPT.finditer(text):
        argv = m.group(1).replace("[", " ").replace("]", " ").split()
        _check_script(_page(path), argv, [])


def test_documented_figures_are_what_the_commands_print_today(reader, tmp_path):
    """Every size and metric docs/export-modes.md and docs/demo.md quote from their commands (the default export,
    baked, the budget path, hoisting, the demo's table) within 10% of what those commands print on this machine
    today (``bench/readme_figures.py``, the command those pages name, measures them the same way)."""
    figures = script_module("bench/readme_figures.py")
    demo = reader.digits_weights().parent
    rows = figures.compare(figures.documents(ROOT), figures.measure(demo, tmp_path))
    missing = [f"{r['doc']}: {r['key']}" for r in rows if r["written"] is None]
    assert not missing, f"no longer stated: {missing}: update bench/readme_figures.py's FIGURES"
    off = [r for r in rows if not r["ok"]]
    assert not off, "documented figures more than 10% from today's: " + "; ".join(
        f"{r['doc']}: {r['key']}: written {r['written']:g}, today {r['measured']:.4g}" for r in off)


def test_the_readme_indexes_every_docs_page():
    """README.md's "Documentation" links every page of docs/ (and the results' index), and every link resolves."""
    text = README.read_text()
    index = text[text.index("## Documentation"):]
    index = index[: index.index("\n## ", 1)]
    linked = set(re.findall(r"\]\((docs/[^)#]+)\)", index))
    assert {_page(p) for p in DOCS if p.parent.name == "docs"} | {"docs/results/README.md"} <= linked, linked
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), f"README.md links {target}, which does not exist"
