"""Ready-made Bayesian models, importable by name (``--model edgebnn.models:digits_cnn``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from torch import nn

from edgebnn.nn import BayesConv2d, BayesLinear


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


FACTORIES: dict[str, Callable[..., nn.Module]] = {"digits_cnn": digits_cnn}
