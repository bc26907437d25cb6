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
``noise/swag_z2`` [S, K] that every layer reads (the SWAG family's draw, :mod:`edgebnn.families.swag`).

Moments per weight: mean ``mean``, variance ``scale · (σ² + Σ_k D_k² / (K − 1))``.

Stored: ``mean`` and ``sigma`` float32 [*shape], ``deviations`` float32 [K, n]; attribute ``scale`` (> 0).

``LowRankFixedWeight`` (SWAG lowered with ``fixed``, :mod:`edgebnn.families.swag`) is the same posterior with
its three parts coded, everything above (draws, moments, the joint z₂) computed from the decoded values:

    mean   = Δ · q                    q packed at B bits, attributes ``step`` (Δ) and ``bits`` (B)
    σ      = levels[codes]            a :class:`~edgebnn.ir.encodings.SigmaCode` (log domain)
    D      = float32(d_q) · d_scale   a :class:`~edgebnn.ir.encodings.rowcode.RowCode`: D viewed as [K·out, rest],
                                      one scale per (iterate k, output channel)

Stored: ``q``, ``sigma_levels``, ``sigma_codes``, ``dev_q`` int8 [K·out, rest], ``dev_scale`` float32 [K·out];
attributes ``scale``, ``step``, ``bits``, ``rank`` (K).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import Encoding, Grid, NoiseNeed, check_finite, check_shape, register_encoding
from edgebnn.ir.encodings.fixedpoint import attr_int, attr_number
from edgebnn.ir.encodings.joint import JointGroup
from edgebnn.ir.encodings.packing import MAX_BITS, pack_int, packed_nbytes, unpack_int
from edgebnn.ir.encodings.rowcode import RowCode
from edgebnn.ir.encodings.sigmacode import SigmaCode

MAX_RANK = 4096
Z2_SUFFIX = ".swag_z2"  # the shared noise input ``noise/swag_z2`` [S, K] of a ``noise`` export


@register_encoding
class LowRankGaussianWeight(Encoding):
    """w = mean + sqrt(scale) · (σ ⊙ z₁ + Dᵀ z₂ / sqrt(K − 1)), z₂ shared by the whole network."""

    op_type = "LowRankGaussianWeight"
    FIELDS: ClassVar[tuple[str, ...]] = ("mean", "sigma", "deviations")

    def __init__(self, mean: np.ndarray, sigma: np.ndarray, deviations: np.ndarray, scale: float) -> None:
        super().__init__(mean.shape)
        self.mu = np.ascontiguousarray(mean, dtype=np.float32)
        self.sigma = np.ascontiguousarray(sigma, dtype=np.float32)
        self.deviations = np.ascontiguousarray(deviations, dtype=np.float32)
        self.scale = float(np.float32(scale))

    @classmethod
    def fp32_bytes(cls, attrs: Mapping[str, Any], field_dims: Mapping[str, list[int]]) -> int:
        """μ and σ, and the K deviations [K, n], in fp32."""
        return 8 * math.prod(attrs["shape"]) + 4 * math.prod(field_dims["deviations"])

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


def dev_rows(shape: tuple[int, ...], rank: int) -> tuple[int, int]:
    """The 2-D view of SWAG's deviations that :class:`LowRankFixedWeight` codes: ``[K · out, rest]``."""
    n = int(np.prod(shape, dtype=np.int64))
    out = int(shape[0]) if shape else 1
    return rank * out, n // out


def fixed_mean(packed: np.ndarray, bits: int, step: float, shape: tuple[int, ...], where: str) -> np.ndarray:
    """The int16 codes of a fixed-point mean stored packed at ``bits`` bits, validated (size, range)."""
    n = int(np.prod(shape, dtype=np.int64))
    want = packed_nbytes(n, bits)
    if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != want:
        raise InvalidArtifactError(f"{where}: q must be {want} packed uint8 bytes ({n} values at {bits} bits), "
                                   f"got {packed.dtype} {packed.shape}")
    if not step > 0:
        raise InvalidArtifactError(f"{where}: attribute 'step' must be > 0, got {step}")
    q = unpack_int(packed, bits, n)
    limit = (1 << (bits - 1)) - 1
    if n and int(np.abs(q.astype(np.int32)).max()) > limit:
        raise InvalidArtifactError(f"{where}: q holds a value outside ±{limit}, too wide for {bits} bits")
    return q.reshape(shape)


class FixedMean:
    """A fixed-point mean ``Δ · q`` (q packed at B bits) shared by the lowered correlated families."""

    q: np.ndarray
    packed: np.ndarray
    quant_step: float
    bits: int

    def _set_mean(self, q: np.ndarray, step: float, bits: int, packed: np.ndarray | None) -> np.ndarray:
        self.q = np.asarray(q, np.int16)
        self.quant_step = float(np.float32(step))  # ONNX float attributes are float32
        self.bits = int(bits)
        self.packed = pack_int(self.q, self.bits) if packed is None else packed
        return self.q.astype(np.float32) * np.float32(self.quant_step)

    @staticmethod
    def _read_mean(fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...],
                   where: str) -> tuple[np.ndarray, float, int]:
        bits = attr_int(attrs, "bits", 2, MAX_BITS, where)
        step = attr_number(attrs, "step", where)
        return fixed_mean(fields["q"], bits, step, shape, where), step, bits

    def step(self) -> float:
        return self.quant_step

    def mean_grid(self) -> Grid:
        """``mean() = q · step`` exactly (float32 product)."""
        return Grid(self.quant_step, self.bits)

    def mean_attributes(self) -> dict[str, Any]:
        return {"step": self.quant_step, "bits": self.bits}


@register_encoding
class LowRankFixedWeight(FixedMean, LowRankGaussianWeight):
    """SWAG with its mean on a fixed-point grid, σ a log-domain code and D an int8 row code (module docstring)."""

    op_type = "LowRankFixedWeight"
    FIELDS = ("q", "sigma_levels", "sigma_codes", "dev_q", "dev_scale")

    def __init__(self, q: np.ndarray, step: float, bits: int, sigma: SigmaCode, dev: RowCode, scale: float,
                 packed: np.ndarray | None = None) -> None:
        mean = self._set_mean(q, step, bits, packed)
        self.sigma_code = sigma
        self.dev_code = dev
        rank = dev.q.shape[0] // (int(q.shape[0]) if q.ndim else 1)
        super().__init__(mean, sigma.decode().reshape(self.q.shape), dev.decode().reshape(rank, -1), scale)

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> LowRankFixedWeight:
        scale = attr_number(attrs, "scale", where)
        if not scale > 0:
            raise InvalidArtifactError(f"{where}: attribute 'scale' must be > 0, got {scale}")
        rank = attr_int(attrs, "rank", 2, MAX_RANK, where)
        q, step, bits = cls._read_mean(fields, attrs, shape, where)
        n = int(np.prod(shape, dtype=np.int64))
        sigma = SigmaCode.from_arrays(fields["sigma_levels"], fields["sigma_codes"], n, "sigma", where)
        dev = RowCode.from_arrays(fields["dev_q"], fields["dev_scale"], dev_rows(shape, rank), "deviations", where)
        return cls(q, step, bits, sigma, dev, scale, packed=fields["q"])

    def fields(self) -> dict[str, np.ndarray]:
        return {"q": self.packed, "sigma_levels": self.sigma_code.levels, "sigma_codes": self.sigma_code.codes,
                "dev_q": self.dev_code.q, "dev_scale": self.dev_code.scale}

    def attributes(self) -> dict[str, Any]:
        return {"scale": self.scale, **self.mean_attributes(), "rank": self.rank}

    @classmethod
    def fp32_bytes(cls, attrs: Mapping[str, Any], field_dims: Mapping[str, list[int]]) -> int:
        """The SWAG posterior it was lowered from: μ, σ and K = ``rank`` deviations per weight, in fp32."""
        return (8 + 4 * int(attrs["rank"])) * math.prod(attrs["shape"])
