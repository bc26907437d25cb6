"""The torch runner's float BNN baseline draws fresh weights with the posterior's distribution, as onnxruntime's does.

Moved from tests/unit/test_runners.py: 600 Monte Carlo passes through torch (the unit lane does no torch-heavy work).
"""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import INPUT_SHAPE, synthetic_cnn

from edgebnn.exporters.ensemble import float_bnn
from edgebnn.targets.runners import OrtRunner, TorchRunner

torch = pytest.importorskip("torch")


def _x(batch: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, *INPUT_SHAPE[1:]), dtype=np.float32)


def test_torch_float_bnn_draws_fresh_weights_with_the_right_distribution():
    # Both runtimes estimate E_w[softmax(f(x; w))] by Monte Carlo; with N draws each the difference of the two
    # means has standard deviation sqrt(var_a/N + var_b/N): allow 5 of them (a false alarm ~1e-6 per entry).
    model = synthetic_cnn(sigma=0.3)
    graph = float_bnn(model)
    x = _x(2, seed=4)
    n = 300
    torch.manual_seed(0)
    runner = TorchRunner(graph)
    t = np.stack([runner.run(x)[0] for _ in range(n)])
    session = OrtRunner(graph, threads=1)  # one session redraws on every run
    o = np.stack([session.run(x)[0] for _ in range(n)])
    assert not np.allclose(t[0], t[1])  # a new posterior sample per pass
    se = np.sqrt(t.var(0) / n + o.var(0) / n)
    assert np.all(np.abs(t.mean(0) - o.mean(0)) <= 5 * se + 1e-6), (t.mean(0), o.mean(0), se)
