"""``DropoutMask``: MC dropout (Gal & Ghahramani 2016) as a posterior over an activation mask.

A dropout layer kept on at prediction multiplies its input by a mask ``M`` drawn per forward pass:

    M_i = [u_i >= p] / (1 - p),   u_i ~ U[0, 1)        (kept with probability 1 - p, rescaled)
    mean  E[M_i] = 1,   variance  Var[M_i] = p / (1 - p)

The mask is an encoded "weight" of shape ``[*features]`` (``nn.Dropout``: every unit its own draw) or
``[C, 1, ...]`` (``Dropout1d/2d/3d``: one draw per channel, broadcast over positions) that feeds
``Mul(activation, mask)``; nothing is stored but the attribute ``p``. Its mean is the deterministic network,
its draws are the thinned networks, so every sampling path (reference runtime, ``baked``, in-graph draws)
and the moment paths (``analytic``) treat it as any other encoded weight. Its value is named
``<layer>`` + :data:`MASK_SUFFIX` so the exporters recognise the ``Mul`` it feeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import Encoding, Grid, NoiseNeed, register_encoding
from edgebnn.ir.encodings.fixedpoint import attr_number

MASK_SUFFIX = ".dropout_mask"


@register_encoding
class DropoutMask(Encoding):
    """Bernoulli keep-mask with drop probability ``p``, scaled by 1/(1-p)."""

    op_type = "DropoutMask"
    FIELDS = ()
    PLAIN_REFERENCE = True  # a model with masks came from a plain network: its fp32 BNN is that network

    @classmethod
    def fp32_bytes(cls, attrs: Mapping[str, Any], field_dims: Mapping[str, list[int]]) -> int:
        """Nothing: a mask is drawn, never stored."""
        return 0

    def __init__(self, shape: tuple[int, ...], p: float) -> None:
        super().__init__(shape)
        self.p = float(np.float32(p))

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> DropoutMask:
        p = attr_number(attrs, "p", where)
        if not 0 < p < 1:
            raise InvalidArtifactError(f"{where}: attribute 'p' must be in (0, 1), got {p}")
        return cls(shape, p)

    def fields(self) -> dict[str, np.ndarray]:
        return {}

    def attributes(self) -> dict[str, Any]:
        return {"p": self.p}

    def keep_scale(self) -> np.float32:
        """1 / (1 - p): the value of a kept unit."""
        return np.float32(1.0) / (np.float32(1.0) - np.float32(self.p))

    def mean(self) -> np.ndarray:
        return np.ones(self.shape, np.float32)

    def stddev(self) -> np.ndarray:
        return np.full(self.shape, np.sqrt(self.p / (1 - self.p)), np.float32)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        u = rng.random((n, *self.shape), dtype=np.float32)
        return np.where(u >= np.float32(self.p), self.keep_scale(), np.float32(0.0))

    def noise_needs(self) -> tuple[NoiseNeed, ...]:
        return (NoiseNeed("", self.shape, "uniform"),)

    def select(self, axis: int, index: np.ndarray) -> DropoutMask:
        shape = list(self.shape)
        shape[axis] = len(index)
        return DropoutMask(tuple(shape), self.p)

    def sample_grid(self) -> Grid:
        """Every draw is 0 or 1/(1-p): ``q`` in {0, 1} times ``step = 1/(1-p)``."""
        return Grid(float(self.keep_scale()), 2)
