"""Adapters for the layers of edgebnn's training recipes (:mod:`edgebnn.train`).

* VNQ (:mod:`edgebnn.train.vnq`): θ clipped to the funnels and σ = exp(½ log σ²); deterministic bias.
* Bayesian Compression (:mod:`edgebnn.train.bc`): the IR carries the per-weight factor w̃ ~ N(μ, σ²); the
  group scales z ~ N(μ_z, σ_z²) are NOT folded in — lower such a model with ``prune`` (or ``prune+X``) and
  ``group_scales=edgebnn.train.bc.group_scales(model)``, which folds the marginal moments and prunes groups.
  Deterministic bias.
* 2DGBNN stage 3 (:mod:`edgebnn.train.dgbnn`): every inlier weight carries its component's (m_k, s_k),
  outliers and biases their own Gaussian; ``lower(ir, "codebook")`` finds the components back.
* EBP (:mod:`edgebnn.train.ebp`): a binary weight with P(W = +1) = p becomes the Gaussian with the same mean
  and the same sign probability, μ = 2p - 1, σ = |μ| / |Φ⁻¹(p)| (so Φ(μ/σ) = p; σ is capped where p ≈ ½),
  which the ``binary`` pass turns back into sign bits, flip probabilities Φ(-|μ|/σ) = min(p, 1-p), and a
  per-layer scale ≈ 1.

Dependencies run one way, importers -> train (train is the layer below, docs/design.md): the adapters import
the recipe layer classes when asked to match a module, and :mod:`edgebnn.train` never imports the importers.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from edgebnn.importers.base import LayerPosterior, ntuple, to_numpy

if TYPE_CHECKING:
    import torch


def _posterior(module: Any, path: str, mu: torch.Tensor, sigma: torch.Tensor) -> LayerPosterior:
    bias = getattr(module, "bias", None)
    weight, bias_mu = (to_numpy(mu), to_numpy(sigma)), None if bias is None else to_numpy(bias)
    if mu.ndim == 4:
        return LayerPosterior(
            path, "conv", *weight, bias_mu, stride=ntuple(module.stride, 2, "stride", path),
            padding=ntuple(module.padding, 2, "padding", path),
        )
    return LayerPosterior(path, "linear", *weight, bias_mu)


class VNQAdapter:
    library = "edgebnn-vnq"

    def matches(self, module: torch.nn.Module) -> bool:
        from edgebnn.train.vnq import _VNQLayer

        return isinstance(module, _VNQLayer)

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        m: Any = module
        return _posterior(m, path, m.clipped_mu(), m.weight_sigma)


class BCAdapter:
    library = "edgebnn-bc"

    def matches(self, module: torch.nn.Module) -> bool:
        from edgebnn.train.bc import _GroupNJLayer

        return isinstance(module, _GroupNJLayer)

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        m: Any = module
        return _posterior(m, path, m.weight_mu, m.weight_sigma)


class EBPAdapter:
    library = "edgebnn-ebp"

    def matches(self, module: torch.nn.Module) -> bool:
        from edgebnn.train.ebp import BinaryLinear

        return isinstance(module, BinaryLinear)

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        mu, sigma = module.gaussian_posterior()  # type: ignore[operator]
        return _posterior(module, path, mu, sigma)


class TiedAdapter:
    library = "edgebnn-2dgbnn"

    def matches(self, module: torch.nn.Module) -> bool:
        from edgebnn.train.dgbnn import TiedBayesLayer

        return isinstance(module, TiedBayesLayer)

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior:
        from edgebnn.importers.edgebnn_layers import ADAPTER

        m: Any = module
        inner = ADAPTER.extract(m.layer, path)
        mu, sigma = m.posterior()
        return dataclasses.replace(inner, weight_mu=to_numpy(mu), weight_sigma=to_numpy(sigma))


VNQ_ADAPTER = VNQAdapter()
BC_ADAPTER = BCAdapter()
EBP_ADAPTER = EBPAdapter()
TIED_ADAPTER = TiedAdapter()
