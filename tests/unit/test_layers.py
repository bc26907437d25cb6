"""The import-layer contract (`lint-imports`, run by `make test`) covers every unit of the package.

import-linter only constrains the modules a contract names: a new unit left out of the layers list could
import anything. This test keeps the list and the package in step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["type"]: c for c in config["contracts"]}


def _units() -> set[str]:
    package = ROOT / "edgebnn"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    packages = {p.parent.name for p in package.glob("*/__init__.py")}
    return {f"edgebnn.{name}" for name in modules | packages}


def test_every_unit_sits_in_exactly_one_layer():
    named = [m.strip() for layer in _contracts()["layers"]["layers"] for m in layer.replace(":", "|").split("|")]
    assert len(named) == len(set(named)), "a unit is named in two layers"
    assert set(named) == _units()


def test_cycles_are_checked_over_the_whole_package():
    assert _contracts()["acyclic_siblings"]["ancestors"] == ["edgebnn"]
