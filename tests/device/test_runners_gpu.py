"""Runners and the profiler on a real GPU: the unit tests of edgebnn.targets.runners/profiler, on hardware.

torch CUDA tests skip without a CUDA device; TensorRT tests skip without the ``tensorrt`` package or
when TensorRT cannot start a builder (no CUDA device). The ORT CUDA test skips without onnxruntime-gpu.
"""

from __future__ import annotations

import platform

import numpy as np
import onnxruntime as ort
import pytest
from synthetic import INPUT_SHAPE, synthetic_cnn

from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import float_deterministic, save_onnx
from edgebnn.exporters.export import export_model
from edgebnn.targets import CompileOptions, get_target
from edgebnn.targets.runners import OrtRunner, TorchRunner

pytestmark = pytest.mark.device

# fp32 on the GPU (TF32 off for these tiny layers; cuDNN/TensorRT may reorder sums): a few ulps of O(1)
# probabilities after a few hundred multiply-adds.
ATOL = 1e-4


def _x(batch: int = 2) -> np.ndarray:
    return np.random.default_rng(0).random((batch, *INPUT_SHAPE[1:]), dtype=np.float32)


@pytest.fixture(scope="module")
def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


@pytest.fixture(scope="module")
def trt_device():
    trt = pytest.importorskip("tensorrt")
    try:
        builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    except (TypeError, RuntimeError) as e:
        pytest.skip(f"TensorRT is installed but no CUDA device is usable: {e}")
    if builder is None:
        pytest.skip("TensorRT is installed but no CUDA device is usable")
    return "jetson" if platform.machine() == "aarch64" else "rtx"


@pytest.mark.parametrize("mode", ["baked", "analytic"])
def test_torch_cuda_matches_onnxruntime_cpu(cuda_torch, mode):
    graph = export_model(synthetic_cnn(), ExportConfig(4, mode=mode, rng="host")).proto
    want = OrtRunner(graph, threads=1).run(_x())
    runner = TorchRunner(graph, device="cuda")
    for got, ref in zip(runner.run(_x()), want, strict=True):
        np.testing.assert_allclose(got, ref, atol=ATOL)
    out = runner.bind(_x())()
    assert out[0].is_cuda  # outputs stay on the device; the call returned after synchronize


def test_ort_cuda_provider(cuda_torch):
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu not installed")
    graph = float_deterministic(synthetic_cnn())
    runner = OrtRunner(graph, provider="cuda")
    assert runner.provider == "CUDAExecutionProvider"
    np.testing.assert_allclose(runner.run(_x())[0], OrtRunner(graph).run(_x())[0], atol=ATOL)
    runner.bind(_x())()


def test_tensorrt_runner_matches_onnxruntime(trt_device, cuda_torch, tmp_path):
    from edgebnn.exporters.tensorrt import BuildOptions, build_engine
    from edgebnn.targets.runners import TensorRTRunner

    graph = export_model(synthetic_cnn(), ExportConfig(4, mode="baked")).proto
    onnx_path = save_onnx(graph, tmp_path / "ens.onnx")
    build_engine(onnx_path, tmp_path / "ens.engine", trt_device, BuildOptions(workspace_mib=256, max_batch=2))
    runner = TensorRTRunner(tmp_path / "ens.engine", trt_device)
    want = OrtRunner(graph, threads=1).run(_x())
    got = runner.run(_x())
    assert runner.output_names == ["probs", "entropy", "mutual_info"]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL)


@pytest.mark.parametrize("runtime", ["torch", "tensorrt"])
def test_gpu_target_compiles_for_its_runtimes(cuda_torch, runtime, tmp_path, request):
    device = request.getfixturevalue("trt_device") if runtime == "tensorrt" else "rtx"
    graph = export_model(synthetic_cnn(), ExportConfig(4, mode="baked")).proto
    exe = get_target(device).compile(graph, runtime=runtime, options=CompileOptions(workdir=tmp_path, max_batch=2))
    assert exe.name == runtime and exe.meta["mode"] == "baked"
    for got, want in zip(exe.run(_x()), OrtRunner(graph, threads=1).run(_x()), strict=True):
        np.testing.assert_allclose(got, want, atol=ATOL)


def test_profile_on_the_gpu(trt_device, cuda_torch):
    from edgebnn.targets.profiler import profile

    model = synthetic_cnn()
    report = profile(model, export_model(model, ExportConfig(4, mode="baked")).proto, device=trt_device, samples=4,
                     runs=20, warmup=5)
    assert report["runner"] == "tensorrt" and report["mode"] == "baked"
    assert report["baselines"]["float_deterministic"]["runner"] == "tensorrt"
    assert report["baselines"]["float_bnn"]["runner"] == "torch"
    # energy: a number from a sensor, or null with the reason; never both missing
    for row in (report, *report["baselines"].values()):
        assert row["energy_mj_per_inference"] is not None or row["energy_reason"]
