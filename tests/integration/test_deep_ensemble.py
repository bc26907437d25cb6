"""Deep ensembles imported with ``from_torch(members, ...)`` and exported as one graph (issue 21, item 1).

The exported S = M predictive must be the mean of the members' softmax (to 1e-4: float32 round-off of a
different op order is ~1e-7), and a ``fixed`` lowering must keep NLL within 0.05 and accuracy within 1 point on
digits (the issue's goals).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

import edgebnn
from edgebnn.cli import main
from edgebnn.errors import InvalidArtifactError, InvalidOptionError, UnsupportedLayerError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.ir import BNNModel, from_bytes, to_bytes, verify
from edgebnn.runtime.reference import predict

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
nn = torch.nn
M = 4
ROUNDOFF = 1e-4  # the bound; float32 in another op order is ~1e-7


def _mlp() -> Any:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))


def _cnn(seed: int) -> Any:
    """A CNN with BatchNorm2d, random weights and running statistics (training is not the point)."""
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(4 * 4 * 4, 10))
    with torch.no_grad():
        m[1].running_mean.normal_()
        m[1].running_var.uniform_(0.5, 2.0)
        m[1].weight.uniform_(0.5, 1.5)
        m[1].bias.normal_()
    return m.eval()


@pytest.fixture(scope="module")
def members(digits_data):
    """M digits MLPs (with BatchNorm), trained a few epochs from different seeds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fastest for these small MLPs on a shared machine
    xtr, ytr = (torch.from_numpy(a) for a in digits_data.split("train"))
    out = []
    try:
        for seed in range(M):
            torch.manual_seed(seed)
            m = _mlp()
            opt = torch.optim.Adam(m.parameters(), 1e-2)
            g = torch.Generator().manual_seed(seed)
            for _ in range(5):
                perm = torch.randperm(len(xtr), generator=g)
                for i in range(0, len(xtr), 64):
                    idx = perm[i:i + 64]
                    loss = nn.functional.cross_entropy(m(xtr[idx]), ytr[idx])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            out.append(m.eval())
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def ensemble_ir(members):
    return edgebnn.from_torch(members, (1, 1, 8, 8))


def _mean_softmax(models: list[Any], x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch.stack([m(torch.from_numpy(x)).softmax(-1) for m in models]).mean(0).numpy()


def _run(proto: Any, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["probs"], {"input": x})[0]


def _metrics(p: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    return float(np.mean(p.argmax(1) == y)), float(-np.mean(np.log(np.maximum(p[np.arange(len(y)), y], 1e-12))))


def test_exported_predictive_is_the_members_mean_softmax(members, ensemble_ir, digits_data):
    x, _ = digits_data.split("test")
    kinds = {w.name: w.encoding.op_type for w in ensemble_ir.encoded_weights()}
    assert set(kinds.values()) == {"MemberSetWeight"} and "2.weight" in kinds  # BatchNorm per member too
    ref = _mean_softmax(members, x)
    np.testing.assert_allclose(_run(export_model(ensemble_ir, ExportConfig(M, mode="baked")).proto, x), ref,
                               atol=ROUNDOFF)
    np.testing.assert_allclose(predict(ensemble_ir, x, M).probs, ref, atol=ROUNDOFF)  # the reference runtime
    # conv + BatchNorm2d members with different running statistics: member k's BN, not member 0's
    cnns = [_cnn(s) for s in range(3)]
    ir = edgebnn.from_torch(nn.ModuleList(cnns), (1, 1, 8, 8))
    np.testing.assert_allclose(_run(export_model(ir, ExportConfig(3, mode="baked")).proto, x[:50]),
                               _mean_softmax(cnns, x[:50]), atol=ROUNDOFF)


def test_list_tuple_modulelist_and_wrapper_import_alike(members, ensemble_ir):
    class Averaging(nn.Module):
        def __init__(self, ms: list[Any], log: bool) -> None:
            super().__init__()
            self.members, self.log = nn.ModuleList(ms), log

        def forward(self, x: Any) -> Any:
            p = torch.stack([m(x).softmax(-1) for m in self.members]).mean(0)
            return p.log() if self.log else p

    want = to_bytes(ensemble_ir)
    # (an nn.ModuleList: the CNN case above and the CLI; each import is one torch.onnx.export)
    for form in (tuple(members), Averaging(members, True)):
        assert to_bytes(edgebnn.from_torch(form, (1, 1, 8, 8), name="list")) == want


def test_fixed_lowering_keeps_nll_and_accuracy(members, ensemble_ir, digits_data):
    x, y = digits_data.split("test")
    acc, nll = _metrics(_mean_softmax(members, x), y)
    lowered = edgebnn.lower(ensemble_ir, "fixed")
    rows = lowered.lowering_report["layers"]
    assert {r["kind"] for r in rows} == {"MemberSetFixedWeight"}
    assert lowered.lowering_report["compression_ratio"] > 3  # fp32 members -> at most 8 bits here
    probs = predict(lowered, x, M).probs
    acc_low, nll_low = _metrics(probs, y)
    assert nll_low - nll <= 0.05 and abs(acc_low - acc) <= 0.01, (acc, nll, acc_low, nll_low)
    # int8 members: the grid is at most 8 bits, so int8 storage holds the lowered members exactly
    assert max(r["bits"] for r in rows) <= 8
    np.testing.assert_allclose(_run(export_model(lowered, ExportConfig(M, mode="baked", weights="int8",
                                                                       form="qdq")).proto, x), probs, atol=ROUNDOFF)
    again = from_bytes(to_bytes(lowered), "again")
    np.testing.assert_array_equal(predict(again, x[:20], M).probs, predict(lowered, x[:20], M).probs)


def test_bad_ensembles_are_one_line(members, ensemble_ir):
    shape = (1, 1, 8, 8)
    other = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))
    ln = [nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.LayerNorm(10)) for _ in range(2)]
    with torch.no_grad():
        ln[1][2].weight.fill_(2.0)

    class NotAverage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.members = nn.ModuleList(members)

        def forward(self, x: Any) -> Any:
            return torch.stack([m(x) for m in self.members]).mean(0)  # mean logits: another model

    cases = [
        ([members[0], "not a model"], InvalidOptionError, "member 1 is a str"),
        ([members[0]], InvalidOptionError, "at least 2 members"),
        ([members[0], other], UnsupportedLayerError, "differ in architecture: '1.weight'"),
        ([members[0], _cnn(0)], UnsupportedLayerError, "member 1"),
        (ln, UnsupportedLayerError, "'2.weight' differs between members"),
        (NotAverage(), UnsupportedLayerError, "not their mean softmax"),
    ]
    for model, err, needle in cases:
        with pytest.raises(err) as e:
            edgebnn.from_torch(model, shape)
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(InvalidOptionError, match="mc-dropout"):
        edgebnn.from_torch(members, shape, mc_dropout=True)
    for kwargs, needle in (({"samples": M + 1}, f"--samples {M}"), ({"samples": M, "mode": "analytic"}, "Gaussian"),
                           ({"samples": M, "mode": "noise"}, "constants")):
        with pytest.raises(InvalidOptionError, match=needle):
            export_model(ensemble_ir, ExportConfig(**{"mode": "baked", "rng": "host", **kwargs}))
    with pytest.raises(InvalidOptionError, match="codebook cannot lower"):
        edgebnn.lower(ensemble_ir, "codebook")


def test_hostile_member_sets_are_refused(ensemble_ir):
    import onnx

    proto = onnx.ModelProto()
    proto.CopyFrom(ensemble_ir.proto)
    node = next(n for n in proto.graph.node if n.op_type == "MemberSetWeight")
    next(a for a in node.attribute if a.name == "members").i = M + 1
    bad = BNNModel(proto, ensemble_ir.manifest, "hostile.ebnn")
    with pytest.raises(InvalidArtifactError, match="members must be float32"):
        verify(bad)


def test_cli_list_factory_and_prefixed_weights(members, tmp_path, monkeypatch, digits_data):
    from click.testing import CliRunner
    from safetensors.torch import save_file

    (tmp_path / "ens_factories.py").write_text(
        "from torch import nn\n\n"
        "def mlp():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(),\n"
        "                         nn.Linear(32, 10))\n\n"
        f"def ensemble():\n    return [mlp() for _ in range({M})]\n\n"
        "def junk():\n    return [mlp(), 3]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("ens_factories", None)
    weights = tmp_path / "ens.safetensors"
    save_file({k: v.contiguous() for k, v in nn.ModuleList(members).state_dict().items()}, str(weights))  # 0., 1.
    run = CliRunner()
    base = ["lower", "--weights", str(weights), "--input-shape", "1,1,8,8"]
    r = run.invoke(main, [*base, "--model", "ens_factories:ensemble", "--scheme", "fixed", "-o",
                          str(tmp_path / "e.ebnn")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    r = run.invoke(main, ["export", str(tmp_path / "e.ebnn"), "-o", str(tmp_path / "e.onnx")], catch_exceptions=False)
    assert r.exit_code == 0 and f"S={M}" in r.output, r.output  # --samples defaults to M
    x, _ = digits_data.split("test")
    probs = edgebnn.Session(str(tmp_path / "e.onnx")).predict(x[:30]).probs
    np.testing.assert_allclose(probs, _mean_softmax(members, x[:30]), atol=0.05)  # fixed-point members
    for args, needle in ((["--model", "ens_factories:junk"], "not a torch.nn.Module"),
                         (["--model", "ens_factories:mlp"], "does not match the model: missing 1.weight")):
        r = run.invoke(main, [*base, *args, "-o", str(tmp_path / "bad.ebnn")])
        assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = run.invoke(main, ["export", str(tmp_path / "e.ebnn"), "-S", "3", "-o", str(tmp_path / "x.onnx")])
    assert r.exit_code == 2 and "--samples 4" in r.output, r.output
    assert not (tmp_path / "bad.ebnn").exists() and not (tmp_path / "x.onnx").exists()
