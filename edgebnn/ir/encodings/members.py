"""Deep ensembles (Lakshminarayanan et al. 2017): the posterior is a finite set of M member weight sets.

    p(w) = (1/M) Σ_k δ(w − w_k)          predictive = (1/M) Σ_k softmax(f(x; w_k))
    mean  E[w] = (1/M) Σ_k w_k,   variance  Var[w] = (1/M) Σ_k (w_k − E[w])²   (the mixture's moments)

One weight tensor of an M-member ensemble stores its M values. Sample s is member ``s mod M`` in every layer
(:class:`~edgebnn.ir.encodings.joint.JointGroup` kind ``members``), so S = M draws are the M members, each once,
and the S-sample predictive is the ensemble's predictive exactly. Encodings:

- ``MemberSetWeight``: field ``members`` float32 [M, *shape] (as imported);
- ``MemberSetFixedWeight``: every member on one per-layer fixed-point grid, ``w_k = Δ · q_k`` with
  ``|q| <= 2^(B-1) - 1``; field ``q`` packed at B bits (M·n values, member-major), attributes ``scale`` (Δ) and
  ``bits`` (B). One Δ for all members: the members of a layer span the same range, so per-member scales would
  buy nothing but M floats.

Both carry the attribute ``members`` (M), so an exporter reads M without decoding the weight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import Encoding, Grid, check_finite, register_encoding
from edgebnn.ir.encodings.fixedpoint import attr_int, attr_number
from edgebnn.ir.encodings.joint import JointGroup
from edgebnn.ir.encodings.packing import MAX_BITS, pack_int, packed_nbytes, unpack_int

MAX_MEMBERS = 1024


class MemberSet(Encoding):
    """M member values of one weight (abstract: subclasses say how they are stored)."""

    def __init__(self, shape: tuple[int, ...], members: int) -> None:
        super().__init__(shape)
        self.m = int(members)

    def values(self) -> np.ndarray:
        """The members, float32 ``(M, *shape)``."""
        raise NotImplementedError

    def attributes(self) -> dict[str, Any]:
        return {"members": self.m}

    @classmethod
    def fp32_bytes(cls, attrs: Mapping[str, Any], field_dims: Mapping[str, list[int]]) -> int:
        """The M fp32 members."""
        return 4 * int(attrs["members"]) * math.prod(attrs["shape"])

    def mean(self) -> np.ndarray:
        return self.values().mean(axis=0, dtype=np.float64).astype(np.float32)

    def stddev(self) -> np.ndarray:
        return self.values().std(axis=0, dtype=np.float64).astype(np.float32)

    def joint_group(self) -> JointGroup:
        return JointGroup("members", self.m)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Sample s is member ``s mod M`` (the group's draw; ``rng`` is not used)."""
        return self.sample_joint(self.joint_group().draw(0, n), rng, n)

    def sample_joint(self, shared: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.ascontiguousarray(self.values()[np.asarray(shared, np.int64)])

    def noise_needs(self) -> None:
        return None


def check_members(attrs: Mapping[str, Any], where: str) -> int:
    """The ``members`` attribute (M, 1..MAX_MEMBERS)."""
    return attr_int(attrs, "members", 1, MAX_MEMBERS, where)


@register_encoding
class MemberSetWeight(MemberSet):
    """A deep ensemble's weight: its M members in float32."""

    op_type = "MemberSetWeight"
    FIELDS = ("members",)

    def __init__(self, members: np.ndarray) -> None:
        super().__init__(members.shape[1:], members.shape[0])
        self.members = np.ascontiguousarray(members, dtype=np.float32)

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> MemberSetWeight:
        m = check_members(attrs, where)
        arr = fields["members"]
        if arr.dtype != np.float32 or tuple(arr.shape) != (m, *shape):
            raise InvalidArtifactError(
                f"{where}: members must be float32 {(m, *shape)}, got {arr.dtype} {tuple(arr.shape)}"
            )
        check_finite(arr, "members", where)
        return cls(arr)

    def fields(self) -> dict[str, np.ndarray]:
        return {"members": self.members}

    def values(self) -> np.ndarray:
        return self.members


@register_encoding
class MemberSetFixedWeight(MemberSet):
    """A deep ensemble's weight with every member on one per-layer fixed-point grid ``Δ · q``."""

    op_type = "MemberSetFixedWeight"
    FIELDS = ("q",)

    def __init__(self, q: np.ndarray, scale: float, bits: int, packed: np.ndarray | None = None) -> None:
        super().__init__(q.shape[1:], q.shape[0])
        self.q = np.asarray(q, np.int16)
        self.scale = float(np.float32(scale))  # ONNX float attributes are float32
        self.bits = int(bits)
        self.packed = pack_int(self.q, self.bits) if packed is None else packed

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> MemberSetFixedWeight:
        m = check_members(attrs, where)
        scale = attr_number(attrs, "scale", where)
        if not scale > 0:
            raise InvalidArtifactError(f"{where}: attribute 'scale' must be > 0, got {scale}")
        bits = attr_int(attrs, "bits", 2, MAX_BITS, where)
        n = m * int(np.prod(shape, dtype=np.int64))
        packed = fields["q"]
        want = packed_nbytes(n, bits)
        if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != want:
            raise InvalidArtifactError(
                f"{where}: q must be {want} packed uint8 bytes ({n} values at {bits} bits), "
                f"got {packed.dtype} {packed.shape}"
            )
        q = unpack_int(packed, bits, n)
        limit = (1 << (bits - 1)) - 1
        if n and int(np.abs(q.astype(np.int32)).max()) > limit:
            raise InvalidArtifactError(f"{where}: q holds a value outside ±{limit}, too wide for {bits} bits")
        return cls(q.reshape(m, *shape), scale, bits, packed=packed)

    def fields(self) -> dict[str, np.ndarray]:
        return {"q": self.packed}

    def attributes(self) -> dict[str, Any]:
        return {**super().attributes(), "scale": self.scale, "bits": self.bits}

    def values(self) -> np.ndarray:
        return self.q.astype(np.float32) * np.float32(self.scale)

    def step(self) -> float:
        return self.scale

    def sample_grid(self) -> Grid:
        """Every draw is a member, ``q · scale`` exactly."""
        return Grid(self.scale, self.bits)
