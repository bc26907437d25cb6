"""Sampled weights into MatMul: a Linear on a 3-D input (``nn.TransformerEncoderLayer``'s MLP, attention
projections, any ``F.linear`` on [B, T, in]).

torch exports such a Linear as ``Transpose(W) -> MatMul(x, ·) -> Add(·, b)``: the sampled weight reaches the MatMul
through a view (Transposes and Reshapes of the weight alone), and the bias is a separate Add.
:func:`fuse_weight_views` rewrites each such chain whose weight (or bias) samples into ONE node the exporters hand to
a layer kind::

    MatMul(x, W[, b])  with attribute VIEW = the view's steps ("Transpose 1 0", "Reshape 4 8"), applied to W

(the node exists only inside the rewrite: :data:`VIEW` marks it, and no other MatMul is this kind.) Its layer kind
:class:`MatMul` replays the view on one member (``plain``: ``noise --noise local`` on (x, mu) and (x², σ²)) or on
the S members at once (``batched``)::

    [B·S, *lead, K] -> Reshape [B, S, M, K] -> MatMul view(W_s) [S, K, N] -> + b_s [S, 1, N] -> Reshape [B·S, *lead, N]

(M = prod(lead): the tokens; a shared input [B, ...] is folded first.) The weights are shared across the M
positions, so local reparameterization is not exact here (``LOCAL_EXACT`` False, as for Conv): ``auto`` draws the
weights per sample, and ``--noise local`` draws each position apart.
"""

from __future__ import annotations

import dataclasses
import math

import onnx

from edgebnn.errors import UnsupportedLayerError
from edgebnn.exporters._graph import Builder
from edgebnn.exporters.layers import (
    LayerKind,
    Operand,
    SampledLayer,
    _bias,
    _folded_input,
    register_layer,
    reshape,
    transpose,
)

VIEW = "edgebnn_weight_view"  # the fused node's steps from the weight to the MatMul's operand
Step = tuple[str, tuple[int, ...]]


def steps(node: onnx.NodeProto) -> list[Step]:
    """The view's steps of a fused node: ("Transpose", perm) or ("Reshape", dims)."""
    out: list[Step] = []
    for a in node.attribute:
        if a.name == VIEW:
            for s in a.strings:
                op, *args = s.decode().split()
                out.append((op, tuple(int(v) for v in args)))
    return out


def viewed_shape(node: onnx.NodeProto, wshape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape the view gives a weight of shape ``wshape``."""
    shape = tuple(int(d) for d in wshape)
    for op, args in steps(node):
        shape = tuple(shape[i] for i in args) if op == "Transpose" else args
    return shape


def view(b: Builder, node: onnx.NodeProto, w: Operand, lead: tuple[int, ...], name: str) -> Operand:
    """The node's view applied to ``w`` ([*lead, *weight shape]: ``lead`` = (S,) for the members)."""
    n = len(lead)
    for k, (op, args) in enumerate(steps(node)):
        if op == "Transpose":
            w = transpose(b, w, (*range(n), *(a + n for a in args)), f"{name}{k}")
        else:
            w = reshape(b, w, (*lead, *args), f"{name}{k}_shape", f"{name}{k}")
    return w


@register_layer
class MatMul(LayerKind):
    """``MatMul(x, view(W))`` plus an optional bias, as :func:`fuse_weight_views` writes it: x [N, *lead, K], the
    viewed weight [K, N_out] (a 2-D operand: a Linear's)."""

    op_type = "MatMul"
    LOCAL_EXACT = False  # one weight for every position of the lead axes (the tokens)

    def matches(self, node: onnx.NodeProto) -> bool:
        return any(a.name == VIEW for a in node.attribute)

    def out_dim(self, node: onnx.NodeProto, wshape: tuple[int, ...]) -> int:
        return int(viewed_shape(node, wshape)[-1])

    def out_dims(self, node: onnx.NodeProto, wshape: tuple[int, ...], shapes: dict[str, list[int]],
                 where: str) -> list[int]:
        ys = shapes.get(node.output[0])
        if len(viewed_shape(node, wshape)) != 2:
            raise UnsupportedLayerError(f"{where}: MatMul on a sampled weight viewed as "
                                        f"{list(viewed_shape(node, wshape))}: only a 2-D weight operand is supported")
        if ys is None or len(ys) < 2 or any(not isinstance(d, int) or d <= 0 for d in ys[1:]):
            raise UnsupportedLayerError(_no_static_shape(node, viewed_shape(node, wshape), shapes, where))
        return list(ys[1:])

    def bias_shape(self, wshape: tuple[int, ...]) -> tuple[int, ...]:
        return (-1,)

    def plain(self, b: Builder, node: onnx.NodeProto, inputs: list[str], out: str) -> str:
        w = view(b, node, inputs[1], (), out + "/w")
        assert isinstance(w, str)
        if len(inputs) < 3:
            return b.add("MatMul", [inputs[0], w], out)
        return b.add("Add", [b.add("MatMul", [inputs[0], w], out + "/xw"), inputs[2]], out)

    def batched(self, b: Builder, layer: SampledLayer, w: Operand, bias: Operand | None) -> None:
        if layer.shared:  # the members side by side would need a [B, *lead, S, N] regrouping: fold the input
            layer = dataclasses.replace(layer, node=_folded_input(b, layer), shared=False)
        node, p, samples = layer.node, layer.p, layer.samples
        *lead, n_out = self.out_dims(node, layer.wshape, layer.shapes, layer.where)
        n_in = int(viewed_shape(node, layer.wshape)[0])
        w = view(b, node, w, (samples,), p + "W_v")  # [S, K, N]
        x = b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, samples, math.prod(lead), n_in)], p + "x")
        y = b.add("MatMul", [x, self._member(b, layer, w, "W")], p + "xw")  # [B, S, M, N]
        if bias is not None:
            b3 = reshape(b, bias, (samples, 1, n_out), p + "b_shape", p + "b3")
            y = b.add("Add", [y, _bias(b, b3, p + "b")], p + "y")
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, *lead, n_out)], node.output[0])


def fuse_weight_views(nodes: list[onnx.NodeProto], encoded: set[str], quiet: set[str],
                      shapes: dict[str, list[int]]) -> list[onnx.NodeProto]:
    """``nodes`` with each ``W -> Transpose/Reshape ... -> MatMul(x, ·) [-> Add(·, b)]`` whose weight ``W`` or bias
    ``b`` (encoded weights) samples as one fused :class:`MatMul` node (module docstring); a fused layer samples
    whole: its weight and bias leave ``quiet`` (updated in place). Each value of the chain has that one reader."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for x in set(node.input):
            readers.setdefault(x, []).append(node)
    gone: set[int] = set()
    fused: dict[int, onnx.NodeProto] = {}
    for w in [x for x in encoded if x in readers]:
        chain, view_steps, value = _chain(w, readers, shapes)
        users = readers.get(value, [])
        if len(users) != 1 or users[0].op_type != "MatMul" or list(users[0].input[1:]) != [value]:
            continue
        mm = users[0]
        add = _bias_add(mm, readers, encoded, shapes)
        bias = [x for x in add.input if x != mm.output[0]] if add is not None else []
        if w in quiet and not any(x not in quiet for x in bias):
            continue
        quiet.difference_update([w, *bias])
        attr = onnx.helper.make_attribute(VIEW, [s.encode() for s in view_steps], attr_type=onnx.AttributeProto.STRINGS)
        new = onnx.helper.make_node("MatMul", [mm.input[0], w, *bias], [(add or mm).output[0]], name=mm.name)
        new.attribute.append(attr)
        gone.update(id(n) for n in chain)
        if add is not None:
            gone.add(id(add))
        fused[id(mm)] = new
    return [fused.get(id(n), n) for n in nodes if id(n) not in gone]


def _chain(w: str, readers: dict[str, list[onnx.NodeProto]], shapes: dict[str, list[int]],
           ) -> tuple[list[onnx.NodeProto], list[str], str]:
    """The Transposes and Reshapes from ``w`` on (each value read by that one node), their steps, the last value."""
    chain: list[onnx.NodeProto] = []
    out: list[str] = []
    value = w
    shape = shapes.get(w)
    while shape is not None:
        users = readers.get(value, [])
        if len(users) != 1 or users[0].input[0] != value or users[0].op_type not in ("Transpose", "Reshape"):
            break
        u = users[0]
        if u.op_type == "Transpose":
            perm = next((list(a.ints) for a in u.attribute if a.name == "perm"), list(range(len(shape)))[::-1])
            out.append("Transpose " + " ".join(map(str, perm)))
        else:
            dims = shapes.get(u.output[0])
            if dims is None or any(not isinstance(d, int) or d < 0 for d in dims):
                break
            out.append("Reshape " + " ".join(map(str, dims)))
        chain.append(u)
        value = u.output[0]
        shape = shapes.get(value)
    return chain, out, value


def _bias_add(mm: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]], encoded: set[str],
              shapes: dict[str, list[int]]) -> onnx.NodeProto | None:
    """The Add of an encoded bias [N] right after the MatMul (its one reader), if any."""
    users = readers.get(mm.output[0], [])
    if len(users) != 1 or users[0].op_type != "Add" or len(users[0].input) != 2:
        return None
    add = users[0]
    (other,) = [x for x in add.input if x != mm.output[0]] or [None]
    out = shapes.get(mm.output[0])
    if other is None or other not in encoded or out is None:
        return None
    b = shapes.get(other)
    return add if b is not None and list(b) == [out[-1]] else None


def _no_static_shape(node: onnx.NodeProto, viewed: tuple[int, ...], shapes: dict[str, list[int]], where: str) -> str:
    """Why a sampled MatMul's output has no static feature shape, naming the node, its input's shape and the weight's
    (a weight whose first axis is not the input's last: a malformed weight)."""
    xs, ys = shapes.get(node.input[0]), shapes.get(node.output[0])
    head = (f"{where}: MatMul {node.name or node.output[0]!r} needs a static feature shape (its output's is {ys}; "
            f"input {xs}, weight viewed as {list(viewed)})")
    if xs and isinstance(xs[-1], int) and xs[-1] != viewed[0]:
        return (f"{head}: the input's last axis ({xs[-1]}) must equal the weight's first ({viewed[0]}); the weight "
                "is malformed (its shape does not match the layer's input)")
    return f"{head}: give the input a static shape (edgebnn import --input-shape)"
