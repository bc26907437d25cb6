"""The training recipes of :mod:`edgebnn.train` (VNQ, Bayesian Compression, 2DGBNN stage 3, EBP).

Small runs: each test asserts a recipe's mechanism, or its "must show" property where that is cheap (EBP);
the full-size claims are measured by ``examples/train_*.py`` (docs/recipes.md).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from edgebnn.errors import EdgeBNNError, InvalidOptionError  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def small_digits():
    """A third of the digits training split (every class present) and the test split."""
    from edgebnn.data import digits

    d = digits(0)
    return d.x_train[:360], d.y_train[:360], d.x_test, d.y_test


def _vnq_mlp():
    from edgebnn.train.vnq import VNQLinear

    return nn.Sequential(OrderedDict([("flatten", nn.Flatten()), ("fc1", VNQLinear(64, 32)), ("relu", nn.ReLU()),
                                      ("fc2", VNQLinear(32, 10))]))


def _bc_cnn():
    from edgebnn.train.bc import GroupNJConv2d, GroupNJLinear

    return nn.Sequential(OrderedDict([
        ("conv1", GroupNJConv2d(1, 8, 3, padding=1)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()), ("fc1", GroupNJLinear(128, 32)), ("relu2", nn.ReLU()),
        ("fc2", GroupNJLinear(32, 10)),
    ]))


def test_train_package_keeps_the_old_exports():
    import edgebnn.train as train
    from edgebnn.train.elbo import train_bnn

    assert train.train_bnn is train_bnn
    for name in ("TrainResult", "EpochStats", "mc_predict", "mc_accuracy"):
        assert hasattr(train, name)


def test_vnq_kl_prefers_the_codebook_levels():
    from edgebnn.train.vnq import kl_quantizing

    a = torch.tensor(0.3)
    theta = torch.tensor([-0.3, -0.15, 0.0, 0.15, 0.3])
    log_sigma2 = torch.full_like(theta, -8.0)
    kl = torch.stack([kl_quantizing(t[None], s[None], a) for t, s in zip(theta, log_sigma2, strict=True)])
    # small σ: cheap at ±a, expensive between the levels; symmetric in θ
    assert kl[0] < kl[1] and kl[4] < kl[3]
    assert math.isclose(float(kl[0]), float(kl[4]), rel_tol=1e-5)
    assert math.isclose(float(kl[1]), float(kl[3]), rel_tol=1e-5)
    # large σ (pruned weight): the KL vanishes
    assert float(kl_quantizing(torch.tensor([0.01]), torch.tensor([1.0]), a)) < 0.05


def test_vnq_training_clips_and_lowers_to_ternary(small_digits):
    from edgebnn.importers import import_model
    from edgebnn.train.vnq import MIN_LEVEL, level_table, lower_to_ternary, train_vnq, vnq_layers

    x, y, _, _ = small_digits
    torch.manual_seed(0)
    model = _vnq_mlp()
    # a huge level learning rate drives the levels against the clip
    result = train_vnq(model, (x, y), epochs=6, lr=0.01, level_lr_factor=30.0, kl_warmup_epochs=0)
    kls = [h.kl for h in result.history]
    assert kls[-1] < kls[0]  # full-weight KL from epoch 1: the quantizing prior is being fitted
    for _, layer in vnq_layers(model):
        assert float(layer.level.detach()) >= MIN_LEVEL
        log_sigma2 = layer.weight_log_sigma2.detach()
        assert float(log_sigma2.min()) >= -10.0 and float(log_sigma2.max()) <= 1.0
        bound = layer.level + math.exp(-1) * layer.weight_sigma
        assert bool((layer.clipped_mu().abs() <= bound + 1e-6).all())
    _, report = lower_to_ternary(model, import_model(model, (1, 1, 8, 8)))
    kinds = {row["name"]: row["kind"] for row in report["layers"]}
    assert kinds["fc1.weight"] == kinds["fc2.weight"] == "TernaryWeight"
    prunable = level_table(model)
    for row in report["layers"]:
        if row["kind"] == "TernaryWeight":  # the pass prunes exactly the weights VNQ marks (log α >= 2)
            assert row["pruned"] == pytest.approx(prunable[row["layer"]]["prunable"], abs=1e-6)
            # rounded to the level VNQ learned (Sec. 3.2), stored as float32, not re-fitted
            assert row["level_from"] == "levels"
            assert row["level"] == np.float32(prunable[row["layer"]]["level"])


def test_vnq_sampled_ensemble_is_within_one_test_image_of_the_posterior_mean():
    """Issue 23's goal at the recipe's settings on seed 0: VNQ on digits with pruning-aware training
    (``RECIPE["prune_epochs"]``), ternary with the learned levels, the 64-member sampled ensemble at most one
    test image (0.28 point of 360: within 0.5 point) below the posterior-mean network of ALL the clipped means
    (the pruned ones not zeroed: the same reference as before the phase). Measured here: 0.9528 vs 0.9556, one
    image below, the bound itself; on two torch threads seed 0 is one image below too (three before the phase),
    and ``examples/train_vnq.py --seed S`` measures seeds 1-4 at +1 / 0 / -1 / 0 (docs/recipes.md). The margin
    the phase buys is in the mean networks: pruning no longer moves the logits, so the ternary mean network
    sits with the ensemble instead of two images below.
    """
    import onnxruntime as ort

    from edgebnn.data import digits
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.importers import import_model
    from edgebnn.metrics import accuracy
    from edgebnn.runtime import Session
    from edgebnn.train.vnq import ENSEMBLE_SAMPLES, RECIPE, lower_to_ternary, train_vnq, vnq_cnn, vnq_layers

    data = digits(0)
    torch.manual_seed(0)
    model = vnq_cnn()
    train_vnq(model, data, seed=0, **RECIPE)
    x, y = data.split("test")

    def mean_logits(ir):
        sess = ort.InferenceSession(ir.float_model().SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, {sess.get_inputs()[0].name: x})[0]

    bnn = import_model(model, (1, 1, 8, 8))
    full = mean_logits(bnn)  # the posterior-mean network: every clipped mean, pruned ones included
    for _, layer in vnq_layers(model):
        layer.use_mean = layer.pruning = True
    with torch.no_grad():
        masked = model(torch.from_numpy(x)).numpy()
    # the phase's mechanism: zeroing the pruned means barely moves the logits (median over test images of the
    # largest |Δlogit|: 0.41 on this seed without the phase, 0.05 with it; 0.1 lies between)
    assert float(np.median(np.abs(masked - full).max(axis=1))) < 0.1
    mean_acc = accuracy(full, y)
    ternary, _ = lower_to_ternary(model, bnn, seed=0)
    # the ternary mean network (no draws) within one image too: two below without the phase
    assert accuracy(mean_logits(ternary), y) >= mean_acc - 1 / len(y) - 1e-9, (accuracy(mean_logits(ternary), y),
                                                                              mean_acc)
    probs = Session(export_model(ternary, ExportConfig(ENSEMBLE_SAMPLES, mode="baked", seed=0)).proto).predict(x).probs
    assert accuracy(probs, y) >= mean_acc - 1 / len(y) - 1e-9, (accuracy(probs, y), mean_acc)


def test_bc_prunes_groups_and_picks_bits(small_digits):
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.exporters.sizes import deployed_bytes
    from edgebnn.importers import import_model
    from edgebnn.passes import ebnn_bytes
    from edgebnn.runtime.session import Session
    from edgebnn.train.bc import compress, group_scales, train_bc

    x, y, x_test, y_test = small_digits
    torch.manual_seed(0)
    model = _bc_cnn()
    train_bc(model, (x, y), epochs=25, lr=0.01, kl_warmup_epochs=5)
    scales = group_scales(model)
    assert {k: v[0].shape for k, v in scales.items()} == {"conv1.weight": (8,), "fc1.weight": (128,),
                                                          "fc2.weight": (32,)}
    imported = import_model(model, (1, 1, 8, 8))
    ir, report = compress(model, imported, threshold=-2.0, noise_fraction=0.05)
    arch = report["architecture"]
    assert sum(a["groups"] - a["kept"] for a in arch.values()) > 0  # some groups pruned
    assert all(a["kept"] > 0 for a in arch.values())
    assert all(2 <= a["bits"] < 16 for a in arch.values())
    probs = Session(export_model(ir, ExportConfig(8, mode="baked", seed=0, hoist="off")).proto).predict(x_test).probs
    assert np.mean(probs.argmax(1) == y_test) > 0.8
    # the pruned input neurons of fc2 leave the graph: fc1 loses those units (rounded to an even width), so the
    # layer shapes, the .ebnn and the deployed file shrink; the analytic predictive is unchanged
    shapes = {w.name: w.encoding.shape for w in ir.encoded_weights()}
    dead_fc2 = arch["fc2"]["groups"] - arch["fc2"]["kept"]
    assert dead_fc2 > 1, arch
    units = 32 - dead_fc2 + dead_fc2 % 2
    assert shapes["fc1.weight"] == (units, 128) and shapes["fc2.weight"] == (10, units)
    unshrunk = _lowered_without_shrink(imported, group_scales(model))
    assert {w.name: w.encoding.shape for w in unshrunk.encoded_weights()}["fc1.weight"] == (32, 128)
    assert ebnn_bytes(ir) < ebnn_bytes(unshrunk)
    small, full = (export_model(m, ExportConfig(8, mode="analytic")).proto for m in (ir, unshrunk))
    assert deployed_bytes(small).file_bytes < deployed_bytes(full).file_bytes
    # float32 sums of the same non-zero terms, in another order
    np.testing.assert_allclose(Session(small).predict(x_test).probs, Session(full).predict(x_test).probs, atol=1e-5)


def _lowered_without_shrink(ir, scales):
    """compress's prune+fixed, pass by pass, without the shrink lower() ends with."""
    from edgebnn.passes.config import PASSES, pass_configs

    options = {"group_log_alpha_threshold": -2.0, "noise_fraction": 0.05}
    for name, config in pass_configs("prune+fixed", "auto", options, {"group_scales": scales}):
        ir = PASSES[name](config)(ir, seed=0).model
    return ir


def test_2dgbnn_stage3_ties_inliers_and_lowers_to_codebook(small_digits):
    from edgebnn.importers import import_model
    from edgebnn.models import digits_cnn
    from edgebnn.train import train_bnn
    from edgebnn.train.dgbnn import TieConfig, lower_stage3, tie_to_codebook, tied_layers, train_stage3

    x, y, _, _ = small_digits
    torch.manual_seed(0)
    model = digits_cnn()
    train_bnn(model, (x, y), epochs=8, progress=False)
    config = TieConfig(clusters=8)
    report = tie_to_codebook(model, config)
    assert set(report) == {"conv1", "conv2", "fc1", "fc2"}
    result = train_stage3(model, (x, y), config=config, epochs=2)
    assert all(math.isfinite(h.loss) for h in result.history)
    for _, layer in tied_layers(model):
        mu, _ = layer.posterior()
        inlier = (layer.assign >= 0).reshape(mu.shape)
        # inliers carry exactly their component's (m_k, s_k); merged components have no members
        assert torch.equal(mu[inlier], layer.comp_mu[layer.assign[layer.assign >= 0]])
        assert not bool(torch.isin(layer.assign, torch.nonzero(~layer.alive).flatten()).any())
        # one draw per component per pass: the members of a component share their sampled value
        layer.eval()
        with torch.no_grad():
            torch.manual_seed(1)
            shared = layer.comp_mu + layer.comp_sigma * torch.randn_like(layer.comp_mu)
            torch.manual_seed(1)
            w = layer._tie(layer.layer.weight_mu, shared)
        assert torch.equal(w.reshape(-1)[layer.assign >= 0], shared[layer.assign[layer.assign >= 0]])
    lowered = lower_stage3(import_model(model, (1, 1, 8, 8)), clusters=8)
    codebooks = [w.encoding for w in lowered.model.encoded_weights() if w.encoding.op_type == "CodebookWeight"]
    assert codebooks and all(enc.sampling == "shared" for enc in codebooks)  # the draws stage 3 trained with
    assert not any("sampling='shared'" in (row["note"] or "") for row in lowered.report["layers"])


def test_ebp_p_beats_ebp_d_and_binary_lowering_keeps_p_plus():
    from scipy.special import ndtr
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    from edgebnn.importers import import_model
    from edgebnn.passes import lower
    from edgebnn.train.ebp import EBPNet, bayes_probability, binary_outputs, binary_weights, fit_temperature, train_ebp

    data, target = load_breast_cancer(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(data, target, test_size=0.4, stratify=target, random_state=0)
    mean, std = x_tr.mean(0), x_tr.std(0)

    def prep(a):
        return np.hstack([(a - mean) / std, np.ones((len(a), 1))]).astype(np.float32)

    x_tr, x_te = prep(x_tr), prep(x_te)
    torch.manual_seed(0)
    net = EBPNet([x_tr.shape[1], 120, 1])
    result = train_ebp(net, x_tr, y_tr, epochs=3)
    assert result.history[-1].nll < result.history[0].nll

    def scores(p1):
        p = np.where(y_te == 1, p1, 1 - p1)
        return float(np.mean((p1 > 0.5) == (y_te == 1))), float(-np.mean(np.log(np.maximum(p, 1e-12))))

    map_w = binary_weights(net, None)
    fit_temperature(net, x_tr, y_tr, map_w)
    acc_d, nll_d = scores(binary_outputs(net, x_te, map_w))
    acc_p, nll_p = scores(bayes_probability(net, x_te))
    assert acc_p >= acc_d and nll_p < nll_d  # EBP-P (binary weights, Bayes output) beats EBP-D

    lowered = lower(import_model(net, (1, x_tr.shape[1]), task="classification"), "binary")  # 2-class logits
    for row, layer in zip(lowered.report["layers"], net.layers, strict=True):
        assert row["kind"] == "BinaryWeight" and row["scale"] == pytest.approx(1.0, abs=0.05)
        mu, sigma = layer.gaussian_posterior()
        p_plus = torch.sigmoid(2 * layer.h).numpy()
        np.testing.assert_allclose(ndtr((mu / sigma).numpy()), p_plus, atol=1e-4)


def test_nan_loss_names_the_epoch_and_keeps_finite_parameters(small_digits):
    from edgebnn.train.vnq import train_vnq

    x, y, _, _ = small_digits

    class Poisoned(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _vnq_mlp()
            self.calls = 0

        def forward(self, inputs):
            self.calls += 1
            out = self.net(inputs)
            return out * float("nan") if self.training and self.calls > 12 else out

    torch.manual_seed(0)
    model = Poisoned()
    with pytest.raises(EdgeBNNError, match=r"vnq: epoch 2: loss became NaN"):
        train_vnq(model, (x, y), epochs=3, batch_size=64)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_diverging_parameters_are_refused_and_rolled_back(small_digits):
    from edgebnn.train.bc import train_bc

    x, y, _, _ = small_digits
    torch.manual_seed(0)
    model = _bc_cnn()
    with pytest.raises(EdgeBNNError, match=r"bc: epoch 1: "):
        train_bc(model, (x, y), epochs=2, lr=1e38)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_empty_class_and_mismatched_data_are_refused(small_digits):
    from edgebnn.train.bc import train_bc
    from edgebnn.train.ebp import EBPNet, train_ebp
    from edgebnn.train.vnq import train_vnq

    x, y, _, _ = small_digits
    keep = y != 3
    with pytest.raises(InvalidOptionError, match=r"before epoch 1: class\(es\) \[3\]"):
        train_bc(_bc_cnn(), (x[keep], y[keep]), epochs=1)
    with pytest.raises(InvalidOptionError, match="rejects inputs of shape"):
        train_vnq(_vnq_mlp(), (np.zeros((20, 30), np.float32), np.arange(20) % 10), epochs=1)
    net = EBPNet([5, 4, 1])
    with pytest.raises(InvalidOptionError, match="does not match the model's input"):
        train_ebp(net, np.zeros((10, 7)), np.arange(10) % 2)
    with pytest.raises(InvalidOptionError, match="class 1 has no training examples"):
        train_ebp(net, np.zeros((10, 5)), np.zeros(10, int))


# -- each recipe's paper claim on the example's default seed (bench/recipe_seeds.py runs seeds 0-4) -----------------


def _example(name: str):
    """``examples/<name>.py`` as a module (its ``parser()`` and ``run()``), with ``examples/`` importable."""
    import sys
    from pathlib import Path

    from scripts import script_module

    folder = Path(__file__).resolve().parents[2] / "examples"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return script_module(f"examples/{name}.py", f"example_{name}")


def _holds(result):
    from edgebnn.train.claims import CLAIMS, check

    holds, figures = check(result)
    assert holds, (CLAIMS[result["recipe"]].text, figures)
    return figures


def test_bbb_claim_on_the_default_seed(trained_digits):
    """Blundell et al.: half of the weights (lowest |μ|/σ) removable, the predictive as accurate as the mean net.
    The session's trained digits CNN is the example's model (digits_cnn, ELBO trainer, seed 0, one thread)."""
    import copy

    example = _example("train_bbb")
    figures = _holds(example.run(copy.deepcopy(trained_digits[0]), example.parser().parse_args([])))
    assert figures["snr_half_pruned_images"] >= -3 and figures["predictive_images"] >= -3


def test_2dgbnn_claim_on_the_default_seed(trained_digits):
    """Stage 3 at the recipe's settings (π_k-weighted KL, components at 1e-2) keeps the plain BNN's accuracy and
    uncertainty in the deployed shared-draw model: measured on seed 0 (S = 32) NLL +0.026, ECE +0.018; before
    the change, +0.15 and +0.13 (docs/recipes.md)."""
    import copy

    example = _example("train_2dgbnn")
    result = example.run(copy.deepcopy(trained_digits[0]), example.parser().parse_args([]))
    _holds(result)
    assert result["after"]["bytes"] < result["direct_codebook"]["bytes"]  # shared draws: the smaller artifact


def test_ebp_claim_on_the_default_seed():
    """EBP-P beats EBP-D in 8-fold cross-validation (the paper's measurement) on seed 0."""
    example = _example("train_ebp")
    _holds(example.run(example.parser().parse_args([])))


def test_bc_claim_on_the_default_seed():
    """Bayesian Compression prunes most groups at a few bits per layer and keeps the accuracy on seed 0."""
    example = _example("train_bc")
    _holds(example.run(example.parser().parse_args([])))
