"""Load a script of bench/ or examples/ (not a package) as a module, for the tests that call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def script_module(relative: str, name: str | None = None) -> ModuleType:
    """``bench/analytic_ood.py`` (relative to the repository root) as a module, registered in ``sys.modules`` under
    ``name`` (default: its stem) so that its dataclasses and pickling find it."""
    path = ROOT / relative
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
