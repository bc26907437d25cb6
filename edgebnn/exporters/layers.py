"""Layer kinds: how each op that reads a sampled weight is emitted, once, for every export mode.

A layer kind is registered by ONNX op type (:data:`LAYERS`) and gives:

- ``batched``: the op over the sample axis with one weight per sample ``W_s`` ([S, *weight shape]), on the
  folded input (row b·S + s) — ``baked`` and ``noise --noise weight``;
- ``plain``: the op itself with its own attributes on other operands — ``noise --noise local`` runs it on
  (x, mu) and (x², σ²), ``analytic`` on means and variances;
- ``out_dims`` / ``bias_shape``: the per-row output shape and how a per-output bias broadcasts on it;
- ``LOCAL_EXACT``: whether local reparameterization is exact (each output has its own weights) — ``auto``
  noise draws per row where it is, per weight where weights are shared across positions.

Batched forms (S samples, one op per layer)::

    Conv, any rank (group g):  [B·S, C, *sp] -> Reshape [B, S·C, *sp] -> Conv(W_s as [S·O, C/g, *k],
                                group S·g, bias b_s as [S·O]) -> [B, S·O, *sp'] -> Reshape [B·S, O, *sp']
                                (baked, fewer than SPLIT_BELOW channels per group: Split -> S Convs -> Concat)
                                then Relu / MaxPool run before that last Reshape (sink_wide_outputs); baked:
                                BatchNormalization, Relu, residual Add on [B, S·O, *sp] too (run_wide)
    Gemm (members stream once): [B·S, in] -> Reshape [B, S, in] -> Transpose [S, B, in] -> MatMul W_s [S, in, out]
                                -> + b_s [S, 1, out] -> Transpose [B, S, out] -> Reshape [B·S, out]

The Gemm form is sample-major so that each member's weights are read once per call, not once per input row:
a batch-major [B, S, 1, in] x [S, in, out] MatMul is B·S matrix-vector products that stream every member's
weights B times (onnxruntime CPU, LeNet-5 fc1 at S=16: 0.73 ms at B=32 against 0.21 ms sample-major; equal at
B=1, docs/speed.md).

Shared input (``shared=True``): the first sampled layer reads a value that is identical for every sample (the
graph input, or a hoisted layer's output, on B rows). It then runs as one wide op with the S members side by
side on the output axis, no copies of its input and no grouping::

    Conv:  [B, C, *sp] -> Conv(W_s as [S·O, C/g, *k], group g, b_s as [S·O]) -> [B, S·O, *sp'] -> [B·S, O, *sp']
    Gemm:  [B, in] -> Gemm(W_s as [S·out, in], transB, b_s as [S·out]) -> [B, S·out] -> Reshape [B·S, out]

Integer kernels (the ``integer`` form of :class:`~edgebnn.exporters._graph.ExportFormat`, int8 / int4 constant Gemm
weights; :mod:`.stores.constants` writes them): int8 quantizes the activation per call (DynamicQuantizeLinear:
uint8, per tensor) and runs MatMulInteger (u8 x s8, int32 accumulation), then one float multiply by (activation
scale x weight scale) per output channel and the bias. int4 runs onnxruntime's MatMulNBits, whose weight is 2-D.
Both run one op per member on the sample-major input (int8: each member's activation quantized on its own;
onnxruntime pre-packs only a 2-D constant MatMulInteger weight), or one on the members side by side for a shared input::

    Gemm, int8 / int4 members:  [S, B, in] -> Split into S -> S MatMulInteger (W_s as [in, out]) or MatMulNBits
                                (W_s as [out, in] blocks) -> Concat [S, B, out]

Conv weights are folded to fp32 in that form (onnxruntime's ConvInteger measured slower than its fp32 Conv).

Weights and biases reach ``batched`` as an :data:`Operand`: a constant array not emitted yet (``baked``: laid
out in numpy, then stored in the requested weight format) or a graph value (``noise``: laid out by nodes).

ConvTranspose (weight [C, O/g, *k]) stacks its S weights as [S·C, O/g, *k] with group S·g, as Conv does; the
affine node of a Bayesian batch norm multiplies on a [B, S, C, *sp] view (:class:`BatchNormalization`).
Adding a layer kind is one :class:`LayerKind` subclass registered here.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx import numpy_helper

from edgebnn.errors import UnsupportedLayerError
from edgebnn.exporters import quantize
from edgebnn.exporters._graph import Builder, renamed_input
from edgebnn.exporters.stores.constants import constant, grid_step, matmul_integer, matmul_nbits, per_channel
from edgebnn.ir import attrs_of
from edgebnn.ir.encodings import MASK_SUFFIX, Encoding, Grid

Operand = np.ndarray | str  # a constant not emitted yet, or the name of a graph value
# Baked Conv layers with fewer input channels per group than this run as S Convs (Split, Concat) instead of one
# grouped Conv: onnxruntime's grouped Conv is slow on thin groups (LeNet-5 conv2, 6 channels: 1.4x faster split at
# batch 1, 2.3x at batch 32); on ResNet-20's 16-64-channel convs the grouped Conv was 1.2x faster (docs/speed.md).
SPLIT_BELOW = 8
WIDE_OUT = "wide_out"  # the name of a Conv layer's output Reshape: sink_wide_outputs moves it below Relu, MaxPool
POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})  # spatial per channel: commute with regrouping N and C
LAYERS: dict[str, LayerKind] = {}


def register_layer(cls: type[LayerKind]) -> type[LayerKind]:
    """Class decorator: emit nodes of ``cls.op_type`` whose weight samples with ``cls``."""
    LAYERS[cls.op_type] = cls()
    return cls


def bias_name(node: onnx.NodeProto) -> str | None:
    return node.input[2] if len(node.input) > 2 and node.input[2] else None


def reshape(b: Builder, v: Operand, dims: tuple[int, ...], shape_name: str, out: str) -> Operand:
    if isinstance(v, np.ndarray):
        return v.reshape(dims)
    return b.add("Reshape", [v, b.i64(shape_name, *dims)], out)


def transpose(b: Builder, v: Operand, perm: tuple[int, ...], out: str) -> Operand:
    return v.transpose(perm) if isinstance(v, np.ndarray) else b.add("Transpose", [v], out, perm=list(perm))


def unsqueeze(b: Builder, v: Operand, axis: int, axes_name: str, out: str) -> Operand:
    if isinstance(v, np.ndarray):
        return np.expand_dims(v, axis)
    return b.add("Unsqueeze", [v, b.i64(axes_name, axis)], out)


@dataclass(frozen=True)
class SampledLayer:
    """One sampled layer a layer kind emits over the sample axis (:meth:`LayerKind.batched`).

    Attributes:
        node: The layer's node; ``node.input[0]`` is [B·S, ...], or [B, ...] identical for every sample when
            ``shared``; ``node.output[0]`` is written [B·S, ...].
        p: Prefix of every value emitted for it.
        samples: S.
        wshape: The weight's shape (one member's).
        shapes: Static shapes of the graph's values (batch 1).
        where: How messages name the layer.
        dtype: The format constant weights take (in the builder's form; with ``grid``: exact); biases stay fp32.
        grid: The integer grid the constant members lie on, if any.
        shared: Whether the input is shared by every sample (the wide form: members side by side).
        source: The encoding whose store writes fp32 members on its grid (:func:`.stores.constants.constant`).
    """

    node: onnx.NodeProto
    p: str
    samples: int
    wshape: tuple[int, ...]
    shapes: dict[str, list[int]]
    where: str
    dtype: str = "fp32"
    grid: Grid | None = None
    shared: bool = False
    source: Encoding | None = None


class LayerKind(ABC):
    """One op type that reads a sampled weight as its input 1 (and an optional bias as input 2)."""

    op_type: ClassVar[str]
    LOCAL_EXACT: ClassVar[bool]

    def attrs(self, node: onnx.NodeProto, where: str) -> dict[str, Any]:
        """The node's attributes, refusing forms the exporters do not rewrite."""
        return attrs_of(node)

    def out_dim(self, node: onnx.NodeProto, wshape: tuple[int, ...]) -> int:
        """Output features (channels): the length of a bias."""
        return int(wshape[0])

    @abstractmethod
    def out_dims(self, node: onnx.NodeProto, wshape: tuple[int, ...], shapes: dict[str, list[int]],
                 where: str) -> list[int]:
        """The output shape of one row (without the batch)."""

    @abstractmethod
    def bias_shape(self, wshape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape a per-output vector takes to broadcast on one row's output."""

    def plain(self, b: Builder, node: onnx.NodeProto, inputs: list[str], out: str) -> str:
        """The op with the node's own attributes on ``inputs`` (x, weight[, bias])."""
        return b.add(node.op_type, inputs, out, **attrs_of(node))

    def matches(self, node: onnx.NodeProto) -> bool:
        """Whether ``node`` (of ``op_type``) is this kind (default: every node of the op type)."""
        return True

    def weight_format(self, node: onnx.NodeProto, wshape: tuple[int, ...], dtype: str, batched: bool) -> str:
        """The weight format this op's weight takes when ``dtype`` is asked for (int4 only where TensorRT's
        weight-only int4 GEMMs take it: blocks along the reduction axis, even output dim; int8 otherwise)."""
        return "int8" if dtype == "int4" else dtype

    has_integer_plain: ClassVar[bool] = False

    def integer_plain(self, b: Builder, node: onnx.NodeProto, w: np.ndarray, grid: Grid | None, p: str,
                      dtype: str = "int8") -> None:
        """The op on its own input with the constant weight ``w`` (as ``dtype``) in an integer kernel
        (``has_integer_plain``)."""
        raise NotImplementedError(self.op_type)

    @abstractmethod
    def batched(self, b: Builder, layer: SampledLayer, w: Operand, bias: Operand | None) -> None:
        """Emit ``layer`` over the sample axis (:class:`SampledLayer`): ``w`` is [S, *wshape], ``bias`` [S, out]."""

    def _member(self, b: Builder, layer: SampledLayer, w: Operand, tag: str) -> str:
        """The members ``w`` as one graph value named ``layer.p + tag``: a constant in the weight format of this
        kind for ``layer.dtype`` (written by the source's store where it writes members), or ``w`` itself."""
        fmt = self.weight_format(layer.node, layer.wshape, layer.dtype, True)
        return _const(b, w, layer.p + tag, fmt, layer.grid, layer.source)


def _const(b: Builder, v: Operand, name: str, dtype: str = "fp32", grid: Grid | None = None,
           source: Encoding | None = None) -> str:
    return constant(b, name, v, dtype, grid, source) if isinstance(v, np.ndarray) else v


def _bias(b: Builder, v: Operand, name: str) -> str:
    """A member bias: a constant in the builder's ``bias_format`` (fp32; int8 in the "channels" int4 layout)."""
    if not isinstance(v, np.ndarray) or b.fmt.bias_format == "fp32":
        return _const(b, v, name)
    return per_channel(b, name, np.asarray(v, np.float32), None, 8)


def integer_kernel(b: Builder, v: Operand, dtype: str) -> bool:
    """Whether this weight runs in an integer kernel: an int8 / int4 constant in the ``integer`` form, larger (as
    fp32) than the builder's ``integer_min_bytes``."""
    return (b.fmt.form == "integer" and dtype in ("int8", "int4") and isinstance(v, np.ndarray)
            and v.size * 4 > b.fmt.integer_min_bytes)


@register_layer
class Gemm(LayerKind):
    op_type = "Gemm"
    LOCAL_EXACT = True

    def attrs(self, node: onnx.NodeProto, where: str) -> dict[str, Any]:
        attrs = attrs_of(node)
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            raise UnsupportedLayerError(f"{where}: Gemm with transA/alpha/beta is not supported")
        return attrs

    def out_dim(self, node: onnx.NodeProto, wshape: tuple[int, ...]) -> int:
        return int(wshape[0] if attrs_of(node).get("transB", 0) else wshape[1])

    def out_dims(self, node: onnx.NodeProto, wshape: tuple[int, ...], shapes: dict[str, list[int]],
                 where: str) -> list[int]:
        self.attrs(node, where)
        return [self.out_dim(node, wshape)]

    def bias_shape(self, wshape: tuple[int, ...]) -> tuple[int, ...]:
        return (-1,)

    def weight_format(self, node: onnx.NodeProto, wshape: tuple[int, ...], dtype: str, batched: bool) -> str:
        # batched: [S, in, out]; plain: as stored, [in, out] only without transB
        k_axis_ok = batched or not attrs_of(node).get("transB", 0)
        return dtype if dtype != "int4" or (k_axis_ok and self.out_dim(node, wshape) % 2 == 0) else "int8"

    def batched(self, b: Builder, layer: SampledLayer, w: Operand, bias: Operand | None) -> None:
        node, p, samples, wshape, grid = layer.node, layer.p, layer.samples, layer.wshape, layer.grid
        attrs = self.attrs(node, layer.where)
        n_out = self.out_dim(node, wshape)
        n_in = int(wshape[1] if attrs.get("transB", 0) else wshape[0])
        fmt = self.weight_format(node, wshape, layer.dtype, True)
        if layer.shared:
            self._wide(b, layer, (n_in, n_out), attrs, w, bias, fmt)
            return
        if attrs.get("transB", 0):
            w = transpose(b, w, (0, 2, 1), p + "W_t")  # [S, out, in] -> [S, in, out]
        x = b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, samples, n_in)], p + "x")
        xt = b.add("Transpose", [x], p + "x_t", perm=[1, 0, 2])  # [S, B, in]: each member's weights read once
        if integer_kernel(b, w, fmt):
            # one op per member on a 2-D weight (Split, S ops, Concat): MatMulNBits takes only a 2-D weight, and
            # onnxruntime pre-packs a constant MatMulInteger weight only when it is 2-D (the [S, in, out] one was
            # re-packed on every call: 3x slower at batch 1, docs/speed.md); each member's activation is quantized
            # on its own (its own uint8 range)
            assert isinstance(w, np.ndarray)
            xs = [f"{p}x{s}" for s in range(samples)]
            b.nodes.append(onnx.helper.make_node("Split", [xt, b.i64(p + "split", *[1] * samples)], xs, axis=0))
            if fmt == "int4":
                ys = [matmul_nbits(b, xs[s], w[s], grid, f"{p}m{s}/", f"{p}y{s}") for s in range(samples)]
            else:  # one scale per member and output
                q, scale = quantize.rows(w.transpose(0, 2, 1).reshape(samples * n_out, n_in), step=grid_step(grid))
                q, scale = q.reshape(samples, n_out, n_in), scale.reshape(samples, n_out)
                ys = [matmul_integer(b, xs[s], q[s].T, scale[s], f"{p}m{s}/", f"{p}y{s}")
                      for s in range(samples)]
            y = b.add("Concat", ys, p + "xw", axis=0)
        else:
            y = b.add("MatMul", [xt, self._member(b, layer, w, "W")], p + "xw")
        if bias is not None:
            y = b.add("Add", [y, _bias(b, unsqueeze(b, bias, 1, p + "axis1", p + "b3"), p + "b")], p + "y")
        y = b.add("Transpose", [y], p + "y_t", perm=[1, 0, 2])  # [B, S, out]
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, n_out)], node.output[0])

    has_integer_plain = True

    def integer_plain(self, b: Builder, node: onnx.NodeProto, w: np.ndarray, grid: Grid | None, p: str,
                      dtype: str = "int8") -> None:
        """x -> MatMulInteger with ``w`` as int8 -> · (s_x · scale) [+ bias] -> node's output. On a grid of at most
        8 bits (MCQ counts, fixed point) the weight is its integer grid ``q`` and the scale is the layer's one
        step, a scalar; otherwise one scale per output. ``int4``: one MatMulNBits."""
        attrs = self.attrs(node, p)
        w_oi = w if attrs.get("transB", 0) else w.T  # [out, in]
        out = node.output[0] if len(node.input) < 3 or not node.input[2] else p + "xw"
        if dtype == "int4":
            y = matmul_nbits(b, node.input[0], np.ascontiguousarray(w_oi.T), grid, p, out)
        else:
            step = grid_step(grid)
            q, scale = quantize.rows(np.asarray(w_oi, np.float32), step=step)
            y = matmul_integer(b, node.input[0], q.T, scale[:1] if step is not None else scale, p,
                            out)
        if len(node.input) > 2 and node.input[2]:
            b.add("Add", [y, node.input[2]], node.output[0])

    def _wide(self, b: Builder, layer: SampledLayer, dims: tuple[int, int], attrs: dict[str, Any], w: Operand,
              bias: Operand | None, fmt: str) -> None:
        """[B, in] -> [B, S·out] in one Gemm with the members side by side (W_s as [S·out, in]; int4: a MatMul
        on [in, S·out], its blocks along the reduction axis); ``dims``: (in, out)."""
        node, p, samples, grid, source = layer.node, layer.p, layer.samples, layer.grid, layer.source
        n_in, n_out = dims
        b_wide = None if bias is None else _bias(b, reshape(b, bias, (-1,), p + "b_shape", p + "b_wide"), p + "b")
        if fmt == "int4":
            if attrs.get("transB", 0):
                w = transpose(b, w, (0, 2, 1), p + "W_t")  # [S, out, in] -> [S, in, out]
            w = reshape(b, transpose(b, w, (1, 0, 2), p + "W_is"), (n_in, samples * n_out), p + "w_shape", p + "W_wide")
            if integer_kernel(b, w, fmt):
                assert isinstance(w, np.ndarray)
                y = matmul_nbits(b, node.input[0], w, grid, p, p + "xw")
            else:
                y = b.add("MatMul", [node.input[0], _const(b, w, p + "W", fmt, grid, source)], p + "xw")
            y = b.add("Add", [y, b_wide], p + "y") if b_wide is not None else y
            b.add("Reshape", [y, b.i64(p + "out_shape", -1, n_out)], node.output[0])
            return
        if not attrs.get("transB", 0):
            w = transpose(b, w, (0, 2, 1), p + "W_t")  # [S, in, out] -> [S, out, in]
        w = reshape(b, w, (samples * n_out, n_in), p + "w_shape", p + "W_wide")
        if integer_kernel(b, w, fmt):
            assert isinstance(w, np.ndarray)
            q, scale = quantize.rows(w, step=grid_step(grid))
            y = matmul_integer(b, node.input[0], q.T, scale, p, p + "xw")
            if b_wide is not None:
                y = b.add("Add", [y, b_wide], p + "y")
        else:
            y = b.add("Gemm", [node.input[0], _const(b, w, p + "W", fmt, grid, source), *([b_wide] if b_wide else [])],
                      p + "y", transB=1)
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, n_out)], node.output[0])


@register_layer
class Conv(LayerKind):
    """Conv of any rank: [N, C, *spatial] with a weight [O, C/group, *kernel]."""

    op_type = "Conv"
    LOCAL_EXACT = False  # a kernel is shared across positions; local noise would draw each position apart

    def shapes(self, node: onnx.NodeProto, wshape: tuple[int, ...], shapes: dict[str, list[int]],
               where: str) -> tuple[list[int], list[int]]:
        xs, ys = shapes.get(node.input[0]), shapes.get(node.output[0])
        if xs is None or ys is None or len(xs) != len(wshape) or len(ys) != len(wshape):
            raise UnsupportedLayerError(f"{where}: {self.op_type} needs static {len(wshape) - 2}-D feature shapes "
                                        f"(got {xs} -> {ys})")
        return xs, ys

    def out_dims(self, node: onnx.NodeProto, wshape: tuple[int, ...], shapes: dict[str, list[int]],
                 where: str) -> list[int]:
        return self.shapes(node, wshape, shapes, where)[1][1:]

    def bias_shape(self, wshape: tuple[int, ...]) -> tuple[int, ...]:
        return (-1, *[1] * (len(wshape) - 2))

    def batched(self, b: Builder, layer: SampledLayer, w: Operand, bias: Operand | None) -> None:
        node, p, samples, wshape, shared = layer.node, layer.p, layer.samples, layer.wshape, layer.shared
        (_, c, *spatial), (_, o, *out_spatial) = self.shapes(node, wshape, layer.shapes, layer.where)
        attrs = attrs_of(node)
        group = int(attrs.pop("group", 1))
        x = node.input[0]
        if shared and group > 1:  # side by side, S members' groups would interleave: fold the input instead
            x, shared = b.fold_samples(x, p + "x_s", samples, [c, *spatial], p + "fold/"), False
        fmt = self.weight_format(node, wshape, layer.dtype, True)
        if not shared and isinstance(w, np.ndarray) and not isinstance(bias, str) and c // group < SPLIT_BELOW:
            self._split(b, layer, x, (c, spatial, o, out_spatial), w, bias, {**attrs, "group": group}, fmt)
            return
        if not shared:
            x = b.add("Reshape", [x, b.i64(p + "in_shape", -1, samples * c, *spatial)], p + "x")
            group *= samples
        w = reshape(b, w, (samples * wshape[0], *wshape[1:]), p + "w_shape", p + "W")  # ConvTranspose: [S·C, O/g, ..]
        # no ConvInteger in the integer form: onnxruntime 1.32's ConvInteger ran LeNet-5's grouped conv 4.6x slower
        # than the fp32 Conv (docs/speed.md); the builder folds the int8 weight to fp32 there
        b_flat = None if bias is None else _bias(b, reshape(b, bias, (-1,), p + "b_shape", p + "b"), p + "b")
        y = b.add(self.op_type, [x, self._member(b, layer, w, "W"), *([b_flat] if b_flat else [])], p + "y",
                  group=group, **attrs)
        _wide_out(b, p, y, [o, *out_spatial], node.output[0])


    def _split(self, b: Builder, layer: SampledLayer, x: str, dims: tuple[int, list[int], int, list[int]],
               w: np.ndarray, bias: Operand | None, attrs: dict[str, Any], fmt: str) -> None:
        """[B·S, C, *sp] -> Reshape [B, S·C, *sp] -> Split into S -> S Convs (W_s, b_s; ``attrs``: the Conv's, its
        group included) -> Concat [B, S·O, *sp']."""
        p, samples, grid, source = layer.p, layer.samples, layer.grid, layer.source
        c, spatial, o, out_spatial = dims
        xs = [f"{p}x{s}" for s in range(samples)]
        folded = b.add("Reshape", [x, b.i64(p + "in_shape", -1, samples * c, *spatial)], p + "x")
        b.nodes.append(onnx.helper.make_node("Split", [folded, b.i64(p + "split", *[c] * samples)], xs, axis=1))
        ys = [b.add(self.op_type, [xs[s], _const(b, w[s], f"{p}W{s}", fmt, grid, source),
                             *([_bias(b, bias[s], f"{p}b{s}")] if isinstance(bias, np.ndarray) else [])],
                    f"{p}y{s}", **attrs) for s in range(samples)]
        _wide_out(b, p, b.add("Concat", ys, p + "y", axis=1), [o, *out_spatial], layer.node.output[0])


def _wide_out(b: Builder, p: str, y: str, dims: list[int], out: str) -> None:
    """A Conv's output [B, S·O, *sp] as [B·S, O, *sp]: a Reshape named ``p + WIDE_OUT`` (:func:`sink_wide_outputs`)."""
    b.add("Reshape", [y, b.i64(p + "out_shape", -1, *dims)], out)
    b.nodes[-1].name = p + WIDE_OUT


def sink_wide_outputs(b: Builder, shapes: dict[str, list[int]], elementwise: frozenset[str]) -> None:
    """Run the unary elementwise ops and spatial pools after a Conv layer on its wide output [B, S·O, *sp].

    Both only see one channel of one row at a time, so they commute with the Reshape that regroups
    [B, S·O, *sp] as [B·S, O, *sp]: the Reshape moves below them (a pool's output takes its spatial shape from
    ``shapes``), and merges into a Reshape that follows (a flatten, or the next batched Conv's fold)::

        Conv -> Reshape -> Relu -> MaxPool -> Reshape    ==   Conv -> Relu -> MaxPool -> Reshape

    onnxruntime then fuses the Relu into the Conv and pools in its blocked (NCHWc) layout (LeNet-5 baked, S=16,
    batch 1: 1.5x -> 1.26x the float net on 16 copies, docs/speed.md). Each moved value has one consumer.
    """
    consts = {t.name: numpy_helper.to_array(t) for t in b.inits if t.data_type == onnx.TensorProto.INT64}
    for r in [n for n in b.nodes if n.op_type == "Reshape" and n.name.endswith(WIDE_OUT)]:
        while True:
            users = [n for n in b.nodes if r.output[0] in n.input]
            if len(users) != 1:
                break
            u, dims = users[0], consts[r.input[1]]
            pooled = shapes.get(u.output[0], [])[2:]
            if u.op_type in POOLS and len(u.output) == 1 and len(pooled) == len(dims) - 2:
                dims = np.array([*dims[:2], *pooled], np.int64)
                r.input[1] = b.i64(f"{r.name}/{u.output[0]}_shape", *dims.tolist())
                consts[r.input[1]] = dims
            elif u.op_type not in elementwise:
                break
            out = u.output[0]
            u.input[0], u.output[0] = r.input[0], f"{r.name}/{out}"
            r.input[0], r.output[0] = u.output[0], out
            b.nodes.remove(r)
            b.nodes.insert(b.nodes.index(u) + 1, r)
        users = [n for n in b.nodes if r.output[0] in n.input]
        after = consts.get(users[0].input[1]) if len(users) == 1 and users[0].op_type == "Reshape" else None
        if after is not None and 0 not in after:  # a Reshape of a Reshape is the second one (no copied dims)
            users[0].input[0] = r.input[0]
            b.nodes.remove(r)



WIDE_BINARY = frozenset({"Add", "Sub", "Mul"})


def run_wide(b: Builder, samples: int, elementwise: frozenset[str], keep: frozenset[str]) -> None:
    """Keep per-channel work between batched Conv layers on the wide layout [B, S·O, *sp] (after
    :func:`sink_wide_outputs`, for what it leaves: values with several consumers, BatchNormalization, Add).

    A value ``f = Reshape(w)`` from a Conv's wide output (a ``WIDE_OUT`` Reshape) is the same memory as ``w``
    read as [B·S, O, *sp]. An op whose data inputs are all such values (same dims) and that works per channel
    (unary ``elementwise``; BatchNormalization with constant statistics, tiled S times: channel s·O + o is member
    s's channel o; Add / Sub / Mul of two such values) runs on the wide values instead, its output read back
    through a new ``WIDE_OUT`` Reshape; a Reshape of such a value to [-1, S·C, *sp] (the next batched Conv's
    fold) reads the wide value directly, and Reshapes left without consumers go. onnxruntime then folds the
    BatchNormalization into the Conv, fuses the Relu and the residual Add (NCHWc Sum) into it, and keeps the
    blocked layout between Convs (ResNet-20 baked, docs/speed.md). ``keep``: values read later (the logits)."""
    inits = {t.name: t for t in b.inits}
    wide: dict[str, tuple[str, tuple[int, ...]]] = {}  # folded value -> (wide value, folded dims)
    nodes: list[onnx.NodeProto] = []
    for u in b.nodes:
        if u.op_type == "Reshape" and u.name.endswith(WIDE_OUT) and u.input[1] in inits:
            wide[u.output[0]] = (u.input[0], tuple(numpy_helper.to_array(inits[u.input[1]]).tolist()))
            nodes.append(u)
            continue
        data = [x for x in u.input[:2 if u.op_type in WIDE_BINARY else 1]]
        dims = {wide[x][1] for x in data if x in wide}
        params = list(u.input[1:]) if u.op_type == "BatchNormalization" else []
        ok = (len(dims) == 1 and all(x in wide for x in data) and len(u.output) == 1 and (
            u.op_type in elementwise or (u.op_type in WIDE_BINARY and len(u.input) == 2)
            or (u.op_type == "BatchNormalization" and all(x in inits for x in params))))
        if not ok:
            nodes.append(u)
            continue
        out = u.output[0]
        tiled = [b.f32(f"{out}/{WIDE_OUT}/{k}", np.tile(numpy_helper.to_array(inits[x]), samples))
                 for k, x in enumerate(params)]
        w_out = f"{out}/{WIDE_OUT}/y"
        nodes.append(onnx.helper.make_node(u.op_type, [wide[x][0] for x in data] + tiled, [w_out], name=u.name,
                                           domain=u.domain, **attrs_of(u)))
        (d,) = dims
        nodes.append(onnx.helper.make_node("Reshape", [w_out, b.i64(f"{out}/{WIDE_OUT}/shape", *d)], [out],
                                           name=f"{out}/{WIDE_OUT}"))
        wide[out] = (w_out, d)
    inits = {t.name: t for t in b.inits}
    same: dict[str, str] = {}
    for u in nodes:  # the next Conv's fold reads the wide value: [B·S, C, *sp] -> [B, S·C, *sp] is a view
        if u.op_type == "Reshape" and u.input[0] in wide and u.input[1] in inits:
            to = numpy_helper.to_array(inits[u.input[1]])
            d = wide[u.input[0]][1]
            if to[0] == -1 and 0 not in to and to[1] == samples * d[1] and tuple(to[2:]) == d[2:] \
                    and u.output[0] not in keep:  # [B, S·C, *sp] already: the Reshape goes, its readers read w
                same[u.output[0]] = wide[u.input[0]][0]
    nodes = [n for n in nodes if n.output[0] not in same]
    for n in nodes:
        n.input[:] = [same.get(x, x) for x in n.input]
    while True:  # Reshapes nobody reads
        used = {x for n in nodes for x in n.input} | keep
        dead = [n for n in nodes if n.op_type == "Reshape" and n.name.endswith(WIDE_OUT) and n.output[0] not in used]
        if not dead:
            break
        nodes = [n for n in nodes if n not in dead]
    b.nodes[:] = nodes


@register_layer
class ConvTranspose(Conv):
    """ConvTranspose of any rank: [N, C, *spatial] with a weight [C, O/group, *kernel].

    Over the sample axis it is the grouped op as for Conv: S·group groups, the S weights stacked on the input
    axis ([S·C, O/group, *kernel]) and the biases as [S·O]; output channel s·O + o is member s's channel o.
    (``output_shape``, pads and strides are spatial and unchanged.)
    """

    op_type = "ConvTranspose"

    def out_dim(self, node: onnx.NodeProto, wshape: tuple[int, ...]) -> int:
        return int(wshape[1]) * int(attrs_of(node).get("group", 1))

    def batched(self, b: Builder, layer: SampledLayer, w: Operand, bias: Operand | None) -> None:
        """As Conv, on the folded input; a ``shared`` input ([B, ...], the same for every sample) is folded first
        (the members side by side on the output axis would need the weight interleaved on its axis 1)."""
        if layer.shared:
            layer = dataclasses.replace(layer, node=_folded_input(b, layer), shared=False)
        super().batched(b, layer, w, bias)


@register_layer
class BatchNormalization(LayerKind):
    """The affine part of a Bayesian batch norm: ``BatchNormalization(x̂, scale, shift, 0, 1, epsilon=0)``.

    The importers emit a batch norm with a sampled scale and shift as a deterministic normalisation
    (running statistics) followed by this node, which is linear in the scale ``w`` [C] and shift ``b`` [C]:
    ``y = w ⊙ x̂ + b`` per channel (torchbnn's ``BayesBatchNorm2d``). Only a node with epsilon 0 is this kind
    (:meth:`matches`); other batch norms are deterministic ops to the exporters, and a sampled weight feeding one
    is refused as any unsupported layer is.

    Over the sample axis (exact, elementwise)::

        [B·S, C, *sp] -> Reshape [B, S, C, *sp] -> Mul w_s [S, C, 1..] -> Add b_s [S, C, 1..] -> Reshape [B·S, C, *sp]

    (``shared``: the input [B, C, *sp] is viewed as [B, 1, C, *sp] and broadcasts over the members.)

    ``plain`` is the same node on other operands (a zero shift where none is given), so local noise and the
    analytic mode get ``op(x², σ²) = σ² ⊙ x²`` per channel, as for any layer linear in its weight.
    """

    op_type = "BatchNormalization"
    LOCAL_EXACT = False  # a channel's scale is shared across positions, as a Conv kernel is

    def matches(self, node: onnx.NodeProto) -> bool:
        attrs = attrs_of(node)
        return attrs.get("epsilon", 1e-5) == 0.0 and not attrs.get("training_mode", 0)

    def out_dims(self, node: onnx.NodeProto, wshape: tuple[int, ...], shapes: dict[str, list[int]],
                 where: str) -> list[int]:
        self.attrs(node, where)
        xs = shapes.get(node.input[0])
        if xs is None:
            raise UnsupportedLayerError(f"{where}: BatchNormalization needs a static feature shape")
        return xs[1:]

    def bias_shape(self, wshape: tuple[int, ...]) -> tuple[int, ...]:
        return (-1, 1, 1)  # [B, C, H, W]: the Bayesian batch norms the libraries have are 2-D (BayesBatchNorm2d)

    def plain(self, b: Builder, node: onnx.NodeProto, inputs: list[str], out: str) -> str:
        shift = inputs[2] if len(inputs) > 2 else node.input[3]  # the statistic 0 [C] is a zero shift
        return b.add("BatchNormalization", [inputs[0], inputs[1], shift, *node.input[3:5]], out,
                     **attrs_of(node))

    def batched(self, b: Builder, layer: SampledLayer, w: Operand, bias: Operand | None) -> None:
        node, p, samples, wshape = layer.node, layer.p, layer.samples, layer.wshape
        c, *spatial = self.out_dims(node, wshape, layer.shapes, layer.where)
        ones = (1,) * len(spatial)
        rows = 1 if layer.shared else samples  # a shared input [B, ...] broadcasts over the S members
        x = b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, rows, c, *spatial)], p + "x")
        w = reshape(b, w, (samples, c, *ones), p + "w_shape", p + "W")
        y = b.add("Mul", [x, self._member(b, layer, w, "W")],
                  p + "xw")
        if bias is not None:
            bias = reshape(b, bias, (samples, c, *ones), p + "b_shape", p + "b")
            y = b.add("Add", [y, _bias(b, bias, p + "b")], p + "y")
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, c, *spatial)], node.output[0])


@register_layer
class DropoutMul(LayerKind):
    """``Mul(x, mask)`` of an MC-dropout layer (:mod:`edgebnn.families.dropout`, value ``*.dropout_mask``):
    a mask [*features] or [C, 1, ...] per sample on the activation.

    Over the sample axis (exact, elementwise)::

        [B·S, *f] -> Reshape [B, S, *f] -> Mul M_s [S, *mask shape] -> Reshape [B·S, *f]

    (``shared``: the input [B, *f] is viewed as [B, 1, *f] and broadcasts over the members.)

    ``plain`` is the Mul itself, so ``analytic`` propagates m' = m, v' = (m² + v)·p/(1-p) + v (the mask's
    moments (1, p/(1-p)) through the layer rule). Other Mul nodes are not this kind (:meth:`matches`).
    """

    op_type = "Mul"
    LOCAL_EXACT = False  # a mask is Bernoulli, not Gaussian: noise draws it (uniform input per sample)

    def matches(self, node: onnx.NodeProto) -> bool:
        return len(node.input) == 2 and node.input[1].endswith(MASK_SUFFIX)

    def out_dims(self, node: onnx.NodeProto, wshape: tuple[int, ...], shapes: dict[str, list[int]],
                 where: str) -> list[int]:
        xs = shapes.get(node.input[0])
        if xs is None or len(xs) != len(wshape) + 1:
            raise UnsupportedLayerError(f"{where}: MC dropout needs a static feature shape (got {xs})")
        return xs[1:]

    def bias_shape(self, wshape: tuple[int, ...]) -> tuple[int, ...]:
        return (-1,)  # no bias

    def batched(self, b: Builder, layer: SampledLayer, w: Operand, bias: Operand | None) -> None:
        node, p, samples, wshape = layer.node, layer.p, layer.samples, layer.wshape
        dims = self.out_dims(node, wshape, layer.shapes, layer.where)
        rows = 1 if layer.shared else samples  # a shared input [B, ...] broadcasts over the S members
        x = b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, rows, *dims)], p + "x")
        y = b.add("Mul", [x, self._member(b, layer, w, "M")],
                  p + "xm")
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, *dims)], node.output[0])


def _folded_input(b: Builder, layer: SampledLayer) -> onnx.NodeProto:
    """The layer's node reading its input [B, *dims] folded to [B·S, *dims]."""
    node, p, samples, shapes = layer.node, layer.p, layer.samples, layer.shapes
    dims = shapes[node.input[0]][1:]
    folded = b.fold_samples(node.input[0], p + "x_s", samples, dims, p + "fold/")
    shapes[folded] = shapes[node.input[0]]
    return renamed_input(node, node.input[0], folded)


def layer_kind(node: onnx.NodeProto) -> LayerKind | None:
    """The kind of ``node``, or None when no exporter rewrites its op type."""
    kind = LAYERS.get(node.op_type)
    return kind if kind is not None and kind.matches(node) else None
