"""``KronGaussianWeight``: a Kronecker-factored (KFAC) Laplace posterior of one weight, drawn exactly.

A Kronecker-factored Laplace approximation (Ritter et al. 2018; laplace-torch's ``KronLaplace``) gives one
weight ``W`` (Linear ``[out, in]``, Conv ``[out, in/g, *k]`` viewed as ``[out, in/g · prod(k)]``) the posterior
precision ``P = c · (F_out ⊗ F_in) + δ I`` (``c``: 1 / temperature, ``δ``: the layer's prior precision) over the
row-major ``vec(W)``. With the eigendecompositions ``F_out = Q_o diag(λ_o) Q_oᵀ``, ``F_in = Q_i diag(λ_i) Q_iᵀ``,
``P = (Q_o ⊗ Q_i) diag(c · λ_o ⊗ λ_i + δ) (Q_o ⊗ Q_i)ᵀ``: the prior makes it no Kronecker product, but it is
diagonal in the Kronecker eigenbasis, so with ``D = (c · λ_o λ_iᵀ + δ)^{-1/2}`` ([out, rest], stored as ``scale``)::

    W = M + Q_o (Z ⊙ D) Q_iᵀ,   Z ~ N(0, I) [out, rest]

is an exact draw of N(M, P⁻¹) (``Q_oᵀ Z' Q_i`` of a standard normal ``Z'`` is standard normal again, so this is
laplace-torch's ``sample``, which rotates first). Any ``D`` is stored as given (damped factors too). Marginal
variance per weight: ``Var W[a, b] = Σ_pq Q_o[a, p]² D[p, q]² Q_i[b, q]²``.

Stored: ``mu`` (the weight's shape), ``q_out`` [out, out], ``q_in`` [rest, rest], ``scale`` [out, rest], fp32.

Lowered with ``fixed`` (:mod:`edgebnn.families.laplace`), ``KronFixedWeight`` and ``DenseFixedWeight`` are the same
posteriors with coded parts, every draw and moment computed from the decoded values:

    mean        = Δ · q                          q packed at B bits, attributes ``step`` (Δ) and ``bits`` (B)
    Q_o, Q_i    = RowCode of Q_oᵀ, Q_iᵀ, transposed back   int8, one scale per eigenvector
    D           = levels[codes]                  a log-domain :class:`~edgebnn.ir.encodings.SigmaCode`
    L (dense)   = RowCode of Lᵀ, transposed back int8, one scale per column of L

(:class:`~edgebnn.ir.encodings.rowcode.RowCode`). Coded eigenvectors are no longer exactly orthonormal: the draw
``M + Q̃_o (Z ⊙ D̃) Q̃_iᵀ`` is still an exact draw of a Gaussian, N(M, (Q̃_o ⊗ Q̃_i) diag(D̃²) (Q̃_o ⊗ Q̃_i)ᵀ), the
coded posterior, whose distance from the imported one the lowering reports (``distortion_std``).

Stored (Kron): ``q``, ``q_out_q`` int8 [out, out], ``q_out_scale`` [out], ``q_in_q`` int8 [rest, rest],
``q_in_scale`` [rest], ``scale_levels``, ``scale_codes``; (dense): ``q``, ``scale_q`` int8 [r, numel],
``scale_scale`` [r]; attributes ``step`` and ``bits``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import Encoding, NoiseNeed, check_finite, check_shape, register_encoding
from edgebnn.ir.encodings.lowrank import FixedMean
from edgebnn.ir.encodings.rowcode import RowCode
from edgebnn.ir.encodings.sigmacode import SigmaCode


def _float32(fields: Mapping[str, np.ndarray], names: tuple[str, ...], where: str) -> None:
    for name in names:
        if fields[name].dtype != np.float32:
            raise InvalidArtifactError(f"{where}: {name} must be float32, got {fields[name].dtype}")
        check_finite(fields[name], name, where)


@register_encoding
class KronGaussianWeight(Encoding):
    """N(mu, P⁻¹) with ``P`` diagonal in a Kronecker eigenbasis: ``W = mu + q_out (Z ⊙ scale) q_inᵀ``."""

    op_type = "KronGaussianWeight"
    FIELDS: ClassVar[tuple[str, ...]] = ("mu", "q_out", "q_in", "scale")
    CORRELATED = True

    def __init__(self, mu: np.ndarray, q_out: np.ndarray, q_in: np.ndarray, scale: np.ndarray) -> None:
        super().__init__(mu.shape)
        self.mu = np.ascontiguousarray(mu, dtype=np.float32)
        self.q_out = np.ascontiguousarray(q_out, dtype=np.float32)
        self.q_in = np.ascontiguousarray(q_in, dtype=np.float32)
        self.scale = np.ascontiguousarray(scale, dtype=np.float32)

    @property
    def matrix_shape(self) -> tuple[int, int]:
        """``(out, rest)``: the weight viewed as the matrix its Kronecker factors act on."""
        return self.shape[0], self.size // self.shape[0]

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> KronGaussianWeight:
        _float32(fields, cls.FIELDS, where)
        if len(shape) < 2:
            raise InvalidArtifactError(f"{where}: a Kronecker-factored weight needs >= 2 dims, got {shape}")
        out = int(shape[0])
        rest = int(np.prod(shape[1:], dtype=np.int64))
        check_shape(fields["mu"], shape, "mu", where)
        check_shape(fields["q_out"], (out, out), "q_out", where)
        check_shape(fields["q_in"], (rest, rest), "q_in", where)
        check_shape(fields["scale"], (out, rest), "scale", where)
        if np.any(fields["scale"] < 0):
            raise InvalidArtifactError(f"{where}: scale has negative values")
        return cls(fields["mu"], fields["q_out"], fields["q_in"], fields["scale"])

    def fields(self) -> dict[str, np.ndarray]:
        return {"mu": self.mu, "q_out": self.q_out, "q_in": self.q_in, "scale": self.scale}

    def mean(self) -> np.ndarray:
        return self.mu

    def stddev(self) -> np.ndarray:
        var = (self.q_out.astype(np.float64) ** 2) @ (self.scale.astype(np.float64) ** 2) \
            @ (self.q_in.astype(np.float64) ** 2).T
        return np.sqrt(var).astype(np.float32).reshape(self.shape)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        z = rng.standard_normal((n, *self.matrix_shape), dtype=np.float32)
        z *= self.scale
        draws = self.q_out @ z @ self.q_in.T
        return (draws.reshape(n, *self.shape) + self.mu).astype(np.float32)

    def noise_needs(self) -> tuple[NoiseNeed, ...]:
        return (NoiseNeed("", self.matrix_shape),)


@register_encoding
class DenseGaussianWeight(Encoding):
    """N(mu, L Lᵀ) over the row-major ``vec(W)``: ``W = mu + reshape(L z)``, ``z ~ N(0, I_r)``.

    A full-covariance block: the bias of a Kronecker-factored Laplace layer (``L = Q diag((c·λ + δ)^{-1/2})``) or a
    full-covariance last layer (``L`` = laplace-torch's ``posterior_scale``, its bias folded in as an extra input
    column). Marginal variance per weight: ``Σ_j L[i, j]²``. Stored: ``mu`` and ``scale`` [numel, r], fp32.
    """

    op_type = "DenseGaussianWeight"
    FIELDS: ClassVar[tuple[str, ...]] = ("mu", "scale")
    CORRELATED = True

    def __init__(self, mu: np.ndarray, scale: np.ndarray) -> None:
        super().__init__(mu.shape)
        self.mu = np.ascontiguousarray(mu, dtype=np.float32)
        self.scale = np.ascontiguousarray(scale, dtype=np.float32)

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> DenseGaussianWeight:
        _float32(fields, cls.FIELDS, where)
        check_shape(fields["mu"], shape, "mu", where)
        scale = fields["scale"]
        size = int(np.prod(shape, dtype=np.int64))
        if scale.ndim != 2 or scale.shape[0] != size or scale.shape[1] < 1:
            raise InvalidArtifactError(f"{where}: scale has shape {tuple(scale.shape)}, expected ({size}, r >= 1)")
        return cls(fields["mu"], scale)

    def fields(self) -> dict[str, np.ndarray]:
        return {"mu": self.mu, "scale": self.scale}

    def mean(self) -> np.ndarray:
        return self.mu

    def covariance(self) -> np.ndarray:
        """``L Lᵀ`` over the row-major ``vec(W)``, float64."""
        scale = self.scale.astype(np.float64)
        return scale @ scale.T

    def stddev(self) -> np.ndarray:
        return np.sqrt(np.sum(self.scale.astype(np.float64) ** 2, axis=1)).astype(np.float32).reshape(self.shape)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        z = rng.standard_normal((n, self.scale.shape[1]), dtype=np.float32)
        return ((z @ self.scale.T).reshape(n, *self.shape) + self.mu).astype(np.float32)

    def noise_needs(self) -> tuple[NoiseNeed, ...]:
        return (NoiseNeed("", (int(self.scale.shape[1]),)),)


@register_encoding
class KronFixedWeight(FixedMean, KronGaussianWeight):
    """A Kronecker-factored Laplace weight lowered with ``fixed`` (module docstring)."""

    op_type = "KronFixedWeight"
    FIELDS = ("q", "q_out_q", "q_out_scale", "q_in_q", "q_in_scale", "scale_levels", "scale_codes")

    def __init__(self, q: np.ndarray, step: float, bits: int, q_out: RowCode, q_in: RowCode, scale: SigmaCode,
                 packed: np.ndarray | None = None) -> None:
        mean = self._set_mean(q, step, bits, packed)
        self.q_out_code, self.q_in_code, self.scale_code = q_out, q_in, scale
        out = int(q.shape[0])
        super().__init__(mean, q_out.decode().T, q_in.decode().T, scale.decode().reshape(out, -1))

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> KronFixedWeight:
        if len(shape) < 2:
            raise InvalidArtifactError(f"{where}: a Kronecker-factored weight needs >= 2 dims, got {shape}")
        q, step, bits = cls._read_mean(fields, attrs, shape, where)
        out, rest = int(shape[0]), int(np.prod(shape[1:], dtype=np.int64))
        q_out = RowCode.from_arrays(fields["q_out_q"], fields["q_out_scale"], (out, out), "q_out", where)
        q_in = RowCode.from_arrays(fields["q_in_q"], fields["q_in_scale"], (rest, rest), "q_in", where)
        scale = SigmaCode.from_arrays(fields["scale_levels"], fields["scale_codes"], out * rest, "scale", where)
        return cls(q, step, bits, q_out, q_in, scale, packed=fields["q"])

    def fields(self) -> dict[str, np.ndarray]:
        return {"q": self.packed, "q_out_q": self.q_out_code.q, "q_out_scale": self.q_out_code.scale,
                "q_in_q": self.q_in_code.q, "q_in_scale": self.q_in_code.scale,
                "scale_levels": self.scale_code.levels, "scale_codes": self.scale_code.codes}

    def attributes(self) -> dict[str, Any]:
        return self.mean_attributes()


@register_encoding
class DenseFixedWeight(FixedMean, DenseGaussianWeight):
    """A full-covariance Gaussian block lowered with ``fixed`` (module docstring)."""

    op_type = "DenseFixedWeight"
    FIELDS = ("q", "scale_q", "scale_scale")

    def __init__(self, q: np.ndarray, step: float, bits: int, scale: RowCode, packed: np.ndarray | None = None,
                 ) -> None:
        mean = self._set_mean(q, step, bits, packed)
        self.scale_code = scale
        super().__init__(mean, scale.decode().T)

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> DenseFixedWeight:
        q, step, bits = cls._read_mean(fields, attrs, shape, where)
        codes = fields["scale_q"]
        size = int(np.prod(shape, dtype=np.int64))
        if codes.ndim != 2 or codes.shape[1] != size or codes.shape[0] < 1:
            raise InvalidArtifactError(f"{where}: scale_q has shape {tuple(codes.shape)}, expected (r >= 1, {size})")
        scale = RowCode.from_arrays(codes, fields["scale_scale"], (int(codes.shape[0]), size), "scale", where)
        return cls(q, step, bits, scale, packed=fields["q"])

    def fields(self) -> dict[str, np.ndarray]:
        return {"q": self.packed, "scale_q": self.scale_code.q, "scale_scale": self.scale_code.scale}

    def attributes(self) -> dict[str, Any]:
        return self.mean_attributes()
