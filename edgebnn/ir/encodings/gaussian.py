"""``GaussianWeight``: the mean-field posterior as imported, w ~ N(mu, sigma²), stored in fp32."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import Encoding, check_finite, check_shape, register_encoding


@register_encoding
class GaussianWeight(Encoding):
    op_type = "GaussianWeight"
    FIELDS = ("mu", "sigma")
    GAUSSIAN = True

    def __init__(self, mu: np.ndarray, sigma: np.ndarray) -> None:
        super().__init__(mu.shape)
        self.mu = np.ascontiguousarray(mu, dtype=np.float32)
        self.sigma = np.ascontiguousarray(sigma, dtype=np.float32)

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> GaussianWeight:
        mu, sigma = fields["mu"], fields["sigma"]
        for name, arr in (("mu", mu), ("sigma", sigma)):
            if arr.dtype != np.float32:
                raise InvalidArtifactError(f"{where}: {name} must be float32, got {arr.dtype}")
            check_shape(arr, shape, name, where)
            check_finite(arr, name, where)
        if np.any(sigma < 0):
            raise InvalidArtifactError(f"{where}: sigma has negative values")
        return cls(mu, sigma)

    def fields(self) -> dict[str, np.ndarray]:
        return {"mu": self.mu, "sigma": self.sigma}

    def mean(self) -> np.ndarray:
        return self.mu

    def stddev(self) -> np.ndarray:
        return self.sigma

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return draw_gaussian(rng, n, self.mu, self.sigma)

    def select(self, axis: int, index: np.ndarray) -> GaussianWeight:
        return GaussianWeight(np.take(self.mu, index, axis), np.take(self.sigma, index, axis))


def draw_gaussian(rng: np.random.Generator, n: int, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """``n`` draws ``mean + std ⊙ ε``, float32 ``(n, *mean.shape)``; ε from one ``standard_normal`` call, so every
    encoding drawn weight by weight consumes ``rng`` alike (same seed, same ε)."""
    draws = rng.standard_normal((n, *mean.shape), dtype=np.float32)
    draws *= std
    draws += mean
    return draws
