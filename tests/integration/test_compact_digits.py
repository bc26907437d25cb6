"""The trained digits CNN, lowered (prune+fixed), exported with the IR's own encoding in every mode: the files carry
the codes, and each predictive is the reference runtime's (exactly for baked, within Monte Carlo error when sampled)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import read_metadata
from edgebnn.metrics import accuracy, nll
from edgebnn.passes import lower
from edgebnn.runtime import Session
from edgebnn.runtime.reference import predict

pytestmark = pytest.mark.slow
S = 16


@pytest.fixture(scope="module")
def lowered(digits_ir):
    return lower(digits_ir, "prune+fixed", seed=0).model


def _fp32_bnn_bytes(model) -> int:
    return sum(w.encoding.size for w in model.encoded_weights()) * 8  # μ and σ in fp32


def test_baked_is_the_reference_and_noise_analytic_carry_the_codes(lowered, digits_data):
    x, y = digits_data.split("test")
    # the members are the reference's draws (streams [seed, i])
    baked = export_model(lowered, ExportConfig(S, mode="baked", seed=0)).proto
    sess = ort.InferenceSession(baked.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(["probs"], {"input": x})[0], predict(lowered, x, S, seed=0).probs,
                               atol=1e-5)  # float32 round-off of the same members
    ref = predict(lowered, x, 1024, seed=1).probs
    fp32_bnn = _fp32_bnn_bytes(lowered)
    for mode, kw in (("noise", {"rng": "graph"}), ("noise", {}), ("analytic", {})):
        proto = export_model(lowered, ExportConfig(S, mode=mode, **{"rng": "host", **kw})).proto
        assert read_metadata(proto, "d.onnx").stores.get("FixedPointWeight", 0) >= 4  # the layers' codes
        # the file is the codes, not fp32 moments (fp32: 1.0x noise, 0.6x analytic); analytic also holds the ReLU
        # moments' constants and its Q·K quadrature points
        assert len(proto.SerializeToString()) * (5 if mode == "noise" else 4) < fp32_bnn, (mode, kw)
        probs = Session(proto, seed=0).predict(x).probs
        # the S-sample (S-point) predictive against the reference's 1024 draws: accuracy within 1.5 points and NLL
        # within 0.05 (the lowering budget's scale; S=16 Monte Carlo and analytic's Gaussian logits both move NLL
        # by a few hundredths on this split)
        assert abs(accuracy(probs, y) - accuracy(ref, y)) <= 0.015, (mode, kw)
        assert abs(nll(probs, y) - nll(ref, y)) <= 0.05, (mode, kw)
