"""``BinaryWeight``: binarised Gaussian posterior (EBP): w ∈ {-a, +a} with P(W = +a) = Φ(μ/σ).

Each weight stores its most probable sign ``s_i = sign(μ_i)`` (one bit, ``1`` = +) and a code for its
flip probability ``f_i = P(W ≠ s_i) = Φ(-|μ_i|/σ_i) ∈ [0, 1/2]``, so that P(W = +a) = Φ(μ_i/σ_i):

    draw    w_i = a · s_i · (1 - 2·[u_i < f_i]),   u_i ~ U[0, 1)
    mean    E[w_i] = a · s_i · (1 - 2 f_i)
    stddev  sd[w_i] = 2a · sqrt(f_i (1 - f_i))

Stored: ``signs`` packed one bit per weight, ``flip_levels`` / ``flip_codes`` (a :class:`SigmaCode` with
``power = 1``: each level is the mean flip probability of its bin, every level in [0, 1/2]); attribute
``scale`` (a, float32, > 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import Encoding, Grid, register_encoding
from edgebnn.ir.encodings.fixedpoint import attr_number
from edgebnn.ir.encodings.packing import pack_uint, packed_nbytes, unpack_uint
from edgebnn.ir.encodings.sigmacode import SigmaCode


@register_encoding
class BinaryWeight(Encoding):
    """Sign bits, one per-layer scale and a flip-probability code."""

    op_type = "BinaryWeight"
    FIELDS = ("signs", "flip_levels", "flip_codes")
    bits = 1

    def __init__(self, positive: np.ndarray, scale: float, flip: SigmaCode, packed: np.ndarray | None = None) -> None:
        super().__init__(positive.shape)
        self.positive = np.asarray(positive, bool)
        self.scale = float(np.float32(scale))
        self.flip = flip
        self.packed = pack_uint(self.positive, 1) if packed is None else packed

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> BinaryWeight:
        scale = attr_number(attrs, "scale", where)
        if not scale > 0:
            raise InvalidArtifactError(f"{where}: attribute 'scale' must be > 0, got {scale}")
        n = int(np.prod(shape, dtype=np.int64))
        packed = fields["signs"]
        if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != packed_nbytes(n, 1):
            raise InvalidArtifactError(
                f"{where}: signs must be {packed_nbytes(n, 1)} packed uint8 bytes ({n} bits), "
                f"got {packed.dtype} {packed.shape}"
            )
        flip = SigmaCode.from_arrays(fields["flip_levels"], fields["flip_codes"], n, "flip", where)
        if np.any(flip.levels > 0.5):
            raise InvalidArtifactError(f"{where}: flip probabilities must be <= 0.5")
        positive = unpack_uint(packed, 1, n).astype(bool).reshape(shape)
        return cls(positive, scale, flip, packed=packed)

    def fields(self) -> dict[str, np.ndarray]:
        return {"signs": self.packed, "flip_levels": self.flip.levels, "flip_codes": self.flip.codes}

    def attributes(self) -> dict[str, Any]:
        return {"scale": self.scale}

    def _signed_scale(self) -> np.ndarray:
        return np.where(self.positive, np.float32(self.scale), np.float32(-self.scale))

    def flip_probability(self) -> np.ndarray:
        """P(W ≠ its stored sign) per weight, float32, shaped like the weight."""
        return self.flip.decode().reshape(self.shape)

    def mean(self) -> np.ndarray:
        return self._signed_scale() * (1 - 2 * self.flip_probability())

    def stddev(self) -> np.ndarray:
        f = self.flip_probability()
        return (2 * self.scale) * np.sqrt(f * (1 - f))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        flips = rng.random((n, *self.shape), dtype=np.float32) < self.flip_probability()
        return np.where(flips, -self._signed_scale(), self._signed_scale())

    def select(self, axis: int, index: np.ndarray) -> BinaryWeight:
        """The same sign bits, scale and flip levels on the kept slices."""
        return BinaryWeight(np.take(self.positive, index, axis), self.scale, self.flip.select(self.shape, axis, index))

    def sample_grid(self) -> Grid:
        """Every draw is ``±a``: ``q = ±1`` times ``step = a``."""
        return Grid(self.scale, 2)
