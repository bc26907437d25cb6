"""What ``export --help`` and ``edgebnn.export``'s docstring say a graph takes and gives is what it does: the data
first, then (host noise) the ``noise/<weight>`` inputs the metadata lists; the task's outputs, and ``samples`` for
``--samples auto`` (issue 42: "one input and three outputs" was false for all three)."""

from __future__ import annotations

import onnx
import torch
from click.testing import CliRunner
from synthetic import synthetic_linear

import edgebnn
from edgebnn.cli import main
from edgebnn.nn import BayesLinear


def _io(path) -> tuple[list[str], list[str]]:
    graph = onnx.load(str(path)).graph
    return [i.name for i in graph.input], [o.name for o in graph.output]


def _said() -> str:
    help_text = CliRunner().invoke(main, ["export", "--help"], terminal_width=200).output
    return " ".join((help_text + (edgebnn.export.__doc__ or "")).split())


def test_the_documented_inputs_and_outputs_are_the_graphs(tmp_path):
    said = _said()
    ir = synthetic_linear()
    inputs, outputs = _io(edgebnn.export(ir, tmp_path / "h.onnx", samples=4, mode="noise", rng="host"))
    meta = edgebnn.Session(tmp_path / "h.onnx").noise_inputs
    assert inputs == ["input", *(r["name"] for r in meta)] and all(n.startswith("noise/") for n in inputs[1:])
    assert outputs == ["probs", "entropy", "mutual_info"]
    assert "probs (mean over S), entropy and mutual_info for classification" in said and "noise/<weight>" in said
    _, outputs = _io(edgebnn.export(ir, tmp_path / "a.onnx", samples="auto", mode="baked"))
    assert outputs == ["probs", "entropy", "mutual_info", "samples"] and "adds an output samples" in said

    torch.manual_seed(0)
    net = torch.nn.Sequential(BayesLinear(3, 8), torch.nn.ReLU(), BayesLinear(8, 2))  # mean and log-variance
    reg = edgebnn.from_torch(net, (1, 3), task="regression")
    inputs, outputs = _io(edgebnn.export(reg, tmp_path / "r.onnx", samples=4, mode="noise", rng="graph"))
    assert len(inputs) == 1 and outputs == ["mean", "variance", "aleatoric", "epistemic"]
    assert "mean, variance, aleatoric and epistemic for regression" in said
