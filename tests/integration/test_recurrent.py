"""Recurrent BNNs end to end (torch -> IR -> ONNX -> onnxruntime) on a small synthetic sequence task, and
runtime failures of an artifact as one line.

The data: 1-D signals [N, T, F] (a noisy sine whose frequency is the class). Models are small and seeded so
every test takes seconds; the torch Monte Carlo references are the libraries' own forward passes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
bl = pytest.importorskip("bayesian_torch.layers")
from torch import nn  # noqa: E402

import edgebnn  # noqa: E402
from edgebnn.cli import main  # noqa: E402
from edgebnn.errors import ArtifactRuntimeError, UnsupportedLayerError  # noqa: E402
from edgebnn.exporters.config import ExportConfig  # noqa: E402
from edgebnn.exporters.ensemble import save_onnx  # noqa: E402
from edgebnn.exporters.export import export_model  # noqa: E402
from edgebnn.importers._torch import import_model  # noqa: E402
from edgebnn.ir import gaussian_mlp  # noqa: E402
from edgebnn.runtime import Session  # noqa: E402
from edgebnn.runtime._ort import describe  # noqa: E402
from edgebnn.runtime.reference import predict  # noqa: E402

T, F, CLASSES = 6, 2, 3


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/integration/conftest.py


def signals(n: int, seed: int = 0) -> np.ndarray:
    """[n, T, F] sequences: sin and cos of a class-dependent frequency plus noise."""
    rng = np.random.default_rng(seed)
    freq = 0.5 + rng.integers(0, CLASSES, n)[:, None]
    t = np.arange(T)[None, :]
    x = np.stack([np.sin(freq * t), np.cos(freq * t)], -1) + 0.3 * rng.standard_normal((n, T, F))
    return x.astype(np.float32)


class BayesLSTM(nn.Module):
    """bayesian-torch's LSTM and a Bayesian head (the library's hand-written (out, kl) style)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = bl.LSTMReparameterization(F, 8, posterior_rho_init=-2.0)
        self.head = bl.LinearReparameterization(8, CLASSES, posterior_rho_init=-2.0)

    def forward(self, x):
        y, _, _ = self.rnn(x)
        return self.head(y[:, -1])[0]


class DropoutLSTM(nn.Module):
    """A plain 2-layer nn.LSTM whose own inter-layer dropout is the only dropout (MC dropout)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(F, 16, num_layers=2, dropout=0.5, batch_first=True)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x):
        y, (h, _c) = self.rnn(x)
        return self.head(h[-1]) + 0.0 * y[:, -1].sum()


class GRUHead(nn.Module):
    """A deterministic nn.GRU (sequence-major inside) and a Bayesian head."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(F, 8)
        self.head = bl.LinearReparameterization(8, CLASSES, posterior_rho_init=-2.0)

    def forward(self, x):
        _y, h = self.rnn(x.transpose(0, 1))
        return self.head(h[-1])[0]


def torch_predictive(model: nn.Module, x: np.ndarray, draws: int) -> np.ndarray:
    """[draws, N, K] softmax of ``draws`` forward passes (each draws its own weights or masks)."""
    torch.manual_seed(1)
    with torch.no_grad():
        xt = torch.from_numpy(x)
        return np.stack([torch.softmax(model(xt), -1).numpy() for _ in range(draws)])


def check_within_mc_error(probs: np.ndarray, torch_probs: np.ndarray, samples: int) -> None:
    """The exported S-sample predictive against the torch reference (mean of all draws): the mean absolute
    difference is at most 1.5x torch's own S-sample Monte Carlo error (std of one draw / sqrt(S), averaged over
    entries) + 0.002 (the reference's own MC error is sqrt(S / draws) of that: 0.25x at 500 draws)."""
    ref = torch_probs.mean(0)
    mc_error = torch_probs.std(0) / np.sqrt(samples)
    assert mc_error.mean() > 1e-4  # the posterior is not degenerate: the bound below could fail
    assert np.abs(probs - ref).mean() <= 1.5 * mc_error.mean() + 0.002


@pytest.fixture(scope="module")
def bayes_lstm():
    """The model, its IR and torch's 500-draw reference on ``signals(40)``."""
    torch.manual_seed(0)
    model = BayesLSTM().eval()
    return model, import_model(model, (1, T, F)), torch_predictive(model, signals(40), 500)


def test_bayesian_torch_lstm_draws_every_step(bayes_lstm):
    _, ir, _ = bayes_lstm
    names = ir.encoded_weight_names()
    # ih and hh (weight, bias) drawn at each of the T steps, as bayesian-torch's loop does, and the head once
    assert len([n for n in names if n.startswith("rnn.ih.weight")]) == T
    assert len([n for n in names if n.startswith("rnn.hh.bias")]) == T
    assert len(names) == 4 * T + 2


@pytest.mark.parametrize("mode, noise", [("baked", "auto"), ("noise", "weight"), ("noise", "auto")])
def test_bayesian_torch_lstm_matches_torch(bayes_lstm, mode, noise):
    _, ir, ref = bayes_lstm
    x = signals(40)
    probs = Session(export_model(ir, ExportConfig(32, mode=mode, noise=noise, rng="host")).proto,
                    seed=0).predict(x).probs
    check_within_mc_error(probs, ref, 32)


def test_baked_lstm_is_the_reference_runtime(bayes_lstm):
    _, ir, _ = bayes_lstm
    x = signals(3, seed=1)
    got = Session(export_model(ir, ExportConfig(5, mode="baked", seed=3)).proto).predict(x).probs
    np.testing.assert_allclose(got, predict(ir, x, 5, seed=3).probs, atol=1e-5)  # same members, fp32 round-off


def test_mc_dropout_two_layer_lstm(tmp_path):
    torch.manual_seed(0)
    model = DropoutLSTM()
    for p in model.parameters():  # larger weights so that dropping units moves the prediction
        p.data.mul_(3.0)
    ir = import_model(model.eval(), (1, T, F), mc_dropout=True)
    masks = [w for w in ir.encoded_weights() if w.encoding.op_type == "DropoutMask"]
    assert [(w.layer, w.encoding.shape) for w in masks] == [("rnn.drop0", (T, 16))]  # layer 1's output, [T, H]
    x = signals(40)
    model.train()  # nn.LSTM drops between its layers in training mode only: torch's MC dropout
    ref = torch_predictive(model, x, 500)
    for mode in ("baked", "noise"):
        pred = Session(export_model(ir, ExportConfig(32, mode=mode, rng="host")).proto, seed=0).predict(x)
        check_within_mc_error(pred.probs, ref, 32)
        assert pred.mutual_info.mean() > 1e-3  # the masks are sampled (zero without them)


@pytest.fixture(scope="module")
def gru_ir():
    torch.manual_seed(0)
    return import_model(GRUHead().eval(), (1, T, F))


def test_gru_any_batch_and_samples(gru_ir):
    ir = gru_ir
    x = signals(3, seed=2)
    np.testing.assert_allclose(Session(export_model(ir, ExportConfig(5, mode="baked")).proto).predict(x).probs,
                               predict(ir, x, 5).probs, atol=1e-5)
    for mode in ("noise", "baked"):  # other batches and S: the GRU's state follows the folded batch
        proto = export_model(ir, ExportConfig(7, mode=mode, rng="host")).proto
        assert Session(proto).predict(signals(11)).probs.shape == (11, CLASSES)


def test_lstm_layer_with_bayesian_head_any_batch():
    """The issue's case: nn.LSTM + Bayesian head failed in onnxruntime for batch x S > 1 (initial_h)."""

    class LSTMHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.LSTM(F, 16, batch_first=True)
            self.head = bl.LinearReparameterization(16, CLASSES)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.head(y[:, -1])[0]

    torch.manual_seed(0)
    ir = import_model(LSTMHead().eval(), (1, T, F))
    lstm = next(n for n in ir.proto.graph.node if n.op_type == "LSTM")
    assert list(lstm.input)[5:] in ([], [""], ["", ""])  # zero initial states dropped: the op's default
    x = signals(40)
    got = Session(export_model(ir, ExportConfig(16, mode="baked", seed=1)).proto).predict(x).probs
    np.testing.assert_allclose(got, predict(ir, x, 16, seed=1).probs, atol=1e-5)


def test_analytic_refuses_recurrent(bayes_lstm, gru_ir):
    _, ir, _ = bayes_lstm
    with pytest.raises(UnsupportedLayerError, match=r"layer 'rnn.ih' is recurrent.*analytic mode.*--mode baked"):
        export_model(ir, ExportConfig(8, mode="analytic"))
    with pytest.raises(UnsupportedLayerError, match=r"GRU node .*analytic mode does not propagate") as err:
        export_model(gru_ir, ExportConfig(8, mode="analytic"))
    assert "\n" not in str(err.value)


def _broken_artifact(path):
    """An exported MLP ensemble whose predictive head reshapes to the wrong class count: loads, fails on run."""
    rng = np.random.default_rng(0)
    ir = gaussian_mlp([(rng.standard_normal((4, 5)).astype(np.float32), np.full((4, 5), 0.1, np.float32),
                        np.zeros(4, np.float32), None)])
    proto = export_model(ir, ExportConfig(4, mode="baked")).proto
    shape = next(t for t in proto.graph.initializer if t.name == "ens/head/shape")
    shape.CopyFrom(onnx.numpy_helper.from_array(np.array([-1, 3, 7], np.int64), shape.name))  # 4 x 4 logits
    save_onnx(proto, path)
    return path


def test_runtime_failure_is_one_line(tmp_path):
    path = _broken_artifact(tmp_path / "broken.onnx")
    with pytest.raises(ArtifactRuntimeError, match=r"broken\.onnx: onnxruntime failed in Reshape node") as err:
        Session(path).predict(np.zeros((2, 5), np.float32))
    assert "\n" not in str(err.value)
    np.savez(tmp_path / "d.npz", x=np.zeros((6, 5), np.float32), y=np.zeros(6, np.int64))
    r = CliRunner().invoke(main, ["eval", str(path), "--data", str(tmp_path / "d.npz")], catch_exceptions=False)
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "broken.onnx: onnxruntime failed in Reshape node" in lines[0], r.output
    assert "Traceback" not in r.output


def test_describe_parses_onnxruntime_messages():
    run = RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running LSTM node. "
                       "Name:'node_lstm__2' Status Message: Input initial_h must have shape {1,1,16}. "
                       "Actual:{1,640,16}")
    assert describe("m.onnx", run) == ("m.onnx: onnxruntime failed in LSTM node 'node_lstm__2': Input initial_h "
                                       "must have shape {1,1,16}. Actual:{1,640,16}")
    load = RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Load model failed:Node (fc) Op (Gemm) "
                        "[ShapeInferenceError] Incompatible dimensions\nmore")
    assert describe("m.onnx", load) == ("m.onnx: onnxruntime failed in Gemm node 'fc': [ShapeInferenceError] "
                                        "Incompatible dimensions more")
    assert edgebnn.errors.ArtifactRuntimeError.__mro__[1] is edgebnn.errors.EdgeBNNError
