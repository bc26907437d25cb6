"""Runners on the CPU: onnxruntime, the torch interpreter, and the TensorRT runner against a fake ``tensorrt``."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from synthetic import INPUT_SHAPE, synthetic_cnn

from edgebnn.errors import InvalidArtifactError, InvalidOptionError, MissingDependencyError, UnsupportedLayerError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import float_deterministic, save_onnx
from edgebnn.exporters.export import export_model
from edgebnn.exporters.tensorrt import BuildOptions, build_engine, manifest_path
from edgebnn.targets.runners import OrtRunner, TensorRTRunner, TorchRunner

torch = pytest.importorskip("torch")

# float32 results of the same graph in two runtimes differ by summation order only: a few ulps of values
# of order 1 after at most a few hundred multiply-adds.
ATOL = 1e-5


def _x(batch: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, *INPUT_SHAPE[1:]), dtype=np.float32)


# -- onnxruntime ------------------------------------------------------------------------------------------


def test_ort_runner_run_and_bind_agree():
    runner = OrtRunner(float_deterministic(synthetic_cnn()), threads=1)
    x = _x()
    (probs,) = runner.run(x)
    (again,) = runner.bind(x)()
    assert probs.shape == (3, 3) and np.array_equal(probs, again)
    assert runner.name == "onnxruntime" and runner.provider == "CPUExecutionProvider"
    assert np.array_equal(runner.run({"input": x})[0], probs)


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="onnxruntime-gpu present")
def test_ort_cuda_without_gpu_build_names_what_to_install():
    with pytest.raises(MissingDependencyError, match="onnxruntime-gpu"):
        OrtRunner(float_deterministic(synthetic_cnn()), provider="cuda")


# -- torch ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("graph", ["float_deterministic", "baked", "analytic"])
def test_torch_runner_matches_onnxruntime(graph):
    model = synthetic_cnn()
    proto = {
        "float_deterministic": lambda: float_deterministic(model),
        "baked": lambda: export_model(model, ExportConfig(4, mode="baked")).proto,
        "analytic": lambda: export_model(model, ExportConfig(4, mode="analytic")).proto,  # MaxPool indices + Gather
    }[graph]()
    x = _x(5)
    want = OrtRunner(proto, threads=1).run(x)
    runner = TorchRunner(proto)
    got = runner.run(x)
    assert runner.name == "torch" and runner.provider == "cpu"
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL)
    bound = runner.bind(x)()
    np.testing.assert_allclose(bound[0].numpy(), want[0], atol=ATOL)


def test_torch_runner_names_an_unsupported_op():
    graph = helper.make_graph(
        [helper.make_node("Hardmax", ["x"], ["y"], name="hm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    with pytest.raises(UnsupportedLayerError, match=r"node hm \(Hardmax\): op Hardmax is not supported"):
        TorchRunner(helper.make_model(graph))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_torch_cuda_without_gpu_is_a_missing_dependency():
    with pytest.raises(MissingDependencyError, match="CUDA build of PyTorch"):
        TorchRunner(float_deterministic(synthetic_cnn()), device="cuda")


# -- TensorRT with a fake tensorrt module -----------------------------------------------------------------


class HostMemory:
    """The runner's device-memory interface on host numpy buffers (addresses are the arrays' data pointers)."""

    stream_handle = 1234

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}
        self.syncs = 0

    def _keep(self, arr: np.ndarray) -> np.ndarray:
        self.buffers[arr.ctypes.data] = arr
        return arr

    def upload(self, arr: np.ndarray) -> np.ndarray:
        return self._keep(np.array(arr, copy=True))

    def empty(self, shape, dtype) -> np.ndarray:
        return self._keep(np.zeros(shape, dtype))

    def address(self, buf: np.ndarray) -> int:
        return buf.ctypes.data

    def download(self, buf: np.ndarray) -> np.ndarray:
        return buf.copy()

    def synchronize(self) -> None:
        self.syncs += 1


def fake_tensorrt(version: str, calls: list[str], memory: HostMemory, *, deserializes: bool = True):
    """A ``tensorrt`` module whose engine computes probs = softmax(x @ W) for the test graph's W."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    trt.DataType = types.SimpleNamespace(FLOAT="FLOAT")
    trt.nptype = lambda dtype: {"FLOAT": np.float32}[dtype]

    class Logger:
        WARNING = "WARNING"

        def __init__(self, severity):
            calls.append(f"Logger({severity})")

    class Context:
        def __init__(self):
            self.shapes, self.addresses = {}, {}

        def set_input_shape(self, name, shape):
            calls.append(f"set_input_shape({name}, {tuple(shape)})")
            self.shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name):
            calls.append(f"get_tensor_shape({name})")
            assert "x" in self.shapes, "output shape asked before the input shape was set"
            return (self.shapes["x"][0], 4)

        def set_tensor_address(self, name, address):
            calls.append(f"set_tensor_address({name})")
            self.addresses[name] = address

        def execute_async_v3(self, stream):
            calls.append(f"execute_async_v3({stream})")
            x = memory.buffers[self.addresses["x"]]
            logits = x @ W
            e = np.exp(logits - logits.max(-1, keepdims=True))
            memory.buffers[self.addresses["probs"]][...] = e / e.sum(-1, keepdims=True)
            return True

    class Engine:
        num_io_tensors = 2

        def get_tensor_name(self, i):
            return ["x", "probs"][i]

        def get_tensor_mode(self, name):
            return trt.TensorIOMode.INPUT if name == "x" else trt.TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name):
            return trt.DataType.FLOAT

        def create_execution_context(self):
            calls.append("create_execution_context")
            return Context()

    class Runtime:
        def __init__(self, logger):
            calls.append("Runtime")

        def deserialize_cuda_engine(self, data):
            calls.append(f"deserialize_cuda_engine({len(data)} bytes)")
            return Engine() if deserializes else None

    trt.Logger, trt.Runtime = Logger, Runtime
    return trt


W = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)


def write_engine(tmp_path: Path, *, device: str = "jetson", version: str = "10.8.0", batch: int | str = 1) -> Path:
    """An 'engine' (opaque bytes) with the manifest a real build would write next to it."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["probs"], axis=-1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 4])],
        [numpy_helper.from_array(W, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx_path = tmp_path / "m.onnx"
    save_onnx(model, onnx_path)
    engine = tmp_path / "m.engine"
    build_engine(onnx_path, engine, device, BuildOptions(dry_run=True, max_batch=4))
    blob = b"serialized engine " + device.encode()
    engine.write_bytes(blob)
    manifest = json.loads(manifest_path(engine).read_text())
    manifest.update(dry_run=False, tensorrt_version=version, engine_sha256=hashlib.sha256(blob).hexdigest(),
                    engine_bytes=len(blob))
    manifest_path(engine).write_text(json.dumps(manifest))
    return engine


@pytest.fixture
def trt_env(monkeypatch):
    calls: list[str] = []
    memory = HostMemory()

    def install(version: str = "10.8.0", **kw):
        monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version, calls, memory, **kw))

    return install, calls, memory


def test_tensorrt_runner_call_sequence_and_outputs(tmp_path, trt_env):
    install, calls, memory = trt_env
    install()
    engine = write_engine(tmp_path)
    runner = TensorRTRunner(engine, "jetson", memory=memory)
    assert runner.input_names == ["x"] and runner.output_names == ["probs"]
    assert runner.provider == "TensorRT 10.8.0 (GPU)"
    x = np.random.default_rng(1).random((1, 8), dtype=np.float32)
    (probs,) = runner.run(x)
    e = np.exp(x @ W - (x @ W).max(-1, keepdims=True))
    np.testing.assert_allclose(probs, e / e.sum(-1, keepdims=True), rtol=1e-6)
    assert calls == [
        "Logger(WARNING)", "Runtime", f"deserialize_cuda_engine({engine.stat().st_size} bytes)",
        "create_execution_context",
        "set_input_shape(x, (1, 8))", "set_tensor_address(x)",
        "get_tensor_shape(probs)", "set_tensor_address(probs)",
        "execute_async_v3(1234)",
    ]
    # bind stages once; each call only executes and synchronizes
    calls.clear()
    call = runner.bind(x)
    syncs = memory.syncs
    call()
    call()
    assert calls.count("execute_async_v3(1234)") == 2 and calls.count("set_input_shape(x, (1, 8))") == 1
    assert memory.syncs == syncs + 2


def test_tensorrt_runner_refuses_an_engine_of_another_tensorrt_version(tmp_path, trt_env):
    install, calls, memory = trt_env
    install("10.9.0")
    engine = write_engine(tmp_path, version="10.8.0")
    with pytest.raises(InvalidArtifactError, match=r"built with TensorRT 10\.8\.0, installed is 10\.9\.0; engines do "
                                                   r"not carry across TensorRT versions, rebuild it"):
        TensorRTRunner(engine, "jetson", memory=memory)
    assert "Runtime" not in calls  # refused from the manifest, before TensorRT touched the engine


def test_tensorrt_runner_refuses_an_engine_for_another_device(tmp_path, trt_env):
    install, _, memory = trt_env
    install()
    engine = write_engine(tmp_path, device="jetson-agx-orin")
    with pytest.raises(InvalidArtifactError,
                       match="built for jetson-agx-orin, not jetson-orin-nano: profile it with --device "
                             "jetson-agx-orin"):
        TensorRTRunner(engine, "jetson", memory=memory)


def test_tensorrt_runner_engine_tensorrt_cannot_deserialize(tmp_path, trt_env):
    install, _, memory = trt_env
    install(deserializes=False)
    engine = write_engine(tmp_path)
    with pytest.raises(InvalidArtifactError, match="cannot deserialize this engine"):
        TensorRTRunner(engine, "jetson", memory=memory)


def test_tensorrt_runner_engine_tampered_or_without_manifest(tmp_path, trt_env):
    install, _, memory = trt_env
    install()
    engine = write_engine(tmp_path)
    engine.write_bytes(b"something else")
    with pytest.raises(InvalidArtifactError, match="does not match its manifest"):
        TensorRTRunner(engine, "jetson", memory=memory)
    manifest_path(engine).unlink()
    with pytest.raises(InvalidArtifactError, match=r"no build manifest m\.engine\.manifest\.json"):
        TensorRTRunner(engine, "jetson", memory=memory)


def test_tensorrt_runner_batch_outside_the_engine_profile(tmp_path, trt_env):
    install, _, memory = trt_env
    install()
    static = TensorRTRunner(write_engine(tmp_path), "jetson", memory=memory)
    with pytest.raises(InvalidOptionError, match=r"static shape \(1, 8\), got \(2, 8\); rebuild with --max-batch 2"):
        static.run(np.zeros((2, 8), np.float32))
    (tmp_path / "dyn").mkdir()
    dynamic = TensorRTRunner(write_engine(tmp_path / "dyn", batch="batch"), "jetson", memory=memory)
    assert dynamic.run(np.zeros((4, 8), np.float32))[0].shape == (4, 4)
    with pytest.raises(InvalidOptionError, match=r"outside the engine's profile \[1, 8\]\.\.\[4, 8\]"):
        dynamic.run(np.zeros((5, 8), np.float32))


def test_profile_on_a_jetson_without_tensorrt_says_what_works(tmp_path, monkeypatch):
    """No machine but the board builds or runs a Jetson engine: the line gives the dry run's trtexec command, then
    profile --engine on the board, or --remote; never an x86 pip install."""
    from click.testing import CliRunner

    from edgebnn import ir
    from edgebnn.cli import main
    from edgebnn.targets import get_target

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    ir.save(synthetic_cnn(), tmp_path / "m.ebnn")
    ran = CliRunner().invoke(main, ["profile", str(tmp_path / "m.ebnn"), "--device", "jetson-orin-nano", "--runs", "2"])
    line = " ".join(ran.output.split())
    assert ran.exit_code == 2 and line.startswith("error: no TensorRT here to build a jetson-orin-nano engine"), line
    for needed in ("--dry-run -o model.engine", "model.engine.trtexec.txt on the board",
                   "--device jetson-orin-nano --engine model.engine there", "--remote USER@BOARD"):
        assert needed in line, (needed, line)
    assert "x86" not in line and "pip install" not in line
    with pytest.raises(MissingDependencyError, match=r"^no TensorRT here to run a jetson-orin-nano engine: it runs on "
                                                     r"the board: edgebnn profile MODEL.ebnn --device jetson-orin-nano "
                                                     r"--engine model.engine there .*--remote USER@BOARD$"):
        get_target("jetson").load(write_engine(tmp_path))


def test_tensorrt_runner_without_tensorrt(tmp_path, monkeypatch):
    engine = write_engine(tmp_path)
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    with pytest.raises(MissingDependencyError, match="JetPack"):
        TensorRTRunner(engine, "jetson")
