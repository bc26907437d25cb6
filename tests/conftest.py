from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/synthetic.py

from synthetic import synthetic_cnn


@pytest.fixture
def cnn_ir():
    """A fresh synthetic Bayesian CNN IR (see tests/synthetic.py)."""
    return synthetic_cnn()
