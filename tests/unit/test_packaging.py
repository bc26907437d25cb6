"""``pip install -e .`` reads pyproject.toml without a deprecation warning (what a new user sees first)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression_and_the_build_backend_reads_it():
    config = _pyproject()
    assert config["project"]["license"] == "Apache-2.0"  # PEP 639: a string; `{ text = ... }` is deprecated
    # setuptools reads SPDX license strings from 77.0 on: an older build backend would reject the string
    (req,) = [r for r in config["build-system"]["requires"] if r.startswith("setuptools")]
    floor = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", req)
    assert floor is not None and int(floor.group(1)) >= 77, req


def test_setuptools_applies_the_project_table_without_warnings(monkeypatch):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates SPDX license strings")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)  # the dynamic version is read relative to the project
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), "pyproject.toml")
    assert [f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"


def test_every_phony_make_target_has_a_rule():
    """`make lint` was declared .PHONY without a rule (issue 38); `make -n` only prints what would run."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    makefile = ROOT / "Makefile"
    phony = re.search(r"^\.PHONY:(.*)$", makefile.read_text(), flags=re.M)
    assert phony is not None
    targets = phony.group(1).split()
    assert "lint" in targets and "test" in targets
    for target in targets:
        dry = subprocess.run(["make", "-n", "-f", str(makefile), target], cwd=ROOT, capture_output=True, text=True,
                             check=False)
        assert dry.returncode == 0, (target, dry.stderr)
    lint = subprocess.run(["make", "-n", "-f", str(makefile), "lint"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    assert all(tool in lint for tool in ("ruff check", "mypy -p edgebnn", "lint-imports"))
