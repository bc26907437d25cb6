"""The registry (edgebnn.registry): one object for encodings, families, tasks and plug-ins; a lookup never imports
(the loader hook, installed from above, runs once on the first miss); a test's registrations live in a scope; and no
module of edgebnn imports another by name, where the import linter cannot see it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from edgebnn.errors import PluginError
from edgebnn.families import Family, register_family
from edgebnn.family import families, family_of
from edgebnn.ir import GaussianWeight, encoding_class
from edgebnn.registry import REGISTRY, Registry
from edgebnn.tasks import TASKS, Classification, option_task, register_task

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "edgebnn"


def test_a_lookup_runs_the_loader_only_on_a_miss_and_once():
    calls: list[str] = []
    reg = Registry()
    reg.encodings.add("Known", int)

    def hook() -> None:
        calls.append("load")
        assert reg.encodings.find("Missing") is None  # a plug-in looking up while it registers: no second load
        reg.encodings.add("Late", float)

    reg.set_loader(hook)
    assert reg.encodings.find("Known") is int and reg.encodings["Known"] is int and calls == []
    assert "Late" not in reg.encodings and calls == []  # reading the mapping never loads
    assert reg.encodings.find("Late") is float and calls == ["load"] and reg.loaded
    assert reg.encodings.find("Other") is None and reg.tasks.listing() == [] and calls == ["load"]


def test_a_loader_that_fails_runs_again_on_the_next_miss():
    reg, calls = Registry(), []

    def hook() -> None:
        calls.append("load")
        if len(calls) == 1:
            raise PluginError("plug-in 'broken' failed to import")

    reg.set_loader(hook)
    with pytest.raises(PluginError, match="broken"):
        reg.families.find("x")
    assert not reg.loaded
    assert reg.families.listing() == [] and reg.loaded and calls == ["load", "load"]


def test_a_scope_restores_every_table_and_the_loading():
    reg = Registry()
    reg.set_loader(lambda: reg.tasks.add("builtin", "B"))
    with reg.scoped():
        assert reg.loaded and list(reg.tasks) == ["builtin"]  # loaded before the snapshot: kept after it
        reg.tasks.add("mine", "M")
        reg.encodings.add("MineWeight", "E")
        reg._loaded = False
    assert list(reg.tasks) == ["builtin"] and "MineWeight" not in reg.encodings and reg.loaded
    with pytest.raises(ValueError, match="task 'builtin' registered twice"):
        reg.tasks.add("builtin", "again")


class TwiceWeight(GaussianWeight):
    op_type: ClassVar[str] = "TwiceWeight"


class Twice(Classification):
    name = "twice"
    aliases = ()


@pytest.mark.parametrize("run", [1, 2])
def test_a_test_that_registers_runs_twice_in_one_process(registry, run):
    """The second run registers the same family and task again: the first run's scope forgot them (without the
    ``registry`` fixture it fails with "family 'twice' is registered twice")."""
    register_family(Family("twice", (TwiceWeight,), f"registered by run {run}"))
    register_task(Twice)
    assert family_of("TwiceWeight").summary == f"registered by run {run}"
    assert encoding_class("TwiceWeight") is TwiceWeight and option_task("twice") is Twice
    assert families()[-1].name == "twice"


def test_twice_in_one_test_and_nothing_left_after():
    for _ in range(2):
        with REGISTRY.scoped():
            register_family(Family("twice", (TwiceWeight,)))
            register_task(Twice)
            with pytest.raises(PluginError, match="family 'twice' is registered twice"):
                register_family(Family("twice", (TwiceWeight,)))
    assert family_of("TwiceWeight") is None and encoding_class("TwiceWeight") is None and "twice" not in TASKS
    assert family_of("GaussianWeight").name == "gaussian"  # the built-ins stay
    ir_enc = TwiceWeight(np.zeros(2, np.float32), np.ones(2, np.float32))
    assert ir_enc.op_type == "TwiceWeight"


# -- no module of edgebnn imports another by name -----------------------------------------------------------------

IMPORTERS = {"import_module", "__import__", "find_spec"}
# strings that name an edgebnn module but import nothing unseen: the entry-point group plug-ins declare; the
# ``source_library`` values the trainers record in a manifest (files keep them); the demo's model, lowered as a
# user's ``--model`` is and imported by a statement in the same function (lint-imports sees demo -> models)
NOT_IMPORTS = {("edgebnn/plugins.py", "edgebnn.plugins"), ("edgebnn/passes/binary.py", "edgebnn.train.ebp"),
               ("edgebnn/passes/ternary.py", "edgebnn.train.vnq"), ("edgebnn/demo.py", "edgebnn.models:digits_cnn")}


def _modules() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names - {"edgebnn"}  # the package's own name is also a producer's, a plug-in's, a logger's


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _leading_text(node: ast.expr) -> str | None:
    """The text a string argument starts with (a literal, or an f-string's first literal part)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def by_name_imports(source: str, where: str, modules: set[str]) -> list[str]:
    """Every ``import_module`` / ``__import__`` / ``find_spec`` of a string naming edgebnn, and every string literal
    (docstrings aside) that is an edgebnn module's name, alone or as a ``MODULE:FACTORY`` spec: a module imported by
    name, which lint-imports cannot see."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    seen = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            text = _leading_text(node.args[0])
            if name in IMPORTERS and text is not None and re.match(r"edgebnn\b", text):
                found.append((node.lineno, f"{name}({text!r})"))
                seen.add(id(node.args[0]))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in seen
                and node.value.split(":")[0] in modules and (where, node.value) not in NOT_IMPORTS):
            found.append((node.lineno, f"module name {node.value!r}"))
    return [f"{where}:{line}: {what}" for line, what in sorted(found)]


def test_the_scan_finds_an_import_by_name():
    modules = {"edgebnn.plugins", "edgebnn.runtime"}
    source = ('import importlib\nimportlib.import_module("edgebnn.plugins").load()\n__import__(f"edgebnn.{x}")\n'
              '_LAZY = {"Session": "edgebnn.runtime"}\nUSER = importlib.import_module(user_module)\n'
              'SPEC = "edgebnn.runtime:Session"\nGROUP = "edgebnn.runtime_plugins"\n')
    assert [f.split(": ", 1)[1] for f in by_name_imports(source, "m.py", modules)] == [
        "import_module('edgebnn.plugins')", "__import__('edgebnn.')", "module name 'edgebnn.runtime'",
        "module name 'edgebnn.runtime:Session'"]


def test_no_edgebnn_module_is_imported_by_name():
    """The units import each other with import statements only (what lint-imports checks); a user's module
    (``--model PKG.MOD:FACTORY``, ``--plugin MOD``) is imported by a name that is no literal, and stays allowed."""
    modules = _modules()
    found = [hit for path in sorted(PACKAGE.rglob("*.py"))
             for hit in by_name_imports(path.read_text(), str(path.relative_to(ROOT)), modules)]
    assert found == []


def test_import_edgebnn_is_light_and_its_lazy_names_resolve():
    code = ("import sys, edgebnn\n"
            "heavy = sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules)\n"
            "assert heavy == [], heavy\n"
            "assert edgebnn.load_data.__module__ == 'edgebnn.data' and edgebnn.Dataset.__name__ == 'Dataset'\n"
            "assert 'onnxruntime' not in sys.modules\n"
            "assert edgebnn.Session.__name__ == 'Session' and 'onnxruntime' in sys.modules\n"
            "assert {'Session', 'load_data', 'Dataset'} <= set(dir(edgebnn))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
