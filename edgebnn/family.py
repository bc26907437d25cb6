"""The posterior-family contract (:class:`Family`, :class:`Analytic`, :class:`ExportRequest`) and its lookups.

A family is registered once (:func:`register_family`, re-exported by :mod:`edgebnn.families` for plug-ins) into the
registry (:data:`edgebnn.registry.REGISTRY`), with its encodings. The exporters, passes and importers look families
up here (:func:`family_of`, :func:`families`, :func:`adapters`); a lookup that misses runs the registry's loader
hook (the plug-in loader, :mod:`edgebnn.plugins`, installed from above), so this module sits below the families
and names neither them nor the loader.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from edgebnn.errors import PluginError
from edgebnn.ir.encodings import ENCODINGS, Encoding, register_encoding
from edgebnn.registry import REGISTRY, Table

__all__ = ["EXACT", "FAMILIES", "Analytic", "ExportRequest", "Family", "PluginError", "adapters", "families",
           "family_of", "register_family"]


@dataclass(frozen=True)
class Analytic:
    """What ``--mode analytic`` (one pass propagating means and variances per unit) does with a family.

    ``exact``: the family's weights are independent given their marginal moments (``Encoding.moments``), so the
    moment propagation treats them as it treats a mean-field Gaussian (what remains is the mode's own
    approximation: moment matching through nonlinearities, docs/uncertainty.md). ``approximate``: the moments
    drop a dependence between weights; ``bound`` states the error the family's author measured or proved, and
    every export says it. ``refused``: ``why`` is the one-line reason. ``last_layer``: the exact logit variance
    of a last-layer posterior of this family (the GLM / probit predictive, :mod:`edgebnn.exporters.glm`); with it
    a family refused elsewhere still exports ``analytic`` as the last layer.
    """

    kind: Literal["exact", "approximate", "refused"]
    why: str = ""
    bound: str | None = None
    last_layer: Callable[..., str] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("exact", "approximate", "refused"):
            raise ValueError(f"Analytic kind {self.kind!r}: exact, approximate or refused")
        if self.kind == "approximate" and not self.bound:
            raise ValueError("an approximate analytic mode states its error bound (Analytic(..., bound=...))")
        if self.kind == "refused" and not self.why:
            raise ValueError("a refused analytic mode says why (Analytic('refused', why=...))")


EXACT = Analytic("exact", "independent weights: their marginal moments are the whole posterior")


@dataclass(frozen=True)
class ExportRequest:
    """An export a family is asked about (:attr:`Family.exports`): ``mode``, ``samples`` (S), the ``noise``
    variant, and ``nodes``, the IR's encoding nodes of this family (read their attributes; nothing decoded)."""

    mode: str
    samples: int
    noise: str
    nodes: list[Any]


@dataclass(frozen=True)
class Family:
    """A posterior family: everything edgebnn needs of it, registered once (:func:`register_family`).

    Attributes:
        name: short name (``swag``), unique.
        encodings: its encoding classes (:class:`edgebnn.ir.encodings.Encoding`): the imported form first, then
            lowered forms; each op type belongs to one family.
        summary: one line for ``edgebnn plugins``.
        draws: op type -> in-graph draw ``(b, enc, prefix, tag, eps, samples) -> W_s`` from standard noise
            (``--mode noise --noise weight``, ``--mode shared``); an encoding with ``GAUSSIAN = True`` and none
            here draws ``mean + stddev ⊙ ε``.
        stores: op type -> compact store (:class:`edgebnn.exporters.stores.Store`): how ``--weights ir`` writes
            its codes into a graph and decodes them there (without one: fp32 mean and σ).
        lowerings: op type -> {scheme: lowering ``(pass_, weight, rng) -> LayerOutcome``}: what ``lower
            --scheme`` does to it; a scheme its table lacks is refused in one line naming the schemes it has
            (``float`` always keeps it); an encoding with no table is left as it is by every scheme, which says so.
        adapters: torch importer adapters for its layers (``library``, ``matches(module)``,
            ``extract(module, path)`` -> :class:`edgebnn.importers.LayerPosterior`).
        analytic: what ``--mode analytic`` does with it (:class:`Analytic`, or a function of the encoding giving
            one); a family that states nothing is refused there, never silently treated as independent weights.
        requantize: whether ``--weights int8|int4`` may code its mean and σ at export (per-channel integers and a
            log-domain σ code); False keeps them fp32 (a dropout mask's 1 and p/(1-p) are its whole posterior).
        factors: ``(b, enc, field, name, bits) -> value``: how ``--weights int8|int4`` codes the covariance factors
            its draw reads (:func:`edgebnn.exporters.stores.factors.factor`); None: they stay fp32.
        exports: ``(ExportRequest) -> reason | None``: the exports that cannot be exact for it (a mode, S or
            ``--noise`` variant), refused in one line with the reason; None: every mode its encodings can take.
        default_samples: ``(nodes) -> S | None``: the S an export takes when none is given (a deep ensemble: M),
            from its encoding nodes (attributes only, nothing decoded).
        label: how messages name a model of this family ("deep ensemble"); default ``name``.
    """

    name: str
    encodings: tuple[type[Encoding], ...]
    summary: str = ""
    draws: Mapping[str, Callable[..., str]] = field(default_factory=dict)
    stores: Mapping[str, Any] = field(default_factory=dict)
    lowerings: Mapping[str, Mapping[str, Callable[..., Any]]] = field(default_factory=dict)
    adapters: tuple[Any, ...] = ()
    analytic: Analytic | Callable[[Encoding], Analytic] | None = None
    requantize: bool = True
    factors: Callable[..., str] | None = None
    exports: Callable[[ExportRequest], str | None] | None = None
    default_samples: Callable[[list[Any]], int | None] | None = None
    label: str = ""

    @property
    def noun(self) -> str:
        return self.label or self.name

    @property
    def op_types(self) -> tuple[str, ...]:
        return tuple(cls.op_type for cls in self.encodings)

    def analytic_for(self, enc: Encoding) -> Analytic:
        """The analytic rule for one of its encodings (:attr:`analytic`; refused when the family states none)."""
        rule = self.analytic(enc) if callable(self.analytic) else self.analytic
        return rule or Analytic("refused", f"the {self.name} family states no analytic rule (its weights may be "
                                           "dependent); export it with --mode baked or noise")

    def describe(self) -> dict[str, Any]:
        """What ``edgebnn plugins`` prints of it."""
        return {"name": self.name, "summary": self.summary, "encodings": list(self.op_types),
                "draws": sorted(self.draws), "gaussian_draws": sorted(c.op_type for c in self.encodings if c.GAUSSIAN),
                "stores": sorted(self.stores),
                "lowerings": {op: sorted({*s, "float"}) for op, s in sorted(self.lowerings.items())},
                "importers": sorted({str(getattr(a, "library", type(a).__name__)) for a in self.adapters}),
                "analytic": sorted({self.analytic_for_kind()})}

    def analytic_for_kind(self) -> str:
        return "per encoding" if callable(self.analytic) else (self.analytic or Analytic("refused", "-")).kind


FAMILIES: Table[Family] = REGISTRY.families
"""The registered families by name, in registration order (the registry's table; read, never written)."""
_BY_OP: Table[Family] = REGISTRY.family_ops  # op type -> its family


def register_family(family: Family) -> Family:
    """Register ``family`` (and its encodings, if not registered yet) so every command and the library use it.

    Raises:
        PluginError: the name or one of its op types is taken by another family, or a table names an op type
            that is not one of its encodings.
    """
    if not isinstance(family, Family):
        raise PluginError(f"register_family takes an edgebnn.families.Family, got {type(family).__name__}")
    if family.name in FAMILIES:
        raise PluginError(f"family {family.name!r} is registered twice")
    ops = family.op_types
    for table in ("draws", "stores", "lowerings"):
        stray = sorted(set(getattr(family, table)) - set(ops))
        if stray:
            raise PluginError(f"family {family.name!r}: {table} names {stray}, which are not its encodings {list(ops)}")
    for cls in family.encodings:  # every check before anything is registered: a refused family leaves no trace
        owner = _BY_OP.get(cls.op_type)
        if owner is not None:
            raise PluginError(f"family {family.name!r}: encoding {cls.op_type} already belongs to family "
                              f"{owner.name!r}")
        if ENCODINGS.get(cls.op_type, cls) is not cls:
            raise PluginError(f"family {family.name!r}: another class is registered as encoding {cls.op_type}")
    for cls in family.encodings:
        if cls.op_type not in ENCODINGS:
            register_encoding(cls)
    FAMILIES.add(family.name, family)
    for op in ops:
        _BY_OP.add(op, family)
    return family


def family_of(op_type: str) -> Family | None:
    """The family an encoding's op type belongs to (on a miss, after the plug-ins are loaded), or None."""
    return _BY_OP.find(op_type)


def families() -> list[Family]:
    """Every registered family, built-ins first (the plug-ins loaded first)."""
    return FAMILIES.listing()


def adapters() -> list[Any]:
    """Every family's torch importer adapters, in registration order (the first that matches a module wins)."""
    return [a for fam in families() for a in fam.adapters]
