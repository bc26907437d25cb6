"""Plug-ins: the registry of posterior families, and the loader of packages that add families and tasks.

A plug-in is a Python module that, when imported, registers what it adds with the public calls
(:func:`edgebnn.families.register_family`, :func:`edgebnn.tasks.register_task`). It reaches edgebnn three ways:

- a package declares an entry point in the group ``edgebnn.plugins`` (``pyproject.toml``)::

      [project.entry-points."edgebnn.plugins"]
      rownoise = "edgebnn_example.rownoise"

- a module named on the command line: ``edgebnn --plugin my_family COMMAND ...`` (repeatable);
- a module named in the environment: ``EDGEBNN_PLUGINS=my_family,other_module``.

:func:`load` imports the package's own families (:mod:`edgebnn.families`, registered through the same call),
then every entry point, then the named modules, each once per process; every ``edgebnn`` command calls it before
it runs, and the library calls it before its first registry lookup (:func:`family_of`, an unknown encoding or task
in a file). A plug-in that fails to import ends the command in one line naming it and its entry point (exit 2).
``edgebnn plugins`` lists what was loaded, from where, and what each registered.

This module sits below the exporters, passes and importers (which look families up here) and imports the family
definitions only by name, at run time: the built-in families import the exporters' and importers' helpers.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal

from edgebnn._io import cwd_on_path
from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.ir.encodings import ENCODINGS, Encoding, register_encoding

GROUP = "edgebnn.plugins"
ENV = "EDGEBNN_PLUGINS"
BUILTIN = "edgebnn.families"  # the package's own families, registered with the public call


class PluginError(EdgeBNNError):
    """A plug-in failed to import or registered something invalid (names the plug-in and where it came from)."""


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


FAMILIES: dict[str, Family] = {}  # name -> family
_BY_OP: dict[str, Family] = {}  # op type -> its family


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
    FAMILIES[family.name] = family
    _BY_OP.update((op, family) for op in ops)
    return family


def family_of(op_type: str) -> Family | None:
    """The family an encoding's op type belongs to (plug-ins loaded first), or None."""
    load()
    return _BY_OP.get(op_type)


def families() -> list[Family]:
    """Every registered family, built-ins first (plug-ins loaded first)."""
    load()
    return list(FAMILIES.values())


def adapters() -> list[Any]:
    """Every family's torch importer adapters, in registration order (the first that matches a module wins)."""
    return [a for fam in families() for a in fam.adapters]


@dataclass
class Plugin:
    """One loaded plug-in: where it came from and what it registered."""

    name: str
    module: str
    source: str  # "built-in", "entry point of DIST VERSION", "--plugin", "EDGEBNN_PLUGINS"
    registered: dict[str, list[str]] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "module": self.module, "source": self.source, "registered": self.registered}


LOADED: dict[str, Plugin] = {}  # module -> plug-in, in load order
# "done": every source was imported; "loading": an import is under way (a plug-in registering a family asks
# family_of, which must not start the loading again). A failed plug-in leaves "done" False: the next call retries.
_state = {"done": False, "loading": False}


def _snapshot() -> dict[str, set[str]]:
    from edgebnn.tasks import TASKS

    return {"families": set(FAMILIES), "encodings": set(ENCODINGS), "tasks": set(TASKS)}


def _import(name: str, module: str, source: str, origin: str) -> None:
    """Import one plug-in module and record what it registered (once per module); ``origin`` says where it was
    named, for messages."""
    if module in LOADED:
        return
    before = _snapshot()
    try:
        with cwd_on_path():  # a module in the working folder, as --model finds one (not for the built-ins)
            importlib.import_module(module)
    except EdgeBNNError as e:
        raise PluginError(f"plug-in {name!r} ({origin}): {e}") from e
    except Exception as e:
        what = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise PluginError(f"plug-in {name!r} ({origin}) failed to import: {type(e).__name__}"
                          + (f": {what}" if what else "")) from e
    after = _snapshot()
    LOADED[module] = Plugin(name, module, source, {k: sorted(after[k] - before[k]) for k in after
                                                   if after[k] - before[k]})


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=GROUP), key=lambda ep: ep.name)


def load(modules: Iterable[str] = ()) -> list[Plugin]:
    """Load the built-in families, every ``edgebnn.plugins`` entry point, the modules in ``$EDGEBNN_PLUGINS``
    and ``modules`` (each once per process); returns every plug-in loaded so far.

    Raises:
        PluginError: a plug-in failed to import (one line naming it and its entry point or option).
    """
    if not _state["done"] and not _state["loading"]:
        _state["loading"] = True
        try:
            _import("edgebnn", BUILTIN, "built-in", f"built-in: {BUILTIN}")
            for ep in _entry_points():
                dist = getattr(ep, "dist", None)
                package = f"{dist.name} {dist.version}" if dist is not None else "an installed package"
                source = f"entry point {GROUP}: {ep.name} = {ep.value}, from {package}"
                _import(ep.name, ep.value.split(":")[0], source, source)
            for module in _named(os.environ.get(ENV, "")):
                _import(module, module, ENV, f"{ENV}: {module}")
            _state["done"] = True
        finally:
            _state["loading"] = False
    for module in modules:
        if not module or not all(part.isidentifier() for part in module.split(".")):
            raise InvalidOptionError(f"--plugin {module!r}: give an importable module name (my_package.my_family)")
        _import(module, module, "--plugin", f"--plugin: {module}")
    return list(LOADED.values())


def _named(value: str) -> list[str]:
    return [m.strip() for m in value.replace(":", ",").split(",") if m.strip()]
