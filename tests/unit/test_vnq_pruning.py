"""Pruning-aware VNQ training (:mod:`edgebnn.train.vnq`): the masked forward zeroes exactly the log α >= 2 weights.

Fast: one small layer with weights set by hand, no training (the recipe's claim is measured by
``tests/integration/test_recipes.py`` and ``examples/train_vnq.py``).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from edgebnn.errors import InvalidOptionError  # noqa: E402


def _layer(log_alpha: np.ndarray, seed: int = 0):
    """A VNQLinear(in, out) whose weights have the given log α = log σ² - log θ² (θ well inside the funnels)."""
    from edgebnn.train.vnq import VNQLinear

    out_features, in_features = log_alpha.shape
    layer = VNQLinear(in_features, out_features)
    rng = np.random.default_rng(seed)
    # |θ| in [0.02, 0.1], below the level 0.2: the funnel clip (a + σ/e) never touches it
    mu = rng.uniform(0.02, 0.1, log_alpha.shape) * rng.choice([-1.0, 1.0], log_alpha.shape)
    log_sigma2 = log_alpha + np.log(mu * mu)  # in (-10, 1) for these θ and log α in [-2, 4]
    with torch.no_grad():
        layer.weight_mu.copy_(torch.as_tensor(mu, dtype=torch.float32))
        layer.weight_log_sigma2.copy_(torch.as_tensor(log_sigma2, dtype=torch.float32))
    return layer


# log α per weight: away from the threshold 2 by 0.25 at least (float32 rounding of log σ² moves it by ~1e-6),
# and column 3 entirely pruned
_LOG_ALPHA = np.array([
    [-2.0, 1.75, 2.25, 3.0, 0.0],
    [4.0, -1.0, 1.0, 2.5, 2.25],
    [1.5, 2.75, -0.5, 2.25, 1.75],
])


def test_pruned_marks_exactly_log_alpha_at_least_two():
    from edgebnn.train.vnq import PRUNE_LOG_ALPHA

    layer = _layer(_LOG_ALPHA)
    assert PRUNE_LOG_ALPHA == 2.0
    np.testing.assert_array_equal(layer.pruned().numpy(), _LOG_ALPHA >= 2.0)
    np.testing.assert_array_equal(layer.pruned().numpy(), layer.log_alpha().numpy() >= 2.0)


def test_pruning_forward_zeroes_mean_and_noise_of_exactly_the_pruned_weights():
    layer = _layer(_LOG_ALPHA)
    kept = torch.as_tensor(_LOG_ALPHA < 2.0, dtype=torch.float32)
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mu = layer.clipped_mu()
        layer.use_mean, layer.pruning = True, True
        # the posterior-mean forward sees θ · kept (float32 products of the same values: exact up to summation)
        torch.testing.assert_close(layer(x), F.linear(x, mu * kept, layer.bias), rtol=0, atol=1e-6)
        layer.pruning = False  # and without pruning every θ, as before
        torch.testing.assert_close(layer(x), F.linear(x, mu, layer.bias), rtol=0, atol=1e-6)
        assert not torch.allclose(F.linear(x, mu, layer.bias), F.linear(x, mu * kept, layer.bias), atol=1e-3)
        # column 3 is fully pruned: an input on it alone yields the bias, noise included (training: local
        # reparameterization, whose variance floor 1e-12 leaves a noise of 1e-6 · N(0, 1); eval: one weight draw)
        e3 = torch.zeros(4, 5)
        e3[:, 3] = 1.0
        layer.use_mean = False
        for training in (True, False):
            layer.train(training)
            layer.pruning = True
            torch.testing.assert_close(layer(e3), layer.bias.expand(4, -1), rtol=0, atol=1e-5)
            layer.pruning = False  # unmasked, the pruned weights' σ (≥ e·|θ|) moves every output
            assert not torch.allclose(layer(e3), layer.bias.expand(4, -1), atol=1e-3)


def test_pruning_forward_gives_pruned_weights_no_data_gradient():
    layer = _layer(_LOG_ALPHA)
    layer.pruning = True
    layer.train()
    x = torch.randn(16, 5, generator=torch.Generator().manual_seed(2))
    layer(x).square().sum().backward()
    pruned = torch.as_tensor(_LOG_ALPHA >= 2.0)
    assert layer.weight_mu.grad is not None and layer.weight_log_sigma2.grad is not None
    assert torch.all(layer.weight_mu.grad[pruned] == 0) and torch.all(layer.weight_log_sigma2.grad[pruned] == 0)
    assert torch.all(layer.weight_mu.grad[~pruned] != 0)


def test_pruned_agrees_with_the_ternary_pass():
    """The mask of training is the pass's: its pruned weights are the ones coded with σ = 0."""
    from edgebnn.importers import import_model
    from edgebnn.train.vnq import lower_to_ternary

    rng = np.random.default_rng(3)
    log_alpha = rng.uniform(-2.0, 4.0, (10, 20))
    layer = _layer(log_alpha, seed=4)
    model = nn.Sequential(OrderedDict([("fc", layer)]))
    ternary, _ = lower_to_ternary(model, import_model(model, (1, 20)))
    pass_pruned = ternary.encoded_weight("fc.weight").encoding.stddev().reshape(10, 20) == 0
    np.testing.assert_array_equal(layer.pruned().numpy(), pass_pruned)
    assert 0.2 < pass_pruned.mean() < 0.5  # both sides of the threshold present (1/3 expected)


def test_train_vnq_prunes_in_the_last_epochs_only_and_returns_unmasked():
    from edgebnn.train.vnq import VNQLinear, train_vnq, vnq_layers

    rng = np.random.default_rng(5)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    y = (np.arange(40) % 3).astype(np.int64)
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict([("fc", VNQLinear(6, 3, init_log_sigma2=-1.0))]))
    seen: list[bool] = []
    # the training steps' forwards (the input checks run without grad)
    model.register_forward_pre_hook(lambda m, _: seen.append(m.fc.pruning) if torch.is_grad_enabled() else None)
    train_vnq(model, (x, y), epochs=3, batch_size=20, prune_epochs=1, kl_warmup_epochs=0)
    assert seen == [False] * 4 + [True] * 2  # two steps per epoch; the phase is the last epoch
    assert not any(m.pruning for _, m in vnq_layers(model))
    with pytest.raises(InvalidOptionError, match=r"prune_epochs=4 must be an integer in \[0, epochs=3\]"):
        train_vnq(model, (x, y), epochs=3, prune_epochs=4)
