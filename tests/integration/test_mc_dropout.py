"""MC dropout: a plain torch model's dropout layers kept on at prediction, imported, exported in every mode.

The mask is a ``DropoutMask`` encoding feeding ``Mul``: the reference runtime and ``baked`` draw it from the same
streams (equal to round-off), ``noise`` draws it in the graph from uniform inputs (fed the reference's
uniforms: equal), ``analytic`` propagates its moments (checked against the closed form on one layer), and on
digits the S = 64 baked export matches torch's own MC dropout within the issue's goals.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import onnx
import pytest

from edgebnn.errors import UnsupportedLayerError
from edgebnn.exporters.analytic import quadrature_points
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.importers import import_model
from edgebnn.ir import from_bytes, to_bytes
from edgebnn.metrics import predictive_from_logits
from edgebnn.passes import lower
from edgebnn.runtime import Session
from edgebnn.runtime.reference import sample_logits

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
ort = pytest.importorskip("onnxruntime")

ROUNDOFF = 1e-5  # float32 arithmetic in another op order


def _cnn() -> Any:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Dropout2d(0.3), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 10)).eval()


def _x(n: int = 5) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, 1, 8, 8)).astype(np.float32)


def _run(proto: onnx.ModelProto, x: np.ndarray, **feeds: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x, **feeds})[0]


def test_masks_import_as_encodings_and_round_trip():
    ir = import_model(_cnn(), (1, 1, 8, 8), where="cnn", mc_dropout=True)
    masks = {w.name: (w.encoding.op_type, w.encoding.shape, w.encoding.p) for w in ir.encoded_weights()
             if w.encoding.op_type == "DropoutMask"}
    # the plain Conv/Linear weights: σ = 0 Gaussians (lowering schemes encode them); biases stay plain
    plain = {w.name: (w.encoding.op_type, float(w.encoding.stddev().max())) for w in ir.encoded_weights()
             if w.encoding.op_type != "DropoutMask"}
    assert plain == {f"{i}.weight": ("GaussianWeight", 0.0) for i in (0, 4, 7)}
    assert masks == {"2.dropout_mask": ("DropoutMask", (4, 1, 1), pytest.approx(0.3)),
                     "6.dropout_mask": ("DropoutMask", (32,), 0.5)}
    again = from_bytes(to_bytes(ir), "again")
    assert [getattr(w.encoding, "p", None) for w in again.encoded_weights()] == \
        [getattr(w.encoding, "p", None) for w in ir.encoded_weights()]


def test_baked_and_noise_are_the_reference_ensemble():
    ir, x = import_model(_cnn(), (1, 1, 8, 8), where="cnn", mc_dropout=True), _x()
    ref = predictive_from_logits(sample_logits(ir, x, 8, seed=3)).probs
    np.testing.assert_allclose(_run(export_model(ir, ExportConfig(8, mode="baked", seed=3)).proto, x), ref,
                               atol=ROUNDOFF)
    int8 = lower(ir, "fixed", seed=0, bits=8).model  # the plain weights on an 8-bit grid: int8 storage is exact
    ref8 = predictive_from_logits(sample_logits(int8, x, 8, seed=3)).probs
    np.testing.assert_allclose(_run(export_model(int8, ExportConfig(8, mode="baked", seed=3, weights="int8")).proto, x),
                               ref8, atol=ROUNDOFF)
    # noise --noise weight: masks drawn per sample from uniform inputs; fed the reference's uniforms
    uniforms = {f"noise/{w.name}": np.random.default_rng([3, i]).random((8, *w.encoding.shape), dtype=np.float32)
                for i, w in enumerate(ir.encoded_weights()) if w.encoding.op_type == "DropoutMask"}
    np.testing.assert_allclose(_run(export_model(ir, ExportConfig(8, mode="noise", noise="weight", rng="host")).proto,
                                    x, **uniforms), ref,
                               atol=ROUNDOFF)


def test_analytic_propagates_the_mask_moments():
    """Linear -> Dropout(p) -> logits: m' = m, v' = m² p/(1-p) (a deterministic input: v = 0)."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 5), nn.Dropout(0.25)).eval()
    ir = import_model(model, (1, 6), where="lin", mc_dropout=True)
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    with torch.no_grad():
        m = model(torch.from_numpy(x)).numpy()
    z = m[:, None] + np.sqrt(m * m * 0.25 / 0.75)[:, None] * quadrature_points(16, 5)[None]
    e = np.exp(z - z.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)).mean(1)
    np.testing.assert_allclose(_run(export_model(ir, ExportConfig(16, mode="analytic")).proto, x), want, atol=ROUNDOFF)


def test_float_bnn_baseline_draws_bernoulli_masks():
    """The profiling baseline draws a mask in the graph per run, [RandomUniform >= p] / (1-p), as torch does:
    every entry is 0 or 1/(1-p), kept with frequency 1-p, and the runs' mean predictive is the reference's
    (1,000 runs of 4 examples; bounds are 4 standard errors)."""
    from onnx import TensorProto, helper

    from edgebnn.exporters.ensemble import float_bnn

    torch.manual_seed(1)
    ir = import_model(nn.Sequential(nn.Linear(6, 5), nn.Dropout(0.25), nn.Linear(5, 3)).eval(), (1, 6),
                      where="lin", mc_dropout=True)
    proto = float_bnn(ir)
    onnx.checker.check_model(proto, full_check=True)
    proto.graph.output.append(helper.make_tensor_value_info("1.dropout_mask", TensorProto.FLOAT, [5]))
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    runs = [sess.run(["probs", "1.dropout_mask"], {"input": x}) for _ in range(1000)]
    masks = np.stack([m for _, m in runs])
    assert set(np.unique(masks)) == {0.0, np.float32(1 / 0.75)}
    assert abs(masks.mean() - 1.0) < 4 * np.sqrt(0.25 / 0.75 / masks.size)  # E[M] = 1, Var[M] = p/(1-p)
    ref = predictive_from_logits(sample_logits(ir, x, 4096, seed=0)).probs
    got = np.mean([p for p, _ in runs], axis=0)
    assert np.abs(got - ref).max() < 4 * 0.5 * np.sqrt(1 / 1000 + 1 / 4096)  # a probability's sd is at most 1/2


def test_every_export_is_clean():
    ir = import_model(_cnn(), (1, 1, 8, 8), where="cnn", mc_dropout=True)
    for mode, kw in [("baked", {}), ("baked", {"weights": "int8"}), ("noise", {"noise": "weight"}), ("shared", {}),
                     ("analytic", {})]:
        proto = export_model(ir, ExportConfig(4, mode=mode, **{"rng": "host", **kw})).proto
        onnx.checker.check_model(proto, full_check=True)
        used = {x for node in proto.graph.node for x in node.input}
        assert [t.name for t in proto.graph.initializer if t.name not in used] == []


def test_functional_dropout_in_a_custom_module_is_refused():
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: Any) -> Any:
            return F.dropout(self.fc(x), 0.2, self.training)

    model = nn.Sequential(nn.Dropout(0.1), Block()).eval()
    with pytest.raises(UnsupportedLayerError, match=r"^m: layer '1' \(Block\) calls dropout itself; --mc-dropout "
                                                    r"keeps only nn.Dropout/Dropout1d/2d/3d submodules on"):
        import_model(model, (1, 4), where="m", mc_dropout=True)


def test_a_model_without_dropout_is_refused():
    with pytest.raises(UnsupportedLayerError, match=r"^m: --mc-dropout: no nn.Dropout/Dropout1d/2d/3d with p > 0 "
                                                    r"\(nor an nn.LSTM/GRU/RNN with dropout > 0\) in Sequential$"):
        import_model(nn.Sequential(nn.Linear(4, 3)).eval(), (1, 4), where="m", mc_dropout=True)


@functools.lru_cache(maxsize=1)
def _digits_mlp() -> tuple[Any, np.ndarray, np.ndarray]:
    """A dropout MLP trained on sklearn's digits (bundled; 1,500 train / 297 test), fixed seeds."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 64), nn.ReLU(),
                          nn.Dropout(0.5), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x[:1500]), torch.from_numpy(y[:1500])
    model.train()
    for _ in range(300):
        opt.zero_grad()
        F.cross_entropy(model(xt), yt).backward()
        opt.step()
    return model.eval(), x[1500:], y[1500:]


def _scores(probs: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    return float(np.mean(probs.argmax(-1) == y)), float(-np.mean(np.log(probs[np.arange(len(y)), y] + 1e-12)))


def _torch_mc_dropout(model: Any, x: np.ndarray, passes: int) -> np.ndarray:
    """torch's own MC dropout: ``passes`` forward passes with dropout on, softmax averaged (seeded)."""
    torch.manual_seed(1)
    model.train()  # dropout on
    with torch.no_grad():
        probs = torch.stack([torch.softmax(model(torch.from_numpy(x)), -1) for _ in range(passes)]).mean(0).numpy()
    model.eval()
    return probs


def test_digits_export_matches_torch_mc_dropout():
    """S = 64: the baked export within 1 point of accuracy and +0.03 NLL of torch's own MC dropout (64 passes
    with dropout on). Both are 64-sample estimates of the same predictive (torch: masks per example; baked: 64
    masks shared by all examples)."""
    model, x, y = _digits_mlp()
    lib = _torch_mc_dropout(model, x, 64)
    ir = import_model(model, (1, 64), where="digits-mlp", mc_dropout=True)
    got = Session(export_model(ir, ExportConfig(64, mode="baked", seed=0)).proto).predict(x).probs
    (acc_lib, nll_lib), (acc, nll) = _scores(lib, y), _scores(got, y)
    assert acc >= acc_lib - 0.01 and nll <= nll_lib + 0.03, (acc_lib, nll_lib, acc, nll)
    noise = Session(export_model(ir, ExportConfig(64, mode="noise", noise="weight", rng="host")).proto,
                    seed=0).predict(x).probs
    acc_n, nll_n = _scores(noise, y)
    assert acc_n >= acc_lib - 0.01 and nll_n <= nll_lib + 0.03, (acc_lib, nll_lib, acc_n, nll_n)


def test_digits_lowered_with_fixed_stores_the_weights_once():
    """``fixed`` encodes the plain weights (σ = 0: they run once with their mean); the S = 16 baked export stores
    them once, not 16 times, and stays within 1 point / +0.03 NLL of torch's MC dropout with 16 passes."""
    model, x, y = _digits_mlp()
    ir = import_model(model, (1, 64), where="digits-mlp", mc_dropout=True)
    lowered = lower(ir, "fixed", seed=0).model
    assert {w.encoding.op_type for w in lowered.encoded_weights()} == {"FixedPointWeight", "DropoutMask"}
    proto = export_model(lowered, ExportConfig(16, mode="baked", seed=0)).proto
    weights = sum(p.numel() for p in model.parameters())  # 17,226 (weights and biases)
    assert len(proto.SerializeToString()) < 1.5 * 4 * weights  # fp32 once (S copies: 16x that)
    lib = _torch_mc_dropout(model, x, 16)
    (acc_lib, nll_lib), (acc, nll) = _scores(lib, y), _scores(Session(proto).predict(x).probs, y)
    assert acc >= acc_lib - 0.01 and nll <= nll_lib + 0.03, (acc_lib, nll_lib, acc, nll)


@pytest.mark.parametrize("scheme", ["fixed", "mcq", "codebook", "ternary", "binary", "prune"])
def test_every_scheme_encodes_the_deterministic_weights(scheme):
    """Schemes lower the plain layers' σ = 0 weights (a deterministic layer: every draw is the mean) and pass the
    masks through; the lowered IR exports with those layers run once (σ ≡ 0) and the masks sampled."""
    ir = import_model(_cnn(), (1, 1, 8, 8), where="cnn", mc_dropout=True)
    out = lower(ir, scheme, seed=0).model
    kinds = [w.encoding.op_type for w in out.encoded_weights()]
    assert kinds[3:] == ["DropoutMask", "DropoutMask"]
    assert ("GaussianWeight" in kinds) == (scheme == "prune")  # prune keeps Gaussians; the others encode them
    assert all(not w.encoding.stddev().any() for w in out.encoded_weights() if w.encoding.op_type != "DropoutMask")
    meta = json.loads(export_model(out, ExportConfig(4, mode="baked", seed=0)).proto.metadata_props[0].value)
    assert meta["layers"] == {"sampled": ["2", "6"], "hoisted": ["0", "4", "7"]}


@pytest.mark.parametrize("variant", ["auto", "local"])
def test_gaussian_noise_variants_draw_masks(variant):
    """``auto``/``local`` (the default and its Gemm form) draw a mask from uniform inputs per sample, as
    ``weight`` does: fed the reference's uniforms, the same ensemble; the Gaussian layers of this plain model
    are deterministic, so the only noise inputs are the masks'."""
    ir, x = import_model(_cnn(), (1, 1, 8, 8), where="cnn", mc_dropout=True), _x()
    proto = export_model(ir, ExportConfig(8, mode="noise", noise=variant, rng="host")).proto
    ref = predictive_from_logits(sample_logits(ir, x, 8, seed=3)).probs
    index = {name: i for i, name in enumerate(ir.encoded_weight_names())}
    masks = [w for w in ir.encoded_weights() if w.encoding.op_type == "DropoutMask"]
    uniforms = {f"noise/{w.name}": np.random.default_rng([3, index[w.name]]).random((8, *w.encoding.shape),
                                                                                   dtype=np.float32)
                for w in masks}
    assert {i.name for i in proto.graph.input} == {"input", *uniforms}
    np.testing.assert_allclose(_run(proto, x, **uniforms), ref, atol=ROUNDOFF)


FACTORIES = '''
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return F.dropout(self.fc(x.flatten(1)), 0.2, self.training)


def dropout_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10))


def functional_dropout():
    return nn.Sequential(Block())
'''


def test_cli_lower_mc_dropout_and_its_bad_input(tmp_path, monkeypatch):
    """``edgebnn lower --mc-dropout`` writes an IR with the masks; functional dropout: one line, exit 2, nothing
    written."""
    from click.testing import CliRunner

    from edgebnn.cli import main
    from edgebnn.ir import load

    (tmp_path / "mcd_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    import mcd_factories

    for factory in ("dropout_mlp", "functional_dropout"):
        torch.save(getattr(mcd_factories, factory)().state_dict(), tmp_path / f"{factory}.pt")
    out = tmp_path / "mlp.ebnn"
    args = ["lower", "--input-shape", "1,1,8,8", "--mc-dropout"]
    r = CliRunner().invoke(main, [*args, "--model", "mcd_factories:dropout_mlp", "--weights",
                                  str(tmp_path / "dropout_mlp.pt"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert [w.encoding.op_type for w in load(out).encoded_weights()] == ["GaussianWeight"] * 2 + ["DropoutMask"]
    bad = tmp_path / "bad.ebnn"
    r = CliRunner().invoke(main, [*args, "--model", "mcd_factories:functional_dropout", "--weights",
                                  str(tmp_path / "functional_dropout.pt"), "-o", str(bad)])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "layer '0' (Block) calls dropout itself" in lines[0] and not bad.exists()


def test_deploy_example_meets_the_goals(tmp_path):
    """examples/deploy_mc_dropout.py as a user runs it: S = 64, within 1 point / +0.03 NLL of torch's MC dropout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).parents[2] / "examples" / "deploy_mc_dropout.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(example.parents[1]), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(example), "--out", str(tmp_path)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    lib, onnx_scores = summary["torch_mc_dropout"], summary["onnx"]
    assert onnx_scores["accuracy"] >= lib["accuracy"] - 0.01 and onnx_scores["nll"] <= lib["nll"] + 0.03, summary
    assert (tmp_path / "model.onnx").stat().st_size > 0 and (tmp_path / "model.ebnn").stat().st_size > 0
