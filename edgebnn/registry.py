"""The registry: one object (:data:`REGISTRY`) holding every table of what edgebnn knows by name.

Its tables: ``encodings`` (op type -> encoding class), ``families`` (name -> posterior family) with ``family_ops``
(op type -> the family that owns it), ``tasks`` (name -> task class) and ``plugins`` (module -> what its import
registered). The units that define what a table holds register into it and read it through typed names of their
own (:data:`edgebnn.ir.encodings.ENCODINGS`, :data:`edgebnn.tasks.TASKS`, :func:`edgebnn.family.family_of`).

The registry sits below every unit that registers or looks something up and imports nothing of edgebnn:
registering and looking up never import a module. What is not registered yet comes from one *loader hook*
(:meth:`Registry.set_loader`), installed from above: the package root installs the plug-in loader's
(:func:`edgebnn.plugins.load_sources`: the built-in families, every installed entry point, ``$EDGEBNN_PLUGINS``).
The registry calls it on the first lookup that misses (:meth:`Table.find`) or the first full listing
(:meth:`Table.listing`), until it has succeeded once: a hook that raises (a broken plug-in) runs again on the next
miss, so a later plug-in is never skipped in silence. Reading a table as a mapping (``table[key]``, ``key in
table``, iterating it) never runs the hook.

Tests run in a scope (:meth:`Registry.scoped`, the ``registry`` fixture of tests/conftest.py): every table and
the loader's state are restored when it ends, so a test that registers a family or a task runs twice in one
process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

V = TypeVar("V")


class Table(Mapping[str, V]):
    """One table of the registry: key -> value, in registration order.

    As a :class:`~collections.abc.Mapping` it shows what is registered now; :meth:`find` and :meth:`listing` run
    the registry's loader hook first where they must.
    """

    def __init__(self, registry: Registry, kind: str) -> None:
        self._registry = registry
        self.kind = kind
        self._items: dict[str, V] = {}

    def __getitem__(self, key: str) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"<registry table of {len(self)} {self.kind}s: {', '.join(self._items)}>"

    def add(self, key: str, value: V) -> V:
        """Register ``value`` as ``key``; returns it.

        Raises:
            ValueError: ``key`` is taken (the registering unit checks first, to name what holds it).
        """
        if key in self._items:
            raise ValueError(f"{self.kind} {key!r} registered twice")
        self._items[key] = value
        return value

    def find(self, key: str) -> V | None:
        """The value registered as ``key``; on a miss, the loader hook runs (once) and it is looked up again."""
        if key not in self._items:
            self._registry.ensure_loaded()
        return self._items.get(key)

    def listing(self) -> list[V]:
        """Every value, in registration order, once the loader hook has run."""
        self._registry.ensure_loaded()
        return list(self._items.values())


class Registry:
    """Every table (:class:`Table`) and the loader hook that fills them from the plug-ins."""

    def __init__(self) -> None:
        self.encodings: Table[Any] = Table(self, "encoding")
        self.families: Table[Any] = Table(self, "family")
        self.family_ops: Table[Any] = Table(self, "family encoding")
        self.tasks: Table[Any] = Table(self, "task")
        self.plugins: Table[Any] = Table(self, "plug-in")
        self._loader: Callable[[], object] | None = None
        self._loaded = False
        self._loading = False

    def tables(self) -> dict[str, Table[Any]]:
        """The tables by name."""
        return {"encodings": self.encodings, "families": self.families, "family_ops": self.family_ops,
                "tasks": self.tasks, "plugins": self.plugins}

    def set_loader(self, hook: Callable[[], object]) -> None:
        """Install the loader hook: what :meth:`ensure_loaded` calls (the layer above that knows the plug-ins)."""
        self._loader = hook

    @property
    def loaded(self) -> bool:
        """Whether the loader hook has succeeded once."""
        return self._loaded

    def ensure_loaded(self) -> None:
        """Run the loader hook unless it has succeeded once or is running now (a plug-in that looks something up
        while it registers does not start the loading again). A hook that raises leaves the registry unloaded: the
        next miss runs it again."""
        if self._loaded or self._loading or self._loader is None:
            return
        self._loading = True
        try:
            self._loader()
            self._loaded = True
        finally:
            self._loading = False

    @contextmanager
    def scoped(self) -> Iterator[Registry]:
        """A block after which every table and the loader's state are as they were before it.

        The loader hook runs first, so the built-in families and the installed plug-ins stay registered outside
        the scope: a module is imported once per process, and one first imported inside a scope would not register
        again after the scope forgot it.
        """
        self.ensure_loaded()
        saved = {name: dict(table._items) for name, table in self.tables().items()}
        loaded = self._loaded
        try:
            yield self
        finally:
            for name, table in self.tables().items():
                table._items = saved[name]
            self._loaded = loaded


REGISTRY = Registry()
"""The process-wide registry."""
