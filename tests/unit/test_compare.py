"""edgebnn compare: agrees on artifacts of the same posterior, flags a different posterior."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper
from synthetic import synthetic_cnn

from edgebnn import ir
from edgebnn.compare import compare_artifacts
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import save_onnx
from edgebnn.exporters.export import export_model

NULL_RUNS = 39  # p-values down to 0.025; alpha 0.05 keeps the test fast and still decisive


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    return rng.normal(size=(60, 1, 6, 6)).astype(np.float32), rng.integers(0, 3, 60)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    model = synthetic_cnn(sigma=0.3)
    ir.save(model, d / "m.ebnn")
    for mode, seed in (("baked", 11), ("noise", 0), ("analytic", 0)):
        save_onnx(export_model(model, ExportConfig(16, mode=mode, seed=seed, rng="host")).proto, d / f"{mode}.onnx")
    # The same skeleton with every sigma tripled: a different posterior.
    wider = synthetic_cnn(sigma=0.3)
    for t in wider.proto.graph.initializer:
        if t.name.endswith(".sigma"):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 3, t.name))
    save_onnx(export_model(wider, ExportConfig(16, mode="baked", seed=11)).proto, d / "wider.onnx")
    return d


@pytest.mark.parametrize("other", ["baked.onnx", "noise.onnx"])
def test_same_posterior_is_same(files, data, other):
    report = compare_artifacts(str(files / "m.ebnn"), str(files / other), data, null_runs=NULL_RUNS, alpha=0.05)
    assert report["same_distribution"], report
    assert report["a"]["samples"] == report["b"]["samples"] == 16


def test_wider_posterior_is_different(files, data):
    report = compare_artifacts(str(files / "baked.onnx"), str(files / "wider.onnx"), data,
                               ir=str(files / "m.ebnn"), null_runs=NULL_RUNS, alpha=0.05)
    assert not report["same_distribution"], report
    assert report["p_value"] == pytest.approx(1 / (NULL_RUNS + 1))


def test_two_exports_need_the_ir(files, data):
    with pytest.raises(InvalidOptionError, match="--ir"):
        compare_artifacts(str(files / "baked.onnx"), str(files / "noise.onnx"), data)
