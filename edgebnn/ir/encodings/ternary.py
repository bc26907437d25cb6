"""``TernaryWeight``: VNQ ternary levels {-a, 0, +a} per layer plus a σ code.

    mean  w̄_i = a · t_i,   t_i ∈ {-1, 0, +1}
    draw  w_i = w̄_i + σ_i ε_i,   ε_i ~ N(0, 1),   σ_i from the layer's :class:`SigmaCode`

Pruned weights carry σ_i = 0 (the σ code's reserved zero level), so they stay exact zeros in every draw;
weights merely rounded to 0 keep their posterior σ. Stored: ``codes`` as 2-bit two's complement, four per
byte (``01`` = +1, ``11`` = -1, ``00`` = 0; ``10`` is invalid), ``sigma_levels``, ``sigma_codes``;
attribute ``level`` (a, float32, > 0).
"""

from __future__ import annotations

from edgebnn.ir.encodings.base import register_encoding
from edgebnn.ir.encodings.fixedpoint import QuantizedWeight


@register_encoding
class TernaryWeight(QuantizedWeight):
    """Ternary codes times one per-layer level ``a``."""

    op_type = "TernaryWeight"
    FIELDS = ("codes", "sigma_levels", "sigma_codes")
    SCALE_ATTR = "level"
    FIXED_BITS = 2
