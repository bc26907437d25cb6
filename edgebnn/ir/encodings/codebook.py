"""``CodebookWeight``: stochastic weight sharing on the μ–σ plane (2DGBNN).

A layer's weights fall in three groups:

- **inliers** share one of ``K`` codebook entries ``(m_k, s_k)``: weight ``i`` reads entry ``k_i``;
- **blended** ("ellipse") weights mix up to ``J`` entries with weights ``α_ij`` (Σ_j α_ij = 1);
- **outliers** keep their own Gaussian ``N(μ_o, σ_o²)``.

Moments per weight:

    inlier   E = m_k,          sd = s_k
    blended  E = Σ α_j m_j,    sd = sqrt(Σ α_j (s_j² + m_j²) - E²)   (the mixture Σ_j α_j N(m_j, s_j²), eq. 7)
    outlier  E = μ_o,          sd = σ_o

Sampling, attribute ``sampling``:

- ``independent`` (the post-training default of the ``codebook`` pass): every weight draws on its own,
  ``w_i = E_i + sd_i ε_i`` with ``ε_i ~ N(0, 1)`` — the mean-field posterior the codebook was fitted to, with
  each weight's (μ, σ) replaced by its entry's; a blended weight is the Gaussian with its mixture's moments.
  Storage stays ``K`` entries plus indices; a draw consumes one normal per weight, like a Gaussian weight.
- ``shared`` (2DGBNN stochastic weight sharing, for models trained for it, e.g. 2DGBNN stage 3): each draw
  takes ONE value per entry, ``c_k = m_k + s_k ε_k``, shared by every weight that reads entry ``k``; a
  blended weight picks entry ``j`` with probability ``α_ij`` and takes that entry's shared value; an
  outlier draws independently, ``w_o = μ_o + σ_o ε_o``. Per weight the moments are the same as above, but
  the weights of one entry move together: on a posterior trained with independent noise this correlates
  thousands of weights it learned as independent (on the digits CNN: NLL 0.11 -> 0.47, docs/uncertainty.md).
  Files written before the attribute existed hold ``shared`` codebooks, so a missing attribute reads as it.

Stored tensors (``B`` = attribute ``bits``, ``K <= 2**B``; ``n`` weights; index dtype uint16 when
``n <= 65536`` else uint32; component dtype uint8 when ``K <= 256`` else uint16):

    indices           uint8 [ceil(n·B/8)]  entry of every weight, packed at B bits (0 bytes when B = 0);
                                           ignored for outliers and blended weights
    codebook          float32 [K, 2]       (m_k, s_k), s_k >= 0
    outlier_index     uint16/32 [n_o]      flat weight indices, strictly increasing
    outlier_mu        float32 [n_o]
    outlier_sigma     float32 [n_o]        >= 0
    blend_index       uint16/32 [n_b]      flat weight indices, strictly increasing, none an outlier
    blend_components  uint8/16 [n_b, J]    entries mixed by each blended weight
    blend_alpha       uint8 [n_b, J]       unnormalised mixing weights, α_ij = a_ij / Σ_j a_ij (each row > 0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import Encoding, NoiseNeed, check_finite, register_encoding
from edgebnn.ir.encodings.fixedpoint import attr_int
from edgebnn.ir.encodings.gaussian import draw_gaussian
from edgebnn.ir.encodings.packing import MAX_BITS, bits_for, pack_uint, packed_nbytes, unpack_uint

SAMPLINGS = ("independent", "shared")


def index_dtype(n: int) -> type[np.unsignedinteger]:
    """Smallest unsigned dtype holding flat indices of an ``n``-weight tensor."""
    return np.uint16 if n <= 1 << 16 else np.uint32


def component_dtype(k: int) -> type[np.unsignedinteger]:
    """Smallest unsigned dtype holding codebook entry numbers ``< k``."""
    return np.uint8 if k <= 1 << 8 else np.uint16


@register_encoding
class CodebookWeight(Encoding):
    """Shared Gaussian codebook entries, blended weights and individual outliers."""

    op_type = "CodebookWeight"
    FIELDS = (
        "indices",
        "codebook",
        "outlier_index",
        "outlier_mu",
        "outlier_sigma",
        "blend_index",
        "blend_components",
        "blend_alpha",
    )

    def __init__(
        self,
        shape: tuple[int, ...],
        indices: np.ndarray,
        codebook: np.ndarray,
        outlier_index: np.ndarray,
        outlier_mu: np.ndarray,
        outlier_sigma: np.ndarray,
        blend_index: np.ndarray,
        blend_components: np.ndarray,
        blend_alpha: np.ndarray,
        *,
        bits: int | None = None,
        packed: np.ndarray | None = None,
        sampling: str = "shared",
    ) -> None:
        """Build from flat arrays; ``bits`` defaults to ``ceil(log2 K)``, ``sampling`` is one of :data:`SAMPLINGS`."""
        super().__init__(shape)
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling={sampling!r}: one of {SAMPLINGS}")
        self.sampling = sampling
        self.GAUSSIAN = sampling == "independent"
        n = self.size
        k = codebook.shape[0]
        self.bits = bits_for(k) if bits is None else int(bits)
        self.indices = np.asarray(indices).reshape(-1)
        self.codebook = np.ascontiguousarray(codebook, np.float32)
        self.outlier_index = np.asarray(outlier_index, index_dtype(n))
        self.outlier_mu = np.asarray(outlier_mu, np.float32)
        self.outlier_sigma = np.asarray(outlier_sigma, np.float32)
        self.blend_index = np.asarray(blend_index, index_dtype(n))
        self.blend_components = np.asarray(blend_components, component_dtype(k))
        self.blend_alpha = np.asarray(blend_alpha, np.uint8)
        if packed is None:
            packed = pack_uint(self.indices, self.bits) if self.bits else np.zeros(0, np.uint8)
        self.packed = packed

    @property
    def k(self) -> int:
        return int(self.codebook.shape[0])

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> CodebookWeight:
        n = int(np.prod(shape, dtype=np.int64))
        cb = fields["codebook"]
        if cb.dtype != np.float32 or cb.ndim != 2 or cb.shape[1] != 2 or cb.shape[0] < 1:
            raise InvalidArtifactError(f"{where}: codebook must be float32 [K >= 1, 2], got {cb.dtype} {cb.shape}")
        check_finite(cb, "codebook", where)
        if np.any(cb[:, 1] < 0):
            raise InvalidArtifactError(f"{where}: codebook has a negative std")
        k = cb.shape[0]
        bits = attr_int(attrs, "bits", 0, MAX_BITS, where)
        sampling = attrs.get("sampling", "shared")
        if sampling not in SAMPLINGS:
            raise InvalidArtifactError(f"{where}: attribute 'sampling' must be one of {SAMPLINGS}, got {sampling!r}")
        if k > 1 << bits:
            raise InvalidArtifactError(f"{where}: {k} codebook entries do not fit {bits}-bit indices")
        packed = fields["indices"]
        want = packed_nbytes(n, bits)
        if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != want:
            raise InvalidArtifactError(
                f"{where}: indices must be {want} packed uint8 bytes ({n} at {bits} bits), got {packed.dtype} "
                f"{packed.shape}"
            )
        indices = unpack_uint(packed, bits, n) if bits else np.zeros(n, np.uint8)
        if n and int(indices.max()) >= k:
            raise InvalidArtifactError(f"{where}: an index points past the {k} codebook entries")

        o_idx = _flat_index(fields["outlier_index"], n, "outlier_index", where)
        n_o = o_idx.size
        for name in ("outlier_mu", "outlier_sigma"):
            arr = fields[name]
            if arr.dtype != np.float32 or arr.shape != (n_o,):
                raise InvalidArtifactError(f"{where}: {name} must be float32 [{n_o}], got {arr.dtype} {arr.shape}")
            check_finite(arr, name, where)
        if np.any(fields["outlier_sigma"] < 0):
            raise InvalidArtifactError(f"{where}: outlier_sigma has negative values")

        b_idx = _flat_index(fields["blend_index"], n, "blend_index", where)
        n_b = b_idx.size
        comps, alpha = fields["blend_components"], fields["blend_alpha"]
        if comps.dtype != component_dtype(k) or comps.ndim != 2 or comps.shape[0] != n_b or comps.shape[1] < 1:
            raise InvalidArtifactError(
                f"{where}: blend_components must be {np.dtype(component_dtype(k)).name} [{n_b}, J >= 1], "
                f"got {comps.dtype} {comps.shape}"
            )
        if alpha.dtype != np.uint8 or alpha.shape != comps.shape:
            raise InvalidArtifactError(
                f"{where}: blend_alpha must be uint8 {list(comps.shape)}, got {alpha.dtype} {alpha.shape}"
            )
        if n_b and int(comps.max()) >= k:
            raise InvalidArtifactError(f"{where}: a blend component points past the {k} codebook entries")
        if n_b and int(alpha.sum(axis=1, dtype=np.int64).min()) == 0:
            raise InvalidArtifactError(f"{where}: a blended weight has all-zero mixing weights")
        if np.intersect1d(o_idx, b_idx).size:
            raise InvalidArtifactError(f"{where}: a weight is both an outlier and blended")
        return cls(
            shape, indices, cb, o_idx, fields["outlier_mu"], fields["outlier_sigma"], b_idx, comps, alpha,
            bits=bits, packed=packed, sampling=sampling,
        )

    def fields(self) -> dict[str, np.ndarray]:
        return {
            "indices": self.packed,
            "codebook": self.codebook,
            "outlier_index": self.outlier_index,
            "outlier_mu": self.outlier_mu,
            "outlier_sigma": self.outlier_sigma,
            "blend_index": self.blend_index,
            "blend_components": self.blend_components,
            "blend_alpha": self.blend_alpha,
        }

    def attributes(self) -> dict[str, Any]:
        return {"bits": self.bits, "sampling": self.sampling}

    def select(self, axis: int, index: np.ndarray) -> CodebookWeight:
        """The kept slices with the same table, width and sampling: inliers keep their entry, outliers and blended
        weights their own values (their flat indices renumbered, still increasing: ``index`` is sorted)."""
        kept = np.take(np.arange(self.size).reshape(self.shape), index, axis)
        position = np.full(self.size, -1, np.int64)
        position[kept.reshape(-1)] = np.arange(kept.size)
        o_new, b_new = position[self.outlier_index], position[self.blend_index]
        o_keep, b_keep = o_new >= 0, b_new >= 0
        return CodebookWeight(
            kept.shape, self.indices[kept.reshape(-1)], self.codebook, o_new[o_keep], self.outlier_mu[o_keep],
            self.outlier_sigma[o_keep], b_new[b_keep], self.blend_components[b_keep], self.blend_alpha[b_keep],
            bits=self.bits, sampling=self.sampling,
        )

    def blend_weights(self) -> np.ndarray:
        """Normalised mixing weights ``α`` of the blended weights, float32 ``[n_b, J]``."""
        a = self.blend_alpha.astype(np.float32)
        return a / a.sum(axis=1, keepdims=True)

    def cluster_sizes(self) -> np.ndarray:
        """How many inliers read each codebook entry (outliers and blended weights not counted)."""
        own = np.ones(self.size, bool)
        own[self.outlier_index] = False
        own[self.blend_index] = False
        return np.bincount(self.indices[own], minlength=self.k)

    def _blend_moments(self) -> tuple[np.ndarray, np.ndarray]:
        a = self.blend_weights()
        m = self.codebook[self.blend_components, 0]
        s = self.codebook[self.blend_components, 1]
        mean = (a * m).sum(axis=1)
        second = (a * (s * s + m * m)).sum(axis=1)
        return mean, np.sqrt(np.maximum(second - mean * mean, 0))

    def mean(self) -> np.ndarray:
        out = self.codebook[self.indices, 0]
        out[self.blend_index] = self._blend_moments()[0]
        out[self.outlier_index] = self.outlier_mu
        return out.reshape(self.shape)

    def stddev(self) -> np.ndarray:
        out = self.codebook[self.indices, 1]
        out[self.blend_index] = self._blend_moments()[1]
        out[self.outlier_index] = self.outlier_sigma
        return out.reshape(self.shape)

    def noise_needs(self) -> tuple[NoiseNeed, ...]:
        """What :meth:`sample` consumes per draw, in its order. ``independent``: one normal per weight.
        ``shared``: K shared normals, one uniform per blended weight (it picks the entry), one normal per
        outlier."""
        if self.sampling == "independent":
            return (NoiseNeed("", self.shape),)
        needs = [NoiseNeed("", (self.k,))]
        if self.blend_index.size:
            needs.append(NoiseNeed(".blend", (self.blend_index.size,), "uniform"))
        if self.outlier_index.size:
            needs.append(NoiseNeed(".outliers", (self.outlier_index.size,)))
        return tuple(needs)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.sampling == "independent":
            return draw_gaussian(rng, n, self.mean(), self.stddev())
        shared = self.codebook[:, 0] + self.codebook[:, 1] * rng.standard_normal((n, self.k), dtype=np.float32)
        out = shared[:, self.indices]
        if self.blend_index.size:
            cum = np.cumsum(self.blend_weights(), axis=1)
            u = rng.random((n, self.blend_index.size, 1), dtype=np.float32)
            pick = np.minimum((u >= cum[None, :, :-1]).sum(axis=2), cum.shape[1] - 1)
            comp = np.take_along_axis(self.blend_components[None].astype(np.intp), pick[..., None], axis=2)[..., 0]
            out[:, self.blend_index] = np.take_along_axis(shared, comp, axis=1)
        if self.outlier_index.size:
            eps = rng.standard_normal((n, self.outlier_index.size), dtype=np.float32)
            out[:, self.outlier_index] = self.outlier_mu + self.outlier_sigma * eps
        return out.reshape(n, *self.shape)


def _flat_index(arr: np.ndarray, n: int, name: str, where: str) -> np.ndarray:
    if arr.dtype not in (np.uint16, np.uint32) or arr.ndim != 1:
        raise InvalidArtifactError(f"{where}: {name} must be a 1-D uint16/uint32 tensor, got {arr.dtype} {arr.shape}")
    if arr.dtype == np.uint16 and n > 1 << 16:
        raise InvalidArtifactError(f"{where}: {name} is uint16 but the weight has {n} > 65536 elements")
    if arr.size and (int(arr[-1]) >= n or np.any(np.diff(arr.astype(np.int64)) <= 0)):
        raise InvalidArtifactError(f"{where}: {name} must be strictly increasing and < {n}")
    return arr
