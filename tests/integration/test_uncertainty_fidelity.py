"""Defaults that keep uncertainty (issue 13): on the trained digits CNN, ``codebook`` and ``fixed`` at their
defaults stay inside the budget of ``bench/uncertainty_fidelity.py`` against the float BNN (same seeds, same S),
and ``sampling="shared"`` still draws the 2DGBNN way.

The model is the session's ``trained_digits`` (seed 0), the one the bench trains; the OOD sets, metrics and
budget are the bench's own functions, so this test also keeps the bench honest.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
from scripts import script_module

from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.passes import lower
from edgebnn.runtime import Session

pytestmark = pytest.mark.slow
S = 16


def _bench() -> ModuleType:
    return script_module("bench/uncertainty_fidelity.py")


@pytest.fixture(scope="module")
def setting(digits_data):
    bench = _bench()
    x, y = digits_data.split("test")
    ood = {"flipped": np.ascontiguousarray(x[..., ::-1]), "blobs": bench.noise_blobs(len(x), 1)}
    return bench, x, y, ood


@pytest.fixture(scope="module")
def float_baked(setting, digits_ir):
    bench, x, y, ood = setting
    return bench.run_mode(digits_ir, "baked", S, x, y, ood)


@pytest.mark.parametrize(("scheme", "mode"), [("codebook", "baked"), ("codebook", "noise"), ("fixed", "baked")])
def test_default_keeps_the_uncertainty_budget(setting, digits_ir, float_baked, scheme, mode):
    bench, x, y, ood = setting
    ref = float_baked if mode == "baked" else bench.run_mode(digits_ir, mode, S, x, y, ood)
    got = bench.run_mode(lower(digits_ir, scheme, seed=0).model, mode, S, x, y, ood)
    verdict = bench.verdict(got, ref, list(ood))
    # measured (bench, seed 0): codebook baked dNLL +0.004, dECE +0.005, dAUROC blobs -0.007; noise -0.013;
    # fixed baked -0.006 / +0.002 / -0.005 (budget 0.05 / 0.01 / 0.02)
    assert verdict["within_budget"], verdict


def test_shared_sampling_keeps_the_2dgbnn_draws(setting, digits_ir, float_baked):
    """One value per entry per sample, in the IR's draws and in the shared-mode graph (K normals per layer);
    on this posterior, trained with independent noise, the correlated draws inflate the mutual information."""
    bench, x, y, ood = setting
    lowered = lower(digits_ir, "codebook", seed=0, sampling="shared")
    codebooks = {w.name: w.encoding for w in lowered.model.encoded_weights() if w.encoding.op_type == "CodebookWeight"}
    assert codebooks and all(enc.sampling == "shared" for enc in codebooks.values())
    name, enc = next(iter(codebooks.items()))
    draws = enc.sample(np.random.default_rng(0), 4).reshape(4, -1)
    own = np.zeros(enc.size, bool)
    own[enc.outlier_index] = own[enc.blend_index] = True
    k = int(np.bincount(enc.indices[~own]).argmax())
    members = np.flatnonzero((enc.indices == k) & ~own)
    assert members.size > 1 and np.all(draws[:, members] == draws[:, members[:1]])
    sess = Session(export_model(lowered.model, ExportConfig(S, mode="shared", rng="host")).proto, seed=0)
    assert next(r for r in sess.noise_inputs if r["name"] == f"noise/{name}")["shape"] == [S, enc.k]
    shared = bench.run_mode(lowered.model, "shared", S, x, y, ood)
    # measured: mean MI 0.32 against the float BNN's 0.041 (issue 13: 0.411 vs 0.040 at the old defaults)
    assert shared["mean_mi"] > 3 * float_baked["mean_mi"]
    assert not bench.verdict(shared, float_baked, list(ood))["within_budget"]
