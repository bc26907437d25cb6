"""The profiler: report keys, default modes, GPU wiring (with fakes), and --remote over fake ssh/scp."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from profile_checks import check_report
from synthetic import synthetic_cnn

from edgebnn.errors import InvalidOptionError, MissingDependencyError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import save_onnx
from edgebnn.exporters.export import export_model
from edgebnn.exporters.tensorrt import MANIFEST_FORMAT
from edgebnn.targets import gpu
from edgebnn.targets.base import CompileOptions
from edgebnn.targets.cpu import fastest_mode_in
from edgebnn.targets.profiler import plot_profile, profile
from edgebnn.targets.registry import get_target
from edgebnn.targets.runners import OrtRunner

QUICK = {"runs": 3, "warmup": 1, "power_meter": "none"}


@pytest.mark.parametrize("baseline_runner", ["auto", "torch"])
def test_cpu_profile_report(baseline_runner):
    if baseline_runner == "torch":
        pytest.importorskip("torch")
    model = synthetic_cnn()
    report = profile(model, export_model(model, ExportConfig(4, mode="baked")).proto, samples=4,
                     baseline_runner=baseline_runner, **QUICK)
    check_report(report, "cpu")
    assert report["runner"] == "onnxruntime" and report["mode"] == "baked"
    want = "torch" if baseline_runner == "torch" else "onnxruntime"
    assert {r["runner"] for r in report["baselines"].values()} == {want}
    assert report["ratios"]["speedup_vs_float_bnn"] > 0


def test_plot_profile_writes_png(tmp_path):
    model = synthetic_cnn()
    report = profile(model, export_model(model, ExportConfig(2, mode="baked")).proto, samples=2, **QUICK)
    plot_profile(report, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_engine_is_for_gpu_targets_only(tmp_path):
    model = synthetic_cnn()
    with pytest.raises(InvalidOptionError, match="runs on rtx or jetson, not the cpu"):
        profile(model, export_model(model, ExportConfig(2, mode="baked")).proto, samples=2,
                engine=tmp_path / "m.engine", **QUICK)


@pytest.mark.parametrize(("device", "says"), [
    ("rtx", r"^TensorRT Python package not found: tensorrt_rtx; pip install"),
    ("jetson", r"^no TensorRT here to build a jetson-orin-nano engine, .* on the board, then edgebnn profile "),
])
def test_gpu_profile_without_tensorrt_says_what_to_do(monkeypatch, device, says):
    """rtx: what to install (TensorRT for RTX builds anywhere); a Jetson: what works, as only the board builds."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", None)
    model = synthetic_cnn()
    with pytest.raises(MissingDependencyError, match=says):
        profile(model, export_model(model, ExportConfig(2, mode="baked")).proto, device=device, samples=2, **QUICK)


# -- GPU wiring, with TensorRT replaced by onnxruntime -----------------------------------------------------


class FakeTensorRTRunner:
    """Stands in for TensorRTRunner: the fake 'engine' file holds the ONNX it was 'built' from."""

    name = "tensorrt"

    def __init__(self, engine_path, device):
        self.engine_path = Path(engine_path)
        self.inner = OrtRunner(self.engine_path.read_bytes(), threads=1)
        self.input_names = self.inner.input_names
        self.provider = f"fake TensorRT ({device})"

    def bind(self, x):
        return self.inner.bind(x)


@pytest.fixture
def fake_gpu(monkeypatch):
    built = []

    def build_engine(onnx_path, engine_path, device, options):
        built.append((Path(onnx_path).name, device, options.max_batch))
        Path(engine_path).write_bytes(Path(onnx_path).read_bytes())

    def no_torch_cuda(graph, **kw):
        raise MissingDependencyError("no CUDA build of torch here")

    monkeypatch.setattr(gpu, "import_tensorrt", lambda *a: None)
    monkeypatch.setattr("edgebnn.exporters.tensorrt.build_engine", build_engine)
    monkeypatch.setattr(gpu, "TensorRTRunner", FakeTensorRTRunner)
    # float_bnn: torch CUDA missing, so the target falls back to onnxruntime (CUDA provider -> the CPU here)
    monkeypatch.setattr(gpu, "TorchRunner", no_torch_cuda)
    monkeypatch.setattr(gpu, "OrtRunner", lambda graph, **kw: OrtRunner(graph, threads=1))
    return built


def test_gpu_profile_builds_ensemble_and_deterministic_engines(fake_gpu):
    model = synthetic_cnn()
    report = profile(model, export_model(model, ExportConfig(4, mode="baked")).proto, device="jetson", samples=4,
                     batch=2, **QUICK)
    check_report(report, "jetson-orin-nano")
    assert fake_gpu == [("ensemble.onnx", "jetson-orin-nano", 2), ("float_deterministic.onnx", "jetson-orin-nano", 2)]
    assert report["runner"] == "tensorrt" and report["mode"] == "baked"
    assert report["baselines"]["float_deterministic"]["runner"] == "tensorrt"
    # float_bnn redraws weights per pass: never a TensorRT engine (random ops ignore seeds there)
    assert report["baselines"]["float_bnn"]["runner"] == "onnxruntime"


def test_gpu_profile_of_a_given_engine_checks_its_samples(fake_gpu, tmp_path):
    model = synthetic_cnn()
    save_onnx(export_model(model, ExportConfig(8, mode="baked")).proto, tmp_path / "ens.onnx")
    engine = tmp_path / "ens.engine"
    engine.write_bytes((tmp_path / "ens.onnx").read_bytes())
    manifest = {"format": MANIFEST_FORMAT, "builder": None, "device": "rtx", "onnx": "ens.onnx",
                "engine_sha256": hashlib.sha256(engine.read_bytes()).hexdigest()}  # a build's manifest (no header)
    (tmp_path / "ens.engine.manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidOptionError, match=r"built from an S=8 ensemble .*pass --samples 8"):
        profile(model, None, device="rtx", engine=engine, samples=4, **QUICK)
    report = profile(model, None, device="rtx", engine=engine, samples=8, **QUICK)
    assert report["engine"] == str(engine) and report["mode"] == "baked" and fake_gpu == [
        ("float_deterministic.onnx", "rtx", 1)]


def test_gpu_profile_refuses_noise_graphs(fake_gpu):
    model = synthetic_cnn()
    with pytest.raises(InvalidOptionError, match="--mode noise on rtx: a noise graph takes host-drawn noise"):
        profile(model, export_model(model, ExportConfig(2, mode="noise", rng="host")).proto, device="rtx", samples=2,
                **QUICK)


def test_gpu_float_bnn_needs_torch_cuda_or_onnxruntime_gpu():
    torch = pytest.importorskip("torch")
    import onnxruntime as ort

    if torch.cuda.is_available() or "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("a CUDA runtime is present")
    from edgebnn.exporters.ensemble import float_bnn

    rtx = get_target("rtx")
    with pytest.raises(MissingDependencyError, match=r"float_bnn on rtx needs one of torch, onnxruntime: the torch "
                                                     r"CUDA runner needs a CUDA build of PyTorch .*onnxruntime-gpu"):
        rtx.compile(float_bnn(synthetic_cnn()), runtime=rtx.plan()["float_bnn"],
                    options=CompileOptions(name="float_bnn"))


# -- default mode -----------------------------------------------------------------------------------------


def test_default_mode_gpu_is_baked(tmp_path):
    mode, why = get_target("jetson-agx-orin").default_mode(bench_results=tmp_path / "none.json")
    assert mode == "baked" and "TensorRT ignores RNG seeds" in why


def _bench_cell(batch, samples, **p50):
    """One cell as bench/ensemble_latency.py writes it: models.<name>.cells[] with latency_ms per mode."""
    return {"batch": batch, "samples": samples, "latency_ms": {m: {"p50": v, "mean": v} for m, v in p50.items()}}


def test_default_mode_cpu_reads_bench_results(tmp_path):
    assert get_target("cpu").default_mode(samples=16)[0] == "baked"  # no --bench-results: baked, whatever the cwd holds
    path = tmp_path / "ensemble_latency.json"
    path.write_text(json.dumps({"schema": "edgebnn.bench.ensemble_latency/1", "models": {"lenet5": {"cells": [
        _bench_cell(1, 1, baked=0.06, noise=0.13, analytic=0.01, float_det=0.02),  # another S: analytic wins
        _bench_cell(1, 16, baked=0.30, noise=0.80, analytic=0.40),
        _bench_cell(32, 16, baked=5.0, noise=6.0, analytic=2.5),  # another batch
    ]}}, "goals": {"cell": {"batch": 1, "model": "lenet5", "samples": 16}}}))
    mode, why = get_target("cpu").default_mode(samples=16, batch=1, bench_results=path)
    assert mode == "baked" and "0.3 ms" in why
    assert get_target("cpu").default_mode(samples=16, batch=32, bench_results=path)[0] == "analytic"
    assert get_target("cpu").default_mode(samples=1, batch=1, bench_results=path)[0] == "analytic"
    (tmp_path / "flat.json").write_text(json.dumps({"baked": {"p50_ms": 2.0}, "noise": {"p50_ms": 1.0}}))
    assert fastest_mode_in(tmp_path / "flat.json") == ("noise", 1.0)


def test_default_mode_bad_bench_results(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InvalidOptionError, match="not a readable JSON file"):
        get_target("cpu").default_mode(bench_results=tmp_path / "bad.json")
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(InvalidOptionError, match="no CPU mode measurements"):
        get_target("cpu").default_mode(bench_results=tmp_path / "empty.json")
