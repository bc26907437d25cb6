from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.internal.conjecture import providers as hypothesis_providers
from hypothesis.internal.constants_ast import Constants

sys.path.insert(0, str(Path(__file__).parent))  # tests/synthetic.py

from synthetic import synthetic_cnn


def no_mined_constants() -> Constants:
    """What Hypothesis mines from the source of every module imported so far (its "local constants"): nothing here.

    With them, the cases a property test draws depend on which modules the tests before it imported: a file alone
    and the whole lane drew different cases, so a failure showed only in the lane. Its fixed global constants
    (powers of 2 and 10, the float limits such as 1.175494351e-38, ...) stay; what the mined literals found is kept
    as explicit ``@example`` cases. This replaces a function of Hypothesis' internals: the version is pinned in
    pyproject.toml (tests/reliability/test_properties.py checks it still takes effect)."""
    return Constants()


hypothesis_providers._get_local_constants = no_mined_constants
# Property tests draw the same cases on every run (fixed seeds) and whatever ran before them: CI never sees a case
# a developer did not.
settings.register_profile("edgebnn", derandomize=True, database=None)
settings.load_profile("edgebnn")


@pytest.fixture
def registry():
    """The process-wide registry (edgebnn.registry.REGISTRY) in a scope: the families, encodings, tasks and plug-ins
    a test registers are gone after it, so the test can run twice in one process."""
    from edgebnn.registry import REGISTRY

    with REGISTRY.scoped() as scope:
        yield scope


@pytest.fixture
def cnn_ir():
    """A fresh synthetic Bayesian CNN IR (see tests/synthetic.py)."""
    return synthetic_cnn()
