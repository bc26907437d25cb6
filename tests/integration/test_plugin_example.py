"""The example plug-in package (``examples/plugin``, installed by ``make install``), driven only as a user would.

Its family (Gaussian noise multiplying each output row, :mod:`edgebnn_example.rownoise`) reaches every command
through its ``edgebnn.plugins`` entry point: the CLI runs here in fresh ``python -m edgebnn`` processes with no
``--plugin`` option, and the Python checks use the public API (``edgebnn.from_torch``, ``edgebnn.export``,
``edgebnn.Session``, the reference runtime). Nothing is patched; no private name is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from edgebnn_example.rownoise import RowNoiseLinear, RowNoiseWeight, row_noise_mlp
from safetensors.torch import save_file

import edgebnn
from edgebnn.runtime.reference import predict

S = 8
ROUNDOFF = 1e-5  # the same float32 products in another order


def edgebnn_cli(*argv: object, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgebnn", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, env=env or dict(os.environ), timeout=600, check=False)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    """The refusal a user sees: exit 2, nothing on stdout, exactly one ``error:`` line."""
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, digits_data) -> tuple[Path, torch.nn.Module]:
    """The plug-in's MLP trained for a few full-batch steps in the user's own code, saved as safetensors."""
    torch.manual_seed(0)
    net = row_noise_mlp()
    x = torch.tensor(digits_data.x_train.reshape(len(digits_data.x_train), -1))
    y = torch.tensor(digits_data.y_train)
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    for _ in range(80):
        opt.zero_grad()
        kl = sum(m.kl() for m in net.modules() if isinstance(m, RowNoiseLinear))
        loss = torch.nn.functional.cross_entropy(net(x), y) + kl / len(x)
        loss.backward()
        opt.step()
    folder = tmp_path_factory.mktemp("rownoise")
    save_file(net.state_dict(), folder / "w.safetensors")
    return folder, net


def test_the_cli_takes_the_family_through_its_entry_point(trained):
    folder, _ = trained
    r = edgebnn_cli("plugins", "--json", "plugins.json", cwd=folder)
    assert r.returncode == 0, r.stderr
    listing = json.loads((folder / "plugins.json").read_text())
    plugin = next(p for p in listing["plugins"] if p["name"] == "rownoise")
    assert plugin["source"].startswith("entry point edgebnn.plugins: rownoise = edgebnn_example.rownoise")
    assert plugin["registered"]["families"] == ["rownoise"]
    family = next(f for f in listing["families"] if f["name"] == "rownoise")
    assert family["importers"] == ["edgebnn-example-rownoise"] and family["analytic"] == ["refused"]
    assert family["lowered_by"] == {"RowNoiseWeight": ["float", "fixed (bits)"],
                                    "RowNoiseFixedWeight": ["float", "fixed"]}
    lowered_by = {f["name"]: f["lowered_by"] for f in listing["families"]}  # the built-in families' too, never "-"
    assert lowered_by["gaussian"]["GaussianWeight"] == ["float", "mcq", "fixed", "codebook", "ternary", "binary",
                                                       "prune"]
    assert lowered_by["swag"]["LowRankGaussianWeight"] == ["float", "fixed (bits)"]
    assert lowered_by["quantized"]["FixedPointWeight"] == []  # a lowered form: every scheme keeps it
    assert "kept by every scheme" in edgebnn_cli("plugins", cwd=folder).stdout

    model = ["--model", "edgebnn_example.rownoise:row_noise_mlp", "--weights", "w.safetensors", "--input-shape",
             "1,1,8,8"]
    assert edgebnn_cli("lower", *model, "-o", "m.ebnn", cwd=folder).returncode == 0
    r = edgebnn_cli("lower", *model, "--scheme", "fixed", "-o", "f.ebnn", "--report", "lower.json", cwd=folder)
    assert r.returncode == 0, r.stderr
    report = json.loads((folder / "lower.json").read_text())
    assert {row["kind"] for row in report["layers"] if row["name"].endswith("weight")} == {"RowNoiseFixedWeight"}
    assert report["total_bytes"] < report["float_bnn_bytes"] / 3  # int8 means and fp32 row scales vs μ and σ
    # its lowering declares it honours --bits, not --calibrate: refused in one line, never recorded as applied
    refused = one_line_error(edgebnn_cli("lower", *model, "--scheme", "fixed", "--calibrate", "digits", "-o", "c.ebnn",
                                         cwd=folder))
    assert ("layer '1' is a RowNoiseWeight, whose fixed lowering (the rownoise family's) cannot honour --calibrate"
            in refused and refused.endswith("drop --calibrate"))
    assert not (folder / "c.ebnn").exists()

    for flags in (["--mode", "baked"], ["--mode", "noise", "--rng", "host"], []):
        r = edgebnn_cli("export", "f.ebnn", "--samples", S, *flags, "-o", f"f{len(flags)}.onnx", cwd=folder)
        assert r.returncode == 0, r.stderr
    r = edgebnn_cli("inspect", "f0.onnx", "--json", cwd=folder)
    export = json.loads(r.stdout)["export"]
    assert (export["mode"], export["rng"]) == ("noise", "graph")  # the default: the noise drawn in the graph
    refused = one_line_error(edgebnn_cli("export", "f.ebnn", "--mode", "analytic", "-o", "a.onnx", cwd=folder))
    assert "RowNoiseFixedWeight (rownoise): --mode analytic would treat the weights of a row as independent" in refused
    assert not (folder / "a.onnx").exists()

    r = edgebnn_cli("export", "f.ebnn", "--target", "tensorrt", "--device", "rtx", "--samples", S, "--mode", "noise",
                    "-o", "f.engine", cwd=folder)
    assert r.returncode == 0, r.stderr  # a real TensorRT-RTX build (no GPU needed)
    assert (folder / "f.engine").read_bytes()[:4] == b"vtrt"

    r = edgebnn_cli("eval", "f0.onnx", "--data", "digits", "--json", "eval.json", cwd=folder)
    assert r.returncode == 0, r.stderr
    assert json.loads((folder / "eval.json").read_text())["accuracy"] > 0.85  # a trained digits MLP: 0.9+ here
    r = edgebnn_cli("compare", "f.ebnn", "f2.onnx", "--data", "digits", cwd=folder)
    assert r.returncode in (0, 3) and "DIFFERENT" not in r.stdout, r.stderr  # 3: cannot tell at S = 16, not different
    r = edgebnn_cli("profile", "f.ebnn", "--device", "cpu", "--samples", S, "--runs", 5, "--json", "p.json",
                    cwd=folder)
    assert r.returncode == 0, r.stderr
    assert json.loads((folder / "p.json").read_text())["latency_ms"]["p50"] > 0


def test_the_api_takes_it_and_every_mode_is_the_familys_own_draw(trained, digits_data, tmp_path):
    """``baked`` is the reference runtime's predictive (the same draws); ``noise`` is the family's draw of the noise
    the graph was given."""
    _, net = trained
    four = edgebnn.lower(edgebnn.from_torch(net, (1, 64)), "fixed", bits=4)  # --bits honoured: codes in -7..7
    assert [int(np.abs(four.encoded_weight(f"{n}.weight").encoding.q).max()) for n in "13"] == [7, 7]
    ir = edgebnn.lower(edgebnn.from_torch(net, (1, 64)), "fixed", seed=0)
    x = digits_data.x_test[:16].reshape(16, -1)
    baked = edgebnn.Session(edgebnn.export(ir, tmp_path / "b.onnx", samples=S, mode="baked", seed=3))
    np.testing.assert_allclose(baked.predict(x).probs, predict(ir, x, S, seed=3).probs, atol=ROUNDOFF)

    for variant in ("auto", "mixed"):  # mixed draws the family's own noise in the graph too, never bakes it
        session = edgebnn.Session(edgebnn.export(ir, tmp_path / f"n-{variant}.onnx", samples=S, mode="noise",
                                                 noise=variant, rng="host"))
        assert sorted(rec["name"] for rec in session.noise_inputs) == ["noise/1.weight.row", "noise/3.weight.row"]
        rng = np.random.default_rng(0)
        noise = {rec["name"]: rng.standard_normal((S, *rec["shape"][1:])).astype(np.float32)
                 for rec in session.noise_inputs}
        logits = x
        for i, name in enumerate(("1", "3")):  # the two row-noise layers, ReLU between
            enc = ir.encoded_weight(f"{name}.weight").encoding
            assert isinstance(enc, RowNoiseWeight)
            w = enc.mean()[None] * (1 + enc.s * noise[f"noise/{name}.weight.row"])[:, :, None]  # [S, out, in]
            bias = dict(net.named_parameters())[f"{name}.bias"].detach().numpy()
            logits = (np.einsum("bi,soi->bso", logits, w) if i == 0 else np.einsum("bsi,soi->bso", logits, w)) + bias
            if i == 0:
                logits = np.maximum(logits, 0)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        np.testing.assert_allclose(session.predict(x, noise=noise).probs, (p / p.sum(-1, keepdims=True)).mean(1),
                                   atol=ROUNDOFF)


def test_a_plugin_that_fails_to_load_is_one_line_naming_its_entry_point(tmp_path):
    """A broken installed plug-in (a dist-info on the path declaring an entry point whose module raises) stops every
    command in one line naming the plug-in and its entry point; a --plugin module that is missing, the same."""
    (tmp_path / "broken_example.py").write_text("raise ImportError('needs a library this machine lacks')\n")
    dist = tmp_path / "broken_example-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-example\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[edgebnn.plugins]\nbroken = broken_example\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    line = one_line_error(edgebnn_cli("plugins", cwd=tmp_path, env=env))
    assert line == ("error: plug-in 'broken' (entry point edgebnn.plugins: broken = broken_example, from "
                    "broken-example 0.1) failed to import: ImportError: needs a library this machine lacks")
    elsewhere = tmp_path / "elsewhere"  # python -m puts the working folder on the path: not the broken package's
    elsewhere.mkdir()
    line = one_line_error(edgebnn_cli("--plugin", "no_such_family", "plugins", cwd=elsewhere))
    assert "plug-in 'no_such_family' (--plugin: no_such_family) failed to import: ModuleNotFoundError" in line


def test_a_layer_no_loaded_plugin_knows_is_one_line_that_says_how(tmp_path):
    """A Bayesian-looking layer of a family whose plug-in is not loaded: the importer says a plug-in adds one."""
    (tmp_path / "unknown_family.py").write_text(
        "import torch\n"
        "class Layer(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.weight_mu = torch.nn.Parameter(torch.zeros(10, 64))\n"
        "        self.weight_spread = torch.nn.Parameter(torch.zeros(10))\n"
        "    def forward(self, x):\n"
        "        return torch.nn.functional.linear(x.flatten(1), self.weight_mu)\n"
        "def net():\n"
        "    return torch.nn.Sequential(Layer())\n")
    save_file({"0.weight_mu": torch.zeros(10, 64), "0.weight_spread": torch.zeros(10)}, tmp_path / "w.safetensors")
    line = one_line_error(edgebnn_cli("lower", "--model", "unknown_family:net", "--weights", "w.safetensors",
                                      "--input-shape", "1,64", "-o", "m.ebnn", cwd=tmp_path))
    assert "has Bayesian-looking parameters ['weight_mu'] but no importer knows it" in line
    assert "a plug-in adds one (docs/extending.md): install it, or load its module with --plugin MODULE" in line


def test_a_plugin_module_in_the_working_folder_loads_through_the_edgebnn_script(tmp_path):
    """``edgebnn --plugin mod`` and ``EDGEBNN_PLUGINS=mod`` find ``./mod.py`` when run as the installed script
    (which, unlike ``python -m``, does not put the working folder on the path), as ``--model`` finds a factory."""
    (tmp_path / "eb_local_family.py").write_text("MARK = 1\n")
    script = Path(sys.executable).parent / "edgebnn"
    env = {k: v for k, v in os.environ.items() if k != "EDGEBNN_PLUGINS"}
    r = subprocess.run([str(script), "--plugin", "eb_local_family", "plugins", "--json", "a.json"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(script), "plugins", "--json", "b.json"], cwd=tmp_path, capture_output=True, text=True,
                       env={**env, "EDGEBNN_PLUGINS": "eb_local_family"}, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in ("a.json", "b.json"):
        assert "eb_local_family" in [p["module"] for p in json.loads((tmp_path / name).read_text())["plugins"]]


def test_calibrate_is_refused_before_any_calibration_input_is_read(trained):
    """The refusal comes before the calibration inputs run: calibration data that cannot be read would fail first
    if they were read (the pass's own check comes only after the input second moments are measured)."""
    folder, _ = trained
    with pytest.raises(edgebnn.errors.InvalidOptionError, match="cannot honour --calibrate") as refused:
        edgebnn.api.lower_model("edgebnn_example.rownoise:row_noise_mlp", folder / "w.safetensors", (1, 1, 8, 8),
                                scheme="fixed", calibrate=folder / "no-such-calibration-data.npz")
    assert "no-such-calibration-data" not in str(refused.value)
