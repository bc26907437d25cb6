"""``--model`` factories that an import must refuse with one line (used as ``hostile_factories:NAME``)."""

from __future__ import annotations

import sys

import torch
from torch import nn


class MysteryBayesLinear(nn.Module):
    """Looks Bayesian (weight_mu / weight_rho) but no importer knows it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight_mu = nn.Parameter(torch.zeros(10, 64))
        self.weight_rho = nn.Parameter(torch.full((10, 64), -5.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.weight_mu.t()


def unknown_bayes() -> nn.Module:
    return nn.Sequential(nn.Flatten(), MysteryBayesLinear())


def no_bayes() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


def calls_exit() -> nn.Module:
    sys.exit(0)  # a factory ending the process "successfully" must not make edgebnn exit 0
