"""Runners execute one exported graph on one batch. The profiler times them; they only run.

Every runner has the same surface:

* ``name`` (``onnxruntime``, ``torch``, ``tensorrt``) and ``provider`` (what executes it, e.g.
  ``CPUExecutionProvider``, ``cuda:0``, ``TensorRT 10.3.0``);
* ``run(x)`` — host arrays in, host arrays out (outputs in graph order), for checks and tests. ``x`` is
  the one input array, or a ``{name: array}`` feed;
* ``bind(x)`` — stages the inputs where the runner computes (device memory for CUDA/TensorRT) and returns
  a zero-argument call that runs one inference and returns when it has *finished* (CUDA work is
  synchronized); outputs stay where they were computed. This is what the profiler times, so the figures
  are compute time without host<->device copies (trtexec's ``--noDataTransfers``).

``SessionRunner``: an edgebnn ensemble through :class:`edgebnn.runtime.Session` on the CPU, so a ``noise``
graph gets its noise drawn on the host inside every call, as a user's ``Session.predict`` does.

``OrtRunner``: onnxruntime with the benchmark settings of docs/design.md (``intra_op_num_threads``, no
spinning, ``ORT_ENABLE_ALL``); the CUDA provider when asked for (``onnxruntime-gpu`` needed).

``TorchRunner``: runs an ONNX graph with torch ops, on CPU or CUDA, through the small interpreter of
:mod:`edgebnn.targets.torch_interp` (why an interpreter, and its instruction set, are explained there).

``TensorRTRunner``: a serialized engine, after :func:`edgebnn.exporters.tensorrt.check_engine` has
compared its build manifest with the installed TensorRT and the device. ``tensorrt`` is imported lazily;
device memory is torch CUDA tensors (torch is edgebnn's optional dependency anyway and NVIDIA ships CUDA
builds for Jetson; cuda-python or pycuda would be one more package to install on the board). The
sequence: ``trt.Runtime(logger).deserialize_cuda_engine`` → ``create_execution_context`` → per input
``set_input_shape`` + ``set_tensor_address`` → output buffers sized by ``context.get_tensor_shape`` →
``set_tensor_address`` → ``execute_async_v3(stream)`` → stream synchronize.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import onnxruntime as ort

from edgebnn.errors import EdgeBNNError, InvalidArtifactError, InvalidOptionError, MissingDependencyError
from edgebnn.exporters.metadata import external_data_folder
from edgebnn.metrics import Predictive
from edgebnn.runtime._ort import external_data_options, ort_errors
from edgebnn.targets.torch_interp import TorchProgram, import_torch

Feed = np.ndarray | Mapping[str, np.ndarray]


class Runner(Protocol):
    """The surface every runner has (see the module docstring)."""

    name: str
    provider: str
    input_names: list[str]

    def run(self, x: Feed) -> list[np.ndarray]:
        """Host arrays in, host arrays out, outputs in graph order."""
        ...

    def bind(self, x: Feed) -> Callable[[], Any]:
        """Stage the inputs; return a call that runs one inference and returns when it has finished."""
        ...


def _feed(names: Sequence[str], x: Feed, where: str) -> dict[str, np.ndarray]:
    if isinstance(x, Mapping):
        missing = [n for n in names if n not in x]
        if missing:
            raise InvalidOptionError(f"{where}: missing input(s) {', '.join(missing)}")
        return {n: np.ascontiguousarray(x[n]) for n in names}
    if len(names) != 1:
        raise InvalidOptionError(f"{where}: takes inputs {', '.join(names)}; pass a dict")
    return {names[0]: np.ascontiguousarray(x)}


# -- onnxruntime ------------------------------------------------------------------------------------------


class OrtRunner:
    """onnxruntime on the CPU, or with the CUDA provider (``provider="cuda"``)."""

    name = "onnxruntime"

    def __init__(self, model: onnx.ModelProto | bytes, *, threads: int = 2, provider: str = "cpu",
                 where: str | None = None) -> None:
        # how failures name the graph: ``where``, else the graph's own name
        self.where = where or (model.graph.name if isinstance(model, onnx.ModelProto) and model.graph.name
                               else "<onnx graph>")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        if provider == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise MissingDependencyError(
                    "the onnxruntime CUDA runner needs onnxruntime-gpu (pip install onnxruntime-gpu; on Jetson the "
                    "JetPack wheel) and a CUDA device"
                )
            providers = ["CUDAExecutionProvider", *providers]
        elif provider != "cpu":
            raise InvalidOptionError(f"onnxruntime provider {provider!r}: choose cpu or cuda")
        if isinstance(model, onnx.ModelProto):
            external_data_options(opts, model, where)
        data = model if isinstance(model, bytes) else model.SerializeToString()
        with ort_errors(self.where):
            self.session = ort.InferenceSession(data, opts, providers=providers)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.input_name = self.input_names[0]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.provider = self.session.get_providers()[0]
        self.device = "cuda" if self.provider == "CUDAExecutionProvider" else "cpu"

    def run(self, x: Feed) -> list[np.ndarray]:
        with ort_errors(self.where):
            return self.session.run(None, _feed(self.input_names, x, "onnxruntime"))

    def bind(self, x: Feed) -> Callable[[], Any]:
        feed = _feed(self.input_names, x, "onnxruntime")
        if self.device == "cpu":
            def run() -> Any:
                with ort_errors(self.where):
                    return self.session.run(None, feed)

            return run
        binding = self.session.io_binding()
        for name, arr in feed.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr, "cuda", 0))
        for name in self.output_names:
            binding.bind_output(name, "cuda")

        def call() -> None:
            with ort_errors(self.where):
                self.session.run_with_iobinding(binding)  # returns after the CUDA provider synchronized

        return call


class SessionRunner:
    """An edgebnn-exported ensemble through :class:`edgebnn.runtime.Session` on the CPU.

    Args:
        model: The ensemble, with its export metadata.
        threads: onnxruntime intra-op threads.

    Raises:
        InvalidArtifactError: Not an edgebnn ensemble.
    """

    name = "onnxruntime"
    provider = "CPUExecutionProvider"

    def __init__(self, model: onnx.ModelProto, *, threads: int = 2, where: str | None = None) -> None:
        from edgebnn.runtime import Session

        external = where is not None and external_data_folder(model, where) is not None
        self.session = Session(where if where is not None and external else model, threads=threads)  # by its file
        if where is not None:  # how runtime failures name the artifact
            self.session.where = where
        self.input_names = [self.session.input_name]

    def _input(self, x: Feed) -> np.ndarray:
        return _feed(self.input_names, x, "onnxruntime")[self.input_names[0]]

    def run(self, x: Feed) -> list[np.ndarray]:
        p = self.session.predict(self._input(x))
        outs = [getattr(p, name) for name in self.session.task.outputs]  # the predictive's fields: the outputs
        return [*outs, *([p.samples] if isinstance(p, Predictive) and p.samples is not None else [])]

    def bind(self, x: Feed) -> Callable[[], Any]:
        arr = self._input(x)
        return lambda: self.session.predict(arr)  # draws a noise graph's noise inside the call


# -- torch ------------------------------------------------------------------------------------------------



class TorchRunner:
    """Runs an ONNX graph (a float baseline, or an ensemble) with torch on ``device`` (``cpu``, ``cuda``, ``cuda:N``).

    Args:
        model: The ONNX graph; every op must be in :data:`~edgebnn.targets.torch_interp.TORCH_OPS`.
        device: torch device.
        threads: torch intra-op threads on the CPU (0: leave torch's setting).
    """

    name = "torch"

    def __init__(self, model: onnx.ModelProto, *, device: str = "cpu", threads: int = 0) -> None:
        torch = self.torch = import_torch()
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise MissingDependencyError(
                "the torch CUDA runner needs a CUDA build of PyTorch and a GPU (torch.cuda.is_available() is False; "
                "on Jetson install NVIDIA's JetPack wheel)"
            )
        try:
            self.device = torch.device(device)
        except RuntimeError as e:
            raise InvalidOptionError(f"torch device {device!r}: {e}") from e
        if self.device.type == "cpu" and threads:
            torch.set_num_threads(threads)
        self.cuda = self.device.type == "cuda"
        self.provider = str(self.device)
        self.program = TorchProgram(torch, model, self.device)
        self.input_names = self.program.input_names
        self.output_names = self.program.output_names

    def _stage(self, x: Feed) -> dict[str, Any]:
        return {k: self.torch.from_numpy(v).to(self.device) for k, v in _feed(self.input_names, x, "torch").items()}

    def run(self, x: Feed) -> list[np.ndarray]:
        with self.torch.inference_mode():
            outs = self.program(self._stage(x))
            return [o.detach().cpu().numpy() for o in outs]

    def bind(self, x: Feed) -> Callable[[], Any]:
        feed = self._stage(x)
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize(self.device)

        def call() -> Any:
            with torch.inference_mode():
                out = self.program(feed)
            if self.cuda:
                torch.cuda.synchronize(self.device)  # the timed call ends when the GPU has finished
            return out

        return call


# -- TensorRT ---------------------------------------------------------------------------------------------


def import_tensorrt(device: str = "jetson") -> Any:
    """The TensorRT module that builds and runs ``device``'s engines (``tensorrt_rtx`` for rtx, ``tensorrt`` on
    Jetson), or MissingDependencyError saying how to install it."""
    from edgebnn.devices import get_device
    from edgebnn.exporters.tensorrt import import_builder

    return import_builder(get_device(device))


ENGINE_NEEDS = ("an NVIDIA GPU with its driver, the engine's TensorRT (rtx: tensorrt_rtx, the same version that "
                "built it; Jetson: JetPack's tensorrt) and a CUDA build of PyTorch, in which the runner keeps its "
                "buffers (on Jetson, NVIDIA's JetPack wheel)")
"""What ``profile --engine`` needs to run an engine (README "Commands"; building one needs no GPU on rtx)."""


def _no_cuda(torch: Any) -> str:
    if getattr(torch.version, "cuda", None) is None:
        return f"torch {torch.__version__} is a CPU build"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"


class TorchCudaMemory:
    """Device buffers for the TensorRT runner: torch CUDA tensors on a dedicated stream."""

    def __init__(self, device: int = 0) -> None:
        torch = self.torch = import_torch()
        if not torch.cuda.is_available():
            raise MissingDependencyError(f"running a TensorRT engine needs {ENGINE_NEEDS}; here {_no_cuda(torch)}")
        self.device = torch.device("cuda", device)
        self.stream = torch.cuda.Stream(self.device)
        self.stream_handle = self.stream.cuda_stream

    def upload(self, arr: np.ndarray) -> Any:
        with self.torch.cuda.stream(self.stream):
            return self.torch.from_numpy(np.ascontiguousarray(arr)).to(self.device, non_blocking=False)

    def empty(self, shape: Sequence[int], dtype: np.dtype) -> Any:
        t = self.torch.from_numpy(np.empty(0, dtype)).dtype
        return self.torch.empty(tuple(shape), dtype=t, device=self.device)

    def address(self, buf: Any) -> int:
        return int(buf.data_ptr())

    def download(self, buf: Any) -> np.ndarray:
        return buf.cpu().numpy()

    def synchronize(self) -> None:
        self.stream.synchronize()


class TensorRTRunner:
    """A TensorRT engine built by ``edgebnn export --target tensorrt``, checked against its manifest first.

    Args:
        engine_path: The engine; ``<engine>.manifest.json`` must sit beside it.
        device: Device profile it is about to run on (``rtx``, ``jetson``, ...): an engine built for another
            device is refused. None skips that check.
        memory: Device-buffer backend (default :class:`TorchCudaMemory`); tests pass a host-memory fake.

    Raises:
        MissingDependencyError: No ``tensorrt`` package, or no CUDA build of torch.
        InvalidArtifactError: The engine does not match its manifest, the installed TensorRT version or the
            device, or TensorRT cannot deserialize it.
    """

    name = "tensorrt"

    def __init__(self, engine_path: str | Path, device: str | None = None, *, memory: Any = None) -> None:
        from edgebnn.exporters.tensorrt import check_engine

        self.engine_path = Path(engine_path)
        self.manifest = check_engine(self.engine_path, device)
        trt = self.trt = import_tensorrt(self.manifest["device"])
        self.memory = memory if memory is not None else TorchCudaMemory()
        self.provider = f"TensorRT {trt.__version__} ({self.manifest.get('default_device_type', 'GPU')})"
        logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(logger)
        self.engine = self.runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
        if self.engine is None:
            raise InvalidArtifactError(
                f"{self.engine_path}: TensorRT {trt.__version__} cannot deserialize this engine (built for another "
                "TensorRT version or GPU?); rebuild it on this machine"
            )
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise EdgeBNNError(f"{self.engine_path}: TensorRT could not create an execution context (out of memory?)")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if n not in self.input_names]

    def _check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        profile = (self.manifest.get("shape_profile") or {}).get(name)
        declared = next((i.get("shape") for i in self.manifest.get("inputs", []) if i.get("name") == name), None)
        if profile is not None:
            lo, hi = profile["min"], profile["max"]
            if len(shape) != len(lo) or any(not a <= s <= b for s, a, b in zip(shape, lo, hi, strict=True)):
                raise InvalidOptionError(f"{self.engine_path}: input {name} shape {shape} is outside the engine's "
                                         f"profile {lo}..{hi}; rebuild with --max-batch {shape[0]}")
        elif declared is not None and all(isinstance(d, int) for d in declared) and tuple(declared) != shape:
            raise InvalidOptionError(f"{self.engine_path}: input {name} has static shape {tuple(declared)}, "
                                     f"got {shape}; rebuild with --max-batch {shape[0]}")

    def _stage(self, x: Feed) -> tuple[dict[str, Any], dict[str, Any]]:
        trt, mem, ctx = self.trt, self.memory, self.context
        inputs = {}
        for name, arr in _feed(self.input_names, x, str(self.engine_path)).items():
            want = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
            self._check_shape(name, tuple(arr.shape))
            buf = mem.upload(arr.astype(want, copy=False))
            if not ctx.set_input_shape(name, tuple(arr.shape)):
                raise InvalidOptionError(f"{self.engine_path}: TensorRT refused shape {tuple(arr.shape)} for {name}")
            ctx.set_tensor_address(name, mem.address(buf))
            inputs[name] = buf
        outputs = {}
        for name in self.output_names:
            shape = tuple(ctx.get_tensor_shape(name))
            outputs[name] = mem.empty(shape, np.dtype(trt.nptype(self.engine.get_tensor_dtype(name))))
            ctx.set_tensor_address(name, mem.address(outputs[name]))
        mem.synchronize()
        return inputs, outputs

    def _execute(self) -> None:
        if not self.context.execute_async_v3(self.memory.stream_handle):
            raise EdgeBNNError(f"{self.engine_path}: TensorRT execution failed")
        self.memory.synchronize()

    def run(self, x: Feed) -> list[np.ndarray]:
        _inputs, outputs = self._stage(x)
        self._execute()
        return [self.memory.download(outputs[name]) for name in self.output_names]

    def bind(self, x: Feed) -> Callable[[], Any]:
        staged = self._stage(x)  # keeps the buffers alive as long as the call

        def call() -> Any:
            self._execute()
            return staged

        return call
