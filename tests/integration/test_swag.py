"""SWAG (Maddox et al. 2019) imported with ``from_swag`` and exported exactly (issue 21, item 3).

The statistics are collected here as the SWAG reference code does (wjmaddox/swa_gaussian ``SWAG.collect_model``:
running mean and squared mean, the last K deviations from the running mean), on an MLP trained on digits with
SGD; the reference predictive is this file's own torch implementation of the reference ``sample()``:

    w = mean + sqrt(scale) · (sqrt(max(sq_mean − mean², 1e-30)) ⊙ z₁ + Dᵀ z₂ / sqrt(K − 1)),  one z₂ for all params
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

import edgebnn
from edgebnn.cli import main
from edgebnn.errors import EdgeBNNError, InvalidWeightsError, UnsupportedLayerError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.ir import from_bytes, to_bytes
from edgebnn.ir.encodings import LowRankGaussianWeight

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
nn = torch.nn
K = 10  # deviations: conftest.SWAG_K
SCALE = 0.5


@pytest.fixture(scope="module")
def swag(swag_digits, digits_data):
    """(model, stats, test x, test y): the session's SWAG run (conftest: SGD on digits, then K snapshots)."""
    x, y = digits_data.split("test")
    return *swag_digits, x[:200], y[:200]


@pytest.fixture(scope="module")
def swag_ir(swag):
    model, stats, _, _ = swag
    return edgebnn.from_swag(model, stats, (1, 1, 8, 8), scale=SCALE)


def _torch_swag_probs(model: Any, stats: dict[str, Any], x: np.ndarray, samples: int, seed: int) -> np.ndarray:
    """[samples, N, classes] softmax of the reference sampler's draws (flattened, one z₂ per sample)."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    mean = torch.cat([stats[f"{n}_mean"].reshape(-1) for n in names])
    var = torch.clamp(torch.cat([stats[f"{n}_sq_mean"].reshape(-1) for n in names]) - mean**2, 1e-30)
    dmat = torch.cat([stats[f"{n}_covariance_sqrt"] for n in names], dim=1)
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(samples, mean.numel(), generator=g)
    z2 = torch.randn(samples, K, generator=g)
    w = mean + SCALE**0.5 * (var.sqrt() * z1 + z2 @ dmat / (K - 1) ** 0.5)
    parts = dict(zip(names, torch.split(w, [s.numel() for s in shapes], dim=1), strict=True))
    ws = {n: parts[n].reshape(samples, *s) for n, s in zip(names, shapes, strict=True)}
    h = torch.from_numpy(x).reshape(len(x), -1)
    h = torch.relu(torch.einsum("ni,soi->sno", h, ws["1.weight"]) + ws["1.bias"][:, None])
    logits = torch.einsum("sni,soi->sno", h, ws["3.weight"]) + ws["3.bias"][:, None]
    return logits.softmax(-1).numpy()


def _error(p: np.ndarray, ref: np.ndarray) -> float:
    """Mean over inputs of the largest class-probability difference."""
    return float(np.abs(p - ref).max(axis=1).mean())


def test_swag_export_within_monte_carlo_error_of_the_reference(swag, swag_ir):
    model, stats, x, _ = swag
    ir = swag_ir
    assert {w.encoding.op_type for w in ir.encoded_weights()} == {"LowRankGaussianWeight"}
    ref = _torch_swag_probs(model, stats, x, 4000, seed=1).mean(0)
    # the library's own S = 64 Monte Carlo error (mean over 8 independent S = 64 predictives of the torch sampler)
    mc = np.mean([_error(_torch_swag_probs(model, stats, x, 64, seed=100 + r).mean(0), ref) for r in range(8)])
    sess = ort.InferenceSession(export_model(ir, ExportConfig(64, mode="baked", seed=0)).proto.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    baked = sess.run(["probs"], {"input": x})[0]
    path = export_model(ir, ExportConfig(64, mode="noise", noise="weight", rng="host")).proto
    from edgebnn.runtime import Session

    session = Session(path.SerializeToString(), seed=0, noise_pool=False)
    in_graph = session.predict(x).probs
    # issue 21's goal: within 1.5x the library's S = 64 Monte Carlo error of the 4000-sample reference, + 0.002
    assert _error(baked, ref) <= 1.5 * mc + 0.002, (_error(baked, ref), mc)
    assert _error(in_graph, ref) <= 1.5 * mc + 0.002, (_error(in_graph, ref), mc)


def test_swag_noise_graph_is_the_numpy_draw(swag, swag_ir):
    """noise --noise weight: z₂ one input [S, K] read by every layer; fed noise, the graph is the encoding's draw."""
    x, ir = swag[2], swag_ir
    proto = export_model(ir, ExportConfig(8, mode="noise", noise="weight", rng="host")).proto
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    assert names.count("noise/swag_z2") == 1
    rng = np.random.default_rng(0)
    feed = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()[1:]}
    got = sess.run(["probs"], {"input": x[:20], **feed})[0]
    encs = {w.name: w.encoding for w in ir.encoded_weights()}
    ws = {n: e._draw(feed[f"noise/{n}"].copy(), feed["noise/swag_z2"]) for n, e in encs.items()}
    h = np.maximum(np.einsum("ni,soi->sno", x[:20].reshape(20, -1), ws["1.weight"]) + ws["1.bias"][:, None], 0)
    z = np.einsum("sni,soi->sno", h, ws["3.weight"]) + ws["3.bias"][:, None]
    p = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(got, (p / p.sum(-1, keepdims=True)).mean(0), atol=1e-5)  # float32 op order


def test_joint_draw_shares_z2_across_layers(swag_ir):
    """Baked draws z₂ once per sample for the whole network: each layer's low-rank term is Dᵀ z₂ with the same z₂
    (recovered per layer by least squares from the draw minus its diagonal part)."""
    ir = swag_ir
    from edgebnn.ir.encodings import draw_weight

    z2s = []
    for i, w in enumerate(ir.encoded_weights()):
        enc = w.encoding
        assert isinstance(enc, LowRankGaussianWeight)
        draws = draw_weight(enc, 5, i, 4).reshape(4, -1)
        z1 = np.random.default_rng([5, i]).standard_normal((4, *enc.shape), dtype=np.float32).reshape(4, -1)
        low = (draws - enc.mu.reshape(-1)) / np.sqrt(enc.scale) - enc.sigma.reshape(-1) * z1
        z2s.append(np.linalg.lstsq(enc.deviations.T / np.sqrt(K - 1), low.T, rcond=None)[0].T)
    for z2 in z2s[1:]:
        np.testing.assert_allclose(z2, z2s[0], atol=1e-3)  # float32 draws, least squares on K columns


def test_stats_formats_and_round_trip(swag, swag_ir):
    from edgebnn.importers.swag import _prefix

    model, stats, _, _ = swag
    ref = swag_ir
    # the reference code's buffers (base. prefix, _cov_mat_sqrt, n_models) import to the same IR
    ref_code = {"base." + k.replace("_covariance_sqrt", "_cov_mat_sqrt"): v for k, v in stats.items()}
    ref_code["n_models"] = torch.tensor([K])
    assert to_bytes(edgebnn.from_swag(model, ref_code, (1, 1, 8, 8))) == to_bytes(ref)
    assert _prefix({"model.swag_stats." + k: v for k, v in stats.items()}, "1.weight", "tu") == "model.swag_stats."
    back = from_bytes(to_bytes(ref), "again")
    sd = [w.encoding.stddev() for w in back.encoded_weights()]
    assert all(s.min() > 0 for s in sd)
    diag = edgebnn.from_swag(model, {k: v for k, v in stats.items() if "covariance" not in k}, (1, 1, 8, 8))
    assert {w.encoding.op_type for w in diag.encoded_weights()} == {"GaussianWeight"}  # SWAG-diagonal


def test_bad_swag_inputs_are_one_line(swag, swag_ir):
    model, stats, _, _ = swag
    cases = {
        "missing": ({k: v for k, v in stats.items() if k != "3.bias_sq_mean"}, InvalidWeightsError, "'3.bias'"),
        "extra": ({**stats, "9.weight_mean": torch.zeros(3)}, InvalidWeightsError, "'9.weight_mean'"),
        "shape": ({**stats, "1.bias_mean": torch.zeros(5)}, InvalidWeightsError, "'1.bias'"),
        "rank": ({**stats, "3.bias_covariance_sqrt": torch.zeros(4, 10)}, InvalidWeightsError, "deviations"),
        "none": ({"foo": torch.zeros(2)}, InvalidWeightsError, "'1.weight'"),
    }
    for name, (bad, err, needle) in cases.items():
        with pytest.raises(err) as e:
            edgebnn.from_swag(model, bad, (1, 1, 8, 8))
        assert needle in str(e.value) and "\n" not in str(e.value), name
    ln = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.LayerNorm(10))
    ln_stats = {f"{n}_{s}": p.detach() for n, p in ln.named_parameters() for s in ("mean", "sq_mean")}
    with pytest.raises(UnsupportedLayerError, match=r"'2\.weight'"):
        edgebnn.from_swag(ln, ln_stats, (1, 1, 8, 8))
    with pytest.raises(EdgeBNNError, match="scale"):
        edgebnn.from_swag(model, stats, (1, 1, 8, 8), scale=0)
    ir = swag_ir
    for mode, noise in (("analytic", "auto"), ("noise", "auto"), ("noise", "local")):
        with pytest.raises(EdgeBNNError, match="low-rank") as e:
            export_model(ir, ExportConfig(8, mode=mode, noise=noise, rng="host"))
        assert "\n" not in str(e.value)
    with pytest.raises(EdgeBNNError, match="codebook cannot lower"):
        edgebnn.lower(ir, "codebook")


def test_cli_swag(swag, tmp_path, monkeypatch):
    from click.testing import CliRunner
    from safetensors.torch import save_file

    model, stats, _, _ = swag
    (tmp_path / "swag_factories.py").write_text(
        "from torch import nn\n\ndef mlp():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("swag_factories", None)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    save_file({k: v.contiguous() for k, v in stats.items()}, str(tmp_path / "stats.safetensors"))
    base = ["lower", "--model", "swag_factories:mlp", "--weights", str(tmp_path / "w.safetensors"),
            "--input-shape", "1,1,8,8"]
    r = CliRunner().invoke(main, [*base, "--swag", str(tmp_path / "stats.safetensors"), "-o",
                                  str(tmp_path / "s.ebnn")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["export", str(tmp_path / "s.ebnn"), "-S", "8", "-o", str(tmp_path / "s.onnx")],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    save_file({k: v.contiguous() for k, v in stats.items() if k != "1.weight_mean"}, str(tmp_path / "bad.safetensors"))
    r = CliRunner().invoke(main, [*base, "--swag", str(tmp_path / "bad.safetensors"), "-o", str(tmp_path / "b.ebnn")])
    assert r.exit_code == 2 and "'1.weight_mean'" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "b.ebnn").exists()
