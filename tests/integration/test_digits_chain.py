"""torch -> IR -> baked ONNX -> onnxruntime on the real digits test split, against the reference runtime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.metrics import accuracy, nll
from edgebnn.runtime.reference import predict

S = 16
pytestmark = pytest.mark.slow


def _onnx_probs(proto, x):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


def test_mean_network_matches_torch(trained_digits, digits_ir, digits_data):
    """The IR's posterior-mean graph computes what the torch model computes with its means."""
    model, _ = trained_digits
    x, _ = digits_data.split("test")
    sess = ort.InferenceSession(digits_ir.float_model().SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input": x})[0]
    from edgebnn.nn import posterior_mean

    with torch.no_grad(), posterior_mean(model):
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # float32 conv/gemm round-off


def test_onnx_ensemble_agrees_with_reference_within_monte_carlo_error(digits_ir, digits_data):
    x, y = digits_data.split("test")
    # Same seed: the baked members are the reference's members, so the metrics agree to round-off.
    same = _onnx_probs(export_model(digits_ir, ExportConfig(S, mode="baked", seed=0)).proto, x)
    ref0 = predict(digits_ir, x, S, seed=0).probs
    np.testing.assert_allclose(same, ref0, atol=1e-5)

    # Different seeds: S-sample metrics are random. Estimate their Monte Carlo spread from R reference
    # runs, then require the exported ensemble (a fresh seed) to land within 4 standard deviations of
    # the reference mean (the std of a difference of one draw and an R-mean is sd*sqrt(1 + 1/R)).
    R = 6
    ref_runs = [predict(digits_ir, x, S, seed=100 + r).probs for r in range(R)]
    got = _onnx_probs(export_model(digits_ir, ExportConfig(S, mode="baked", seed=7)).proto, x)
    for metric in (accuracy, nll):
        values = np.array([metric(p, y) for p in ref_runs])
        sd = max(values.std(ddof=1), 1.0 / len(y))  # floor: one test example's worth of accuracy
        bound = 4 * sd * np.sqrt(1 + 1 / R)
        assert abs(metric(got, y) - values.mean()) <= bound, (metric.__name__, metric(got, y), values, bound)


def test_trained_ensemble_is_accurate(digits_ir, digits_data):
    x, y = digits_data.split("test")
    probs = _onnx_probs(export_model(digits_ir, ExportConfig(S, mode="baked", seed=0)).proto, x)
    assert accuracy(probs, y) >= 0.93  # the trainer's own test asserts this bound for the torch model
    assert nll(probs, y) < 0.3  # measured 0.115; an untrained 10-class model gives about ln 10 = 2.3
