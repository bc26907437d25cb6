"""``IntCountWeight``: Monte Carlo Quantization integer counts plus a σ code.

    mean  w̄_i = s · c_i,   c_i = sign(μ_i) · (number of the N = K·n stratified samples that hit weight i)
    draw  w_i = w̄_i + σ_i ε_i,   ε_i ~ N(0, 1),   σ_i from the layer's :class:`SigmaCode`

``s = ||μ||₁ / N`` is the one float scale per layer applied after the integer multiply-accumulate.
Stored: ``counts`` packed at ``B = 1 + floor(log2 max|c|) + 1`` bits (sign included), ``sigma_levels``,
``sigma_codes``; attributes ``scale`` (s), ``bits`` (B) and ``samples_per_weight`` (K = N / n).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import register_encoding
from edgebnn.ir.encodings.fixedpoint import QuantizedWeight, attr_number
from edgebnn.ir.encodings.sigmacode import SigmaCode


@register_encoding
class IntCountWeight(QuantizedWeight):
    """MCQ counts: ``w̄ = scale · counts``; ``samples_per_weight`` records the K that produced them."""

    op_type = "IntCountWeight"
    FIELDS = ("counts", "sigma_levels", "sigma_codes")

    def __init__(
        self,
        q: np.ndarray,
        scale: float,
        bits: int,
        sigma: SigmaCode,
        packed: np.ndarray | None = None,
        *,
        samples_per_weight: float,
    ) -> None:
        super().__init__(q, scale, bits, sigma, packed)
        self.samples_per_weight = float(np.float32(samples_per_weight))

    @classmethod
    def _extra_attrs(cls, attrs: Mapping[str, Any], where: str) -> dict[str, Any]:
        k = attr_number(attrs, "samples_per_weight", where)
        if not k > 0:
            raise InvalidArtifactError(f"{where}: attribute 'samples_per_weight' must be > 0, got {k}")
        return {"samples_per_weight": k}

    def attributes(self) -> dict[str, Any]:
        return {**super().attributes(), "samples_per_weight": self.samples_per_weight}
