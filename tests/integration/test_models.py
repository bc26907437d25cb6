"""The benchmark model factories (lenet5, resnet20): forward shapes, synthetic posterior, import, export."""

from __future__ import annotations

import collections

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.importers import import_model
from edgebnn.metrics import predictive_from_logits
from edgebnn.models import FACTORIES, digits_cnn, lenet5, resnet20, synthetic_posterior
from edgebnn.nn import BayesConv2d, BayesLinear, bayesian_layers
from edgebnn.runtime import Session
from edgebnn.runtime.reference import predict, sample_logits

ROUNDOFF = 1e-5  # float32 round-off: the baked graph and the reference run the same members in another op order
SHAPES = {"lenet5": (1, 28, 28), "resnet20": (3, 32, 32)}
MODES = ("baked", "noise", "analytic")  # the modes for Gaussian posteriors ("shared" needs a codebook)


def _model(name: str, seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return synthetic_posterior(FACTORIES[name](**kw))


def _x(name: str, batch: int = 3) -> np.ndarray:
    return np.random.default_rng(1).random((batch, *SHAPES[name]), dtype=np.float32)


def _ort(proto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["probs", "entropy", "mutual_info"], {"input": x})


def test_factories_are_registered():
    assert FACTORIES["digits_cnn"] is digits_cnn
    assert FACTORIES["lenet5"] is lenet5
    assert FACTORIES["resnet20"] is resnet20


@pytest.mark.parametrize("name", ["lenet5", "resnet20"])
def test_forward_pass_shape(name):
    model = FACTORIES[name](num_classes=7).eval()
    with torch.no_grad():
        out = model(torch.zeros(2, *SHAPES[name]))
    assert out.shape == (2, 7)


def test_layer_structure():
    lenet = lenet5()
    assert [(p, type(m).__name__) for p, m in bayesian_layers(lenet)] == [
        ("conv1", "BayesConv2d"), ("conv2", "BayesConv2d"), ("fc1", "BayesLinear"), ("fc2", "BayesLinear"),
        ("fc3", "BayesLinear")]
    assert sum(p.numel() for n, p in lenet.named_parameters() if n.endswith("_mu")) == 44_426
    res = resnet20()
    layers = dict(bayesian_layers(res))
    assert sum(isinstance(m, BayesConv2d) for m in layers.values()) == 19 + 2  # 2 shortcut 1x1 convs
    assert [p for p, m in layers.items() if isinstance(m, BayesLinear)] == ["fc"]
    assert {m.out_channels for p, m in layers.items() if p.startswith("layer3")} == {64}
    assert sum(isinstance(m, nn.BatchNorm2d) for m in res.modules()) == 21
    assert not any(isinstance(m, (nn.Conv2d, nn.Linear)) for m in res.modules())  # every conv/linear Bayesian


def test_synthetic_posterior_recipe():
    torch.manual_seed(0)
    fresh = lenet5()
    mus = {n: p.detach().clone() for n, p in fresh.named_parameters() if n.endswith("_mu")}
    model = synthetic_posterior(fresh, sigma_ratio=0.5)
    assert model is fresh and not model.training
    for path, layer in bayesian_layers(model):
        for role in ("weight", "bias"):
            mu, sigma = getattr(layer, f"{role}_mu"), getattr(layer, f"{role}_sigma")
            torch.testing.assert_close(mu, mus[f"{path}.{role}_mu"], rtol=0, atol=0)  # means untouched
            assert torch.unique(getattr(layer, f"{role}_rho")).numel() == 1  # one sigma per tensor
            ratio = np.median((sigma / mu.abs()).detach().numpy())
            assert ratio == pytest.approx(0.5, rel=1e-5), (path, role)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidOptionError):
            synthetic_posterior(lenet5(), bad)


@pytest.fixture(scope="module")
def lenet_ir():
    return import_model(_model("lenet5"), (1, *SHAPES["lenet5"]), where="lenet5")


def test_lenet5_imports(lenet_ir):
    assert lenet_ir.manifest.input_shape == [1, 1, 28, 28]
    assert lenet_ir.manifest.num_classes == 10
    assert len(lenet_ir.encoded_weights()) == 10  # weight and bias of 5 layers
    assert sum(w.encoding.size for w in lenet_ir.encoded_weights()) == 44_426


@pytest.mark.parametrize("samples", [1, 16])
def test_lenet5_baked_export_matches_reference(lenet_ir, samples):
    x = _x("lenet5")
    probs, entropy, mi = _ort(export_model(lenet_ir, ExportConfig(samples, mode="baked", seed=7)).proto, x)
    ref = predict(lenet_ir, x, samples, seed=7)
    np.testing.assert_allclose(probs, ref.probs, atol=ROUNDOFF)
    np.testing.assert_allclose(entropy, ref.entropy, atol=ROUNDOFF)
    np.testing.assert_allclose(mi, ref.mutual_info, atol=ROUNDOFF)
    assert probs.shape == (3, 10)


@pytest.mark.parametrize("mode", MODES)
def test_lenet5_every_mode_runs(lenet_ir, mode):
    pred = Session(export_model(lenet_ir, ExportConfig(4, mode=mode, seed=0, rng="host")).proto,
                   threads=1).predict(_x("lenet5"))
    assert pred.probs.shape == (3, 10) and pred.entropy.shape == (3,) and pred.mutual_info.shape == (3,)
    np.testing.assert_allclose(pred.probs.sum(-1), 1.0, atol=ROUNDOFF)


@pytest.fixture(scope="module")
def resnet_ir():
    return import_model(_model("resnet20"), (1, *SHAPES["resnet20"]), where="resnet20")


@pytest.mark.slow
def test_resnet20_imports(resnet_ir):
    assert resnet_ir.manifest.input_shape == [1, 3, 32, 32]
    assert resnet_ir.manifest.num_classes == 10
    assert len(resnet_ir.encoded_weights()) == 2 * 22  # weight and bias of 21 convs and the head
    ops = collections.Counter(n.op_type for n in resnet_ir.float_model().graph.node)
    assert ops["Add"] == 9 and ops["AveragePool"] == 1 and ops["BatchNormalization"] == 21


@pytest.mark.slow
def test_resnet20_baked_export_matches_reference(resnet_ir):
    x = _x("resnet20", batch=2)
    probs, entropy, mi = _ort(export_model(resnet_ir, ExportConfig(4, mode="baked", seed=3)).proto, x)
    ref = predict(resnet_ir, x, 4, seed=3)
    np.testing.assert_allclose(probs, ref.probs, atol=ROUNDOFF)
    np.testing.assert_allclose(entropy, ref.entropy, atol=ROUNDOFF)
    np.testing.assert_allclose(mi, ref.mutual_info, atol=ROUNDOFF)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["noise", "analytic"])
def test_resnet20_noise_and_analytic_modes_run(resnet_ir, mode):
    """Residual Adds, BatchNorm and the AveragePool head go through both modes; probabilities stay near
    the sampled predictive (loose bound: analytic treats the residual operands as independent)."""
    x = _x("resnet20", batch=2)
    pred = Session(export_model(resnet_ir, ExportConfig(16, mode=mode, rng="host")).proto, threads=1).predict(x)
    assert pred.probs.shape == (2, 10) and np.isfinite(pred.probs).all()
    ref = predictive_from_logits(sample_logits(resnet_ir, x, 256, seed=5)).probs
    assert np.abs(pred.probs - ref).max() < 0.1


# Variants of the ResNet-20 pieces that resnet20 avoids (see its docstring), checked in every mode.


class _BiaslessConvNet(nn.Module):
    """The standard ResNet stem: Bayesian conv WITHOUT bias -> BatchNorm -> ReLU -> pool -> Bayesian head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = BayesConv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.AvgPool2d(8)
        self.fc = BayesLinear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(torch.relu(self.bn(self.conv(x)))), 1))


class _AdaptivePoolNet(nn.Module):
    """Global average pool written as ``AdaptiveAvgPool2d(1)`` (torchvision style): exports as ReduceMean."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = BayesConv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = BayesLinear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


@pytest.mark.parametrize("mode", MODES)
def test_biasless_conv_exports(mode):
    """A bias-less conv imports with an explicit zero bias (not one built from Shape(weight))."""
    torch.manual_seed(0)
    ir = import_model(synthetic_posterior(_BiaslessConvNet()), (1, 3, 8, 8))
    x = np.random.default_rng(1).random((2, 3, 8, 8), dtype=np.float32)
    assert Session(export_model(ir, ExportConfig(4, mode=mode, rng="host")).proto,
                   threads=1).predict(x).probs.shape == (2, 3)


@pytest.mark.parametrize("mode", ["baked", "noise"])
def test_adaptive_pool_exports_in_sampling_modes(mode):
    torch.manual_seed(0)
    ir = import_model(synthetic_posterior(_AdaptivePoolNet()), (1, 3, 8, 8))
    x = np.random.default_rng(1).random((2, 3, 8, 8), dtype=np.float32)
    assert Session(export_model(ir, ExportConfig(4, mode=mode, rng="host")).proto,
                   threads=1).predict(x).probs.shape == (2, 3)


def test_analytic_export_of_adaptive_avg_pool():
    """AdaptiveAvgPool2d(1) exports as ReduceMean with in-graph axes; analytic mode averages its variance."""
    from edgebnn.runtime.reference import predict

    torch.manual_seed(0)
    ir = import_model(synthetic_posterior(_AdaptivePoolNet()), (1, 3, 8, 8))
    x = np.random.default_rng(1).random((2, 3, 8, 8), dtype=np.float32)
    got = Session(export_model(ir, ExportConfig(64, mode="analytic")).proto, threads=1).predict(x).probs
    ref = predict(ir, x, 2048).probs
    # moment propagation is an approximation (docs/design.md); 2048 reference draws add at most ~0.02 (4 sd)
    assert np.abs(got - ref).max() < 0.03


def test_analytic_through_batchnorm1d():
    """Found in review: the BatchNorm variance factor was shaped for NCHW only."""
    from torch import nn

    from edgebnn.nn import BayesLinear
    from edgebnn.runtime.reference import predict

    torch.manual_seed(0)
    model = nn.Sequential(BayesLinear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), BayesLinear(8, 3)).eval()
    with torch.no_grad():
        model[1].running_var.uniform_(0.5, 2)
        model[1].running_mean.normal_()
        for layer in (model[0], model[3]):
            layer.weight_rho.fill_(-2.0)
    ir = import_model(model, (1, 6))
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    got = Session(export_model(ir, ExportConfig(256, mode="analytic")).proto).predict(x).probs
    # moment propagation is approximate; 4096 reference draws add at most ~0.016 (4 sd of a probability)
    assert np.abs(got - predict(ir, x, 4096).probs).max() < 0.03
