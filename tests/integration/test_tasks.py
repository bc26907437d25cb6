"""Regression and per-pixel (segmentation) outputs: the task heads against torch's own Monte Carlo predictive.

Tolerances: the exported S = 64 predictive is one S = 64 Monte Carlo estimate of the posterior predictive, so it
is held to 1.5x the error that torch's own S = 64 estimates make against a 4000-sample torch reference, measured
here from the same 4000 samples (62 blocks of 64: the RMS over blocks and outputs), plus a small absolute slack
(float32 round-off and the reference's own error, 1/sqrt(62) of a block's).
"""

from __future__ import annotations

import json
from typing import ClassVar

import numpy as np
import pytest
import torch
from bayesian_torch.layers import Conv2dReparameterization, LinearReparameterization
from torch import nn

from edgebnn import evaluate, from_torch
from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.ir import BNNModel, Manifest, from_bytes, to_bytes
from edgebnn.metrics import RegressionPredictive
from edgebnn.runtime import Session
from edgebnn.tasks import Classification, Regression, Segmentation, Task, predictive_from_samples

S, REF, BLOCKS = 64, 4000, 62  # exported members; torch reference draws; S-sized blocks of it
RHO = -1.5  # posterior sigma = log1p(exp(-1.5)) ~ 0.2: an epistemic spread the tests can see


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/integration/conftest.py


def _seed(n: int = 0) -> None:
    torch.manual_seed(n)
    np.random.seed(n)


class MeanLogVar(nn.Module):
    """bayesian-torch MLP returning (mean, log-variance) as one [B, 2] output."""

    def __init__(self, tuple_out: bool = False) -> None:
        super().__init__()
        self.fc1 = LinearReparameterization(3, 16, posterior_rho_init=RHO)
        self.fc2 = LinearReparameterization(16, 2, posterior_rho_init=RHO)
        self.tuple_out = tuple_out

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(torch.relu(self.fc1(x, return_kl=False)), return_kl=False)
        return (out[:, :1], out[:, 1:]) if self.tuple_out else out


class MeanOnly(nn.Module):
    """bayesian-torch MLP returning two means per example ([B, D = 2])."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = LinearReparameterization(3, 16, posterior_rho_init=RHO)
        self.fc2 = LinearReparameterization(16, 2, posterior_rho_init=RHO)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc2(torch.relu(self.fc1(x, return_kl=False)), return_kl=False)
        return out


class LastLayerBayes(nn.Module):
    """Deterministic features, one Bayesian linear head: its outputs are exactly Gaussian (analytic is exact)."""

    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(3, 16), nn.ReLU())
        self.head = LinearReparameterization(16, width, posterior_rho_init=RHO)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x), return_kl=False)


class SegNet(nn.Module):
    """bayesian-torch per-pixel classifier: [B, 1, 6, 6] -> [B, 3, 6, 6] logits."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = Conv2dReparameterization(1, 6, 3, padding=1, posterior_rho_init=RHO)
        self.c2 = Conv2dReparameterization(6, 3, 1, posterior_rho_init=RHO)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.relu(self.c1(x, return_kl=False)), return_kl=False)


class DropoutSeg(nn.Module):
    """Plain torch per-pixel classifier with channel dropout (MC dropout, nn.Dropout2d)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Dropout2d(0.3), nn.Conv2d(8, 3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _torch_draws(model: nn.Module, x: np.ndarray, n: int, train: bool = False) -> np.ndarray:
    """[n, N, ...] outputs of ``n`` forward passes (each draws its own weights / dropout masks)."""
    model.train(train)
    xt = torch.from_numpy(x)
    with torch.no_grad():
        outs = []
        for _ in range(n):
            y = model(xt)
            outs.append(torch.cat(list(y), 1) if isinstance(y, tuple) else y)
    model.eval()
    return torch.stack(outs).numpy().astype(np.float64)


def _regression_moments(task: Task, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred = predictive_from_samples(task, draws)
    assert isinstance(pred, RegressionPredictive)
    return pred.mean.astype(np.float64), pred.variance.astype(np.float64)


def _check_regression(task: Task, draws: np.ndarray, pred: RegressionPredictive, what: str) -> None:
    """Exported mean within 1.5x torch's S=64 RMS error (+1e-3), total variance within 1.5x its relative RMS error
    (+0.01), both against the 4000-draw reference."""
    mean, var = _regression_moments(task, draws)
    blocks = [_regression_moments(task, draws[i * S:(i + 1) * S]) for i in range(BLOCKS)]
    mean_err = np.sqrt(np.mean([(m - mean) ** 2 for m, _ in blocks]))
    var_err = np.sqrt(np.mean([((v - var) / var) ** 2 for _, v in blocks]))
    got_mean = np.sqrt(np.mean((pred.mean - mean) ** 2))
    got_var = np.sqrt(np.mean(((pred.variance - var) / var) ** 2))
    assert got_mean <= 1.5 * mean_err + 1e-3, f"{what}: mean RMS error {got_mean:.4g} vs torch S=64 {mean_err:.4g}"
    assert got_var <= 1.5 * var_err + 0.01, f"{what}: variance rel. error {got_var:.4g} vs torch S=64 {var_err:.4g}"
    np.testing.assert_allclose(pred.variance, pred.aleatoric + pred.epistemic, rtol=1e-5, atol=1e-7)


def _inputs(n: int = 24) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(n, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def mean_logvar() -> tuple[BNNModel, np.ndarray, np.ndarray]:
    _seed(0)
    model = MeanLogVar()
    x = _inputs()
    return from_torch(model, (1, 3), task="regression"), x, _torch_draws(model, x, REF)


@pytest.fixture(scope="module")
def mean_only() -> tuple[BNNModel, np.ndarray, np.ndarray]:
    _seed(1)
    model = MeanOnly()
    x = _inputs()
    return from_torch(model, (1, 3), task="regression", noise_var=0.05), x, _torch_draws(model, x, REF)


@pytest.mark.parametrize("mode", ["baked", "noise"])
def test_mean_logvar_regression_matches_torch(mode: str, mean_logvar) -> None:
    ir, x, draws = mean_logvar
    task = ir.manifest.task_spec()
    assert (task.name, task.head, task.dims) == ("regression", "mean_logvar", 1)
    pred = Session(export_model(ir, ExportConfig(S, mode=mode, seed=3, rng="host")).proto, seed=5).predict(x)
    assert isinstance(pred, RegressionPredictive) and pred.mean.shape == (len(x), 1)
    _check_regression(task, draws, pred, mode)
    # the split: aleatoric is the mean of exp(log-variance), epistemic the spread of the means
    assert (pred.epistemic > 0).all() and (pred.aleatoric > 0).all()


@pytest.mark.parametrize("mode", ["baked", "noise"])
def test_mean_only_regression_with_noise_var_matches_torch(mode: str, mean_only) -> None:
    ir, x, draws = mean_only
    task = ir.manifest.task_spec()
    assert (task.head, task.dims, task.noise_var) == ("mean", 2, 0.05)
    pred = Session(export_model(ir, ExportConfig(S, mode=mode, seed=3, rng="host")).proto, seed=5).predict(x)
    assert isinstance(pred, RegressionPredictive) and pred.mean.shape == (len(x), 2)
    np.testing.assert_allclose(pred.aleatoric, 0.05, rtol=1e-6)
    _check_regression(task, draws, pred, mode)


@pytest.mark.parametrize("kind", ["mean_logvar", "mean"])
def test_analytic_regression_is_exact_for_a_gaussian_output(kind: str) -> None:
    """One Bayesian linear head on deterministic features: its outputs are Gaussian, so analytic's mean,
    epistemic variance and E[exp(log-variance)] = exp(m + v/2) are exact."""
    _seed(2)
    model = LastLayerBayes()
    ir = from_torch(model, (1, 3), task="regression",
                    **({"noise_var": 0.1} if kind == "mean" else {}))
    assert ir.manifest.task_spec().head == kind
    x = _inputs()
    draws = _torch_draws(model, x, REF)
    pred = Session(export_model(ir, ExportConfig(S, mode="analytic")).proto).predict(x)
    assert isinstance(pred, RegressionPredictive)
    _check_regression(ir.manifest.task_spec(), draws, pred, "analytic")


def test_tuple_head_and_evaluate_report() -> None:
    _seed(3)
    model = MeanLogVar(tuple_out=True)
    ir = from_torch(model, (1, 3), task="regression")
    assert ir.manifest.task_spec().head == "mean_logvar" and ir.manifest.num_classes == 2
    x = _inputs(64)
    y = (x[:, :1] * 0.5).astype(np.float32)
    report = evaluate(Session(export_model(ir, ExportConfig(16, mode="baked")).proto), data=(x, y))
    assert report["task"] == "regression"
    for key in ("nll", "rmse", "mae", "calibration_error", "aleatoric", "epistemic", "variance"):
        assert np.isfinite(report[key]), key
    assert set(report["coverage"]) == {"50", "90", "95"}
    assert report["coverage"]["50"] <= report["coverage"]["90"] <= report["coverage"]["95"]
    # the reference runtime on the IR reports the same keys
    assert {"nll", "rmse"} <= set(evaluate(ir, data=(x, y), samples=8))


def test_regression_metrics_by_hand() -> None:
    """Gaussian NLL, RMSE and coverage of a known predictive."""
    from edgebnn.tasks.regression import RegressionSums

    mean = np.zeros((4, 1), np.float32)
    var = np.ones((4, 1), np.float32)
    y = np.array([[0.0], [0.5], [1.0], [2.0]])
    sums = RegressionSums()
    sums.add(RegressionPredictive(mean, var, var, np.zeros_like(var)), y)
    r = sums.report()
    assert r["rmse"] == pytest.approx(np.sqrt(np.mean(y**2)))
    assert r["nll"] == pytest.approx(np.mean(0.5 * np.log(2 * np.pi) + y**2 / 2))
    # |z| = 0, 0.5, 1, 2: within the 50% interval (0.674) 2 of 4, the 90% (1.645) 3, the 95% (1.960) 3
    assert r["coverage"] == {"50": 0.5, "90": 0.75, "95": 0.75}


def test_two_wide_head_without_task_is_refused() -> None:
    with pytest.raises(UnsupportedLayerError, match=r"^m: forward returns 2 outputs per example \[1, 2\]; .*"
                       r"task='classification'.*task='regression'"):
        from_torch(MeanLogVar(), (1, 3), name="m")
    with pytest.raises(UnsupportedLayerError, match=r"^m: forward returns one output per example; .*task='regression'"):
        from_torch(LastLayerBayes(width=1), (1, 3), name="m")
    # stated, a 2-wide head is a 2-class classifier as before
    ir = from_torch(MeanLogVar(), (1, 3), task="classification")
    assert ir.manifest.task == "classification" and "task" not in ir.manifest.to_json()


def test_regression_options_are_checked() -> None:
    with pytest.raises(InvalidOptionError, match=r"--noise-var -1\.0"):
        from_torch(MeanOnly(), (1, 3), task="regression", noise_var=-1.0)
    with pytest.raises(InvalidOptionError, match="apply to --task regression only"):
        from_torch(SegNet(), (1, 1, 6, 6), noise_var=0.1)
    with pytest.raises(InvalidOptionError, match=r"^--task: task 'blah' is not known to this edgebnn \(known: "
                       r"[^;]*classification, [^;]*regression, segmentation \(dense\)[^;]*\); install or load"):
        from_torch(MeanOnly(), (1, 3), task="blah")
    with pytest.raises(InvalidOptionError, match=r"a mean and log-variance head returns \[batch, 2D\]"):
        from_torch(LastLayerBayes(width=3), (1, 3), task="regression", regression_head="mean_logvar")
    with pytest.raises(UnsupportedLayerError, match=r"task regression needs a \[batch, outputs\] output, got "
                       r"\[1, 3, 6, 6\]"):
        from_torch(SegNet(), (1, 1, 6, 6), task="regression")


def test_task_survives_save_and_old_manifests_are_classification(mean_only) -> None:
    ir = mean_only[0]
    again = from_bytes(to_bytes(ir), "m.ebnn")
    assert again.manifest.task_spec() == ir.manifest.task_spec() == Regression("mean", 2, 0.05)
    # a manifest without a task (every file written before tasks) reads as classification
    raw = json.loads(ir.manifest.to_json())
    del raw["task"], raw["task_options"]
    assert Manifest.from_json(json.dumps(raw), "old.ebnn").task_spec() == Classification()


def _pixel_checks(ir: BNNModel, draws: np.ndarray, x: np.ndarray, modes: list[str]) -> None:
    task = ir.manifest.task_spec()
    ref = predictive_from_samples(task, draws).probs.astype(np.float64)
    blocks = [predictive_from_samples(task, draws[i * S:(i + 1) * S]).probs for i in range(BLOCKS)]
    err = np.sqrt(np.mean([(b - ref) ** 2 for b in blocks]))
    for mode in modes:
        pred = Session(export_model(ir, ExportConfig(S, mode=mode, seed=3, rng="host")).proto, seed=5).predict(x)
        assert pred.probs.shape == (len(x), 3, 6, 6)
        assert pred.entropy.shape == pred.mutual_info.shape == (len(x), 6, 6)
        got = np.sqrt(np.mean((pred.probs - ref) ** 2))
        assert got <= 1.5 * err + 0.002, f"{mode}: per-pixel probs RMS error {got:.4g} vs torch S=64 {err:.4g}"
        assert (pred.mutual_info >= 0).all() and (pred.mutual_info <= pred.entropy + 1e-5).all()


def test_segmentation_bayesian_conv_matches_torch() -> None:
    _seed(4)
    model = SegNet()
    ir = from_torch(model, (1, 1, 6, 6))  # a >= 3-D output is a dense prediction without saying so
    assert ir.manifest.task_spec() == Segmentation((3, 6, 6))
    x = np.random.default_rng(2).random((6, 1, 6, 6), dtype=np.float32)
    _pixel_checks(ir, _torch_draws(model, x, REF), x, ["baked", "noise"])


def test_segmentation_mc_dropout2d_matches_torch() -> None:
    _seed(5)
    model = DropoutSeg()
    ir = from_torch(model, (1, 1, 6, 6), mc_dropout=True, task="dense")
    assert ir.manifest.task == "segmentation"
    x = np.random.default_rng(3).random((6, 1, 6, 6), dtype=np.float32)
    _pixel_checks(ir, _torch_draws(model, x, REF, train=True), x, ["baked", "noise"])


def test_segmentation_analytic_and_evaluate(tmp_path) -> None:
    """Analytic is exact where the logits are Gaussian (one Bayesian 1x1 conv on deterministic features) up to
    its Q-point quadrature; evaluate reports pixel accuracy, IoU, NLL and ECE per pixel, and draws the MI map."""
    _seed(6)

    class LastConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU())
            self.head = Conv2dReparameterization(6, 3, 1, posterior_rho_init=RHO)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(x), return_kl=False)

    model = LastConv()
    ir = from_torch(model, (1, 1, 6, 6))
    x = np.random.default_rng(4).random((6, 1, 6, 6), dtype=np.float32)
    _pixel_checks(ir, _torch_draws(model, x, REF), x, ["analytic"])
    y = np.random.default_rng(5).integers(0, 3, (6, 6, 6))
    png = tmp_path / "seg.png"
    report = evaluate(Session(export_model(ir, ExportConfig(8, mode="baked")).proto), data=(x, y), ood_data=x[::-1] * 3,
                      plot=png)
    assert report["task"] == "segmentation" and png.stat().st_size > 0
    for key in ("pixel_accuracy", "mean_iou", "nll", "ece"):
        assert 0 <= report[key] < np.inf, key
    assert len(report["iou"]) == 3 and 0 <= report["ood"]["auroc_mutual_info"] <= 1
    with pytest.raises(InvalidOptionError, match=r"expected \(6, 6, 6\): an integer class mask per input"):
        evaluate(ir, data=(x, y[:, :3]), samples=4)


def test_one_dimensional_dense_output() -> None:
    """[N, C, L] logits (a per-step classifier on a signal)."""
    _seed(7)

    class Conv1d(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = nn.Conv1d(2, 4, 3, padding=1)
            self.drop = nn.Dropout(0.2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.drop(x))

    ir = from_torch(Conv1d(), (1, 2, 10), mc_dropout=True)
    assert ir.manifest.task_spec().shape == (4, 10)
    x = np.random.default_rng(6).random((3, 2, 10), dtype=np.float32)
    for mode in ("baked", "noise", "analytic"):
        pred = Session(export_model(ir, ExportConfig(8, mode=mode, rng="host")).proto).predict(x)
        assert pred.probs.shape == (3, 4, 10) and pred.mutual_info.shape == (3, 10), mode
        np.testing.assert_allclose(pred.probs.sum(1), 1.0, atol=1e-5)


_CLI_MODULE = '''
from torch import nn
from bayesian_torch.layers import LinearReparameterization


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = LinearReparameterization(3, 8, posterior_rho_init=-1.5)
        self.fc2 = LinearReparameterization(8, 2, posterior_rho_init=-1.5)

    def forward(self, x):
        return self.fc2(self.fc1(x, return_kl=False).relu(), return_kl=False)


def factory():
    return Head()
'''


def test_cli_regression_lower_export_eval(tmp_path, monkeypatch) -> None:
    """The CLI: a 2-wide head without --task is one line, exit 2, nothing written; with --task regression it
    lowers, exports and evaluates on float targets."""
    import importlib

    from click.testing import CliRunner

    from edgebnn.cli import main

    (tmp_path / "edgebnn_task_head.py").write_text(_CLI_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    _seed(8)
    weights = tmp_path / "w.pt"
    torch.save(importlib.import_module("edgebnn_task_head").factory().state_dict(), weights)
    ebnn, onnx_path, report = tmp_path / "reg.ebnn", tmp_path / "reg.onnx", tmp_path / "eval.json"
    lower = ["lower", "--model", "edgebnn_task_head:factory", "--weights", str(weights), "--input-shape", "1,3",
             "-o", str(ebnn)]

    def run(*args: str):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    r = run(*lower)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert "task='regression'" in r.output and "task='classification'" in r.output and not ebnn.exists()

    assert run(*lower, "--task", "regression", "--scheme", "fixed").exit_code == 0
    assert run("export", str(ebnn), "--target", "onnx", "--samples", "8", "-o", str(onnx_path)).exit_code == 0
    x = _inputs(32)
    np.savez(tmp_path / "reg.npz", x=x, y=x[:, 0] * 0.3)  # (N,) float targets for D = 1
    r = run("eval", str(onnx_path), "--data", str(tmp_path / "reg.npz"), "--json", str(report))
    assert r.exit_code == 0, r.output
    got = json.loads(report.read_text())
    assert got["task"] == "regression" and {"nll", "rmse", "mae", "coverage", "calibration_error"} <= set(got)
    assert "rmse" in r.output and "coverage" in r.output


def test_search_objectives_follow_the_task() -> None:
    from edgebnn.search.objectives import DEFAULT_OBJECTIVES, for_task, parse_objectives

    default = parse_objectives(DEFAULT_OBJECTIVES)
    assert [o.name for o in for_task("regression", default, {}, defaulted=True)] == ["bytes", "nll", "rmse"]
    assert [o.name for o in for_task("segmentation", default, {}, defaulted=True)] == ["bytes", "nll", "mean_iou"]
    assert for_task("classification", default, {}, defaulted=True) == default
    with pytest.raises(InvalidOptionError, match=r"^--objectives ece: a regression model reports nll, rmse"):
        for_task("regression", default, {}, defaulted=False)
    with pytest.raises(InvalidOptionError, match=r"^--budget accuracy: a segmentation model reports"):
        for_task("segmentation", default, {"accuracy": -0.01}, defaulted=True)


def test_analytic_takes_a_per_pixel_log_softmax_head() -> None:
    """log_softmax over the class axis (1) of per-pixel logits: softmax(log_softmax(z)) = softmax(z) at every
    quadrature point, so the predictive equals that of the plain logits (to float32 round-off)."""

    class Seg(nn.Module):
        def __init__(self, log: bool) -> None:
            super().__init__()
            self.c = Conv2dReparameterization(1, 3, 3, padding=1, posterior_rho_init=RHO)
            self.log = log

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            z = self.c(x, return_kl=False)
            return torch.log_softmax(z, 1) if self.log else z

    _seed(9)
    plain = Seg(False)
    logged = Seg(True)
    logged.load_state_dict(plain.state_dict())
    x = np.random.default_rng(7).random((2, 1, 5, 5), dtype=np.float32)
    p = [Session(export_model(from_torch(m, (1, 1, 5, 5)), ExportConfig(16, mode="analytic")).proto).predict(x)
         for m in (plain, logged)]
    np.testing.assert_allclose(p[0].probs, p[1].probs, atol=1e-5)
    np.testing.assert_allclose(p[0].mutual_info, p[1].mutual_info, atol=1e-5)


def test_compare_regression_export_with_its_ir(tmp_path, mean_only) -> None:
    """compare on a regression model compares predictive means against the members' spread of means."""
    from edgebnn import save
    from edgebnn.compare import compare_artifacts
    from edgebnn.exporters.ensemble import save_onnx

    ir, x, _ = mean_only
    save(ir, tmp_path / "m.ebnn")
    save_onnx(export_model(ir, ExportConfig(16, mode="baked", seed=1)).proto, tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=x, y=x[:, :2] * 0.5)
    report = compare_artifacts(str(tmp_path / "m.onnx"), str(tmp_path / "m.ebnn"), str(tmp_path / "d.npz"),
                               null_runs=19, alpha=0.05)
    assert report["task"] == "regression" and report["verdict"] != "different"
    assert {"nll", "rmse"} <= set(report["a"]) and {"nll", "rmse"} <= set(report["b"])


def test_a_plug_in_tasks_own_import_options_reach_it_through_from_torch(registry) -> None:
    """``from_torch(..., task=NAME, **options)``: a registered task's own ``import_options`` reach its
    ``from_output``; an option it does not take is refused in one line (issue 42 item 4c)."""
    from edgebnn.tasks import register_task

    class Tempered(Classification):
        name = "tempered"
        import_options = ("temperature",)
        seen: ClassVar[list[dict]] = []

        @classmethod
        def from_output(cls, shape, where, **options):
            cls.seen.append(options)
            return super().from_output(shape, where)

    register_task(Tempered)
    ir = from_torch(MeanLogVar(), (1, 3), task="tempered", temperature=2.0)
    assert Tempered.seen == [{"temperature": 2.0}] and ir.manifest.task == "tempered"
    with pytest.raises(InvalidOptionError, match="no task takes --exposure"):
        from_torch(MeanLogVar(), (1, 3), task="tempered", exposure=2.0)
