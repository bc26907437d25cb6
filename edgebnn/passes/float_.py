"""``float``: keep the Gaussian posterior as imported (fp32 μ and σ) and report it.

A no-op pass: it changes nothing, but writes the same per-layer report as every other scheme, so a float
artifact can be compared with the lowered ones line by line. (fp16 storage would need its own encoding;
it is not offered.) ``bits`` may only be None or 32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import EncodedWeight
from edgebnn.passes.base import LayerOutcome, LayerPass, PassConfig


@dataclass(frozen=True)
class FloatConfig(PassConfig):
    """Settings of ``float``: ``bits`` None or 32."""

    bits: int | None = None

    def __post_init__(self) -> None:
        if self.bits not in (None, 32):
            raise InvalidOptionError(f"bits={self.bits!r}: the float scheme stores 32 bits")


class FloatPass(LayerPass):
    """Keep every weight as it is; report the fp32 layers."""

    name = "float"
    config_type = FloatConfig

    def lower_weight(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        return LayerOutcome(weight.encoding)
