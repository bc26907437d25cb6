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

``OrtRunner``: onnxruntime with the benchmark settings of docs/design.md (``intra_op_num_threads``, no
spinning, ``ORT_ENABLE_ALL``); the CUDA provider when asked for (``onnxruntime-gpu`` needed).

``TorchRunner``: runs an ONNX graph with torch ops, on CPU or CUDA, through a small interpreter
(:data:`TORCH_OPS`). Why an interpreter of the exported graph rather than the user's torch module: an
.ebnn carries no torch module, only the posterior graph; the interpreter runs the float baselines built
from that same IR (so the weights are exactly those the ensemble was built from), needs neither the
user's model code nor their BNN library on the device, and works for every importer. ``float_bnn`` in
torch draws fresh ``torch.randn`` weight noise on the device for each pass and computes
``w = mu + sigma * eps`` before each layer, which is what bayesian-torch's layers do. The cost: Python
dispatch per node, as in eager PyTorch. Ops outside the table raise :class:`UnsupportedLayerError`.

``TensorRTRunner``: a serialized engine, after :func:`edgebnn.exporters.tensorrt.check_engine` has
compared its build manifest with the installed TensorRT and the device. ``tensorrt`` is imported lazily;
device memory is torch CUDA tensors (torch is edgebnn's optional dependency anyway and NVIDIA ships CUDA
builds for Jetson; cuda-python or pycuda would be one more package to install on the board). The
sequence: ``trt.Runtime(logger).deserialize_cuda_engine`` → ``create_execution_context`` → per input
``set_input_shape`` + ``set_tensor_address`` → output buffers sized by ``context.get_tensor_shape`` →
``set_tensor_address`` → ``execute_async_v3(stream)`` → stream synchronize.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from edgebnn.errors import (
    EdgeBNNError,
    InvalidArtifactError,
    InvalidOptionError,
    MissingDependencyError,
    UnsupportedLayerError,
)

Feed = np.ndarray | Mapping[str, np.ndarray]


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

    def __init__(self, model: onnx.ModelProto | bytes, *, threads: int = 2, provider: str = "cpu") -> None:
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
        data = model if isinstance(model, bytes) else model.SerializeToString()
        self.session = ort.InferenceSession(data, opts, providers=providers)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.input_name = self.input_names[0]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.provider = self.session.get_providers()[0]
        self.device = "cuda" if self.provider == "CUDAExecutionProvider" else "cpu"

    def run(self, x: Feed) -> list[np.ndarray]:
        return self.session.run(None, _feed(self.input_names, x, "onnxruntime"))

    def bind(self, x: Feed) -> Callable[[], Any]:
        feed = _feed(self.input_names, x, "onnxruntime")
        if self.device == "cpu":
            return lambda: self.session.run(None, feed)
        binding = self.session.io_binding()
        for name, arr in feed.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr, "cuda", 0))
        for name in self.output_names:
            binding.bind_output(name, "cuda")

        def call() -> None:
            self.session.run_with_iobinding(binding)  # returns after the CUDA provider synchronized

        return call


# -- torch ------------------------------------------------------------------------------------------------


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise MissingDependencyError("the torch runner needs PyTorch: pip install 'edgebnn[torch]'") from e
    return torch


def _ints(v: Any) -> list[int]:
    return [int(i) for i in v.tolist()] if hasattr(v, "tolist") else [int(i) for i in v]


def _pads(attrs: dict[str, Any], where: str, rank: int) -> list[int]:
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise UnsupportedLayerError(f"{where}: auto_pad {attrs['auto_pad']!r} is not supported by the torch runner")
    pads = list(attrs.get("pads", [0] * (2 * rank)))
    begin, end = pads[:rank], pads[rank:]
    if begin != end:
        raise UnsupportedLayerError(f"{where}: asymmetric pads {pads} are not supported by the torch runner")
    return begin


def _conv(t: Any, a: dict[str, Any], where: str, x: Any, w: Any, b: Any = None) -> Any:
    rank = w.dim() - 2
    fn = {1: t.nn.functional.conv1d, 2: t.nn.functional.conv2d, 3: t.nn.functional.conv3d}[rank]
    return fn(x, w, b, stride=a.get("strides", 1), padding=_pads(a, where, rank), dilation=a.get("dilations", 1),
              groups=a.get("group", 1))


def _pool(kind: str) -> Callable[..., Any]:
    def pool(t: Any, a: dict[str, Any], where: str, x: Any) -> Any:
        rank = x.dim() - 2
        kernel = a["kernel_shape"]
        stride = a.get("strides", [1] * rank)
        pad = _pads(a, where, rank)
        ceil = bool(a.get("ceil_mode", 0))
        if kind == "max":
            fn = {1: t.nn.functional.max_pool1d, 2: t.nn.functional.max_pool2d, 3: t.nn.functional.max_pool3d}[rank]
            if a["_outputs"] == 1:
                return fn(x, kernel, stride, pad, a.get("dilations", 1), ceil_mode=ceil)
            if a.get("storage_order", 0):
                raise UnsupportedLayerError(f"{where}: MaxPool indices in column-major order are not supported")
            y, idx = fn(x, kernel, stride, pad, a.get("dilations", 1), ceil_mode=ceil, return_indices=True)
            # torch indexes within each (n, c) plane; ONNX flattens over the whole input tensor
            planes = t.arange(x.shape[0] * x.shape[1], device=x.device).reshape(x.shape[0], x.shape[1], *[1] * rank)
            return y, idx + planes * math.prod(x.shape[2:])
        fn = {1: t.nn.functional.avg_pool1d, 2: t.nn.functional.avg_pool2d, 3: t.nn.functional.avg_pool3d}[rank]
        return fn(x, kernel, stride, pad, ceil_mode=ceil, count_include_pad=bool(a.get("count_include_pad", 0)))

    return pool


def _gemm(t: Any, a: dict[str, Any], where: str, x: Any, w: Any, c: Any = None) -> Any:
    x = x.transpose(0, 1) if a.get("transA", 0) else x
    w = w.transpose(0, 1) if a.get("transB", 0) else w
    y = t.matmul(x, w) * a.get("alpha", 1.0)
    return y if c is None else y + c * a.get("beta", 1.0)


def _reshape(t: Any, a: dict[str, Any], where: str, x: Any, shape: Any) -> Any:
    dims = _ints(shape)
    if not a.get("allowzero", 0):
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _axes(a: dict[str, Any], axes: Any) -> list[int] | None:
    if axes is not None:
        return _ints(axes)
    return list(a["axes"]) if "axes" in a else None


def _reduce(op: str) -> Callable[..., Any]:
    def reduce(t: Any, a: dict[str, Any], where: str, x: Any, axes: Any = None) -> Any:
        dims = _axes(a, axes)
        keep = bool(a.get("keepdims", 1))
        if dims is None or not dims:
            if a.get("noop_with_empty_axes", 0):
                return x
            dims = list(range(x.dim()))
        return getattr(t, op)(x, dim=dims, keepdim=keep)

    return reduce


def _squeeze(t: Any, a: dict[str, Any], where: str, x: Any, axes: Any = None) -> Any:
    dims = _axes(a, axes)
    if dims is None:
        return x.squeeze()
    for d in sorted((d % x.dim() for d in dims), reverse=True):
        x = x.squeeze(d)
    return x


def _unsqueeze(t: Any, a: dict[str, Any], where: str, x: Any, axes: Any = None) -> Any:
    dims = _axes(a, axes) or []
    out_rank = x.dim() + len(dims)
    for d in sorted(d % out_rank for d in dims):
        x = x.unsqueeze(d)
    return x


def _shape(t: Any, a: dict[str, Any], where: str, x: Any) -> Any:
    dims = list(x.shape)
    start, end = a.get("start", 0), a.get("end", len(dims))
    return t.tensor(dims[start:end], dtype=t.int64)  # on the host: shape arithmetic never waits on the GPU


def _expand(t: Any, a: dict[str, Any], where: str, x: Any, shape: Any) -> Any:
    dims = _ints(shape)
    rank = max(len(dims), x.dim())
    dims = [1] * (rank - len(dims)) + dims
    have = [1] * (rank - x.dim()) + list(x.shape)
    return x.reshape(have).expand([max(d, h) for d, h in zip(dims, have, strict=True)])


def _flatten(t: Any, a: dict[str, Any], where: str, x: Any) -> Any:
    axis = a.get("axis", 1) % max(x.dim(), 1)
    return x.reshape(math.prod(x.shape[:axis]), -1)


def _batchnorm(t: Any, a: dict[str, Any], where: str, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    return t.nn.functional.batch_norm(x, mean, var, scale, bias, training=False, eps=a.get("epsilon", 1e-5))


def _random_normal(t: Any, a: dict[str, Any], where: str, like: Any = None) -> Any:
    shape = list(like.shape) if like is not None else list(a["shape"])
    device = like.device if like is not None else a["_device"]
    return t.randn(shape, device=device) * a.get("scale", 1.0) + a.get("mean", 0.0)


def _gather(t: Any, a: dict[str, Any], where: str, x: Any, idx: Any) -> Any:
    axis = a.get("axis", 0) % x.dim()
    picked = t.index_select(x, axis, idx.reshape(-1).to(x.device))
    return picked.reshape([*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]])


def _slice(t: Any, a: dict[str, Any], where: str, x: Any, starts: Any, ends: Any, axes: Any = None,
           steps: Any = None) -> Any:
    dims = _ints(axes) if axes is not None else list(range(len(_ints(starts))))
    index = [slice(None)] * x.dim()
    step_list = _ints(steps) if steps is not None else [1] * len(dims)
    for d, lo, hi, st in zip(dims, _ints(starts), _ints(ends), step_list, strict=True):
        if st < 1:
            raise UnsupportedLayerError(f"{where}: Slice with step {st} is not supported by the torch runner")
        index[d % x.dim()] = slice(lo, hi, st)
    return x[tuple(index)]


def _cast(t: Any, a: dict[str, Any], where: str, x: Any) -> Any:
    to = np.dtype(helper.tensor_dtype_to_np_dtype(a["to"]))
    dtype = t.from_numpy(np.empty(0, to)).dtype
    return x.to(dtype)


def _binary(fn: str) -> Callable[..., Any]:
    return lambda t, a, where, x, y: getattr(t, fn)(x, y.to(x.device) if y.device != x.device else y)


def _variadic(fn: str) -> Callable[..., Any]:
    def op(t: Any, a: dict[str, Any], where: str, *xs: Any) -> Any:
        out = xs[0]
        for y in xs[1:]:
            out = getattr(t, fn)(out, y.to(out.device))
        return out

    return op


TORCH_OPS: dict[str, Callable[..., Any]] = {
    # elementwise                                          # y = f(x) as in the ONNX operator spec
    "Add": _binary("add"), "Sub": _binary("sub"), "Mul": _binary("mul"), "Div": _binary("div"),
    "Pow": _binary("pow"), "Max": _variadic("maximum"), "Min": _variadic("minimum"),
    "Sum": _variadic("add"),
    "Neg": lambda t, a, w, x: -x, "Abs": lambda t, a, w, x: x.abs(), "Exp": lambda t, a, w, x: x.exp(),
    "Log": lambda t, a, w, x: x.log(), "Sqrt": lambda t, a, w, x: x.sqrt(), "Erf": lambda t, a, w, x: t.erf(x),
    "Relu": lambda t, a, w, x: t.relu(x), "Sigmoid": lambda t, a, w, x: t.sigmoid(x),
    "Tanh": lambda t, a, w, x: t.tanh(x), "Softplus": lambda t, a, w, x: t.nn.functional.softplus(x),
    "LeakyRelu": lambda t, a, w, x: t.nn.functional.leaky_relu(x, a.get("alpha", 0.01)),
    "Clip": lambda t, a, w, x, lo=None, hi=None: t.clamp(x, None if lo is None else float(lo),
                                                         None if hi is None else float(hi)),
    "Identity": lambda t, a, w, x: x, "Dropout": lambda t, a, w, x, *_: x,
    "Softmax": lambda t, a, w, x: t.softmax(x, a.get("axis", -1)),
    "LogSoftmax": lambda t, a, w, x: t.log_softmax(x, a.get("axis", -1)),
    # layers
    "Conv": _conv, "Gemm": _gemm, "MatMul": lambda t, a, w, x, y: t.matmul(x, y),
    "MaxPool": _pool("max"), "AveragePool": _pool("avg"),
    "GlobalAveragePool": lambda t, a, w, x: x.mean(dim=list(range(2, x.dim())), keepdim=True),
    "BatchNormalization": _batchnorm,
    "ReduceMean": _reduce("mean"), "ReduceSum": _reduce("sum"),
    # shapes
    "Reshape": _reshape, "Flatten": _flatten, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Shape": _shape,
    "Expand": _expand, "Gather": _gather, "Slice": _slice, "Cast": _cast,
    "Concat": lambda t, a, w, *xs: t.cat(xs, a["axis"]),
    "Transpose": lambda t, a, w, x: x.permute(a["perm"]) if "perm" in a else x.permute(*reversed(range(x.dim()))),
    # sampling: a fresh draw on every call, on the device of the graph
    "RandomNormal": _random_normal, "RandomNormalLike": _random_normal,
}
"""ONNX op -> ``fn(torch, attrs, where, *inputs)``; the torch runner's whole instruction set."""


class TorchRunner:
    """Runs an ONNX graph (a float baseline, or an ensemble) with torch on ``device`` (``cpu``, ``cuda``, ``cuda:N``).

    Args:
        model: The ONNX graph; every op must be in :data:`TORCH_OPS`.
        device: torch device.
        threads: torch intra-op threads on the CPU (0: leave torch's setting).
    """

    name = "torch"

    def __init__(self, model: onnx.ModelProto, *, device: str = "cpu", threads: int = 0) -> None:
        torch = self.torch = _import_torch()
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
        graph = model.graph
        consts = {t.name for t in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in consts]
        self.output_names = [o.name for o in graph.output]
        self.consts = {t.name: self._tensor(numpy_helper.to_array(t)) for t in graph.initializer}
        self.program: list[tuple[Callable[..., Any], dict[str, Any], str, list[str], list[str]]] = []
        for node in graph.node:
            where = f"{graph.name or 'graph'}: node {node.name or node.output[0]} ({node.op_type})"
            if node.domain in ("", "ai.onnx") and node.op_type == "Constant":
                self.consts[node.output[0]] = self._tensor(_constant_value(node, where))
                continue
            if node.domain not in ("", "ai.onnx") or node.op_type not in TORCH_OPS:
                raise UnsupportedLayerError(f"{where}: op {node.domain + '::' if node.domain else ''}{node.op_type} "
                                            "is not supported by the torch runner")
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            attrs["_device"] = self.device
            attrs["_outputs"] = len([o for o in node.output if o])
            self.program.append((TORCH_OPS[node.op_type], attrs, where, list(node.input), list(node.output)))

    def _tensor(self, arr: np.ndarray) -> Any:
        t = self.torch.from_numpy(np.array(arr))  # copy: numpy_helper arrays may be read-only
        # integer tensors are shapes, axes and indices: kept on the host so reading them never syncs the GPU
        return t.to(self.device) if t.is_floating_point() else t

    def _execute(self, feed: Mapping[str, Any]) -> list[Any]:
        env: dict[str, Any] = {**self.consts, **feed}
        for fn, attrs, where, inputs, outputs in self.program:
            args = [env[name] if name else None for name in inputs]
            while args and args[-1] is None:
                args.pop()
            out = fn(self.torch, attrs, where, *args)
            if attrs["_outputs"] > 1:
                env.update(zip(outputs, out, strict=False))
            else:
                env[outputs[0]] = out
        return [env[name] for name in self.output_names]

    def _stage(self, x: Feed) -> dict[str, Any]:
        return {k: self.torch.from_numpy(v).to(self.device) for k, v in _feed(self.input_names, x, "torch").items()}

    def run(self, x: Feed) -> list[np.ndarray]:
        with self.torch.inference_mode():
            outs = self._execute(self._stage(x))
            return [o.detach().cpu().numpy() for o in outs]

    def bind(self, x: Feed) -> Callable[[], Any]:
        feed = self._stage(x)
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize(self.device)

        def call() -> Any:
            with torch.inference_mode():
                out = self._execute(feed)
            if self.cuda:
                torch.cuda.synchronize(self.device)  # the timed call ends when the GPU has finished
            return out

        return call


def _constant_value(node: onnx.NodeProto, where: str) -> np.ndarray:
    attr = node.attribute[0]
    value = helper.get_attribute_value(attr)
    if attr.name == "value":
        return numpy_helper.to_array(value)
    if attr.name in ("value_float", "value_floats"):
        return np.asarray(value, np.float32)
    if attr.name in ("value_int", "value_ints"):
        return np.asarray(value, np.int64)
    raise UnsupportedLayerError(f"{where}: attribute {attr.name} is not supported by the torch runner")


# -- TensorRT ---------------------------------------------------------------------------------------------


def import_tensorrt() -> Any:
    """``import tensorrt``, or MissingDependencyError saying how to install it."""
    from edgebnn.exporters.tensorrt import _import_tensorrt

    return _import_tensorrt()


class TorchCudaMemory:
    """Device buffers for the TensorRT runner: torch CUDA tensors on a dedicated stream."""

    def __init__(self, device: int = 0) -> None:
        torch = self.torch = _import_torch()
        if not torch.cuda.is_available():
            raise MissingDependencyError(
                "the TensorRT runner keeps its buffers in torch CUDA tensors: install a CUDA build of PyTorch "
                "(on Jetson, NVIDIA's JetPack wheel)"
            )
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
        engine_path: The engine; ``<stem>.manifest.json`` must sit beside it.
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

        trt = self.trt = import_tensorrt()
        self.engine_path = Path(engine_path)
        self.manifest = check_engine(self.engine_path, device, tensorrt_version=str(trt.__version__))
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
