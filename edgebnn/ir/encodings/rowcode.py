"""``RowCode``: a float32 matrix as int8 codes with one float32 scale per row, for the factors of a covariance.

    value[r, c] = float32(q[r, c]) · scale[r],   q int8 in [-127, 127],   scale[r] = max_c |value[r, c]| / 127

(``scale = 1`` for an all-zero row). Each value moves by at most ``scale[r] / 2``: half a percent of its row's
largest. Used by the lowered posterior families for the matrices that carry their covariance, each coded along
the axis its values share a magnitude on: SWAG's deviations per (iterate, output channel)
(:mod:`edgebnn.ir.encodings.lowrank`), the eigenvectors of a Kronecker-factored Laplace
per eigenvector and a dense factor's columns (:mod:`~edgebnn.ir.encodings.kron`).

Stored as two tensors: the int8 codes (rows × cols) and the float32 scales (rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import check_finite, check_shape

ROW_BITS = 8
_TOP = (1 << (ROW_BITS - 1)) - 1


@dataclass(frozen=True)
class RowCode:
    """``q`` int8 [rows, cols] and ``scale`` float32 [rows]: ``decode() = float32(q) · scale[:, None]``."""

    q: np.ndarray
    scale: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.q.nbytes + self.scale.nbytes)

    def decode(self) -> np.ndarray:
        """The coded matrix, float32 [rows, cols] (the same float32 product the in-graph decode computes)."""
        return self.q.astype(np.float32) * self.scale[:, None]

    @classmethod
    def fit(cls, values: np.ndarray) -> RowCode:
        """The symmetric int8 code of a 2-D ``values``, one scale per row."""
        v = np.asarray(values, np.float32)
        amax = np.abs(v).max(axis=1, initial=0.0)
        scale = np.where(amax > 0, amax / _TOP, 1.0).astype(np.float32)
        q = np.clip(np.rint(v / scale[:, None]), -_TOP, _TOP).astype(np.int8)
        return cls(q, scale)

    @classmethod
    def from_arrays(cls, q: np.ndarray, scale: np.ndarray, shape: tuple[int, int], what: str,
                    where: str) -> RowCode:
        """Rebuild from stored tensors, validating dtypes, shapes, the code range and the scales (finite, > 0)."""
        if q.dtype != np.int8 or scale.dtype != np.float32:
            raise InvalidArtifactError(f"{where}: {what} must be int8 codes and float32 scales, got {q.dtype}, "
                                       f"{scale.dtype}")
        check_shape(q, shape, f"{what} codes", where)
        check_shape(scale, (shape[0],), f"{what} scales", where)
        check_finite(scale, f"{what} scales", where)
        if np.any(scale <= 0):
            raise InvalidArtifactError(f"{where}: {what} scales must be > 0")
        if q.size and int(q.min()) < -_TOP:
            raise InvalidArtifactError(f"{where}: {what} codes hold -128, outside ±{_TOP}")
        return cls(q, scale)
