"""Posterior families: one module each, every one registered with the same public call a plug-in uses.

A family is everything edgebnn needs of one kind of posterior, in one :class:`Family` registered once with
:func:`register_family`: its encodings (how the ``.ebnn`` stores a weight and how it samples), the torch importer
adapters of its layers, its in-graph draw, its compact store, its lowerings, which exports are exact for it, and
what ``--mode analytic`` does with it (:class:`Analytic`: exact, approximate with a stated bound, or refused).

The package's own families, each a module here: :mod:`.gaussian` (mean-field VI, diagonal Laplace),
:mod:`.quantized` (fixed point, MCQ, ternary), :mod:`.binary` (EBP), :mod:`.codebook` (2DGBNN), :mod:`.dropout`
(MC dropout), :mod:`.ensemble` (deep ensembles), :mod:`.swag` (SWAG), :mod:`.laplace` (Kronecker and dense
Laplace). A family from outside is a module of its own package (docs/extending.md walks through one); it imports
only the names below (``__all__``), the public interface:

- to define and register: :class:`Family`, :class:`Analytic`, :data:`EXACT`, :func:`register_family`,
  :class:`ExportRequest`; the encoding contract :class:`Encoding`, :class:`NoiseNeed`, :class:`Grid`,
  :class:`JointGroup`, :func:`check_shape`, :func:`check_finite`;
- an importer adapter returns a :class:`LayerPosterior` (its ``weight_encoding`` / ``bias_encoding``: the family's
  encodings of the layer's tensors);
- a draw or a store writes graph nodes through a :class:`GraphBuilder` (``add``, ``const``, ``f32``, ``i64``) and
  may read a weight's mean, σ or variance as its store decodes them with :func:`decode`; a store subclasses
  :class:`Store` and may use the shared decode pieces :func:`unpack_codes`, :func:`scaled`, :func:`table_lookup`,
  :func:`reshape_to`;
- a lowering ``(pass_, weight, rng) -> LayerOutcome`` receives the scheme's pass (:class:`SchemePass`: its
  ``config`` is the scheme's configuration, a :class:`FixedConfig` for ``fixed``, each a :class:`PassConfig`; the
  quantising ones :class:`QuantConfig`) and the weight (:class:`EncodedWeight`); it may code a mean on ``fixed``'s
  grid by the variance rule (:func:`variance_grid` -> :class:`MeanGrid`) and a σ with the log-domain
  :class:`SigmaCode` (``SigmaCode.fit(sigma, family_sigma_bits(pass_), rng)``; a store decodes it with
  :func:`sigma_code`); it returns a :class:`LayerOutcome`; :func:`kept` keeps a weight;
  :class:`Lowering` wraps one to declare the scheme settings it honours (``bits``, ``grams``: ``--bits N``,
  ``--calibrate``; a lowering asked for one it does not declare is refused in one line).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from edgebnn.exporters.stores.base import Store, reshape_to, scaled, table_lookup, unpack_codes
from edgebnn.exporters.stores.factors import FactorStore, factor
from edgebnn.exporters.stores.gaussian import sigma_code
from edgebnn.exporters.stores.registry import decode
from edgebnn.family import EXACT, Analytic, ExportRequest, Family, register_family
from edgebnn.importers.base import LayerPosterior
from edgebnn.ir import EncodedWeight, make_encoding_node
from edgebnn.ir.encodings import Encoding, Grid, JointGroup, NoiseNeed, SigmaCode
from edgebnn.ir.encodings.base import check_finite, check_shape
from edgebnn.passes.base import LayerOutcome, Lowering, PassConfig, QuantConfig, kept
from edgebnn.passes.fixed import FixedConfig, MeanGrid, family_sigma_bits, variance_grid


class GraphBuilder(Protocol):
    """What a draw or a store may call on the graph being built (the exporters' builder provides it)."""

    def add(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        """Append a node of ``op`` (ai.onnx, or ``domain=``) reading ``inputs``; returns its output ``output``."""

    def const(self, name: str, value: np.ndarray) -> str:
        """Add an initializer ``name`` holding ``value`` (its dtype kept); returns its name."""

    def f32(self, name: str, value: float | np.ndarray) -> str:
        """A float32 initializer."""

    def i64(self, name: str, *values: int) -> str:
        """A 1-D int64 initializer (shapes, axes)."""


class SchemePass(Protocol):
    """What a family's lowering receives as ``pass_``: the scheme (``name``: ``fixed``, ...) and its configuration
    (``config``: the scheme's :class:`PassConfig`, a :class:`FixedConfig` for ``fixed``; ``config.options()`` its
    settings as JSON, as the manifest records them)."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> PassConfig: ...


__all__ = [
    "EXACT",
    "Analytic",
    "EncodedWeight",
    "Encoding",
    "ExportRequest",
    "FactorStore",
    "Family",
    "FixedConfig",
    "GraphBuilder",
    "Grid",
    "JointGroup",
    "LayerOutcome",
    "LayerPosterior",
    "Lowering",
    "MeanGrid",
    "NoiseNeed",
    "PassConfig",
    "QuantConfig",
    "SchemePass",
    "SigmaCode",
    "Store",
    "check_finite",
    "check_shape",
    "decode",
    "factor",
    "family_sigma_bits",
    "kept",
    "make_encoding_node",
    "register_family",
    "reshape_to",
    "scaled",
    "sigma_code",
    "table_lookup",
    "unpack_codes",
    "variance_grid",
]

# the built-in families register on import, in this order (a torch layer goes to the first adapter that matches)
from edgebnn.families import (  # noqa: E402, F401
    binary,
    codebook,
    dropout,
    ensemble,
    gaussian,
    laplace,
    quantized,
    swag,
)
