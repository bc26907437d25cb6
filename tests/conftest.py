from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))  # tests/synthetic.py

from synthetic import synthetic_cnn

# Property tests draw the same cases on every run (fixed seeds): CI never sees a case a developer did not.
settings.register_profile("edgebnn", derandomize=True, database=None)
settings.load_profile("edgebnn")


@pytest.fixture
def cnn_ir():
    """A fresh synthetic Bayesian CNN IR (see tests/synthetic.py)."""
    return synthetic_cnn()
