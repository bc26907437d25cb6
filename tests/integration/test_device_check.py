"""bench/device_check.py (``make device-check``), run here on the CPU for its shape: every mode and baseline timed
with torch, energy null with its reason, numerics against onnxruntime. On a GPU machine the same script writes the
figures the TensorRT issue reports (the CUDA test below runs only there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripts import script_module

torch = pytest.importorskip("torch")


def _module():
    return script_module("bench/device_check.py")


def _check(report: dict, batches: list[int]) -> None:
    assert [row["batch"] for row in report["rows"]] == batches
    for row in report["rows"]:
        modes = {"baked", "noise", "noise_graph", "analytic"}
        assert set(row["graphs"]) == modes | {"float_deterministic", "float_bnn"}
        for name, g in row["graphs"].items():
            assert "error" not in g, (name, g)
            assert g["latency_ms"]["p50"] > 0 and g["runs"] >= 2
            if name not in ("float_bnn", "noise_graph"):  # same graph, input and host noise: round-off apart
                # float32 sums of up to 800 terms in another order (torch vs onnxruntime kernels), then a softmax
                # and its entropy: ~1e-6 expected (5e-7 measured, here and on an H100); 1e-4 leaves room for
                # BLAS differences and still fails on any wrong op (a wrong draw or weight moves probs by > 1e-2)
                assert max(g["numerics_max_abs"].values()) < 1e-4, (name, g["numerics_max_abs"])
        assert set(row["ratios_p50"]) == modes


def test_device_check_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "dc.json"
    assert _module().main(["--device", "cpu", "--samples", "2", "--batches", "1", "--window", "0.01",
                           "--min-runs", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    _check(report, [1])
    energy = report["rows"][0]["graphs"]["baked"]
    assert energy["energy_mj_per_inference"] is None and energy["energy_reason"]  # no sensor: null, with why


@pytest.mark.device
def test_device_check_on_a_gpu(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "dc.json"
    assert _module().main(["--samples", "4", "--batches", "1", "--window", "0.2", "--out", str(out)]) == 0
    _check(json.loads(out.read_text()), [1])
