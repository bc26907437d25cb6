"""INT8 calibration of a trained digits CNN (``edgebnn calibrate`` and ``eval`` on the command line): what INT8 costs.

Moved from tests/unit/test_calib.py: it trains a model (the unit lane trains none).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgebnn.calib.int8 import METHODS
from edgebnn.cli import main
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import save_onnx
from edgebnn.exporters.export import export_model


@pytest.fixture(scope="module")
def digits_export(tmp_path_factory):
    """A digits CNN trained briefly (15 epochs, ~10 s on one thread; test accuracy ~0.94), baked S=8."""
    torch = pytest.importorskip("torch")
    from edgebnn.data import digits
    from edgebnn.importers import import_model
    from edgebnn.models import digits_cnn
    from edgebnn.train import train_bnn

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = digits_cnn()
        train_bnn(model, digits(0), seed=0, epochs=15, kl_warmup_epochs=3, progress=False)
    finally:
        torch.set_num_threads(threads)
    path = tmp_path_factory.mktemp("digits") / "digits_S8.onnx"
    save_onnx(export_model(import_model(model, (1, 1, 8, 8), where="digits_cnn"), ExportConfig(8, mode="baked")).proto,
              path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_digits_int8_accuracy_within_bound(digits_export, tmp_path, method):
    # Bound: INT8 rounding moves the ensemble's probabilities by at most ~0.02 on digits (measured max |Δp|
    # 0.011-0.020 for the three methods on the fully trained CNN), so only test images whose fp32 top-2
    # margin is below ~0.04 can change class: 3 of 360 on the trained CNN. Hence at most 3 flips (top-1
    # agreement >= 0.99, accuracy within 3/360), and NLL/ECE within 0.01 (about 10% of the fp32 NLL).
    out = tmp_path / "int8.onnx"
    r = CliRunner().invoke(
        main, ["calibrate", str(digits_export), "--method", method, "-o", str(out), "--json", str(tmp_path / "r.json")],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema"] == "edgebnn.calibrate/1" and report["edgebnn_version"]
    ev = report["evaluation"]
    assert ev["split"] == "test" and ev["n"] == 360 and report["calibration"]["split"] == "val"
    assert ev["agreement"]["top1"] >= 0.99
    assert abs(ev["delta"]["accuracy"]) <= 3 / 360 + 1e-9
    assert abs(ev["delta"]["nll"]) <= 0.01 and abs(ev["delta"]["ece"]) <= 0.01
    assert report["tensorrt_compat"]["errors"] == 0
    # edgebnn eval runs the INT8 model like any export
    r = CliRunner().invoke(main,
                           ["eval", str(out), "--json", str(tmp_path / "e.json")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "e.json").read_text())["accuracy"] == pytest.approx(ev["after"]["accuracy"])
