"""The bayesian-torch, torchbnn and blitz adapters against the real libraries.

Each layer test checks three things: the extracted means are the layer's parameters bit for bit, the
sigmas match the library's own rho/log_sigma -> sigma formula, and the geometry is right: the library's
forward with its noise removed equals the importer's ``mean_forward`` (``F.linear``, ``F.convNd``,
``F.conv_transposeNd``, ``F.batch_norm``) with the extracted means and geometry.
bayesian-torch redraws its noise inside ``forward``, so there sigma is pushed to ~4e-18 (rho = -40)
instead; the noise then moves no float32 weight of magnitude above ~1e-10.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from edgebnn.errors import InvalidWeightsError, UnsupportedLayerError
from edgebnn.importers import bayesian_torch as bt_adapter
from edgebnn.importers import blitz as blitz_adapter
from edgebnn.importers import torchbnn as tbnn_adapter
from edgebnn.importers._torch import mean_forward
from edgebnn.importers.base import LayerPosterior

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

TINY_RHO = -40.0  # softplus(-40) ~ 4.2e-18
ATOL = 1e-6  # float32 summation order; the leftover noise contributes < 1e-15
NET_TOL = 1e-5  # a whole small network (conv, ReLU, head) in float32: onnxruntime vs torch op order

# (conv kwargs, input shape): plain, and every geometry argument off its default with groups 2
GEOMETRIES = [
    ({"in_channels": 2, "out_channels": 3, "kernel_size": (3, 3)}, (2, 2, 7, 7)),
    (
        {
            "in_channels": 4,
            "out_channels": 6,
            "kernel_size": (3, 2),
            "stride": (2, 1),
            "padding": (1, 2),
            "dilation": (1, 2),
            "groups": 2,
        },
        (2, 4, 9, 10),
    ),
]
GEOMETRY_IDS = ["plain", "strided-padded-dilated-grouped"]


@pytest.fixture
def bl() -> Any:
    return pytest.importorskip("bayesian_torch.layers")


@pytest.fixture
def tbnn() -> Any:
    return pytest.importorskip("torchbnn")


@pytest.fixture
def bm() -> Any:
    return pytest.importorskip("blitz.modules")


class MeanLayer(nn.Module):
    """A module around :func:`mean_forward`, returning ``(out, 0)`` where the original returned a tuple."""

    def __init__(self, post: LayerPosterior, returns_tuple: bool = False) -> None:
        super().__init__()
        self.post, self.returns_tuple = post, returns_tuple

    def forward(self, x: torch.Tensor) -> Any:
        out = mean_forward(self.post, x)
        return (out, torch.zeros(())) if self.returns_tuple else out


def with_means(model: nn.Module, posts: dict[str, LayerPosterior], returns_tuple: bool = False) -> nn.Module:
    """A copy of ``model`` whose Bayesian layers are replaced by their posterior-mean twins."""
    twin = copy.deepcopy(model)
    for path, post in posts.items():
        parent, _, name = path.rpartition(".")
        setattr(twin.get_submodule(parent), name, MeanLayer(post, returns_tuple))
    return twin


def extract_all(adapter: Any, model: nn.Module) -> dict[str, LayerPosterior]:
    return {path: adapter.extract(m, path) for path, m in model.named_modules() if adapter.matches(m)}


def assert_posterior(
    post: LayerPosterior,
    weight_mu: torch.Tensor,
    weight_sigma: torch.Tensor,
    bias_mu: torch.Tensor | None,
    bias_sigma: torch.Tensor | None,
) -> None:
    """Means bit-exact, sigmas within float32 round-off of the library's own formula, all float32."""
    np.testing.assert_array_equal(post.weight_mu, weight_mu.detach().numpy())
    np.testing.assert_allclose(post.weight_sigma, weight_sigma.detach().numpy(), rtol=1e-6, atol=0)
    assert post.weight_mu.dtype == post.weight_sigma.dtype == np.float32
    if bias_mu is None:
        assert post.bias_mu is None and post.bias_sigma is None
    else:
        assert bias_sigma is not None and post.bias_mu is not None and post.bias_sigma is not None
        np.testing.assert_array_equal(post.bias_mu, bias_mu.detach().numpy())
        np.testing.assert_allclose(post.bias_sigma, bias_sigma.detach().numpy(), rtol=1e-6, atol=0)
        assert post.bias_mu.dtype == post.bias_sigma.dtype == np.float32


def assert_geometry(post: LayerPosterior, kwargs: dict[str, Any]) -> None:
    def two(v: Any) -> tuple[int, int]:
        return (v, v) if isinstance(v, int) else tuple(v)

    assert post.kind == "conv"
    assert post.stride == two(kwargs.get("stride", 1))
    assert post.padding == two(kwargs.get("padding", 0))
    assert post.dilation == two(kwargs.get("dilation", 1))
    assert post.groups == kwargs.get("groups", 1)


# -- bayesian-torch ---------------------------------------------------------------------------------


def _bt_softplus(rho: torch.Tensor) -> torch.Tensor:
    return torch.log1p(torch.exp(rho))  # bayesian-torch's forward


def _bt_shrink(layer: nn.Module) -> None:
    for name, p in layer.named_parameters():
        if name.startswith("rho_"):
            p.data.fill_(TINY_RHO)


def _assert_bt_conv_posterior(post: Any, layer: nn.Module) -> None:
    """The imported posterior is a bayesian-torch conv layer's (μ, softplus(ρ)) for kernel and bias."""
    rho_bias = layer.rho_bias
    assert_posterior(post, layer.mu_kernel, _bt_softplus(layer.rho_kernel), layer.mu_bias,
                     None if rho_bias is None else _bt_softplus(rho_bias))


def _bt_out(result: Any) -> torch.Tensor:
    """bayesian-torch layers return ``(out, kl)`` unless ``return_kl=False`` or ``dnn_to_bnn_flag``."""
    assert isinstance(result, tuple) and len(result) == 2
    return result[0]


@pytest.mark.parametrize("cls_name", ["LinearReparameterization", "LinearFlipout"])
@pytest.mark.parametrize("bias", [True, False])
def test_bayesian_torch_linear(bl: Any, cls_name: str, bias: bool) -> None:
    torch.manual_seed(0)
    layer = getattr(bl, cls_name)(5, 3, bias=bias)
    assert bt_adapter.ADAPTER.matches(layer)
    post = bt_adapter.ADAPTER.extract(layer, "head.fc")
    assert post.path == "head.fc" and post.kind == "linear"
    assert_posterior(
        post,
        layer.mu_weight,
        _bt_softplus(layer.rho_weight),
        layer.mu_bias,
        None if layer.rho_bias is None else _bt_softplus(layer.rho_bias),
    )
    _bt_shrink(layer)
    x = torch.randn(4, 5)
    with torch.no_grad():
        got = _bt_out(layer(x))
    torch.testing.assert_close(got, mean_forward(post, x), rtol=0, atol=ATOL)  # rho only moved sigma


@pytest.mark.parametrize("cls_name", ["Conv2dReparameterization", "Conv2dFlipout"])
@pytest.mark.parametrize(("kwargs", "shape"), GEOMETRIES, ids=GEOMETRY_IDS)
@pytest.mark.parametrize("bias", [True, False])
def test_bayesian_torch_conv2d(
    bl: Any, cls_name: str, kwargs: dict[str, Any], shape: tuple[int, ...], bias: bool
) -> None:
    torch.manual_seed(0)
    layer = getattr(bl, cls_name)(**kwargs, bias=bias)
    post = bt_adapter.ADAPTER.extract(layer, "features.0")
    assert_geometry(post, kwargs)
    _assert_bt_conv_posterior(post, layer)
    _bt_shrink(layer)
    x = torch.randn(shape)
    with torch.no_grad():
        got = layer(x, return_kl=False)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, mean_forward(post, x), rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    ("kernel", "dilation", "padding", "want"),
    [(3, 1, "same", (1, 1)), ((5, 3), 2, "same", (4, 2)), (3, 1, "valid", (0, 0))],
)
def test_bayesian_torch_string_padding_converts_exactly(
    bl: Any, kernel: Any, dilation: int, padding: str, want: tuple[int, int]
) -> None:
    torch.manual_seed(0)
    layer = bl.Conv2dReparameterization(2, 3, kernel, padding=padding, dilation=dilation)
    _bt_shrink(layer)
    post = bt_adapter.ADAPTER.extract(layer, "c")
    assert post.padding == want
    x = torch.randn(2, 2, 11, 12)
    with torch.no_grad():
        got = _bt_out(layer(x))
    torch.testing.assert_close(got, mean_forward(post, x), rtol=0, atol=ATOL)


@pytest.mark.parametrize(("kernel", "stride"), [(4, 1), ((3, 2), 1), (3, 2)])
def test_bayesian_torch_asymmetric_same_padding_is_refused(bl: Any, kernel: Any, stride: int) -> None:
    # even kernel: torch pads one more on the right/bottom; stride 2: F.conv2d itself refuses 'same'
    layer = bl.Conv2dFlipout(2, 3, kernel, stride=stride, padding="same")
    with pytest.raises(UnsupportedLayerError, match=r"layer 'enc\.conv' \(Conv2dFlipout\): padding='same'"):
        bt_adapter.ADAPTER.extract(layer, "enc.conv")


_BT_PRIORS = {"prior_mean": 0.0, "prior_variance": 1.0, "posterior_mu_init": 0.0, "posterior_rho_init": -3.0}
# (layer, kwargs beyond channels and kernel, input shape): every geometry argument off its default, groups 2
_BT_KINDS = [
    ("Conv1d", {"stride": 2, "padding": 1, "dilation": 2}, (2, 4, 11)),
    ("Conv3d", {"stride": 2, "padding": 1}, (2, 4, 5, 6, 7)),
    ("ConvTranspose1d", {"stride": 2, "padding": 1, "output_padding": 1, "dilation": 2}, (2, 4, 6)),
    ("ConvTranspose2d", {"stride": 2, "padding": 1, "output_padding": 1}, (2, 4, 5, 6)),
    ("ConvTranspose3d", {"stride": 2, "padding": 0}, (2, 4, 3, 4, 5)),
]


@pytest.mark.parametrize("method", ["Reparameterization", "Flipout"])
@pytest.mark.parametrize(("kind", "kwargs", "shape"), _BT_KINDS, ids=[k[0] for k in _BT_KINDS])
@pytest.mark.parametrize("bias", [True, False])
def test_bayesian_torch_every_conv_kind(
    bl: Any, method: str, kind: str, kwargs: dict[str, Any], shape: tuple[int, ...], bias: bool
) -> None:
    torch.manual_seed(0)
    layer = getattr(bl, kind + method)(4, 6, 3, groups=2, bias=bias, **kwargs, **_BT_PRIORS)
    post = bt_adapter.ADAPTER.extract(layer, "enc.3")
    rank = len(shape) - 2
    assert post.kind == ("conv_transpose" if "Transpose" in kind else "conv") and post.rank == rank
    assert (post.stride, post.padding, post.groups) == ((2,) * rank, (kwargs["padding"],) * rank, 2)
    assert post.dilation == (kwargs.get("dilation", 1),) * rank
    if "Transpose" in kind:
        assert post.output_padding == (kwargs.get("output_padding", 0),) * rank
    _assert_bt_conv_posterior(post, layer)
    _bt_shrink(layer)
    # bayesian-torch 0.5 bugs: ConvTranspose*Flipout builds its prior sigma in the forward conv's layout (the KL
    # fails unless in = out), and ConvTranspose3dFlipout fails with a bias unless return_kl; reshape the prior
    layer.prior_weight_sigma = torch.ones_like(layer.mu_kernel)
    x = torch.randn(shape)
    with torch.no_grad():
        got = _bt_out(layer(x))
    torch.testing.assert_close(got, mean_forward(post, x), rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    ("cls_name", "args", "why"),
    [
        ("QuantizedLinearFlipout", (4, 5), "quantized bayesian-torch layers hold int8 tensors"),
        ("QuantizedConv2dReparameterization", (2, 3, 3), "quantized bayesian-torch layers hold int8 tensors"),
    ],
)
def test_bayesian_torch_other_layers_are_refused(bl: Any, cls_name: str, args: tuple[float, ...], why: str) -> None:
    layer = getattr(bl, cls_name)(*args)
    assert bt_adapter.ADAPTER.matches(layer)  # matched, so the importer cannot treat it as deterministic
    with pytest.raises(UnsupportedLayerError, match=rf"^layer 'blocks\.1' \({cls_name}\): {why}"):
        bt_adapter.ADAPTER.extract(layer, "blocks.1")


@pytest.mark.parametrize("cls_name", ["LSTMReparameterization", "LSTMFlipout"])
def test_bayesian_torch_lstms_are_read_through_their_linear_layers(bl: Any, cls_name: str) -> None:
    layer = getattr(bl, cls_name)(4, 5)
    assert not bt_adapter.ADAPTER.matches(layer)  # the importer descends to ih / hh (tests/integration/test_recurrent)
    assert bt_adapter.ADAPTER.matches(layer.ih) and bt_adapter.ADAPTER.matches(layer.hh)


def test_bayesian_torch_subclass_is_refused(bl: Any) -> None:
    class MyConv(bl.Conv2dFlipout):  # a changed forward could draw noise differently
        pass

    with pytest.raises(UnsupportedLayerError, match=r"^layer 'c' \(MyConv\): not supported; edgebnn reads"):
        bt_adapter.ADAPTER.extract(MyConv(2, 3, 3), "c")


@pytest.mark.parametrize("field", ["rho_kernel", "rho_bias", "mu_kernel"])
def test_bayesian_torch_nan_is_refused(bl: Any, field: str) -> None:
    layer = bl.Conv2dReparameterization(2, 3, 3)
    getattr(layer, field).data.view(-1)[1] = float("nan")
    with pytest.raises(InvalidWeightsError, match=r"^layer 'features\.3': \w+ has NaN or inf"):
        bt_adapter.ADAPTER.extract(layer, "features.3")


def _dnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding="same"),
        nn.ReLU(),
        nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, bias=False),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(6 * 4 * 4, 3),
    )


@pytest.mark.parametrize("kind", ["Reparameterization", "Flipout"])
@pytest.mark.parametrize("moped", [False, True])
def test_bayesian_torch_dnn_to_bnn(bl: Any, kind: str, moped: bool) -> None:
    dnn_to_bnn = pytest.importorskip("bayesian_torch.models.dnn_to_bnn").dnn_to_bnn
    torch.manual_seed(0)
    dnn = _dnn()
    model = copy.deepcopy(dnn)
    dnn_to_bnn(
        model,
        {
            "prior_mu": 0.0,
            "prior_sigma": 1.0,
            "posterior_mu_init": 0.0,
            "posterior_rho_init": -3.0,
            "type": kind,
            "moped_enable": moped,  # MOPED: the posterior means start as the dnn's weights
            "moped_delta": 0.1,
        },
    )
    assert [type(m).__name__ for m in model] == [
        f"Conv2d{kind}",
        "ReLU",
        f"Conv2d{kind}",
        "ReLU",
        "Flatten",
        f"Linear{kind}",
    ]
    assert all(model[i].dnn_to_bnn_flag for i in (0, 2, 5))

    posts = extract_all(bt_adapter.ADAPTER, model)
    assert list(posts) == ["0", "2", "5"]
    assert [p.kind for p in posts.values()] == ["conv", "conv", "linear"]
    assert posts["0"].padding == (1, 1)  # nn.Conv2d's 'same' carried over as a string
    assert (posts["2"].stride, posts["2"].padding, posts["2"].groups) == ((2, 2), (1, 1), 2)
    assert posts["2"].bias_mu is None
    for i, weight in (("0", model[0].mu_kernel), ("2", model[2].mu_kernel), ("5", model[5].mu_weight)):
        np.testing.assert_array_equal(posts[i].weight_mu, weight.detach().numpy())
    if moped:
        for i in ("0", "2", "5"):
            np.testing.assert_array_equal(posts[i].weight_mu, dnn[int(i)].weight.detach().numpy())

    for i in (0, 2, 5):
        _bt_shrink(model[i])
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        got = model(x)  # dnn_to_bnn sets the flag that makes forward return the output only
        want = with_means(model, posts)(x)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


class _HandWritten(nn.Module):
    """The bayesian-torch tutorial style: every Bayesian layer returns ``(out, kl)``."""

    def __init__(self, bl: Any) -> None:
        super().__init__()
        self.conv = bl.Conv2dFlipout(1, 4, 3, padding=1)
        self.fc = bl.LinearReparameterization(4 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, kl_conv = self.conv(x)
        x = F.max_pool2d(F.relu(x), 2).flatten(1)
        x, kl_fc = self.fc(x)
        return x, kl_conv + kl_fc


def test_bayesian_torch_hand_written_kl_tuples(bl: Any) -> None:
    torch.manual_seed(0)
    model = _HandWritten(bl)
    posts = extract_all(bt_adapter.ADAPTER, model)
    assert list(posts) == ["conv", "fc"]
    assert_posterior(
        posts["fc"],
        model.fc.mu_weight,
        _bt_softplus(model.fc.rho_weight),
        model.fc.mu_bias,
        _bt_softplus(model.fc.rho_bias),
    )
    for layer in (model.conv, model.fc):
        _bt_shrink(layer)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        got, kl = model(x)
        want, zero = with_means(model, posts, returns_tuple=True)(x)
    assert kl.ndim == 0 and float(kl) > 0 and float(zero) == 0
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


# -- torchbnn ---------------------------------------------------------------------------------------


def _tbnn_zero_noise(layer: nn.Module) -> None:
    """torchbnn's ``freeze`` fixes eps; fixing it at zero makes forward use the means exactly."""
    layer.weight_eps = torch.zeros_like(layer.weight_log_sigma)
    if layer.bias:
        layer.bias_eps = torch.zeros_like(layer.bias_log_sigma)


def _tbnn_randomise(layer: nn.Module) -> None:
    """torchbnn starts every log_sigma at log(prior_sigma); spread them so the test sees each element."""
    for name, p in layer.named_parameters():
        if name.endswith("log_sigma"):
            p.data.uniform_(-4.0, -1.0)


@pytest.mark.parametrize("bias", [True, False])
def test_torchbnn_linear(tbnn: Any, bias: bool) -> None:
    torch.manual_seed(0)
    layer = tbnn.BayesLinear(prior_mu=0.0, prior_sigma=0.1, in_features=5, out_features=3, bias=bias)
    _tbnn_randomise(layer)
    assert tbnn_adapter.ADAPTER.matches(layer)
    post = tbnn_adapter.ADAPTER.extract(layer, "fc")
    assert post.kind == "linear"
    assert_posterior(
        post,
        layer.weight_mu,
        torch.exp(layer.weight_log_sigma),
        layer.bias_mu,
        None if layer.bias_log_sigma is None else torch.exp(layer.bias_log_sigma),
    )
    _tbnn_zero_noise(layer)
    x = torch.randn(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), mean_forward(post, x), rtol=0, atol=ATOL)


@pytest.mark.parametrize(("kwargs", "shape"), GEOMETRIES, ids=GEOMETRY_IDS)
@pytest.mark.parametrize("bias", [True, False])
def test_torchbnn_conv2d(tbnn: Any, kwargs: dict[str, Any], shape: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(0)
    layer = tbnn.BayesConv2d(prior_mu=0.0, prior_sigma=0.1, **kwargs, bias=bias)
    _tbnn_randomise(layer)
    post = tbnn_adapter.ADAPTER.extract(layer, "features.0")
    assert_geometry(post, kwargs)
    assert_posterior(
        post,
        layer.weight_mu,
        torch.exp(layer.weight_log_sigma),
        layer.bias_mu,
        None if layer.bias_log_sigma is None else torch.exp(layer.bias_log_sigma),
    )
    _tbnn_zero_noise(layer)
    x = torch.randn(shape)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), mean_forward(post, x), rtol=0, atol=ATOL)


def test_torchbnn_batchnorm(tbnn: Any) -> None:
    torch.manual_seed(0)
    bn = tbnn.BayesBatchNorm2d(prior_mu=0.0, prior_sigma=0.1, num_features=3)
    _tbnn_randomise(bn)
    bn.train()
    with torch.no_grad():
        bn(torch.randn(8, 3, 4, 4) * 2 + 1)  # running statistics away from (0, 1)
    bn.eval()
    assert tbnn_adapter.ADAPTER.matches(bn)
    post = tbnn_adapter.ADAPTER.extract(bn, "bn1")
    assert post.kind == "batchnorm" and post.eps == bn.eps
    np.testing.assert_array_equal(post.running_mean, bn.running_mean.numpy())
    np.testing.assert_array_equal(post.running_var, bn.running_var.numpy())
    assert_posterior(
        post, bn.weight_mu, torch.exp(bn.weight_log_sigma), bn.bias_mu, torch.exp(bn.bias_log_sigma)
    )
    bn.weight_eps, bn.bias_eps = torch.zeros(3), torch.zeros(3)  # torchbnn's freeze with eps fixed at zero
    x = torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(bn(x), mean_forward(post, x), rtol=0, atol=ATOL)


def test_torchbnn_refusals(tbnn: Any) -> None:
    fixed = tbnn.BayesBatchNorm2d(prior_mu=0.0, prior_sigma=0.1, num_features=3, affine=False)
    with pytest.raises(UnsupportedLayerError, match=r"^layer 'bn1' \(BayesBatchNorm2d\): affine=False"):
        tbnn_adapter.ADAPTER.extract(fixed, "bn1")
    batch_stats = tbnn.BayesBatchNorm2d(prior_mu=0.0, prior_sigma=0.1, num_features=3, track_running_stats=False)
    with pytest.raises(UnsupportedLayerError, match=r"^layer 'bn1' \(BayesBatchNorm2d\): track_running_stats"):
        tbnn_adapter.ADAPTER.extract(batch_stats, "bn1")
    circular = tbnn.BayesConv2d(0.0, 0.1, 2, 3, 3, padding=1, padding_mode="circular")
    with pytest.raises(UnsupportedLayerError, match=r"^layer 'c' \(BayesConv2d\): padding_mode='circular'"):
        tbnn_adapter.ADAPTER.extract(circular, "c")
    same = tbnn.BayesConv2d(0.0, 0.1, 2, 3, 3, padding="same")  # torchbnn's _pair splits it into letters
    with pytest.raises(UnsupportedLayerError, match=r"^layer 'c': padding="):
        tbnn_adapter.ADAPTER.extract(same, "c")


def test_torchbnn_nan_is_refused(tbnn: Any) -> None:
    layer = tbnn.BayesConv2d(0.0, 0.1, 2, 3, 3)
    layer.bias_log_sigma.data[0] = float("nan")
    with pytest.raises(InvalidWeightsError, match=r"^layer 'features\.3': bias_sigma has NaN or inf"):
        tbnn_adapter.ADAPTER.extract(layer, "features.3")


# -- blitz ------------------------------------------------------------------------------------------


def _blitz_sigma(sampler: nn.Module) -> torch.Tensor:
    sampler.sample()  # blitz computes sigma = log1p(exp(rho)) as it samples
    return sampler.sigma


def _blitz_shrink(layer: nn.Module) -> None:
    for name, p in layer.named_parameters():
        if name.endswith("rho"):
            p.data.fill_(TINY_RHO)


@pytest.mark.parametrize("bias", [True, False])
def test_blitz_linear(bm: Any, bias: bool) -> None:
    torch.manual_seed(0)
    layer = bm.BayesianLinear(5, 3, bias=bias, posterior_rho_init=-3.0)
    assert blitz_adapter.ADAPTER.matches(layer)
    post = blitz_adapter.ADAPTER.extract(layer, "fc")
    assert post.kind == "linear"
    # with bias=False blitz still creates bias_mu/bias_rho but adds zeros: the posterior has no bias
    assert_posterior(
        post,
        layer.weight_mu,
        _blitz_sigma(layer.weight_sampler),
        layer.bias_mu if bias else None,
        _blitz_sigma(layer.bias_sampler) if bias else None,
    )
    x = torch.randn(4, 5)
    with torch.no_grad():
        layer.freeze = True  # forward_frozen: the means, no noise
        torch.testing.assert_close(layer(x), mean_forward(post, x), rtol=0, atol=ATOL)
        layer.freeze = False
        _blitz_shrink(layer)  # the sampling forward reads weight_sampler.mu/rho
        torch.testing.assert_close(layer(x), mean_forward(post, x), rtol=0, atol=ATOL)


@pytest.mark.parametrize(("kwargs", "shape"), GEOMETRIES, ids=GEOMETRY_IDS)
@pytest.mark.parametrize("bias", [True, False])
def test_blitz_conv2d(bm: Any, kwargs: dict[str, Any], shape: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(0)
    layer = bm.BayesianConv2d(**kwargs, bias=bias, posterior_rho_init=-3.0)
    post = blitz_adapter.ADAPTER.extract(layer, "features.0")
    assert_geometry(post, kwargs)
    assert_posterior(
        post,
        layer.weight_mu,
        _blitz_sigma(layer.weight_sampler),
        layer.bias_mu if bias else None,
        _blitz_sigma(layer.bias_sampler) if bias else None,
    )
    x = torch.randn(shape)
    with torch.no_grad():
        layer.freeze = True
        torch.testing.assert_close(layer(x), mean_forward(post, x), rtol=0, atol=ATOL)
        layer.freeze = False
        _blitz_shrink(layer)
        torch.testing.assert_close(layer(x), mean_forward(post, x), rtol=0, atol=ATOL)


def test_blitz_same_padding(bm: Any) -> None:
    layer = bm.BayesianConv2d(2, 3, (3, 5), padding="same", freeze=True)
    post = blitz_adapter.ADAPTER.extract(layer, "c")
    assert post.padding == (1, 2)
    x = torch.randn(1, 2, 6, 7)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), mean_forward(post, x), rtol=0, atol=ATOL)


def test_blitz_out_of_sync_copies_are_refused(bm: Any) -> None:
    torch.manual_seed(0)
    # .double()/.cuda() copy weight_mu and weight_sampler.mu separately: they no longer share storage
    layer = bm.BayesianLinear(5, 3).double()
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        layer(torch.randn(4, 5, dtype=torch.float64)).sum().backward()
        opt.step()  # only the sampler's copies get gradients
    with pytest.raises(InvalidWeightsError, match=r"^layer 'fc' \(BayesianLinear\): weight_mu/weight_rho differ"):
        blitz_adapter.ADAPTER.extract(layer, "fc")

    fresh = bm.BayesianLinear(5, 3)
    fresh.load_state_dict(layer.state_dict())  # the sampler's entries come last and win
    post = blitz_adapter.ADAPTER.extract(fresh, "fc")
    np.testing.assert_array_equal(post.weight_mu, layer.weight_sampler.mu.detach().float().numpy())


@pytest.mark.parametrize(
    ("cls_name", "kernel", "shape"),
    [("BayesianConv1d", 3, (2, 4, 11)), ("BayesianConv3d", (3, 2, 3), (2, 4, 5, 6, 7))],
)
def test_blitz_conv1d_conv3d(bm: Any, cls_name: str, kernel: Any, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    layer = getattr(bm, cls_name)(4, 6, kernel, groups=2, stride=2, padding=1, dilation=1, posterior_rho_init=-3.0)
    post = blitz_adapter.ADAPTER.extract(layer, "c")
    rank = len(shape) - 2
    assert (post.kind, post.stride, post.padding, post.groups) == ("conv", (2,) * rank, (1,) * rank, 2)
    assert_posterior(
        post, layer.weight_mu, _blitz_sigma(layer.weight_sampler), layer.bias_mu, _blitz_sigma(layer.bias_sampler)
    )
    x = torch.randn(shape)
    with torch.no_grad():
        layer.freeze = True
        torch.testing.assert_close(layer(x), mean_forward(post, x), rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    ("cls_name", "args", "why"),
    [
        ("BayesianLSTM", (4, 5), "recurrent layers are not supported"),
        ("BayesianGRU", (4, 5), "recurrent layers are not supported"),
        ("BayesianEmbedding", (10, 4), "embeddings are not supported"),
    ],
)
def test_blitz_other_layers_are_refused(bm: Any, cls_name: str, args: tuple[Any, ...], why: str) -> None:
    layer = getattr(bm, cls_name)(*args)
    assert blitz_adapter.ADAPTER.matches(layer)
    with pytest.raises(UnsupportedLayerError, match=rf"^layer 'blocks\.1' \({cls_name}\): {why}"):
        blitz_adapter.ADAPTER.extract(layer, "blocks.1")


def test_blitz_flipout_wrapper_is_refused(bm: Any) -> None:
    # blitz.utils.Flipout subclasses a layer and changes its forward: not the plain mean-field layer
    flipout = pytest.importorskip("blitz.utils").Flipout
    layer = flipout(bm.BayesianLinear)(5, 3)
    assert blitz_adapter.ADAPTER.matches(layer)
    with pytest.raises(UnsupportedLayerError, match=r"^layer 'fc' \(Flipout\): not supported"):
        blitz_adapter.ADAPTER.extract(layer, "fc")


def test_blitz_nan_is_refused(bm: Any) -> None:
    layer = bm.BayesianConv2d(2, 3, (3, 3))
    layer.weight_rho.data[0, 0, 0, 0] = float("nan")  # shared with weight_sampler.rho
    with pytest.raises(InvalidWeightsError, match=r"^layer 'features\.3': weight_sigma has NaN or inf"):
        blitz_adapter.ADAPTER.extract(layer, "features.3")


# -- matching across libraries ----------------------------------------------------------------------


def test_matches_only_its_own_library(bl: Any, tbnn: Any, bm: Any) -> None:
    layers = {
        "bayesian-torch": [bl.LinearReparameterization(3, 2), bl.Conv2dFlipout(1, 2, 3)],
        "torchbnn": [tbnn.BayesLinear(0.0, 0.1, 3, 2), tbnn.BayesConv2d(0.0, 0.1, 1, 2, 3)],
        "blitz": [bm.BayesianLinear(3, 2), bm.BayesianConv2d(1, 2, (3, 3))],
        "torch": [nn.Linear(3, 2), nn.Conv2d(1, 2, 3), nn.Sequential(nn.Linear(3, 2))],
    }
    for adapter in (bt_adapter.ADAPTER, tbnn_adapter.ADAPTER, blitz_adapter.ADAPTER):
        for library, modules in layers.items():
            for m in modules:
                assert adapter.matches(m) == (library == adapter.library), (adapter.library, m)
    # blitz's weight samplers are parts of a layer, not layers
    assert not blitz_adapter.ADAPTER.matches(layers["blitz"][0].weight_sampler)


def test_adapters_do_not_import_their_library() -> None:
    code = (
        "import sys, torch\n"
        "from edgebnn.importers import bayesian_torch, blitz, torchbnn\n"
        "for a in (bayesian_torch.ADAPTER, blitz.ADAPTER, torchbnn.ADAPTER):\n"
        "    assert not a.matches(torch.nn.Linear(2, 2))\n"
        "print(sorted(n for n in ('bayesian_torch', 'blitz', 'torchbnn') if n in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_library_blocked_from_import(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("bayesian_torch", "torchbnn", "blitz"):
        monkeypatch.setitem(sys.modules, name, None)  # how Python marks a package as not importable
    for adapter in (bt_adapter.ADAPTER, tbnn_adapter.ADAPTER, blitz_adapter.ADAPTER):
        assert not adapter.matches(nn.Linear(2, 2))
        with pytest.raises(UnsupportedLayerError, match=r"^layer 'fc' \(Linear\): not supported"):
            adapter.extract(nn.Linear(2, 2), "fc")


# -- end to end: import_model -> IR -> onnxruntime --------------------------------------------------
# A tiny CNN per library (conv -> relu -> maxpool -> flatten -> linear) on (1, 1, 8, 8). The IR must hold
# exactly the adapter's posteriors, and its posterior-mean network (``BNNModel.float_model()``) run in
# onnxruntime must equal the torch model with its noise removed.


def _cnn(conv: nn.Module, fc: nn.Module) -> nn.Sequential:
    return nn.Sequential(conv, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), fc)


def _check_import(model: nn.Module, adapter: Any, denoised: nn.Module, *, output_index: int = 0) -> None:
    ort = pytest.importorskip("onnxruntime")
    from edgebnn.importers import import_model
    from edgebnn.ir import GaussianWeight

    posts = extract_all(adapter, model)
    bnn = import_model(model, (1, 1, 8, 8), output_index=output_index)
    assert bnn.manifest.source_library == adapter.library
    assert (bnn.manifest.input_shape, bnn.manifest.num_classes) == ([1, 1, 8, 8], 3)

    want = {}
    for path, post in posts.items():
        want[f"{path}.weight"] = (post.weight_mu, post.weight_sigma)
        if post.bias_mu is not None:
            want[f"{path}.bias"] = (post.bias_mu, post.bias_sigma)
    encoded = bnn.encoded_weights()
    assert sorted(w.name for w in encoded) == sorted(want)
    for w in encoded:
        assert isinstance(w.encoding, GaussianWeight)
        np.testing.assert_array_equal(w.encoding.mean(), want[w.name][0])
        np.testing.assert_array_equal(w.encoding.stddev(), want[w.name][1])

    session = ort.InferenceSession(bnn.float_model().SerializeToString(), providers=["CPUExecutionProvider"])
    x = torch.randn(5, 1, 8, 8)  # batch 5: the exported batch axis is dynamic
    (got,) = session.run(None, {bnn.manifest.input_name: x.numpy()})
    with torch.no_grad():
        ref = denoised(x)
    ref = ref[output_index] if isinstance(ref, tuple) else ref
    np.testing.assert_allclose(got, ref.numpy(), rtol=NET_TOL, atol=NET_TOL)


@pytest.mark.slow
def test_import_bayesian_torch_dnn_to_bnn_cnn(bl: Any) -> None:
    dnn_to_bnn = pytest.importorskip("bayesian_torch.models.dnn_to_bnn").dnn_to_bnn
    torch.manual_seed(0)
    model = _cnn(nn.Conv2d(1, 4, 3, padding="same"), nn.Linear(4 * 4 * 4, 3))
    params = {"prior_mu": 0.0, "prior_sigma": 1.0, "posterior_mu_init": 0.0, "posterior_rho_init": -3.0}
    dnn_to_bnn(model, {**params, "type": "Flipout", "moped_enable": False, "moped_delta": 0.5})
    denoised = copy.deepcopy(model)
    for i in (0, 4):
        _bt_shrink(denoised[i])
    _check_import(model, bt_adapter.ADAPTER, denoised)


@pytest.mark.slow
def test_import_bayesian_torch_hand_written_kl_tuples(bl: Any) -> None:
    torch.manual_seed(0)
    model = _HandWritten(bl)  # forward returns (logits, kl); every layer returns (out, kl)
    denoised = copy.deepcopy(model)
    for layer in (denoised.conv, denoised.fc):
        _bt_shrink(layer)
    _check_import(model, bt_adapter.ADAPTER, denoised, output_index=0)


@pytest.mark.slow
def test_import_torchbnn_cnn(tbnn: Any) -> None:
    torch.manual_seed(0)
    model = _cnn(tbnn.BayesConv2d(0.0, 0.1, 1, 4, 3, padding=1), tbnn.BayesLinear(0.0, 0.1, 4 * 4 * 4, 3))
    for i in (0, 4):
        _tbnn_randomise(model[i])
    denoised = copy.deepcopy(model)
    for i in (0, 4):
        _tbnn_zero_noise(denoised[i])
    _check_import(model, tbnn_adapter.ADAPTER, denoised)


@pytest.mark.slow
def test_import_blitz_cnn(bm: Any) -> None:
    torch.manual_seed(0)
    # bias=False on the Linear: blitz keeps unused bias_mu/bias_rho there, which must not be imported
    model = _cnn(bm.BayesianConv2d(1, 4, (3, 3), padding=1), bm.BayesianLinear(4 * 4 * 4, 3, bias=False))
    denoised = copy.deepcopy(model)
    for i in (0, 4):
        denoised[i].freeze = True
    _check_import(model, blitz_adapter.ADAPTER, denoised)


@pytest.mark.slow
def test_import_refuses_unreadable_layers(bl: Any, bm: Any) -> None:
    from edgebnn.importers import import_model

    gru = nn.Sequential(nn.Flatten(2), bm.BayesianGRU(8, 3))
    with pytest.raises(UnsupportedLayerError, match=r"^layer '1' \(BayesianGRU\): recurrent layers"):
        import_model(gru, (1, 1, 8, 8))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cls_name", "kwargs", "shape"),
    [
        ("Conv1dFlipout", {"stride": 2, "padding": 1}, (1, 2, 9)),
        ("Conv3dReparameterization", {"padding": 1}, (1, 2, 3, 4, 5)),
        ("ConvTranspose1dReparameterization", {"stride": 2, "output_padding": 1}, (1, 2, 5)),
        # bias=False: bayesian-torch 0.5's ConvTranspose3dFlipout fails with a bias when it returns no KL
        ("ConvTranspose3dFlipout", {"stride": 2, "padding": 1, "bias": False}, (1, 2, 2, 3, 3)),
    ],
)
def test_import_other_conv_kinds(bl: Any, cls_name: str, kwargs: dict[str, Any], shape: tuple[int, ...]) -> None:
    """Import -> IR -> onnxruntime (the posterior-mean network, and the reference runtime's draws)."""
    ort = pytest.importorskip("onnxruntime")
    from edgebnn.importers import import_model
    from edgebnn.runtime.reference import sample_logits

    torch.manual_seed(0)
    layer = getattr(bl, cls_name)(2, 4, 3, **kwargs, **_BT_PRIORS)
    layer.dnn_to_bnn_flag = True  # forward returns the output only, as after dnn_to_bnn
    layer.prior_weight_sigma = torch.ones_like(layer.mu_kernel)  # see test_bayesian_torch_every_conv_kind
    model = nn.Sequential(layer, nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))
    with torch.no_grad():
        model(torch.zeros(shape))  # materialise the lazy head
    bnn = import_model(model, shape)
    [conv_weight] = [w for w in bnn.encoded_weights() if w.name == "0.weight"]
    np.testing.assert_array_equal(conv_weight.encoding.mean(), layer.mu_kernel.detach().numpy())
    denoised = copy.deepcopy(model)
    _bt_shrink(denoised[0])
    x = torch.randn(5, *shape[1:])
    session = ort.InferenceSession(bnn.float_model().SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {bnn.manifest.input_name: x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(got, denoised(x).numpy(), rtol=NET_TOL, atol=NET_TOL)
    draws = sample_logits(bnn, x.numpy(), 8, seed=0)  # the reference runtime samples this layer kind
    assert draws.shape == (8, 5, 3) and np.all(draws.std(0) > 0)  # (tests/integration/test_zoo.py: vs the library)
