"""ONNX -> torch: the small interpreter behind the torch runner.

Why an interpreter of the exported graph rather than the user's torch module: an .ebnn carries no torch
module, only the posterior graph; the interpreter runs the float baselines built from that same IR (so the
weights are exactly those the ensemble was built from), needs neither the user's model code nor their BNN
library on the device, and works for every importer. ``float_bnn`` in torch draws fresh ``torch.randn``
weight noise on the device for each pass and computes ``w = mu + sigma * eps`` before each layer, which is
what bayesian-torch's layers do. The cost: Python dispatch per node, as in eager PyTorch.

:class:`TorchProgram` turns a graph into a list of calls of :data:`TORCH_OPS` entries; ops outside the
table raise :class:`~edgebnn.errors.UnsupportedLayerError` naming the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgebnn.errors import MissingDependencyError, UnsupportedLayerError


def import_torch() -> Any:
    """``import torch``, or MissingDependencyError saying how to install it."""
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


def _div(t: Any, a: dict[str, Any], where: str, x: Any, y: Any) -> Any:
    """ONNX Div: integer operands divide with truncation (torch's ``/`` would give floats)."""
    y = y.to(x.device) if y.device != x.device else y
    if x.is_floating_point() or y.is_floating_point():
        return t.div(x, y)
    return t.div(x, y, rounding_mode="trunc")


def _mod(t: Any, a: dict[str, Any], where: str, x: Any, y: Any) -> Any:
    """ONNX Mod: the divisor's sign (``fmod=0``, Python's %) or the dividend's (``fmod=1``)."""
    y = y.to(x.device) if y.device != x.device else y
    return t.fmod(x, y) if a.get("fmod", 0) else t.remainder(x, y)


def _range(t: Any, a: dict[str, Any], where: str, start: Any, limit: Any, delta: Any) -> Any:
    return t.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)


def _split(t: Any, a: dict[str, Any], where: str, x: Any, split: Any = None) -> Any:
    axis = a.get("axis", 0)
    sizes = _ints(split) if split is not None else list(a["split"]) if "split" in a else None
    parts = t.chunk(x, a["_outputs"], dim=axis) if sizes is None else t.split(x, sizes, dim=axis)
    return parts if a["_outputs"] > 1 else parts[0]


def _scatter_elements(t: Any, a: dict[str, Any], where: str, x: Any, idx: Any, updates: Any) -> Any:
    if a.get("reduction", b"none") not in (b"none", "none"):
        raise UnsupportedLayerError(f"{where}: ScatterElements with a reduction is not supported by the torch runner")
    return x.scatter(a.get("axis", 0), idx.long().to(x.device), updates.to(x.device))


def _constant_of_shape(t: Any, a: dict[str, Any], where: str, shape: Any) -> Any:
    value = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
    out = t.full(_ints(shape), value.reshape(-1)[0].item(), dtype=t.from_numpy(value).dtype)
    return out.to(a["_device"]) if out.is_floating_point() else out


def _random_uniform(t: Any, a: dict[str, Any], where: str, like: Any = None) -> Any:
    shape = list(like.shape) if like is not None else list(a["shape"])
    device = like.device if like is not None else a["_device"]
    low, high = a.get("low", 0.0), a.get("high", 1.0)
    return t.rand(shape, device=device) * (high - low) + low


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
    "Add": _binary("add"), "Sub": _binary("sub"), "Mul": _binary("mul"), "Div": _div, "Mod": _mod,
    "Pow": _binary("pow"), "Max": _variadic("maximum"), "Min": _variadic("minimum"),
    "Sum": _variadic("add"), "Less": _binary("lt"), "Greater": _binary("gt"), "Equal": _binary("eq"),
    "Where": lambda t, a, w, c, x, y: t.where(c.to(x.device), x, y.to(x.device)),
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
    "RandomUniform": _random_uniform, "RandomUniformLike": _random_uniform,
    # the stores' decode of packed codes (edgebnn.exporters.stores) and the analytic quadrature
    "Range": _range, "Split": _split, "ScatterElements": _scatter_elements, "ConstantOfShape": _constant_of_shape,
    "Tile": lambda t, a, w, x, reps: x.repeat(_ints(reps)),
}
"""ONNX op -> ``fn(torch, attrs, where, *inputs)``; the torch runner's whole instruction set."""



_DRAWS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike"})  # fresh per call


class TorchProgram:
    """An ONNX graph as a list of torch calls on one device.

    Args:
        torch: The torch module.
        model: The graph; every op must be in :data:`TORCH_OPS` (``Constant`` nodes become constants).
        device: torch device the constants (and so the computation) live on.

    Raises:
        UnsupportedLayerError: A node whose op is not in :data:`TORCH_OPS`, named with its graph.
    """

    def __init__(self, torch: Any, model: onnx.ModelProto, device: Any) -> None:
        self.torch = torch
        self.device = device
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
            step = (TORCH_OPS[node.op_type], attrs, where, list(node.input), list(node.output))
            if node.op_type not in _DRAWS and all(not i or i in self.consts for i in node.input):
                self._fold(step)  # constants in, constants out: once, here (onnxruntime folds them too)
            else:
                self.program.append(step)

    def _fold(self, step: tuple[Callable[..., Any], dict[str, Any], str, list[str], list[str]]) -> None:
        """Run a node whose inputs are all constants (a store's decode of packed codes, a shape computation) once,
        at construction: its outputs join the constants, so a call runs only what depends on the inputs."""
        fn, attrs, where, inputs, outputs = step
        args = _args(self.consts, inputs)
        with self.torch.inference_mode():
            out = fn(self.torch, attrs, where, *args)
        for name, value in zip(outputs, out, strict=False) if attrs["_outputs"] > 1 else [(outputs[0], out)]:
            # float results live on the device (a decode of host-side integer codes yields them on the host)
            floating = hasattr(value, "is_floating_point") and value.is_floating_point()
            self.consts[name] = value.to(self.device) if floating else value

    def _tensor(self, arr: np.ndarray) -> Any:
        t = self.torch.from_numpy(np.array(arr))  # copy: numpy_helper arrays may be read-only
        # integer tensors are shapes, axes and indices: kept on the host so reading them never syncs the GPU
        return t.to(self.device) if t.is_floating_point() else t

    def __call__(self, feed: Mapping[str, Any]) -> list[Any]:
        """Run the graph on ``{input name: tensor}``; returns the outputs in graph order."""
        env: dict[str, Any] = {**self.consts, **feed}
        for fn, attrs, where, inputs, outputs in self.program:
            out = fn(self.torch, attrs, where, *_args(env, inputs))
            if attrs["_outputs"] > 1:
                env.update(zip(outputs, out, strict=False))
            else:
                env[outputs[0]] = out
        return [env[name] for name in self.output_names]


def _args(env: Mapping[str, Any], inputs: list[str]) -> list[Any]:
    """A node's input values: None for an omitted optional input, trailing omitted ones dropped."""
    args = [env[name] if name else None for name in inputs]
    while args and args[-1] is None:
        args.pop()
    return args


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

