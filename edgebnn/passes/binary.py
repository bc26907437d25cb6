"""``binary``: binarise the Gaussian posterior (EBP): w ∈ {-a, +a}, P(W = +a) = Φ(μ/σ).

Per weight: the sign bit is the most probable sign s_i = sign(μ_i) (+ for μ_i = 0), and the flip probability
f_i = P(W ≠ s_i) = Φ(-|μ_i|/σ_i) ∈ [0, 1/2] gets a small log-domain code (``flip_bits``, default 2: four
levels per layer, each the mean f of its bin; f = 0 for σ = 0, and Φ(0/0) := 1/2 for μ = σ = 0).

Per layer: the scale ``a`` is the least-squares fit of the posterior means by the binary means
E[w_i] = a s_i (1 - 2 f̂_i), with f̂ the coded flips:

    a = Σ |μ_i| (1 - 2 f̂_i) / Σ (1 - 2 f̂_i)²

When every f̂_i = 1/2 (no weight has a preferred sign: all-zero μ) the fit is undefined and ``a`` falls
back to the root mean square of σ (1 when σ = 0 too), with a note. ``bits`` may only be None or 1.
Biases (1-D weights) are lowered with ``fixed`` instead (a sign per bias loses too much) and the report
says so.

Report keys besides the common ones: ``scale`` (a), ``flip_mean`` (mean coded flip probability).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.special import ndtr

from edgebnn.ir import EncodedWeight
from edgebnn.ir.encodings import BinaryWeight, SigmaCode
from edgebnn.passes.base import (
    LayerOutcome,
    QuantConfig,
    check_int,
    degenerate_note,
    join_notes,
    posterior,
    sum_sq_diff,
)
from edgebnn.passes.fixed import MatrixPass


@dataclass(frozen=True)
class BinaryConfig(QuantConfig):
    """Settings of ``binary``.

    Attributes:
        flip_bits: Bits of the per-weight flip-probability code (0: one flip probability per layer).
    """

    flip_bits: int = 2

    BITS_RANGE: ClassVar[tuple[int, int]] = (1, 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(self.flip_bits, "flip_bits", 0, 8)


def flip_probability(mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Φ(-|μ|/σ), float32; 0 where σ = 0 < |μ|, 1/2 where μ = σ = 0."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # |μ|/σ → ∞ is P = 0 or 1
        z = np.abs(mu) / sigma
    z[np.isnan(z)] = 0.0  # 0/0: no preferred sign
    return ndtr(-z).astype(np.float32)


def lower_binary(
    mu: np.ndarray, sigma: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator, config: BinaryConfig
) -> LayerOutcome:
    """Encode one Gaussian weight (flat ``mu``, ``sigma``) as a :class:`BinaryWeight`."""
    flip = SigmaCode.fit(flip_probability(mu, sigma), config.flip_bits, rng, power=1)
    keep = 1 - 2 * flip.decode()
    den = float(np.sum(keep * keep, dtype=np.float64))
    note = degenerate_note(mu, sigma)
    if den > 0:
        scale = float(np.sum(np.abs(mu) * keep, dtype=np.float64)) / den
    else:
        scale = float(np.sqrt(sum_sq_diff(sigma) / sigma.size))
        scale = scale if scale > 0 else 1.0
        note = join_notes(note, f"no weight has a preferred sign: scale falls back to rms sigma ({scale:.4g})")
    enc = BinaryWeight((mu >= 0).reshape(shape), scale, flip)
    return LayerOutcome(enc, note, {"scale": enc.scale, "flip_mean": float(1 - keep.mean(dtype=np.float64)) / 2})


class BinaryPass(MatrixPass):
    """Lower every Gaussian weight matrix to sign bits, a per-layer scale and a flip-probability code."""

    name = "binary"
    config_type = BinaryConfig
    config: BinaryConfig
    TRAINED_BY = ("edgebnn-ebp", "edgebnn.train.ebp")
    ENCODING = "BinaryWeight"

    def lower_matrix(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        mu, sigma = posterior(weight)
        return lower_binary(mu, sigma, weight.encoding.shape, rng, self.config)
