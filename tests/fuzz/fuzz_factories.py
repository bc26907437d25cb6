"""The ``--model`` factory of the fuzz lane's ``lower`` targets (``fuzz_factories:tiny``): small, so a mutant
that loads runs the whole import in a fraction of a second."""

from __future__ import annotations

from torch import nn

from edgebnn.nn import BayesLinear


def tiny() -> nn.Module:
    """[B, 1, 8, 8] digits -> Flatten -> BayesLinear(64, 10) logits."""
    return nn.Sequential(nn.Flatten(), BayesLinear(64, 10))


def plain() -> nn.Module:
    """The MAP network of the fuzz lane's laplace-torch state: [B, 1, 8, 8] -> Flatten -> Linear(64, 10)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
