"""``LowRankGaussianWeight``: SWAG's low-rank plus diagonal Gaussian (Maddox et al. 2019), one parameter's slice.

SWAG keeps, per parameter, the running mean θ̄ and squared mean of the SGD iterates and the last K
deviations ``D`` [K, n] (rows ``θ_i − θ̄_i``). The draw is the reference code's ``SWAG.sample``
(wjmaddox/swa_gaussian ``swag/posteriors/swag.py``, ``sample_fullrank``), with ``scale`` as given there:

    σ = sqrt(max(sq_mean − mean², var_clamp))                         (diagonal part)
    w = mean + sqrt(scale) · (σ ⊙ z₁ + Dᵀ z₂ / sqrt(K − 1)),   z₁ ~ N(0, I_n),  z₂ ~ N(0, I_K)

The paper's ``½ Σ_diag + ½ D Dᵀ/(K−1)`` is this formula at ``scale = 0.5`` (the reference code's default for
uncertainty experiments, and edgebnn's). The reference divides by ``max_num_models − 1``; its ``D`` holds
``max_num_models`` rows once SWAG has collected that many, which is the K here. One z₂ is shared by every
parameter of the network (the reference draws it for the flattened concatenation of all parameters), so this
encoding is drawn jointly (:class:`~edgebnn.ir.encodings.joint.JointGroup` kind ``normal`` of size K); its own
``sample`` draws an independent z₂ (the marginal of this one parameter).

In a ``noise --noise weight`` export the draw runs in the graph from inputs ``noise/<weight>`` (z₁) and one
``noise/swag_z2`` [S, K] that every layer reads (:func:`edgebnn.exporters.draws.lowrank_draw`).

Moments per weight: mean ``mean``, variance ``scale · (σ² + Σ_k D_k² / (K − 1))``.

Stored: ``mean`` and ``sigma`` float32 [*shape], ``deviations`` float32 [K, n]; attribute ``scale`` (> 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import Encoding, NoiseNeed, check_finite, check_shape, register_encoding
from edgebnn.ir.encodings.fixedpoint import attr_number
from edgebnn.ir.encodings.joint import JointGroup

MAX_RANK = 4096
Z2_SUFFIX = ".swag_z2"  # the shared noise input ``noise/swag_z2`` [S, K] of a ``noise`` export


@register_encoding
class LowRankGaussianWeight(Encoding):
    """w = mean + sqrt(scale) · (σ ⊙ z₁ + Dᵀ z₂ / sqrt(K − 1)), z₂ shared by the whole network."""

    op_type = "LowRankGaussianWeight"
    FIELDS = ("mean", "sigma", "deviations")

    def __init__(self, mean: np.ndarray, sigma: np.ndarray, deviations: np.ndarray, scale: float) -> None:
        super().__init__(mean.shape)
        self.mu = np.ascontiguousarray(mean, dtype=np.float32)
        self.sigma = np.ascontiguousarray(sigma, dtype=np.float32)
        self.deviations = np.ascontiguousarray(deviations, dtype=np.float32)
        self.scale = float(np.float32(scale))

    @property
    def rank(self) -> int:
        return int(self.deviations.shape[0])

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> LowRankGaussianWeight:
        scale = attr_number(attrs, "scale", where)
        if not scale > 0:
            raise InvalidArtifactError(f"{where}: attribute 'scale' must be > 0, got {scale}")
        n = int(np.prod(shape, dtype=np.int64))
        for name in cls.FIELDS:
            if fields[name].dtype != np.float32:
                raise InvalidArtifactError(f"{where}: {name} must be float32, got {fields[name].dtype}")
            check_finite(fields[name], name, where)
        check_shape(fields["mean"], shape, "mean", where)
        check_shape(fields["sigma"], shape, "sigma", where)
        dev = fields["deviations"]
        if dev.ndim != 2 or dev.shape[1] != n or not 2 <= dev.shape[0] <= MAX_RANK:
            raise InvalidArtifactError(
                f"{where}: deviations must be [K, {n}] with 2 <= K <= {MAX_RANK}, got {tuple(dev.shape)}"
            )
        if np.any(fields["sigma"] < 0):
            raise InvalidArtifactError(f"{where}: sigma has negative values")
        return cls(fields["mean"], fields["sigma"], dev, scale)

    def fields(self) -> dict[str, np.ndarray]:
        return {"mean": self.mu, "sigma": self.sigma, "deviations": self.deviations}

    def attributes(self) -> dict[str, Any]:
        return {"scale": self.scale}

    def mean(self) -> np.ndarray:
        return self.mu

    def stddev(self) -> np.ndarray:
        low = np.square(self.deviations, dtype=np.float64).sum(axis=0) / (self.rank - 1)
        var = self.scale * (np.square(self.sigma, dtype=np.float64) + low.reshape(self.shape))
        return np.sqrt(var).astype(np.float32)

    def joint_group(self) -> JointGroup:
        return JointGroup("normal", self.rank)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """The marginal draw: z₂ drawn for this parameter alone (joint draws go through ``draw_weight``)."""
        z1 = rng.standard_normal((n, *self.shape), dtype=np.float32)
        z2 = rng.standard_normal((n, self.rank), dtype=np.float32)
        return self._draw(z1, z2)

    def sample_joint(self, shared: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
        z2 = np.asarray(shared, np.float32).reshape(n, self.rank)
        return self._draw(rng.standard_normal((n, *self.shape), dtype=np.float32), z2)

    def _draw(self, z1: np.ndarray, z2: np.ndarray) -> np.ndarray:
        n = z1.shape[0]
        low = (z2 @ self.deviations).reshape(n, *self.shape) / np.float32(np.sqrt(self.rank - 1))
        z1 *= self.sigma
        z1 += low
        z1 *= np.float32(np.sqrt(self.scale))
        z1 += self.mu
        return z1

    def noise_needs(self) -> tuple[NoiseNeed, ...]:
        """z₁ per weight, and z₂ [K] as one input shared by every layer (``noise/swag_z2``)."""
        return (NoiseNeed("", self.shape), NoiseNeed(Z2_SUFFIX, (self.rank,), shared=True))
