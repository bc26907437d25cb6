"""Graph-building pieces shared by the ensemble exporters: constants, the sample fold, the predictive head.

Layout convention (every mode): the sample axis is folded into the batch, batch-major (row b·S + s), so
deterministic ops run once on B·S rows and a sampled layer is one batched op.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

from edgebnn.exporters.metadata import ExportMetadata, write_metadata
from edgebnn.ir import BNNModel
from edgebnn.ir.encodings import Grid

P = "ens/"  # prefix of every value an exporter adds
INT4_BLOCK = 32
CONTRIB = "com.microsoft"  # onnxruntime's contrib-op domain


class Builder:
    """Collects nodes, initializers and extra graph inputs for one exported graph."""

    def __init__(self, inits: Iterable[onnx.TensorProto] = (), form: str = "qdq", integer_min_bytes: int = 0,
                 ) -> None:
        self.form = form  # how int8/int4 weights are emitted (exporters.forms.FORMS)
        self.integer_min_bytes = integer_min_bytes  # integer form: dense weights above this many fp32 bytes
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self.int4_used = False  # int4 DequantizeLinear needs opset 21
        self.store_choice = "fp32"  # how posterior moments are stored (exporters.stores.STORE_CHOICES)
        self.store_runtimes: tuple[str, ...] | None = None  # runtimes the stores' decodes must run on (None: any)
        self.stored: dict[str, str] = {}  # decoded tensor -> the store that wrote it (the export metadata)
        self.min_opset = 0  # the ai.onnx opset the emitted ops need (stores' decodes)
        self.code_pool: Any = None  # the stores' pooled code streams (exporters.stores.base.CodePool)
        # baked: writes an fp32 member tensor on an integer grid as its store's codes, or returns None (set per layer
        # by exporters.stores.members.member_codes; None: fp32 constants)
        self.draw_codes: Callable[[Builder, str, np.ndarray, Grid], str | None] | None = None
        # int4 layout: "blocks" (INT4_BLOCK inputs per scale, Gemm weights only: TensorRT's weight-only int4) or
        # "channels" (onnxruntime / portable: every weight int4, one scale per output channel shared by the S
        # members; member biases int8), with ``samples`` S
        self.int4_layout = "blocks"
        self.samples = 1
        self.bias_format = "fp32"  # constant (member) biases: fp32, or int8 in the "channels" int4 layout
        self.outputs: list[onnx.ValueInfoProto] | None = None  # the task head's graph outputs, once added
        self.adopt(inits)

    def adopt(self, inits: Iterable[onnx.TensorProto]) -> None:
        """Keep existing initializers (the skeleton's deterministic parameters)."""
        for t in inits:
            self._names.add(t.name)
            self.inits.append(t)

    def const(self, name: str, value: np.ndarray) -> str:
        if name in self._names:
            raise ValueError(f"duplicate initializer {name}")
        self._names.add(name)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def i64(self, name: str, *values: int) -> str:
        return self.const(name, np.array(values, np.int64))

    def f32(self, name: str, value: float | np.ndarray) -> str:
        return self.const(name, np.asarray(value, np.float32))

    def weight(self, name: str, value: np.ndarray, dtype: str = "fp32", grid: Grid | None = None) -> str:
        """A constant weight, as fp32, symmetric int8 or block-wise int4 + DequantizeLinear.

        int8 has one scale per slice of axis 0 (a 1-D per-channel scale on a constant, zero point 0: TensorRT's
        explicit-quantization rules), ``max|slice| / 127``: each weight moves by at most half a step,
        ``max|slice| / 254``. When ``grid`` says the values are exact multiples ``q · step`` with ``q`` within the
        format (an encoding's integer grid, at most 8 bits for int8, 4 for int4), every scale is ``step`` and
        the weight is stored losslessly.

        In the ``folded`` form (and in the ``integer`` form, for weights no integer kernel takes) the same quantized
        values are stored dequantized, as fp32 constants (``float32(q) · scale``, what DequantizeLinear computes):
        onnxruntime does not constant-fold a DequantizeLinear on a constant, it runs it on every inference.
        """
        if dtype == "fp32":
            if grid is not None and self.draw_codes is not None:
                coded = self.draw_codes(self, name, np.asarray(value, np.float32), grid)
                if coded is not None:
                    return coded
            return self.f32(name, value)
        if dtype not in ("int8", "int4"):
            raise ValueError(dtype)
        value = np.asarray(value, np.float32)
        if self.int4_layout == "channels" and self.form == "qdq" and dtype == "int8" and value.ndim > 1:
            dtype = "int4"  # the layer kinds' int8 for int4 is TensorRT's rule (int4 on GEMMs only)
        exact = grid is not None and grid.bits <= (8 if dtype == "int8" else 4)
        step = grid.step if exact and grid else None
        if self.int4_layout == "channels" and self.form == "qdq" and dtype == "int4":
            return self.per_channel(name, value, step, 4)
        if dtype == "int4":
            q4, scale4 = int4_parts(value, step)
            if self.form != "qdq":
                return self.f32(name, dequantize_blocks(q4, scale4))
            return self._int4(name, q4, scale4)
        q, scale = int8_parts(value, step)
        if self.form != "qdq":
            return self.f32(name, q.astype(np.float32) * scale.reshape((-1,) + (1,) * (value.ndim - 1)))
        return self.add("DequantizeLinear", [self.const(name + ".q", q), self.const(name + ".scale", scale),
                                             self.const(name + ".zero", np.zeros(len(scale), np.int8))],
                        name, axis=0)

    def _int4(self, name: str, q: np.ndarray, scale: np.ndarray, block: int = INT4_BLOCK) -> str:
        """Block-wise int4 (opset 21 DequantizeLinear, weight-only) of :func:`int4_parts`' values."""
        scale_name = self.const(name + ".scale", scale)
        return self.add("DequantizeLinear", [self._int4_tensor(name + ".q", q), scale_name], name, axis=q.ndim - 2,
                        block_size=block)

    def _int4_tensor(self, name: str, q: np.ndarray) -> str:
        """An INT4 initializer holding ``q`` (int values in [-8, 7]) as packed raw bytes: two per byte, the first in
        the low nibble (ONNX's INT4 layout; ``make_tensor`` on a list would write one int32 varint per value)."""
        from edgebnn.ir.encodings.packing import pack_int

        tensor = helper.make_tensor(name, TensorProto.INT4, q.shape, pack_int(q.reshape(-1), 4).tobytes(), raw=True)
        self._names.add(name)
        self.inits.append(tensor)
        self.int4_used = True
        return name

    def per_channel(self, name: str, value: np.ndarray, step: float | None, bits: int) -> str:
        """int4 / int8 with one scale per output channel shared by the S members (per-axis DequantizeLinear).

        Grouping (any grouping decodes exactly what was quantized; this one keeps the scales few): [S, in, out]
        (batched Gemm) per output, axis 2; [S·O, ...] (batched Conv, wide Gemm, member biases) viewed as
        [S, O, rest], per O; otherwise [O, rest], per row. Scale ``max|channel| / (2^(bits-1) - 1)``, or ``step``
        on a grid that fits.
        """
        s = self.samples
        if value.ndim == 3:
            view, axis = value, 2
        elif s > 1 and len(value) % s == 0:
            view, axis = value.reshape(s, len(value) // s, -1), 1
        else:
            view, axis = value.reshape(len(value), -1), 0
        top = (1 << (bits - 1)) - 1
        moved = np.moveaxis(view, axis, 0).reshape(view.shape[axis], -1)
        amax = np.abs(moved).max(axis=1)
        scale = (np.full(len(amax), step) if step is not None else np.where(amax > 0, amax / top, 1.0)
                 ).astype(np.float32)
        shape = [1] * view.ndim
        shape[axis] = -1
        q = np.clip(np.rint(view / scale.reshape(shape)), -top, top).astype(np.int8)
        codes = self._int4_tensor(name + ".q", q) if bits == 4 else self.const(name + ".q", q)
        out = name if view.shape == value.shape else name + ".dq"
        y = self.add("DequantizeLinear", [codes, self.const(name + ".scale", scale)], out, axis=axis)
        if out == name:
            return name
        return self.add("Reshape", [y, self.i64(name + ".shape", *value.shape)], name)

    def add(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def input(self, name: str, dims: list[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        return name

    def fold_samples(self, src: str, dst: str, samples: int, dims: list[int], prefix: str = P) -> str:
        """[B, *dims] -> [B·S, *dims], batch-major (Unsqueeze, Expand, Reshape: no copy of weights)."""
        axes = self.i64(prefix + "axes1", 1)
        expand = self.i64(prefix + "expand_shape", 1, samples, *([1] * len(dims)))
        flat = self.i64(prefix + "fold_shape", -1, *dims)
        x = self.add("Unsqueeze", [src, axes], prefix + "input_1")
        x = self.add("Expand", [x, expand], prefix + "input_s")
        return self.add("Reshape", [x, flat], dst)

    def model(self, base: onnx.ModelProto, graph_inputs: list[onnx.ValueInfoProto], name: str) -> onnx.ModelProto:
        """The graph: the nodes added and the head's outputs (:mod:`edgebnn.tasks`: the exporter adds a head)."""
        outputs = self.outputs
        assert outputs is not None, "the exporter added no task head"
        used = {x for node in self.nodes for x in node.input}  # skeleton parameters a rewrite replaced
        inits = [t for t in self.inits if t.name in used]
        graph = helper.make_graph(self.nodes, name, [*graph_inputs, *self.inputs], outputs, inits)
        least = max(21 if self.int4_used else 0, self.min_opset)
        opsets = [helper.make_opsetid(o.domain, max(o.version, least) if o.domain in ("", "ai.onnx")
                                      else o.version) for o in base.opset_import]
        if any(n.domain == CONTRIB for n in self.nodes) and all(o.domain != CONTRIB for o in opsets):
            opsets.append(helper.make_opsetid(CONTRIB, 1))  # MatMulNBits (the int4 integer form)
        out = helper.make_model(graph, opset_imports=opsets, producer_name="edgebnn")
        out.ir_version = base.ir_version
        return out


def int8_parts(value: np.ndarray, step: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 with one scale per slice of axis 0: ``(q, scale)``, ``scale = max|slice| / 127`` (1 for an
    all-zero slice), or ``step`` everywhere for values known to be ``q · step``."""
    amax = np.abs(value.reshape(len(value), -1)).max(axis=1)
    scale = (np.full(len(value), step) if step is not None else np.where(amax > 0, amax / 127.0, 1.0)
             ).astype(np.float32)
    shape = (-1,) + (1,) * (value.ndim - 1)
    return np.clip(np.rint(value / scale.reshape(shape)), -127, 127).astype(np.int8), scale


def int4_parts(value: np.ndarray, step: float | None = None, block: int = INT4_BLOCK,
               ) -> tuple[np.ndarray, np.ndarray]:
    """Block-wise symmetric int4: one scale per ``block`` values along the second-to-last axis, the layout
    TensorRT's INT4 weight-only GEMMs take (even last dim); ``max|block| / 7``, or ``step`` for values on a known
    grid. Returns ``(q, scale)``: q int8 in [-7, 7] shaped like ``value``, scale [..., blocks, last]."""
    k = value.shape[-2]
    blocks = -(-k // block)
    pad = blocks * block - k
    padded = np.pad(value, [(0, 0)] * (value.ndim - 2) + [(0, pad), (0, 0)])
    shaped = padded.reshape(*value.shape[:-2], blocks, block, value.shape[-1])
    amax = np.abs(shaped).max(axis=-2)  # [..., blocks, out]
    scale = (np.full(amax.shape, step) if step is not None else np.where(amax > 0, amax / 7.0, 1.0)
             ).astype(np.float32)
    q = np.clip(np.rint(shaped / scale[..., None, :]), -7, 7).astype(np.int8)
    return q.reshape(padded.shape)[..., :k, :], scale


def dequantize_blocks(q: np.ndarray, scale: np.ndarray, block: int = INT4_BLOCK) -> np.ndarray:
    """``float32(q) · scale`` for :func:`int4_parts`' block layout (what the int4 DequantizeLinear computes)."""
    per_row = np.repeat(scale, block, axis=-2)[..., : q.shape[-2], :]
    return q.astype(np.float32) * per_row


def nbits_weight(w: np.ndarray, step: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A dense weight ``w`` [K, N] (inputs x outputs) as MatMulNBits' inputs ``B`` and ``scales``.

    The values are :func:`int4_parts`' (the ``qdq`` / ``folded`` forms' blocks of
    ``INT4_BLOCK`` inputs per output, ``q`` in [-7, 7], ``step`` for an exact grid), stored as MatMulNBits takes
    them (onnxruntime's contrib-op schema, checked numerically in the tests): ``B`` [N, ceil(K / block),
    block / 2] uint8, two codes ``q + 8`` per byte, the lower K first in the low nibble (the default zero point
    is 8, so code 8 is 0: the last block is padded with it when ``block`` does not divide K); ``scales``
    [N, blocks] float32."""
    q, scale = int4_parts(np.asarray(w, np.float32), step)  # q [K, N], scale [blocks, N]
    k, n = q.shape
    blocks = scale.shape[0]
    codes = np.full((n, blocks * INT4_BLOCK), 8, np.uint8)
    codes[:, :k] = (q.T + 8).astype(np.uint8)
    pairs = codes.reshape(n, blocks, INT4_BLOCK // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8), np.ascontiguousarray(scale.T)


def renamed_input(node: onnx.NodeProto, old: str, new: str) -> onnx.NodeProto:
    """A copy of ``node`` reading ``new`` wherever it read ``old``."""
    if old not in node.input:
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for i, name in enumerate(copy.input):
        if name == old:
            copy.input[i] = new
    return copy


def static_shapes(proto: onnx.ModelProto) -> dict[str, list[int]]:
    """Shapes of every value with the batch set to 1 (non-batch dims must be static)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    dims = probe.graph.input[0].type.tensor_type.shape.dim
    dims[0].Clear()
    dims[0].dim_value = 1
    inferred = shape_inference.infer_shapes(probe, data_prop=True)
    out: dict[str, list[int]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        shape = vi.type.tensor_type.shape
        if all(d.HasField("dim_value") for d in shape.dim):
            out[vi.name] = [d.dim_value for d in shape.dim]
    return out


def set_metadata(proto: onnx.ModelProto, model: BNNModel, *, mode: str, samples: int, seed: int | None,
                 **extra: Any) -> None:
    """Record what the graph is (read back by ``edgebnn eval``, ``Session`` and ``compare``)."""
    write_metadata(proto, ExportMetadata.describe(model, mode=mode, samples=samples, seed=seed, **extra))
