"""``FixedPointWeight``: a per-layer uniform fixed-point mean plus a σ code (Bayesian Compression).

    mean  w̄_i = Δ · q_i,   q_i ∈ [-(2^(B-1) - 1), 2^(B-1) - 1] (symmetric B-bit two's complement)
    draw  w_i = w̄_i + σ_i ε_i,   ε_i ~ N(0, 1),   σ_i from the layer's :class:`SigmaCode`

Stored: ``q`` packed at ``B`` bits (:mod:`~edgebnn.ir.encodings.packing`), ``sigma_levels``,
``sigma_codes``; attributes ``scale`` (Δ, float32, finite and > 0) and ``bits`` (B, 2..16).

:class:`QuantizedWeight` is the shared machinery of every "integers times one per-layer scale" encoding
(fixed point, MCQ counts, ternary: :class:`QuantizedWeight`): the integer payload is ``FIELDS[0]``, the
σ code ``FIELDS[1:3]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import Grid, register_encoding
from edgebnn.ir.encodings.packing import MAX_BITS, pack_int, packed_nbytes, unpack_int
from edgebnn.ir.encodings.sigmacode import SigmaCode, SigmaCodedWeight


def attr_number(attrs: Mapping[str, Any], name: str, where: str) -> float:
    """A finite float attribute (ints accepted), or :class:`InvalidArtifactError` naming it."""
    value = attrs.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArtifactError(f"{where}: attribute {name!r} must be a finite number, got {value!r}")
    return float(value)


def attr_int(attrs: Mapping[str, Any], name: str, lo: int, hi: int, where: str) -> int:
    """An int attribute in ``lo..hi``, or :class:`InvalidArtifactError` naming it."""
    value = attrs.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArtifactError(f"{where}: attribute {name!r} must be an int in {lo}..{hi}, got {value!r}")
    return value


class QuantizedWeight(SigmaCodedWeight):
    """Integers ``q`` times one positive per-layer scale, plus a σ code (abstract: not registered)."""

    SCALE_ATTR: ClassVar[str] = "scale"
    FIXED_BITS: ClassVar[int | None] = None  # set when the width is implied by the encoding (ternary: 2)

    def __init__(
        self, q: np.ndarray, scale: float, bits: int, sigma: SigmaCode, packed: np.ndarray | None = None
    ) -> None:
        super().__init__(q.shape)
        self.q = np.asarray(q, np.int16)
        self.scale = float(np.float32(scale))  # ONNX float attributes are float32
        self.bits = int(bits)
        self.sigma = sigma
        self.packed = pack_int(self.q, self.bits) if packed is None else packed

    @classmethod
    def _extra_attrs(cls, attrs: Mapping[str, Any], where: str) -> dict[str, Any]:
        """Subclass attributes beyond scale and bits, validated, as constructor keywords."""
        return {}

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> QuantizedWeight:
        scale = attr_number(attrs, cls.SCALE_ATTR, where)
        if not scale > 0:
            raise InvalidArtifactError(f"{where}: attribute {cls.SCALE_ATTR!r} must be > 0, got {scale}")
        bits = cls.FIXED_BITS or attr_int(attrs, "bits", 2, MAX_BITS, where)
        n = int(np.prod(shape, dtype=np.int64))
        name = cls.FIELDS[0]
        packed = fields[name]
        want = packed_nbytes(n, bits)
        if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != want:
            raise InvalidArtifactError(
                f"{where}: {name} must be {want} packed uint8 bytes ({n} values at {bits} bits), "
                f"got {packed.dtype} {packed.shape}"
            )
        q = unpack_int(packed, bits, n)
        limit = (1 << (bits - 1)) - 1
        if n and int(np.abs(q.astype(np.int32)).max()) > limit:
            raise InvalidArtifactError(f"{where}: {name} holds a value outside ±{limit}, too wide for {bits} bits")
        sigma = SigmaCode.from_arrays(fields[cls.FIELDS[1]], fields[cls.FIELDS[2]], n, "sigma", where)
        return cls(q.reshape(shape), scale, bits, sigma, packed=packed, **cls._extra_attrs(attrs, where))

    def fields(self) -> dict[str, np.ndarray]:
        return {self.FIELDS[0]: self.packed, self.FIELDS[1]: self.sigma.levels, self.FIELDS[2]: self.sigma.codes}

    def attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {self.SCALE_ATTR: self.scale}
        if self.FIXED_BITS is None:
            attrs["bits"] = self.bits
        return attrs

    def mean(self) -> np.ndarray:
        return self.q.astype(np.float32) * np.float32(self.scale)

    def step(self) -> float:
        return self.scale

    def mean_grid(self) -> Grid:
        """``mean() = q · scale`` exactly (float32 product), ``|q| <= 2**(bits-1) - 1``."""
        return Grid(self.scale, self.bits)

    def select(self, axis: int, index: np.ndarray) -> QuantizedWeight:
        """The same integers, scale, width and σ levels on the kept slices (subclass attributes carried over)."""
        sigma = self.sigma.select(self.shape, axis, index)
        extra = self._extra_attrs(self.attributes(), self.op_type)
        return type(self)(np.take(self.q, index, axis), self.scale, self.bits, sigma, **extra)

    def sample_grid(self) -> Grid | None:
        """Draws stay on the mean's grid only when no weight has noise (σ ≡ 0)."""
        return None if self.sigma.levels.any() else self.mean_grid()


@register_encoding
class FixedPointWeight(QuantizedWeight):
    """Uniform fixed point: ``w̄ = scale · q`` with ``q`` a symmetric ``bits``-bit integer."""

    op_type = "FixedPointWeight"
    FIELDS = ("q", "sigma_levels", "sigma_codes")
