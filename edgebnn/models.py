"""Ready-made Bayesian models, importable by name (``--model edgebnn.models:digits_cnn``).

``digits_cnn`` (1x8x8, trained in the demo), and two benchmark shapes: ``lenet5`` (1x28x28) and
``resnet20`` (3x32x32, the CIFAR ResNet-20). The benchmark shapes are never trained here: give them a
posterior with :func:`synthetic_posterior` (recipe in its docstring).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from edgebnn.errors import InvalidOptionError
from edgebnn.nn import BayesConv2d, BayesLinear, bayesian_layers

# Median of sigma/|mu| over every weight and bias of digits_cnn trained with edgebnn.train.train_bnn
# (defaults: 60 epochs, seed 0, 1 torch thread; per-tensor medians range from 0.14 for conv1 to 2.4 for
# fc1, which holds most of the weights). bench/ensemble_latency.py re-measures it on every run.
DIGITS_SIGMA_RATIO = 1.026


def digits_cnn(num_classes: int = 10) -> nn.Module:
    """A small Bayesian CNN for 1x8x8 images (sklearn digits); returns logits ``(N, num_classes)``.

    ``conv1 (1->16, 3x3) -> relu -> 2x2 max-pool -> conv2 (16->32, 3x3) -> relu -> 2x2 max-pool ->
    flatten -> fc1 (128->64) -> relu -> fc2 (64->num_classes)``; every conv and linear layer is
    mean-field Bayesian with the default prior ``N(0, 1)``.

    Args:
        num_classes: Number of output logits.

    Returns:
        An ``nn.Sequential`` whose submodules are named ``conv1``, ``relu1``, ``pool1``, ``conv2``,
        ``relu2``, ``pool2``, ``flatten``, ``fc1``, ``relu3``, ``fc2``.
    """
    return nn.Sequential(
        OrderedDict(
            [
                ("conv1", BayesConv2d(1, 16, 3, padding=1)),
                ("relu1", nn.ReLU()),
                ("pool1", nn.MaxPool2d(2)),
                ("conv2", BayesConv2d(16, 32, 3, padding=1)),
                ("relu2", nn.ReLU()),
                ("pool2", nn.MaxPool2d(2)),
                ("flatten", nn.Flatten()),
                ("fc1", BayesLinear(32 * 2 * 2, 64)),
                ("relu3", nn.ReLU()),
                ("fc2", BayesLinear(64, num_classes)),
            ]
        )
    )


def lenet5(num_classes: int = 10) -> nn.Module:
    """Bayesian LeNet-5 for 1x28x28 images; returns logits ``(N, num_classes)``.

    ``conv1 (1->6, 5x5) -> relu -> 2x2 max-pool -> conv2 (6->16, 5x5) -> relu -> 2x2 max-pool -> flatten
    -> fc1 (256->120) -> relu -> fc2 (120->84) -> relu -> fc3 (84->num_classes)``; every conv and linear
    layer is mean-field Bayesian (with bias) with the default prior ``N(0, 1)``. 44,426 weights and biases
    for 10 classes.

    Args:
        num_classes: Number of output logits.

    Returns:
        An ``nn.Sequential`` whose submodules are named ``conv1``, ``relu1``, ``pool1``, ``conv2``,
        ``relu2``, ``pool2``, ``flatten``, ``fc1``, ``relu3``, ``fc2``, ``relu4``, ``fc3``.
    """
    return nn.Sequential(
        OrderedDict(
            [
                ("conv1", BayesConv2d(1, 6, 5)),
                ("relu1", nn.ReLU()),
                ("pool1", nn.MaxPool2d(2)),
                ("conv2", BayesConv2d(6, 16, 5)),
                ("relu2", nn.ReLU()),
                ("pool2", nn.MaxPool2d(2)),
                ("flatten", nn.Flatten()),
                ("fc1", BayesLinear(16 * 4 * 4, 120)),
                ("relu3", nn.ReLU()),
                ("fc2", BayesLinear(120, 84)),
                ("relu4", nn.ReLU()),
                ("fc3", BayesLinear(84, num_classes)),
            ]
        )
    )


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 Bayesian convs with BatchNorm, and the residual Add.

    The shortcut is the identity when the shape is kept, else a Bayesian 1x1 conv (stride 2) with
    BatchNorm ("option B"): it exports as Conv + BatchNormalization, which every export mode handles,
    where option A's strided slice and zero channel pad would export as Slice and Pad (which the
    ``analytic`` mode does not propagate). Every conv has a (Bayesian) bias although BatchNorm follows:
    a bias-less conv exports only because the importer gives it an explicit zero bias (torch.onnx.export
    would otherwise build the zeros from Shape(weight), and the ensemble exporters refuse a sampled weight
    that feeds a Shape node); with its own bias the model does not depend on that.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = BayesConv2d(in_channels, out_channels, 3, stride=stride, padding=1)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu1 = nn.ReLU()
        self.conv2 = BayesConv2d(out_channels, out_channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu2 = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                OrderedDict(
                    [
                        ("conv", BayesConv2d(in_channels, out_channels, 1, stride=stride)),
                        ("bn", nn.BatchNorm2d(out_channels)),
                    ]
                )
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


def resnet20(num_classes: int = 10) -> nn.Module:
    """Bayesian ResNet-20 for 3x32x32 images (He et al. 2016, CIFAR variant); returns logits.

    ``conv (3->16, 3x3) -> BN -> relu -> 3 stages x 3 basic blocks (16, 32, 64 channels; the first block
    of stages 2 and 3 has stride 2 and a 1x1-conv shortcut) -> global average pool -> flatten ->
    fc (64->num_classes)``. Every conv (with bias, see :class:`BasicBlock`) and the linear head are
    mean-field Bayesian; BatchNorm layers are deterministic with default running statistics until trained
    (use the model in eval mode). The global pool is ``AvgPool2d(8)`` over the 8x8 last feature map (as
    in the original CIFAR code): it exports as ONNX AveragePool, which every mode handles, where
    ``AdaptiveAvgPool2d(1)`` exports as ReduceMean with its axes from a Constant node, which the
    ``analytic`` export fails on (tests/integration/test_models.py). So the model takes exactly 3x32x32 inputs.
    19 + 2 shortcut convs and the head: 271,690 Bayesian weights and biases for 10 classes.

    Args:
        num_classes: Number of output logits.

    Returns:
        An ``nn.Sequential`` named ``conv1``, ``bn1``, ``relu1``, ``layer1``..``layer3`` (each an
        ``nn.Sequential`` of :class:`BasicBlock`), ``pool``, ``flatten``, ``fc``.
    """
    stages: list[tuple[str, nn.Module]] = []
    in_ch = 16
    for i, out_ch in enumerate((16, 32, 64), start=1):
        blocks = [BasicBlock(in_ch if b == 0 else out_ch, out_ch, 2 if (b == 0 and i > 1) else 1) for b in range(3)]
        stages.append((f"layer{i}", nn.Sequential(*blocks)))
        in_ch = out_ch
    return nn.Sequential(
        OrderedDict(
            [
                ("conv1", BayesConv2d(3, 16, 3, padding=1)),
                ("bn1", nn.BatchNorm2d(16)),
                ("relu1", nn.ReLU()),
                *stages,
                ("pool", nn.AvgPool2d(8)),  # global: the last feature map is 8x8
                ("flatten", nn.Flatten()),
                ("fc", BayesLinear(64, num_classes)),
            ]
        )
    )


def synthetic_posterior(model: nn.Module, sigma_ratio: float = DIGITS_SIGMA_RATIO) -> nn.Module:
    """Give an untrained model a posterior shaped like a trained one, in place; returns ``model``.

    Recipe, per weight tensor and per bias tensor of every Bayesian layer: ``mu`` stays as initialised
    (torch's default Kaiming-uniform init for weights, uniform(±1/sqrt(fan_in)) for biases: seed torch
    first for repeatable values) and ``sigma`` is one value per tensor, ``sigma = sigma_ratio /
    median(1/|mu|)`` (``= sigma_ratio · median|mu|`` for odd sizes), stored as ``rho = softplus⁻¹(sigma)``.
    So the median of ``sigma/|mu|`` over each tensor (numpy's median) is exactly ``sigma_ratio``; the
    default is the median ratio of the trained digits CNN (:data:`DIGITS_SIGMA_RATIO`). BatchNorm running
    statistics keep their defaults (mean 0, variance 1) and the model is put in eval mode.

    Args:
        model: A model with edgebnn Bayesian layers (e.g. ``lenet5()`` or ``resnet20()``).
        sigma_ratio: The median ``sigma/|mu|`` to give every tensor; positive and finite.
    """
    if not (math.isfinite(sigma_ratio) and sigma_ratio > 0):
        raise InvalidOptionError(f"sigma_ratio={sigma_ratio!r} must be a positive finite number")
    with torch.no_grad():
        for _, layer in bayesian_layers(model):
            for mu, rho in ((layer.weight_mu, layer.weight_rho), (layer.bias_mu, layer.bias_rho)):
                if mu is None or rho is None:
                    continue
                with np.errstate(divide="ignore"):
                    inv = 1.0 / np.abs(mu.detach().cpu().double().numpy())  # inf where mu == 0
                sigma = min(max(sigma_ratio / float(np.median(inv)), 1e-8), 1e3)
                rho.fill_(sigma + math.log(-math.expm1(-sigma)))  # softplus⁻¹(σ) = log(exp(σ) − 1), stably
    return model.eval()


FACTORIES: dict[str, Callable[..., nn.Module]] = {"digits_cnn": digits_cnn, "lenet5": lenet5, "resnet20": resnet20}
