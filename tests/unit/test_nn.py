from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Normal
from torch.distributions import kl_divergence as torch_kl

from edgebnn.errors import InvalidOptionError
from edgebnn.models import FACTORIES, digits_cnn
from edgebnn.nn import BayesConv2d, BayesLinear, bayesian_layers, kl_divergence, posterior_mean


def _randomise(layer: BayesLinear | BayesConv2d, seed: int, rho_range: tuple[float, float] = (-3.0, 0.5)):
    """Give a layer random means and rhos (sigma between ~0.05 and ~1) so every term matters."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = rho_range
    with torch.no_grad():
        for p in layer.parameters():
            if p is layer.weight_rho or p is layer.bias_rho:
                p.copy_(lo + (hi - lo) * torch.rand(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return layer


LAYER_IDS = ["linear", "linear-nobias", "conv", "conv-grouped-strided-dilated-nobias"]


def _layers():
    """Fresh layers, one per entry of LAYER_IDS."""
    return [
        BayesLinear(5, 3),
        BayesLinear(5, 3, bias=False),
        BayesConv2d(2, 4, 3, padding=1),
        BayesConv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2, bias=False),
    ]


def _input_for(layer: nn.Module, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = (n, layer.in_features) if isinstance(layer, BayesLinear) else (n, layer.in_channels, 5, 6)
    return torch.randn(shape, generator=g)


def _reference_op(layer: nn.Module, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None):
    if isinstance(layer, BayesLinear):
        return F.linear(x, w, b)
    return F.conv2d(x, w, b, layer.stride, layer.padding, layer.dilation, layer.groups)


# ---------------------------------------------------------------- parameters, geometry, init


def test_parameter_names_and_shapes():
    lin = BayesLinear(5, 3)
    params = dict(lin.named_parameters())
    assert set(params) == {"weight_mu", "weight_rho", "bias_mu", "bias_rho"}
    assert params["weight_mu"].shape == params["weight_rho"].shape == (3, 5)
    assert params["bias_mu"].shape == params["bias_rho"].shape == (3,)
    assert (lin.in_features, lin.out_features) == (5, 3)

    conv = BayesConv2d(4, 6, 3, groups=2)
    assert set(dict(conv.named_parameters())) == {"weight_mu", "weight_rho", "bias_mu", "bias_rho"}
    assert conv.weight_mu.shape == (6, 2, 3, 3)

    for layer in (BayesLinear(5, 3, bias=False), BayesConv2d(2, 4, 3, bias=False)):
        assert set(dict(layer.named_parameters())) == {"weight_mu", "weight_rho"}
        assert layer.bias_mu is None and layer.bias_rho is None and layer.bias_sigma is None


def test_conv_geometry_attributes_are_int_pairs():
    conv = BayesConv2d(4, 6, 3, stride=2, padding=(1, 0), dilation=(2, 1), groups=2)
    assert conv.kernel_size == (3, 3) and conv.stride == (2, 2)
    assert conv.padding == (1, 0) and conv.dilation == (2, 1)
    assert (conv.groups, conv.in_channels, conv.out_channels) == (2, 4, 6)
    for attr in ("kernel_size", "stride", "padding", "dilation"):
        assert all(type(v) is int for v in getattr(conv, attr))


def test_init_matches_torch_default_bounds():
    torch.manual_seed(0)
    conv = BayesConv2d(16, 32, 3, init_rho=-4.0)
    fan_in = 16 * 9
    # kaiming_uniform(a=sqrt(5)) draws from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as nn.Conv2d does.
    bound = 1 / math.sqrt(fan_in)
    assert conv.weight_mu.abs().max() <= bound
    assert conv.weight_mu.abs().max() > 0.9 * bound  # 4608 draws fill the interval
    assert conv.bias_mu.abs().max() <= bound
    assert torch.all(conv.weight_rho == -4.0) and torch.all(conv.bias_rho == -4.0)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: BayesLinear(0, 3), "positive"),
        (lambda: BayesLinear(3, 3, prior_sigma=0.0), "prior_sigma"),
        (lambda: BayesLinear(3, 3, init_rho=float("nan")), "init_rho"),
        (lambda: BayesConv2d(3, 4, 3, groups=2), "groups=2"),
        (lambda: BayesConv2d(2, 4, 3, padding="same"), "padding='same'"),
        (lambda: BayesConv2d(2, 4, 0), "kernel_size"),
        (lambda: BayesConv2d(2, 4, 3, padding=-1), "padding"),
    ],
)
def test_bad_options_are_refused(make, match):
    with pytest.raises(InvalidOptionError, match=match):
        make()


# ---------------------------------------------------------------- sigma and KL


@pytest.mark.parametrize("index", range(4), ids=LAYER_IDS)
def test_sigma_is_softplus_of_rho(index):
    layer = _randomise(_layers()[index], seed=1, rho_range=(-8.0, 4.0))
    torch.testing.assert_close(layer.weight_sigma, torch.log1p(torch.exp(layer.weight_rho)))
    if layer.bias_rho is not None:
        torch.testing.assert_close(layer.bias_sigma, torch.log1p(torch.exp(layer.bias_rho)))


@pytest.mark.parametrize("prior_sigma", [1.0, 0.3])
@pytest.mark.parametrize("index", range(4), ids=LAYER_IDS)
def test_kl_matches_torch_distributions(index, prior_sigma):
    layer = _randomise(_layers()[index], seed=index)
    layer.prior_sigma = prior_sigma
    want = torch.zeros((), dtype=torch.float64)
    for mu, rho in ((layer.weight_mu, layer.weight_rho), (layer.bias_mu, layer.bias_rho)):
        if mu is None:
            continue
        sigma = torch.log1p(torch.exp(rho.detach().double()))
        prior = Normal(torch.zeros_like(sigma), torch.full_like(sigma, prior_sigma))
        want = want + torch_kl(Normal(mu.detach().double(), sigma), prior).sum()
    got = layer.kl()
    assert got.shape == ()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_kl_is_zero_at_the_prior_and_differentiable():
    layer = BayesLinear(4, 2)
    with torch.no_grad():
        layer.weight_mu.zero_()
        layer.bias_mu.zero_()
        rho = math.log(math.expm1(layer.prior_sigma))  # softplus(rho) = prior_sigma
        layer.weight_rho.fill_(rho)
        layer.bias_rho.fill_(rho)
    assert abs(layer.kl().item()) < 1e-5
    _randomise(layer, seed=3)
    layer.kl().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_kl_divergence_sums_over_the_model():
    torch.manual_seed(0)
    model = digits_cnn()
    want = sum(layer.kl() for _, layer in bayesian_layers(model))
    torch.testing.assert_close(kl_divergence(model), want)
    assert [path for path, _ in bayesian_layers(model)] == ["conv1", "conv2", "fc1", "fc2"]
    assert kl_divergence(nn.Sequential(nn.Linear(2, 2), nn.ReLU())).item() == 0.0


# ---------------------------------------------------------------- forward modes


@pytest.mark.parametrize("index", range(4), ids=LAYER_IDS)
def test_local_reparameterization_moments(index):
    """Training-mode pre-activations are N(x·mu + b_mu, x²·sigma² + b_sigma²), independently per example.

    Feeding the same P inputs R times gives R independent draws of every pre-activation. With
    R = 20000 draws of a Gaussian with variance v, the sample mean has standard error sqrt(v / R) and the
    sample variance (ddof=1) has standard error v * sqrt(2 / (R - 1)) (about 1% of v). We allow 5
    standard errors: a false failure has probability ~6e-7 per quantity, and the seeded draws make the
    test deterministic anyway.
    """
    R = 20000
    layer = _randomise(_layers()[index], seed=10 + index).train()
    x = _input_for(layer, 2, seed=20 + index)
    with torch.no_grad():
        torch.manual_seed(30 + index)
        draws = layer(x.repeat(R, *([1] * (x.ndim - 1)))).double()
        draws = draws.reshape(R, 2, *draws.shape[1:])
        xd = x.double()
        bias_mu = None if layer.bias_mu is None else layer.bias_mu.double()
        bias_var = None if layer.bias_rho is None else torch.log1p(torch.exp(layer.bias_rho.double())) ** 2
        weight_var = torch.log1p(torch.exp(layer.weight_rho.double())) ** 2
        want_mean = _reference_op(layer, xd, layer.weight_mu.double(), bias_mu)
        want_var = _reference_op(layer, xd * xd, weight_var, bias_var)
    mean_se = (want_var / R).sqrt()
    var_se = want_var * math.sqrt(2 / (R - 1))
    assert torch.all((draws.mean(0) - want_mean).abs() <= 5 * mean_se)
    assert torch.all((draws.var(0) - want_var).abs() <= 5 * var_se)


@pytest.mark.parametrize("index", range(4), ids=LAYER_IDS)
def test_eval_mode_samples_one_weight_per_forward(index):
    layer = _randomise(_layers()[index], seed=5).eval()
    x = _input_for(layer, 1, seed=6)
    batch = x.repeat(4, *([1] * (x.ndim - 1)))
    with torch.no_grad():
        torch.manual_seed(0)
        first = layer(batch)
        second = layer(batch)
        torch.manual_seed(0)
        replay = layer(batch)
    # One weight sample per forward: identical rows of a batch give identical outputs ...
    for row in first[1:]:
        torch.testing.assert_close(row, first[0], rtol=0, atol=0)
    # ... and each forward draws a new sample from torch's generator.
    assert not torch.allclose(first, second)
    torch.testing.assert_close(first, replay, rtol=0, atol=0)


@pytest.mark.parametrize("index", range(4), ids=LAYER_IDS)
@pytest.mark.parametrize("training", [True, False])
def test_posterior_mean_is_the_deterministic_layer(index, training):
    layer = _randomise(_layers()[index], seed=7).train(training)
    x = _input_for(layer, 3, seed=8)
    want = _reference_op(layer, x, layer.weight_mu, layer.bias_mu)
    with posterior_mean(layer):
        assert layer.use_mean
        torch.testing.assert_close(layer(x), want, rtol=0, atol=0)
        torch.testing.assert_close(layer(x), want, rtol=0, atol=0)
    assert not layer.use_mean
    layer.use_mean = True
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)
    with posterior_mean(layer):
        pass
    assert layer.use_mean  # the context manager restores the previous flag, whatever it was


def test_forward_returns_a_tensor_and_trains_without_bias():
    torch.manual_seed(0)
    for layer in (BayesLinear(5, 3, bias=False), BayesConv2d(2, 4, 3, padding=1, bias=False)):
        x = _input_for(layer, 4, seed=9)
        for training in (True, False):
            out = layer.train(training)(x)
            assert isinstance(out, torch.Tensor)
            assert out.shape == _reference_op(layer, x, layer.weight_mu, None).shape
        # An all-zero input gives variance exactly 0 without a bias; the gradient must stay finite.
        layer.train()
        (layer(torch.zeros_like(x)).sum() + layer(x).sum() + layer.kl()).backward()
        assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_digits_cnn_shapes_and_factory():
    torch.manual_seed(0)
    model = digits_cnn()
    assert FACTORIES["digits_cnn"] is digits_cnn
    x = torch.rand(5, 1, 8, 8)
    for training in (True, False):
        assert model.train(training)(x).shape == (5, 10)
    assert digits_cnn(num_classes=3)(x).shape == (5, 3)
    names = [name for name, _ in model.named_children()]
    assert names == ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten", "fc1", "relu3", "fc2"]
    assert (model.fc1.in_features, model.fc1.out_features, model.conv2.padding) == (128, 64, (1, 1))
