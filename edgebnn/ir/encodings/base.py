"""The encoding contract: how one Bayesian weight tensor is stored in the IR and how it samples.

An encoded weight is one node of domain ``ai.edgebnn`` whose output is the weight tensor its consumer
(Conv, Gemm) reads. Its inputs are initializers named ``<weight>.<field>`` in the order of ``FIELDS``;
its attributes are ``layer`` (the source module path), ``shape`` (the decoded weight shape) and the
encoding's own. Every encoding can give its posterior mean and draw samples, so an exported ensemble
still samples after lowering.

What the exporters read from an encoding, stated once here:

- ``mean()`` and ``sample(rng, n)``: the posterior mean and ``n`` draws (``baked`` stores the draws);
- ``moments()``: ``(mean, variance)`` per weight (``noise --noise local`` and ``analytic`` propagate them);
- ``noise_needs()``: the standard random tensors one in-graph draw consumes per sample (``noise``/``shared``
  take them as graph inputs), or ``None`` when the encoding is not drawn from standard noise in a graph;
- ``mean_grid()`` / ``sample_grid()``: an integer grid the mean / every draw lies on exactly, so that int8
  and int4 weight formats store it losslessly (``q · step``) instead of re-quantizing by ``max|w| / 127``.

And what the ``shrink`` pass reads: ``select(axis, index)``, the weight on the kept slices with its codes kept
exactly, or ``None`` for a kind that cannot be sliced so (the default; the pass then leaves its layer alone).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.registry import REGISTRY, Table

ENCODINGS: Table[type[Encoding]] = REGISTRY.encodings
"""The registered encoding classes by op type (the registry's table; :func:`register_encoding` adds to it)."""


@dataclass(frozen=True)
class Grid:
    """Values that are exact integer multiples ``q · step`` in float32, with ``|q| <= 2**(bits-1) - 1``."""

    step: float
    bits: int


@dataclass(frozen=True)
class NoiseNeed:
    """One standard random tensor an in-graph draw consumes per sample.

    Attributes:
        suffix: appended to the weight's name to name the graph input (``""`` for the main one).
        dims: its shape per sample.
        dist: ``normal`` (standard normal) or ``uniform`` (on [0, 1)).
        shared: one input for the whole graph, named ``noise/<suffix without its dot>``, read by every weight
            that needs it (a joint draw: SWAG's z₂).
    """

    suffix: str
    dims: tuple[int, ...]
    dist: str = "normal"
    shared: bool = False


JOINT_STREAM = 0x6A6F696E  # "join": group draws seed [seed, JOINT_STREAM, size], never a weight's stream [seed, i]
JOINT_KINDS = ("members", "normal")


@dataclass(frozen=True)
class JointGroup:
    """A shared per-sample draw (:mod:`.joint`): ``kind`` ``members`` (a member index in 0..size-1) or
    ``normal`` (``size`` standard normals)."""

    kind: str
    size: int

    def __post_init__(self) -> None:
        if self.kind not in JOINT_KINDS or self.size < 1:
            raise ValueError(f"joint group {self.kind!r} of size {self.size}")

    def draw(self, seed: int, n: int) -> np.ndarray:
        """The shared draw of ``n`` samples: int64 [n] member indices, or float32 [n, size] normals."""
        if self.kind == "members":
            return np.arange(n, dtype=np.int64) % self.size
        rng = np.random.default_rng([seed, JOINT_STREAM, self.size])
        return rng.standard_normal((n, self.size), dtype=np.float32)



def register_encoding(cls: type[Encoding]) -> type[Encoding]:
    """Class decorator: make ``cls`` loadable from nodes whose op_type is ``cls.op_type``.

    Raises:
        ValueError: the op type is taken.
    """
    return ENCODINGS.add(cls.op_type, cls)


class Encoding(ABC):
    """One encoded weight tensor.

    Subclasses set ``op_type`` and ``FIELDS`` (input tensor names, in node-input order) and implement
    ``from_fields``, ``attributes``, ``mean`` and ``sample``. ``from_fields`` validates (shapes, ranges,
    finiteness) and raises :class:`InvalidArtifactError` naming ``where``.
    """

    op_type: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    # draws are mean() + stddev() * N(0, 1), weight by weight; a class constant except where an instance's own
    # attribute decides (a codebook drawing every weight independently)
    GAUSSIAN: bool = False
    # a joint Gaussian whose weights are correlated (a Kronecker-factored or dense covariance): its draw is a linear
    # map of standard noise (``noise_needs``) that every sampling mode emits whole; ``moments()`` are marginals only
    CORRELATED: bool = False
    # the IR came from a plain network (MC dropout's masks): its fp32 BNN is that network, μ only
    PLAIN_REFERENCE: ClassVar[bool] = False

    @classmethod
    def fp32_bytes(cls, attrs: Mapping[str, Any], field_dims: Mapping[str, list[int]]) -> int:
        """Bytes of this weight in the fp32 BNN it came from, from its node alone (``attrs``: its attributes,
        ``shape`` among them; ``field_dims``: its stored tensors' dims): μ and σ in fp32 unless overridden."""
        return 8 * math.prod(attrs["shape"])

    def step(self) -> float:
        """Quantization step of the stored mean (0 for float storage): noise below it is invisible."""
        return 0.0

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = tuple(int(d) for d in shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @classmethod
    @abstractmethod
    def from_fields(
        cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...], where: str
    ) -> Encoding:
        """Rebuild from stored tensors and attributes, validating them."""

    @abstractmethod
    def fields(self) -> dict[str, np.ndarray]:
        """Stored tensors keyed by field name, in ``FIELDS`` order."""

    def attributes(self) -> dict[str, Any]:
        """Encoding-specific node attributes (besides ``layer`` and ``shape``)."""
        return {}

    @abstractmethod
    def mean(self) -> np.ndarray:
        """Posterior mean of the weight, float32, shaped ``self.shape``."""

    @abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` posterior draws, float32, shaped ``(n, *self.shape)``."""

    def stddev(self) -> np.ndarray:
        """Posterior standard deviation per weight (used by hoisting and reports)."""
        return np.zeros(self.shape, np.float32)

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior ``(mean, variance)`` per weight, float32, shaped ``self.shape``."""
        sd = self.stddev()
        with np.errstate(over="ignore"):  # a huge σ (a corrupt file) squares to inf; the runtimes refuse inf outputs
            return self.mean(), sd * sd

    def noise_needs(self) -> tuple[NoiseNeed, ...] | None:
        """Standard noise one draw consumes, when it is ``mean + stddev ⊙ ε`` weight by weight (``GAUSSIAN``);
        encodings drawn otherwise override this (``None``: not drawn from standard noise in a graph)."""
        return (NoiseNeed("", self.shape),) if self.GAUSSIAN else None

    def mean_grid(self) -> Grid | None:
        """The integer grid ``mean()`` lies on exactly, if any."""
        return None

    def sample_grid(self) -> Grid | None:
        """The integer grid every draw of ``sample`` lies on exactly, if any."""
        return None

    def select(self, axis: int, index: np.ndarray) -> Encoding | None:
        """The weight restricted to the slices ``index`` (sorted, unique) along ``axis``, its codes kept exactly
        (every kept weight has the same mean, spread and draw law), or ``None``: this kind cannot be sliced
        exactly (the ``shrink`` pass then leaves its layer alone)."""
        return None

    def joint_group(self) -> JointGroup | None:
        """The group this weight is drawn jointly with (:mod:`.joint`), or None: drawn on its own."""
        return None

    def sample_joint(self, shared: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws given the group's shared draw ``shared`` [n, ...] (only encodings with a group)."""
        raise NotImplementedError(f"{self.op_type} is not drawn jointly")

    @property
    def nbytes(self) -> int:
        """Bytes this encoding occupies in the artifact (its stored tensors)."""
        return int(sum(a.nbytes for a in self.fields().values()))


def check_shape(arr: np.ndarray, shape: tuple[int, ...], what: str, where: str) -> None:
    if tuple(arr.shape) != tuple(shape):
        raise InvalidArtifactError(f"{where}: {what} has shape {tuple(arr.shape)}, expected {tuple(shape)}")


def check_finite(arr: np.ndarray, what: str, where: str) -> None:
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise InvalidArtifactError(f"{where}: {what} has NaN or inf values")
