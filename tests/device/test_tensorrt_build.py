"""Real TensorRT builds: the unit tests of edgebnn.exporters.tensorrt, on a machine with TensorRT and a GPU.

Skipped without the ``tensorrt`` package or without a CUDA device (``trt.Builder`` cannot start).
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
from synthetic import write_trt_model as write_model

from edgebnn.errors import InvalidArtifactError
from edgebnn.exporters.tensorrt import BuildOptions, build_engine, check_engine, trtexec_path

pytestmark = pytest.mark.device
trt = pytest.importorskip("tensorrt")


@pytest.fixture(scope="module")
def builder():
    try:
        b = trt.Builder(trt.Logger(trt.Logger.ERROR))
    except (TypeError, RuntimeError) as e:
        pytest.skip(f"TensorRT is installed but no CUDA device is usable: {e}")
    if b is None:
        pytest.skip("TensorRT is installed but no CUDA device is usable")
    return b


@pytest.fixture(scope="module")
def device(builder) -> str:
    return "jetson" if platform.machine() == "aarch64" else "rtx"


def io_shapes(engine_path: Path) -> dict[str, tuple[int, ...]]:
    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
    assert engine is not None
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    return {name: tuple(engine.get_tensor_shape(name)) for name in names}


def test_real_build_static(tmp_path: Path, device: str) -> None:
    engine = tmp_path / "m.engine"
    manifest = build_engine(write_model(tmp_path / "m.onnx"), engine, device, BuildOptions(workspace_mib=256))
    assert manifest["tensorrt_version"] == trt.__version__ and manifest["dry_run"] is False
    assert engine.stat().st_size == manifest["engine_bytes"] > 0
    assert trtexec_path(engine).is_file()
    assert check_engine(engine, device) == manifest
    assert io_shapes(engine) == {"x": (1, 8), "probs": (1, 4)}
    with pytest.raises(InvalidArtifactError, match=r"installed is 0\.0"):
        check_engine(engine, device, tensorrt_version="0.0")


def test_real_build_dynamic_batch_with_timing_cache(tmp_path: Path, device: str) -> None:
    onnx_path = write_model(tmp_path / "m.onnx", batch="N")
    cache = tmp_path / "timing.cache"
    engine = tmp_path / "m.engine"
    build_engine(onnx_path, engine, device, BuildOptions(timing_cache=cache, max_batch=4))
    assert cache.stat().st_size > 0
    build_engine(onnx_path, engine, device, BuildOptions(timing_cache=cache, max_batch=4))  # reloads the cache
    assert io_shapes(engine) == {"x": (-1, 8), "probs": (-1, 4)}


def test_real_build_stops_on_compat_errors(tmp_path: Path, device: str) -> None:
    with pytest.raises(InvalidArtifactError, match="not TensorRT-compatible"):
        build_engine(write_model(tmp_path / "m.onnx", random=True), tmp_path / "m.engine", device)
    assert not (tmp_path / "m.engine").exists()


def test_real_build_on_dla(tmp_path: Path, builder) -> None:
    if builder.num_DLA_cores == 0:
        pytest.skip("no DLA core on this machine")
    manifest = build_engine(write_model(tmp_path / "m.onnx"), tmp_path / "m.engine", "jetson-agx-orin",
                            BuildOptions(dla_core=0))
    assert manifest["flags"] == ["STRONGLY_TYPED", "GPU_FALLBACK"] and manifest["dla_core"] == 0
