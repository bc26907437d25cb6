"""The held-out plug-in (tests/fixtures/radial_plugin/radial_poisson.py: a Radial BNN family and a Poisson count
task, written from docs/extending.md's public names alone) through every command, as a newcomer's would go.

A tiny log-rate regressor of two radial layers is trained a few Adam steps on a synthetic Poisson count set, its
posterior widened so that the checks see its spread; then the CLI (fresh ``python -m edgebnn`` processes loading
the plug-in with ``--plugin`` and ``EDGEBNN_PLUGINS``, and in-process runs for the rest) and the API take it through
import, lowering, export in every mode the family takes, eval, inspect, plugins, profile, ``lower --budget`` and
search. The plug-in module is imported inside a registry scope, so this file can run twice in one process.
"""

from __future__ import annotations

import ast
import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

import edgebnn
from edgebnn.cli import main
from edgebnn.registry import REGISTRY
from edgebnn.runtime.reference import predict

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "radial_plugin"
S = 16
ROUNDOFF = 1e-5  # the same float32 products in another order
SIGMA = (0.2, 0.3)  # the radial σ of the two layers after training: marginal σ / √n = 0.025 and 0.075
# (a log-rate spread whose rates are not heavy-tailed: sd(λ) / E λ <= 0.75 on the validation rows)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/integration/conftest.py


@pytest.fixture(scope="module")
def rp():
    """The plug-in module, imported (so registered) inside a registry scope that forgets it afterwards."""
    sys.path.insert(0, str(FIXTURE))
    sys.modules.pop("radial_poisson", None)
    try:
        with REGISTRY.scoped():
            yield importlib.import_module("radial_poisson")
    finally:
        sys.modules.pop("radial_poisson", None)
        sys.path.remove(str(FIXTURE))


@pytest.fixture(scope="module")
def trained(rp, tmp_path_factory):
    """``radial_net`` (4-16-1) trained 150 full-batch Adam steps on 512 synthetic rows y ~ Poisson(exp(0.5 + x·w)),
    then its σ set to SIGMA; its weights, a validation set and a float IR, as files."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    w = np.array([0.5, -0.3, 0.2, 0.1], np.float32)

    def rows(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.standard_normal((n, 4)).astype(np.float32)
        return x, rng.poisson(np.exp(0.5 + x @ w))[:, None].astype(np.int64)

    x, y = rows(512)
    net = rp.radial_net()
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).float()
    for _ in range(150):
        opt.zero_grad()
        z = net(xt)
        (torch.exp(z) - yt * z).mean().backward()  # the Poisson NLL of a log-rate, less its constant
        opt.step()
    with torch.no_grad():
        for layer, sigma in zip((net[0], net[2]), SIGMA, strict=True):
            layer.weight_rho.fill_(math.log(math.expm1(sigma)))  # softplus(ρ) = σ
    net.eval()
    d = tmp_path_factory.mktemp("radial")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, d / "w.safetensors")
    xv, yv = rows(400)
    np.savez(d / "val.npz", x=xv, y=yv)
    ir = edgebnn.from_torch(net, (1, 4), task="poisson")
    edgebnn.save(ir, d / "m.ebnn")
    return net, ir, d, xv, yv


def fresh_cli(*argv: object, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m edgebnn`` in a fresh process whose path holds the plug-in's folder (an installed module)."""
    base = {k: v for k, v in os.environ.items() if k != "EDGEBNN_PLUGINS"}
    path = os.pathsep.join(p for p in (str(FIXTURE), base.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "edgebnn", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, env={**base, "PYTHONPATH": path, **(env or {})}, timeout=600, check=False)


def cli(*argv: object):
    """The CLI in this process, where the plug-in is already imported (what --plugin does)."""
    return CliRunner().invoke(main, [str(a) for a in argv], catch_exceptions=False)


def one_line_error(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]


def test_the_plugin_imports_only_documented_public_names(rp) -> None:
    """Every edgebnn name the plug-in imports is one docs/extending.md calls public: a name in the ``__all__`` of
    ``edgebnn.families`` or ``edgebnn.tasks``, ``edgebnn.data.Targets``, an ``edgebnn.errors`` error; nothing
    private (no ``_`` segment), no other edgebnn module."""
    import edgebnn.errors
    import edgebnn.families
    import edgebnn.tasks

    public = {"edgebnn.families": set(edgebnn.families.__all__), "edgebnn.tasks": set(edgebnn.tasks.__all__),
              "edgebnn.data": {"Targets"},
              "edgebnn.errors": {n for n, v in vars(edgebnn.errors).items() if isinstance(v, type)
                                 and issubclass(v, Exception) and not n.startswith("_")}}
    tree = ast.parse(Path(rp.__file__).read_text())
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not [a.name for a in node.names if a.name.split(".")[0] == "edgebnn"], ast.dump(node)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "edgebnn":
            assert node.level == 0 and node.module in public, node.module
            for alias in node.names:
                assert alias.name in public[node.module], f"{node.module}.{alias.name} is not public"
                imported.append(alias.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "edgebnn":
            pytest.fail(f"edgebnn.{node.attr}")  # no module-attribute access beside the imports
    assert not [n for n in imported if n.startswith("_")]
    assert {"register_family", "register_task", "Targets", "variance_grid", "SigmaCode"} <= set(imported)


def test_plugins_and_lower_in_fresh_processes(trained) -> None:
    """``--plugin`` and ``EDGEBNN_PLUGINS`` load the module in a fresh process: ``plugins`` lists its family and
    task, ``lower --model`` imports the torch model with the family's adapter; its file exports with
    ``--noise mixed`` and ``eval`` reads the count labels."""
    _, _, d, _, _ = trained
    r = fresh_cli("--plugin", "radial_poisson", "plugins", "--json", "plugins.json", cwd=d)
    assert r.returncode == 0, r.stderr
    listing = json.loads((d / "plugins.json").read_text())
    plugin = next(p for p in listing["plugins"] if p["module"] == "radial_poisson")
    assert plugin["source"].startswith("--plugin")
    assert plugin["registered"]["families"] == ["radial"] and plugin["registered"]["tasks"] == ["poisson"]
    family = next(f for f in listing["families"] if f["name"] == "radial")
    assert family["importers"] == ["radial-bnn (held-out test plug-in)"] and family["analytic"] == ["refused"]
    assert family["lowered_by"] == {"RadialWeight": ["float", "fixed (bits)"], "RadialFixedWeight": ["float", "fixed"]}
    assert "poisson" in listing["tasks"] and "tasks: classification, poisson, regression" in r.stdout.replace(
        "multilabel, ", "")

    env = {"EDGEBNN_PLUGINS": "radial_poisson"}
    r = fresh_cli("lower", "--model", "radial_poisson:radial_net", "--weights", "w.safetensors", "--input-shape",
                  "1,4", "--task", "poisson", "--scheme", "fixed", "--bits", "4", "-o", "f4.ebnn", "--report",
                  "lower.json", cwd=d, env=env)
    assert r.returncode == 0, r.stderr
    report = json.loads((d / "lower.json").read_text())
    assert {row["kind"] for row in report["layers"] if row["name"].endswith("weight")} == {"RadialFixedWeight"}
    r = cli("export", d / "f4.ebnn", "--samples", S, "--mode", "noise", "--noise", "mixed", "-o", d / "f4.onnx")
    assert r.exit_code == 0, r.output
    r = cli("eval", d / "f4.onnx", "--data", d / "val.npz", "--json", d / "eval.json")
    assert r.exit_code == 0, r.output
    assert all(c in r.output for c in ("nll", "mae", "rmse"))
    got = json.loads((d / "eval.json").read_text())
    assert got["task"] == "poisson" and 1.0 < got["nll"] < 3.0  # Poisson(e^0.5 ≈ 1.6) counts: about 1.5


def test_bits_are_honoured_and_calibrate_is_refused(rp, trained) -> None:
    """The family's fixed lowering declares honours={"bits"}: ``--bits 4`` codes the means in -7..7 (the lowered
    encoding, decoded, is its codes times its step); ``--calibrate`` is refused in one line naming it."""
    _, ir, d, _, _ = trained
    four = edgebnn.lower(ir, "fixed", bits=4)
    for name in ("0.weight", "2.weight"):
        enc = four.encoded_weight(name).encoding
        assert isinstance(enc, rp.RadialFixedWeight) and enc.bits == 4 and np.abs(enc.q).max() <= 7
        np.testing.assert_array_equal(enc.mean(), enc.q.astype(np.float32) * np.float32(enc.step_))
    r = CliRunner().invoke(main, ["lower", "--model", "radial_poisson:radial_net", "--weights",
                                  str(d / "w.safetensors"), "--input-shape", "1,4", "--task", "poisson", "--scheme",
                                  "fixed", "--calibrate", str(d / "val.npz"), "-o", str(d / "c.ebnn")])
    line = one_line_error(r.output)
    assert "RadialWeight, whose fixed lowering (the radial family's) cannot honour --calibrate" in line, line
    assert not (d / "c.ebnn").exists()


def test_baked_is_the_reference_runtime_and_exposure_scales_it(trained, tmp_path) -> None:
    """baked's members are the reference runtime's draws of the same seed: the same rates up to round-off; a task
    option passed through ``from_torch`` (``exposure=2``) doubles every member's rate, so the predictive's."""
    net, ir, _, xv, _ = trained
    pred = edgebnn.Session(edgebnn.export(ir, tmp_path / "b.onnx", samples=S, mode="baked", seed=3)).predict(xv)
    ref = predict(ir, xv, S, seed=3)
    assert pred.rate.shape == pred.variance.shape == pred.epistemic.shape == (len(xv), 1)
    np.testing.assert_allclose(pred.rate, ref.rate, rtol=ROUNDOFF)
    np.testing.assert_allclose(pred.epistemic, ref.epistemic, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(pred.variance, pred.rate + pred.epistemic, rtol=ROUNDOFF)
    assert ref.epistemic.mean() > 0.01 * ref.rate.mean()  # a spread the checks see

    two = edgebnn.from_torch(net, (1, 4), task="poisson", exposure=2.0)
    assert two.manifest.task_spec().exposure == 2.0
    doubled = edgebnn.Session(edgebnn.export(two, tmp_path / "b2.onnx", samples=S, mode="baked", seed=3))
    np.testing.assert_allclose(doubled.predict(xv).rate, 2 * pred.rate, rtol=ROUNDOFF)


def test_host_noise_is_the_familys_own_draw(rp, trained, tmp_path) -> None:
    """``--mode noise --rng host``: the graph takes ε [S, *shape] and r [S, 1] per weight and computes the radial
    draw of them, exactly as the family's numpy ``radial`` does."""
    net, ir, _, xv, _ = trained
    session = edgebnn.Session(edgebnn.export(ir, tmp_path / "h.onnx", samples=S, mode="noise", rng="host"))
    assert sorted(rec["name"] for rec in session.noise_inputs) == [
        "noise/0.weight", "noise/0.weight.r", "noise/2.weight", "noise/2.weight.r"]
    rng = np.random.default_rng(0)
    noise = {rec["name"]: rng.standard_normal((S, *rec["shape"][1:])).astype(np.float32)
             for rec in session.noise_inputs}
    h = xv.astype(np.float64)
    for i, name in enumerate(("0", "2")):
        enc = ir.encoded_weight(f"{name}.weight").encoding
        w = rp.radial(enc.mean(), enc.sigma, noise[f"noise/{name}.weight"], noise[f"noise/{name}.weight.r"])
        bias = dict(net.named_parameters())[f"{name}.bias"].detach().double().numpy()
        h = np.einsum("bi,soi->bso" if i == 0 else "bsi,soi->bso", h, w) + bias
        h = np.maximum(h, 0) if i == 0 else h
    lam = np.exp(h)  # [B, S, 1]
    got = session.predict(xv, noise=noise)
    np.testing.assert_allclose(got.rate, lam.mean(1), rtol=1e-4)
    np.testing.assert_allclose(got.epistemic, lam.var(1), rtol=1e-3, atol=1e-6)


def test_mixed_noise_draws_the_radial_noise_in_the_graph(trained, tmp_path) -> None:
    """``--noise mixed`` bakes only mean-field Gaussian kernels: the radial weights are drawn in the graph
    (RandomNormal, the family's ReduceL2), no member is baked, and its predictive mean rate is the torch layer's.

    Tolerance: the export's rate (S = 512 draws) and torch's Monte Carlo (N = 4000 forward passes) are both means
    of draws of λ, so their difference has σ = sd(λ) √(1/S + 1/N) per input, sd(λ) estimated from torch's draws;
    over 64 inputs every |z| < 5 (a 1e-5 tail by the CLT)."""
    net, ir, _, xv, _ = trained
    samples, n = 512, 4000
    path = edgebnn.export(ir, tmp_path / "mixed.onnx", samples=samples, mode="noise", noise="mixed", seed=5)
    graph = onnx.load(path).graph
    ops = {node.op_type for node in graph.node}
    assert {"RandomNormal", "ReduceL2"} <= ops, ops
    assert not [t.name for t in graph.initializer if list(t.dims)[:1] == [samples]]  # no baked member stack
    x = xv[:64]
    rate = edgebnn.Session(path).predict(x).rate[:, 0].astype(np.float64)
    torch.manual_seed(7)
    with torch.no_grad():
        lam = torch.stack([net(torch.from_numpy(x)).exp()[:, 0] for _ in range(n)]).double().numpy()  # [N, 64]
    z = (rate - lam.mean(0)) / (lam.std(0) * np.sqrt(1 / samples + 1 / n))
    assert np.abs(z).max() < 5, np.abs(z).max()


def test_export_modes_the_family_refuses_are_one_line(trained) -> None:
    """analytic: the family states it is refused (its weights share a radius and a norm); ``--samples auto``: the
    stopping rule has no statement for a Poisson task. Each a one-line error naming why; nothing written."""
    _, _, d, _, _ = trained
    line = one_line_error(cli("export", d / "m.ebnn", "--mode", "analytic", "-o", d / "a.onnx").output)
    assert "RadialWeight (radial): --mode analytic would treat a tensor's weights as independent" in line, line
    line = one_line_error(cli("export", d / "m.ebnn", "--samples", "auto", "-o", d / "auto.onnx").output)
    assert "--samples auto" in line and "poisson" in line, line
    assert not (d / "a.onnx").exists() and not (d / "auto.onnx").exists()


def test_eval_inspect_profile(trained) -> None:
    """eval's metrics are the Poisson definitions on the export's own predictive; inspect describes the task;
    profile on the cpu runs it."""
    _, _, d, xv, yv = trained
    path = d / "baked.onnx"
    assert cli("export", d / "m.ebnn", "--samples", S, "--mode", "baked", "--seed", 3, "-o", path).exit_code == 0
    report = edgebnn.evaluate(str(path), data=str(d / "val.npz"))
    rate = edgebnn.Session(path).predict(xv).rate.astype(np.float64)
    y = yv.astype(np.float64)
    lgamma = np.vectorize(math.lgamma)(y + 1)
    assert report["task"] == "poisson" and report["n"] == len(xv)
    assert report["nll"] == pytest.approx(np.mean(rate - y * np.log(rate) + lgamma), rel=1e-9)
    assert report["mae"] == pytest.approx(np.abs(rate - y).mean(), rel=1e-9)
    assert report["rmse"] == pytest.approx(np.sqrt(np.square(rate - y).mean()), rel=1e-9)

    for target in (d / "m.ebnn", path):
        r = cli("inspect", target)
        assert r.exit_code == 0 and "Poisson counts of 1 output(s), exposure 1" in " ".join(r.output.split()), r.output
    r = cli("profile", d / "m.ebnn", "--device", "cpu", "--samples", 8, "--runs", 5, "--json", d / "p.json")
    assert r.exit_code == 0, r.output
    assert json.loads((d / "p.json").read_text())["latency_ms"]["p50"] > 0


def test_lower_budget_takes_the_tasks_metrics(trained) -> None:
    """``lower --budget`` over the task's own report (nll, mae, rmse of the rate): the certified lowering keeps
    each bound within its allowance."""
    _, _, d, _, _ = trained
    r = cli("lower", "--model", "radial_poisson:radial_net", "--weights", d / "w.safetensors", "--input-shape",
            "1,4", "--task", "poisson", "--scheme", "fixed", "--eval", d / "val.npz", "--budget",
            "nll=+0.1,mae=+0.1", "-o", d / "budget.ebnn", "--report", d / "budget.json")
    assert r.exit_code == 0, r.output
    budget = json.loads((d / "budget.json").read_text())["budget"]
    assert budget["met"] and budget["limits"] == {"nll": 0.1, "mae": 0.1}
    for bound in budget["bounds"]:
        assert bound["kept"] and bound["bound"] <= 0.1, bound


def test_search_reports_the_tasks_metrics(trained) -> None:
    """A short search (4 trials of fixed × bits × S × baked/noise) completes every trial on the Poisson task and
    tabulates its own metrics (a classifier's accuracy / ECE columns do not exist for it)."""
    _, _, d, _, _ = trained
    r = cli("search", d / "m.ebnn", "--data", d / "val.npz", "--trials", 4, "--schemes", "fixed", "--bits",
            "auto,4", "--samples", "4,8", "--modes", "baked,noise", "--weights", "fp32", "--hoist", "off",
            "--objectives", "bytes,nll", "--json", d / "search.json")
    assert r.exit_code == 0, r.output
    report = json.loads((d / "search.json").read_text())
    assert [t["state"] for t in report["trials"]] == ["complete"] * 4
    assert all({"nll", "mae", "rmse"} <= set(t["metrics"]) for t in report["trials"])
    assert "rmse" in r.output and report["best"] is not None
