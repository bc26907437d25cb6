"""Layer kinds: how each op that reads a sampled weight is emitted, once, for every export mode.

A layer kind is registered by ONNX op type (:data:`LAYERS`) and gives:

- ``batched``: the op over the sample axis with one weight per sample ``W_s`` ([S, *weight shape]), on the
  folded input (row b·S + s) — ``baked`` and ``noise --noise weight``;
- ``plain``: the op itself with its own attributes on other operands — ``noise --noise local`` runs it on
  (x, mu) and (x², σ²), ``analytic`` on means and variances;
- ``out_dims`` / ``bias_shape``: the per-row output shape and how a per-output bias broadcasts on it;
- ``LOCAL_EXACT``: whether local reparameterization is exact (each output has its own weights) — ``auto``
  noise draws per row where it is, per weight where weights are shared across positions.

Batched forms (S samples, no transposes of activations, one op per layer)::

    Conv, any rank (group g):  [B·S, C, *sp] -> Reshape [B, S·C, *sp] -> Conv(W_s as [S·O, C/g, *k],
                                group S·g, bias b_s as [S·O]) -> [B, S·O, *sp'] -> Reshape [B·S, O, *sp']
    Gemm:                      [B·S, in] -> Reshape [B, S, 1, in] -> MatMul W_s [S, in, out]
                                -> + b_s [S, 1, out] -> Reshape [B·S, out]

Weights and biases reach ``batched`` as an :data:`Operand`: a constant array not emitted yet (``baked``: laid
out in numpy, then stored in the requested weight format) or a graph value (``noise``: laid out by nodes).

ConvTranspose (weight [C, O/g, *k]) stacks its S weights as [S·C, O/g, *k] with group S·g, as Conv does; the
affine node of a Bayesian batch norm multiplies on a [B, S, C, *sp] view (:class:`BatchNormalization`).
Adding a layer kind is one :class:`LayerKind` subclass registered here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import onnx

from edgebnn.errors import UnsupportedLayerError
from edgebnn.exporters._graph import Builder, attrs_of, renamed_input
from edgebnn.ir.encodings import MASK_SUFFIX, Grid

Operand = np.ndarray | str  # a constant not emitted yet, or the name of a graph value
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

    @abstractmethod
    def batched(self, b: Builder, node: onnx.NodeProto, p: str, samples: int, wshape: tuple[int, ...],
                w: Operand, bias: Operand | None, shapes: dict[str, list[int]], where: str,
                dtype: str = "fp32", grid: Grid | None = None) -> None:
        """Emit the op over the sample axis: ``w`` is [S, *wshape], ``bias`` [S, out]; ``node.output[0]`` is
        [B·S, ...]. Constant weights take ``dtype`` (with ``grid``: exact), constant biases fp32."""


def _const(b: Builder, v: Operand, name: str, dtype: str = "fp32", grid: Grid | None = None) -> str:
    return b.weight(name, v, dtype, grid) if isinstance(v, np.ndarray) else v


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

    def batched(self, b: Builder, node: onnx.NodeProto, p: str, samples: int, wshape: tuple[int, ...],
                w: Operand, bias: Operand | None, shapes: dict[str, list[int]], where: str,
                dtype: str = "fp32", grid: Grid | None = None) -> None:
        attrs = self.attrs(node, where)
        n_out = self.out_dim(node, wshape)
        if attrs.get("transB", 0):
            w = transpose(b, w, (0, 2, 1), p + "W_t")  # [S, out, in] -> [S, in, out]
        n_in = int(wshape[1] if attrs.get("transB", 0) else wshape[0])
        x = b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, samples, 1, n_in)], p + "x")
        y = b.add("MatMul", [x, _const(b, w, p + "W", self.weight_format(node, wshape, dtype, True), grid)], p + "xw")
        if bias is not None:
            y = b.add("Add", [y, _const(b, unsqueeze(b, bias, 1, p + "axis1", p + "b3"), p + "b")], p + "y")
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

    def batched(self, b: Builder, node: onnx.NodeProto, p: str, samples: int, wshape: tuple[int, ...],
                w: Operand, bias: Operand | None, shapes: dict[str, list[int]], where: str,
                dtype: str = "fp32", grid: Grid | None = None) -> None:
        (_, c, *spatial), (_, o, *out_spatial) = self.shapes(node, wshape, shapes, where)
        attrs = attrs_of(node)
        group = int(attrs.pop("group", 1))
        w = reshape(b, w, (samples * wshape[0], *wshape[1:]), p + "w_shape", p + "W")  # ConvTranspose: [S·C, O/g, ..]
        inputs = [b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, samples * c, *spatial)], p + "x"),
                  _const(b, w, p + "W", self.weight_format(node, wshape, dtype, True), grid)]
        if bias is not None:
            inputs.append(_const(b, reshape(b, bias, (-1,), p + "b_shape", p + "b"), p + "b"))
        y = b.add(self.op_type, inputs, p + "y", group=group * samples, **attrs)
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, o, *out_spatial)], node.output[0])


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

    def batched(self, b: Builder, node: onnx.NodeProto, p: str, samples: int, wshape: tuple[int, ...],
                w: Operand, bias: Operand | None, shapes: dict[str, list[int]], where: str,
                dtype: str = "fp32", grid: Grid | None = None, shared: bool = False) -> None:
        """As Conv, on the folded input; a ``shared`` input ([B, ...], the same for every sample) is folded first
        (the members side by side on the output axis would need the weight interleaved on its axis 1)."""
        if shared:
            node = _folded_input(b, node, p, samples, shapes)
        super().batched(b, node, p, samples, wshape, w, bias, shapes, where, dtype, grid)


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

    def batched(self, b: Builder, node: onnx.NodeProto, p: str, samples: int, wshape: tuple[int, ...],
                w: Operand, bias: Operand | None, shapes: dict[str, list[int]], where: str,
                dtype: str = "fp32", grid: Grid | None = None, shared: bool = False) -> None:
        c, *spatial = self.out_dims(node, wshape, shapes, where)
        ones = (1,) * len(spatial)
        rows = 1 if shared else samples  # a shared input [B, ...] broadcasts over the S members
        x = b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, rows, c, *spatial)], p + "x")
        w = reshape(b, w, (samples, c, *ones), p + "w_shape", p + "W")
        y = b.add("Mul", [x, _const(b, w, p + "W", self.weight_format(node, wshape, dtype, True), grid)], p + "xw")
        if bias is not None:
            bias = reshape(b, bias, (samples, c, *ones), p + "b_shape", p + "b")
            y = b.add("Add", [y, _const(b, bias, p + "b")], p + "y")
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, c, *spatial)], node.output[0])


@register_layer
class DropoutMul(LayerKind):
    """``Mul(x, mask)`` of an MC-dropout layer (:class:`edgebnn.ir.encodings.DropoutMask`, value ``*.dropout_mask``):
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

    def batched(self, b: Builder, node: onnx.NodeProto, p: str, samples: int, wshape: tuple[int, ...],
                w: Operand, bias: Operand | None, shapes: dict[str, list[int]], where: str,
                dtype: str = "fp32", grid: Grid | None = None, shared: bool = False) -> None:
        dims = self.out_dims(node, wshape, shapes, where)
        rows = 1 if shared else samples  # a shared input [B, ...] broadcasts over the S members
        x = b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, rows, *dims)], p + "x")
        y = b.add("Mul", [x, _const(b, w, p + "M", self.weight_format(node, wshape, dtype, True), grid)], p + "xm")
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, *dims)], node.output[0])


def _folded_input(b: Builder, node: onnx.NodeProto, p: str, samples: int, shapes: dict[str, list[int]],
                  ) -> onnx.NodeProto:
    """``node`` reading its input [B, *dims] folded to [B·S, *dims]."""
    dims = shapes[node.input[0]][1:]
    folded = b.fold_samples(node.input[0], p + "x_s", samples, dims, p + "fold/")
    shapes[folded] = shapes[node.input[0]]
    return renamed_input(node, node.input[0], folded)


def layer_kind(node: onnx.NodeProto) -> LayerKind | None:
    """The kind of ``node``, or None when no exporter rewrites its op type."""
    kind = LAYERS.get(node.op_type)
    return kind if kind is not None and kind.matches(node) else None
