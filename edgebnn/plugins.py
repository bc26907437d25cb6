"""The plug-in loader: the package's own families and the packages that add families and tasks.

A plug-in is a Python module that, when imported, registers what it adds with the public calls
(:func:`edgebnn.families.register_family`, :func:`edgebnn.tasks.register_task`). It reaches edgebnn three ways:

- a package declares an entry point in the group ``edgebnn.plugins`` (``pyproject.toml``)::

      [project.entry-points."edgebnn.plugins"]
      rownoise = "edgebnn_example.rownoise"

- a module named on the command line: ``edgebnn --plugin my_family COMMAND ...`` (repeatable);
- a module named in the environment: ``EDGEBNN_PLUGINS=my_family,other_module``.

:func:`load_sources` imports the package's own families (:mod:`edgebnn.families`, registered through the same
call), then every entry point, then the modules in ``$EDGEBNN_PLUGINS``, each once per process. It is the loader
hook of the registry (:data:`edgebnn.registry.REGISTRY`), installed by the package root: the registry calls it on
the first lookup that misses (:func:`edgebnn.family.family_of`, an unknown encoding or task in a file) or the first
full listing, and again after a failure until it succeeds. Every ``edgebnn`` command calls :func:`load` before it
runs, which also imports the ``--plugin`` modules. A plug-in that fails to import ends the command in one line
naming it and its entry point (exit 2). ``edgebnn plugins`` lists what was loaded, from where, and what each
registered.

This module sits above the families (it imports them with an import statement); the units below reach it only
through the registry's hook. The family contract it loads is :mod:`edgebnn.family` (re-exported here).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

from edgebnn._io import cwd_on_path
from edgebnn.errors import EdgeBNNError, InvalidOptionError, PluginError
from edgebnn.family import EXACT, Analytic, ExportRequest, Family, adapters, families, family_of, register_family
from edgebnn.registry import REGISTRY, Table

__all__ = ["ENV", "EXACT", "GROUP", "LOADED", "Analytic", "ExportRequest", "Family", "Plugin", "PluginError",
           "adapters", "families", "family_of", "load", "load_sources", "register_family"]

GROUP = "edgebnn.plugins"  # the entry-point group
ENV = "EDGEBNN_PLUGINS"
BUILTIN = "built-in"


@dataclass
class Plugin:
    """One loaded plug-in: where it came from and what it registered."""

    name: str
    module: str
    source: str  # "built-in", "entry point of DIST VERSION", "--plugin", "EDGEBNN_PLUGINS"
    registered: dict[str, list[str]] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "module": self.module, "source": self.source, "registered": self.registered}


LOADED: Table[Plugin] = REGISTRY.plugins
"""The plug-ins loaded, by module, in load order (the registry's table)."""


def _snapshot() -> dict[str, set[str]]:
    return {"families": set(REGISTRY.families), "encodings": set(REGISTRY.encodings), "tasks": set(REGISTRY.tasks)}


def _import(name: str, source: str, origin: str, run: Callable[[], ModuleType]) -> None:
    """Import one plug-in module with ``run`` and record what it registered; ``origin`` says where it was named,
    for messages."""
    before = _snapshot()
    try:
        module = run()
    except EdgeBNNError as e:
        raise PluginError(f"plug-in {name!r} ({origin}): {e}") from e
    except Exception as e:
        what = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise PluginError(f"plug-in {name!r} ({origin}) failed to import: {type(e).__name__}"
                          + (f": {what}" if what else "")) from e
    after = _snapshot()
    LOADED.add(module.__name__, Plugin(name, module.__name__, source, {k: sorted(after[k] - before[k]) for k in after
                                                                       if after[k] - before[k]}))


def _import_named(name: str, module: str, source: str, origin: str) -> None:
    """A user's plug-in module, by the name an entry point, ``--plugin`` or ``$EDGEBNN_PLUGINS`` gives (once)."""
    if module in LOADED:
        return

    def run() -> ModuleType:
        with cwd_on_path():  # a module in the working folder, as --model finds one
            return importlib.import_module(module)

    _import(name, source, origin, run)


def _builtin_families() -> ModuleType:
    import edgebnn.families  # the package's own families register on import, with the public call

    return edgebnn.families


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=GROUP), key=lambda ep: ep.name)


def load_sources() -> None:
    """Import the built-in families, every ``edgebnn.plugins`` entry point and the modules in ``$EDGEBNN_PLUGINS``,
    each once per process: the registry's loader hook (:meth:`edgebnn.registry.Registry.ensure_loaded` calls it).

    Raises:
        PluginError: a plug-in failed to import (one line naming it and its entry point or variable); the ones
            before it stay loaded, and the next call tries it and those after it again.
    """
    if not any(p.source == BUILTIN for p in LOADED.values()):
        _import("edgebnn", BUILTIN, "the built-in families", _builtin_families)
    for ep in _entry_points():
        dist = getattr(ep, "dist", None)
        package = f"{dist.name} {dist.version}" if dist is not None else "an installed package"
        source = f"entry point {GROUP}: {ep.name} = {ep.value}, from {package}"
        _import_named(ep.name, ep.value.split(":")[0], source, source)
    for module in _named(os.environ.get(ENV, "")):
        _import_named(module, module, ENV, f"{ENV}: {module}")


def load(modules: Iterable[str] = ()) -> list[Plugin]:
    """Load the built-in families, every ``edgebnn.plugins`` entry point, the modules in ``$EDGEBNN_PLUGINS``
    (:func:`load_sources`, through the registry, once) and ``modules`` (each once per process); returns every
    plug-in loaded so far.

    Raises:
        PluginError: a plug-in failed to import (one line naming it and its entry point or option).
        InvalidOptionError: a name in ``modules`` is no module name.
    """
    REGISTRY.ensure_loaded()
    for module in modules:
        if not module or not all(part.isidentifier() for part in module.split(".")):
            raise InvalidOptionError(f"--plugin {module!r}: give an importable module name (my_package.my_family)")
        _import_named(module, module, "--plugin", f"--plugin: {module}")
    return list(LOADED.values())


def _named(value: str) -> list[str]:
    return [m.strip() for m in value.replace(":", ",").split(",") if m.strip()]
