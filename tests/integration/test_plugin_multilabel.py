"""The example plug-in's multi-label task (examples/plugin/edgebnn_example/multilabel.py), driven as a user would:
import the module (it registers the task), train a small edgebnn MLP on a multi-label version of digits, import it
with ``task="multilabel"``, export it in every sampling mode and ``analytic``, and read it back with ``Session``,
``evaluate``, ``compare`` and the CLI (in-process, after the import). No private name, no patch.

Labels of a digit d: [d is even, d > 4, d in {0, 6, 8, 9} (a closed loop)].
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

import edgebnn
from edgebnn.cli import main
from edgebnn.compare import compare_artifacts
from edgebnn.data import digits
from edgebnn.exporters.ensemble import float_deterministic
from edgebnn.nn import BayesLinear, kl_divergence
from edgebnn.runtime import Session
from edgebnn.runtime.reference import sample_logits
from edgebnn.tasks import TASKS, Task

# this repository's plug-in package, whether installed (pip install -e examples/plugin) or not
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "plugin"))
from edgebnn_example import multilabel

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/integration/conftest.py

S = 16
K = 3


def _labels(d: np.ndarray) -> np.ndarray:
    return np.stack([d % 2 == 0, d > 4, np.isin(d, [0, 6, 8, 9])], 1).astype(np.int64)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _h(p: np.ndarray) -> np.ndarray:
    """Binary entropy, nats."""
    p = np.clip(p, 1e-300, 1 - 1e-16)
    return -(p * np.log(p) + (1 - p) * np.log1p(-p))


def _numpy_predictive(z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The multi-label predictive of member logits [S, N, K], written here from its definition."""
    p_s = _sigmoid(z.astype(np.float64))
    probs = p_s.mean(0)
    return probs, _h(probs), _h(probs) - _h(p_s).mean(0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 64-32-3 BayesLinear MLP trained 200 Adam steps (seed 0) on the multi-label digits; its IR, its exports
    and the validation data as files."""
    torch.manual_seed(0)
    split = digits(0)
    x = split.x_train.reshape(len(split.x_train), -1)
    xt, yt = torch.from_numpy(x), torch.from_numpy(_labels(split.y_train)).float()
    net = nn.Sequential(BayesLinear(64, 32, init_rho=-4.0), nn.ReLU(), BayesLinear(32, K, init_rho=-4.0))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(200):
        idx = torch.randint(0, len(xt), (128,))
        loss = nn.functional.binary_cross_entropy_with_logits(net(xt[idx]), yt[idx]) + kl_divergence(net) / len(xt)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    d = tmp_path_factory.mktemp("multilabel")
    ir = edgebnn.from_torch(net, (1, 64), task="multilabel")
    edgebnn.save(ir, d / "m.ebnn")
    for mode in ("baked", "noise", "analytic"):
        edgebnn.export(ir, d / f"{mode}.onnx", samples=S, mode=mode, seed=3)
    xv, yv = split.x_val.reshape(len(split.x_val), -1), _labels(split.y_val)
    np.savez(d / "val.npz", x=xv, y=yv)
    return net, ir, d, xv, yv


def _cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_the_task_registers_on_import_and_the_manifest_records_it(trained) -> None:
    _, ir, d, _, _ = trained
    assert TASKS["multilabel"] is multilabel.MultiLabel and issubclass(multilabel.MultiLabel, Task)
    assert ir.manifest.task_spec() == multilabel.MultiLabel() and ir.manifest.num_classes == K
    assert json.loads(ir.manifest.to_json())["task"] == "multilabel"
    assert Session(d / "baked.onnx").task == multilabel.MultiLabel()


def test_baked_is_the_reference_runtime_and_the_head_its_definition(trained) -> None:
    """The baked members are the reference runtime's draws of seed 3, so the graph's predictive is the numpy
    reduction of the same logits up to float32 round-off (a mean of 16 sigmoids, logs of it: 2e-6)."""
    _, ir, d, xv, _ = trained
    pred = Session(d / "baked.onnx").predict(xv)
    probs, entropy, mi = _numpy_predictive(sample_logits(ir, xv, S, seed=3))
    assert pred.probs.shape == pred.entropy.shape == pred.mutual_info.shape == (len(xv), K)
    np.testing.assert_allclose(pred.probs, probs, atol=2e-6)
    np.testing.assert_allclose(pred.entropy, entropy, atol=2e-6)
    np.testing.assert_allclose(pred.mutual_info, mi, atol=2e-6)
    assert mi.max() > 0.1  # an epistemic spread the check can see
    ref = edgebnn.runtime.reference.predict(ir, xv, S, seed=3)  # the plug-in's numpy reduction
    np.testing.assert_allclose(ref.probs, probs, atol=1e-6)
    np.testing.assert_allclose(ref.mutual_info, mi, atol=1e-6)


def test_analytic_integrates_the_sigmoid_over_gaussian_logits(tmp_path) -> None:
    """One Bayesian linear layer on deterministic features: its logits are exactly Gaussian, so analytic's probs,
    entropy and mutual information are the Gauss-Hermite (80 points) integrals over the logits' N(m, v), up to the
    error of its own 64 quasi-Monte Carlo points (measured 2e-4; the bounds are 5x that)."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), BayesLinear(16, K, init_rho=-1.0)).eval()
    ir = edgebnn.from_torch(net, (1, 64), task="multilabel")
    x = digits(0).x_val[:100].reshape(100, -1)
    with torch.no_grad():
        phi = net[1](net[0](torch.from_numpy(x))).double()
        last = net[2]
        m = (phi @ last.weight_mu.double().T + last.bias_mu.double()).numpy()
        v = (phi**2 @ (last.weight_sigma.double() ** 2).T + last.bias_sigma.double() ** 2).numpy()
    t, w = np.polynomial.hermite_e.hermegauss(80)
    z = m[..., None] + np.sqrt(v)[..., None] * t  # [N, K, 80]
    probs = _sigmoid(z) @ (w / w.sum())
    mi = _h(probs) - _h(_sigmoid(z)) @ (w / w.sum())
    assert v.min() > 0.05  # a spread the quadrature must integrate
    pred = Session(edgebnn.export(ir, tmp_path / "a.onnx", samples=64, mode="analytic")).predict(x)
    assert np.abs(pred.probs - probs).max() < 1e-3
    assert np.abs(pred.entropy - _h(probs)).max() < 1e-3
    assert np.abs(pred.mutual_info - mi).max() < 1e-3


def test_every_mode_predicts_the_posterior_predictive(trained) -> None:
    """noise and baked sample the IR's posterior (compare's simulated null: never called different at alpha 0.01);
    analytic propagates moments through the ReLU layer, an approximation: its probs stay within 0.02 on average
    of a 2000-member predictive (measured 0.006; the reference's own Monte Carlo error is about 0.002)."""
    _, ir, d, xv, yv = trained
    for mode in ("baked", "noise"):
        report = compare_artifacts(str(d / f"{mode}.onnx"), str(d / "m.ebnn"), (xv, yv), null_runs=19, alpha=0.05)
        assert report["verdict"] != "different" and report["task"] == "multilabel", (mode, report["p_value"])
    big, _, _ = _numpy_predictive(sample_logits(ir, xv, 2000, seed=11))
    analytic = Session(d / "analytic.onnx").predict(xv)
    assert np.abs(analytic.probs - big).mean() < 0.02
    assert (analytic.mutual_info >= 0).all() and (analytic.mutual_info <= analytic.entropy + 1e-6).all()


def test_compare_tells_a_shifted_model_apart(trained, tmp_path) -> None:
    """compare compares sigmoid probabilities: the same network with label 0's bias moved by +2 gives other
    predictive probabilities (exit 1; with 39 simulated null pairs the smallest p-value is 1/40, so alpha is 0.05),
    the IR's own baked export not different ones (exit 0 for same, 3 where S = 16 cannot tell)."""
    net, _, d, _, _ = trained
    with torch.no_grad():
        net[2].bias_mu[0] += 2.0
    try:
        shifted = edgebnn.from_torch(net, (1, 64), task="multilabel")
    finally:
        with torch.no_grad():
            net[2].bias_mu[0] -= 2.0
    edgebnn.export(shifted, tmp_path / "shifted.onnx", samples=S, mode="baked", seed=3)
    same = _cli("compare", str(d / "baked.onnx"), str(d / "m.ebnn"), "--data", str(d / "val.npz"),
                "--null-runs", "19", "--alpha", "0.05", "--json", str(tmp_path / "same.json"))
    assert same.exit_code in (0, 3) and "DIFFERENT" not in same.output, same.output
    assert "brier" in same.output
    other = _cli("compare", str(tmp_path / "shifted.onnx"), str(d / "m.ebnn"), "--data", str(d / "val.npz"),
                 "--null-runs", "39", "--alpha", "0.05")
    assert other.exit_code == 1 and "DIFFERENT" in other.output, other.output


def test_evaluate_python_and_cli(trained, tmp_path) -> None:
    """eval's metrics are those of the definitions (module docstring) computed here from the same predictive;
    the CLI prints the task's columns and its line under them, and writes the same report."""
    _, _, d, xv, yv = trained
    report = edgebnn.evaluate(str(d / "baked.onnx"), data=(xv, yv))
    p = Session(d / "baked.onnx").predict(xv).probs.astype(np.float64)
    right = (p > 0.5) == (yv == 1)
    assert report["task"] == "multilabel" and report["n"] == len(xv)
    assert report["accuracy"] == pytest.approx(right.mean(), abs=1e-12)
    assert report["label_accuracy"] == pytest.approx(right.mean(0).tolist(), abs=1e-12)
    assert report["exact_match"] == pytest.approx(right.all(1).mean(), abs=1e-12)
    assert report["nll"] == pytest.approx(-np.mean(yv * np.log(p) + (1 - yv) * np.log1p(-p)), rel=1e-9)
    assert report["brier"] == pytest.approx(np.mean((p - yv) ** 2), rel=1e-9)
    conf = np.maximum(p, 1 - p).reshape(-1)
    bins = np.minimum((conf * 15).astype(int), 14)
    ece = sum(abs(right.reshape(-1)[bins == b].sum() - conf[bins == b].sum()) for b in range(15)) / conf.size
    assert report["ece"] == pytest.approx(ece, abs=1e-12)
    assert report["accuracy"] > 0.9  # trained: 0.97 on these labels (chance: about 0.5)

    r = _cli("eval", str(d / "baked.onnx"), "--data", str(d / "val.npz"), "--json", str(tmp_path / "eval.json"))
    assert r.exit_code == 0, r.output
    assert "brier" in r.output and "accuracy per label" in r.output and "exact match" in r.output
    written = json.loads((tmp_path / "eval.json").read_text())
    assert {k: written[k] for k in ("accuracy", "nll", "ece", "brier")} == pytest.approx(
        {k: report[k] for k in ("accuracy", "nll", "ece", "brier")}, abs=1e-12)
    r = _cli("eval", str(d / "m.ebnn"), "--data", str(d / "val.npz"), "--samples", "8", "--plot",
             str(tmp_path / "eval.png"))
    assert r.exit_code == 0 and (tmp_path / "eval.png").stat().st_size > 0, r.output


@pytest.mark.parametrize(("y", "message"), [
    (lambda y: np.where(np.arange(y.size).reshape(y.shape) == 16, 2, y),
     r"^error: \S*bad\.npz\['y'\]: label 2 at row 5 \(output 1\) is not 0 or 1$"),
    (lambda y: y[:, 0],
     r"^error: \S*bad\.npz\['y'\]: shape \(360,\), expected \(360, 3\): 0/1 labels, one per output$"),
    (lambda y: y.astype(np.float32),
     r"^error: \S*bad\.npz\['y'\]: dtype float32; multi-label targets must be 0/1 integers or booleans$"),
])
def test_bad_labels_are_one_line(trained, tmp_path, y, message) -> None:
    _, _, d, xv, yv = trained
    np.savez(tmp_path / "bad.npz", x=xv, y=y(yv))
    r = _cli("eval", str(d / "baked.onnx"), "--data", str(tmp_path / "bad.npz"))
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert re.match(message, r.output.strip()), r.output


def test_boolean_labels_are_labels(trained) -> None:
    _, _, d, xv, yv = trained
    as_int = edgebnn.evaluate(str(d / "baked.onnx"), data=(xv, yv))
    as_bool = edgebnn.evaluate(str(d / "baked.onnx"), data=(xv, yv.astype(bool)))
    assert as_bool["nll"] == as_int["nll"] and as_bool["accuracy"] == as_int["accuracy"]


def test_inspect_and_the_float_baseline(trained) -> None:
    """inspect says what the output is; the one-pass float baseline ends in the task's sigmoid."""
    net, ir, d, xv, _ = trained
    for path in (d / "m.ebnn", d / "analytic.onnx"):
        r = _cli("inspect", str(path))
        assert r.exit_code == 0 and "3 independent labels (sigmoid)" in r.output, r.output
    import onnxruntime as ort

    base = float_deterministic(ir)
    assert base.graph.node[-1].op_type == "Sigmoid"
    got = ort.InferenceSession(base.SerializeToString()).run(["probs"], {ir.manifest.input_name: xv[:8]})[0]
    for layer in (net[0], net[2]):
        layer.use_mean = True
    try:
        with torch.no_grad():
            want = torch.sigmoid(net(torch.from_numpy(xv[:8]))).numpy()
    finally:
        for layer in (net[0], net[2]):
            layer.use_mean = False
    np.testing.assert_allclose(got, want, atol=1e-5)  # float32 round-off of two 64-32-3 networks


def test_a_fresh_process_takes_the_task_through_its_entry_point(trained) -> None:
    """Out of process, with nothing imported by hand: the installed package's entry point registers the task, so
    ``eval`` of a multi-label export reads its labels and reports its metrics; ``plugins`` says where it came from."""
    import os
    import subprocess

    _, _, d, _, _ = trained

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "EDGEBNN_PLUGINS"}
        return subprocess.run([sys.executable, "-m", "edgebnn", *argv], capture_output=True, text=True, cwd=d,
                              env=env, timeout=600, check=False)

    r = run("plugins", "--json", "plugins.json")
    assert r.returncode == 0, r.stderr
    plugin = next(p for p in json.loads((d / "plugins.json").read_text())["plugins"] if p["name"] == "multilabel")
    assert plugin["source"].startswith("entry point edgebnn.plugins: multilabel = edgebnn_example.multilabel")
    assert plugin["registered"]["tasks"] == ["multilabel"]
    r = run("eval", "noise.onnx", "--data", "val.npz", "--json", "eval.json")
    assert r.returncode == 0, r.stderr
    report = json.loads((d / "eval.json").read_text())
    assert 0.8 < report["accuracy"] <= 1 and report["nll"] > 0  # per-label accuracy of a trained MLP: 0.9+ here


_FACTORY = '''from torch import nn
from edgebnn.nn import BayesLinear


def net():
    return nn.Sequential(BayesLinear(64, 32, init_rho=-4.0), nn.ReLU(), BayesLinear(32, 3, init_rho=-4.0))
'''


def test_lower_budget_bounds_the_tasks_own_metric(trained, tmp_path, monkeypatch) -> None:
    """``lower --budget`` takes a metric only the task reports (``MultiLabel.budget_metrics``: ``exact_match``,
    higher is better): an unsigned allowance is a fall it may take, its bound is a lower limit by the bootstrap, and
    a misspelt metric's error lists it among the known ones."""
    from safetensors.torch import save_file

    from edgebnn.budget import Budget
    from edgebnn.errors import InvalidOptionError

    net, _, d, _, _ = trained
    assert Budget.parse("exact_match=0.1").limits == {"exact_match": -0.1}
    with pytest.raises(InvalidOptionError, match=r"unknown metric 'exact_matc'; known: .*exact_match"):
        Budget.parse("exact_matc=0.1")
    (tmp_path / "mlnet.py").write_text(_FACTORY)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, tmp_path / "w.safetensors")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    r = _cli("lower", "--model", "mlnet:net", "--weights", "w.safetensors", "--input-shape", "1,64", "--task",
             "multilabel", "--scheme", "fixed", "--eval", str(d / "val.npz"), "--budget", "exact_match=0.1,nll=+0.1",
             "-o", "m.ebnn", "--report", "lower.json")
    assert r.exit_code == 0, r.output
    assert "exact_match" in r.output
    budget = json.loads((tmp_path / "lower.json").read_text())["budget"]
    assert budget["met"] and budget["limits"] == {"exact_match": -0.1, "nll": 0.1}
    bound = next(b for b in budget["bounds"] if b["metric"] == "exact_match")
    # higher is better: the bound is the lower limit of the change, below the change measured, within -0.1
    assert bound["kept"] and bound["method"] == "bootstrap" and -0.1 <= bound["bound"] <= bound["delta"]
    assert bound["rows"] == len(np.load(d / "val.npz")["y"])
