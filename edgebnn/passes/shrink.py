"""``shrink``: pruned units leave the graph, so the layers get smaller shapes; the predictive is unchanged.

``prune`` (and VNQ, ternary, Bayesian Compression's group pruning) set weights to exact, deterministic zeros
(μ = σ = 0) but keep the shapes, so a dead output unit, input neuron or conv filter still costs bytes and
FLOPs in every export. This pass removes whole units between a *producer* layer P and the *consumer* layer
C that reads its output. P and C are ``Gemm`` (``transA = 0``), ``MatMul`` (2-D weight) or ``Conv``
(``group = 1``); between them only ops that act on each unit alone:

    Relu, LeakyRelu, Tanh, Sigmoid, Elu, Identity; BatchNormalization (a Conv output, or a Gemm's [B, F]);
    Add / Sub / Mul / Div by a per-unit constant (a MatMul's bias); MaxPool, AveragePool, GlobalMaxPool,
    GlobalAveragePool (a Conv output); then, for Conv → … → Linear, one Flatten (axis 1) or a Reshape that
    ONNX shape inference shows flattens [B, C, H, W] to [B, C·H·W] (its target a 2-entry constant), which
    maps unit j to the H·W consecutive columns j·H·W … (j+1)·H·W − 1 of C.

Unit j of P is removed when one of these holds (it then cannot change any output):

(a) its columns in C are zero in every draw (μ = σ = 0 for every encoding, a deterministic 0 for a float
    weight): whatever P computes for unit j is multiplied by 0;
(b) P's row j is zero in every draw, so unit j is the constant b_j (P's bias; 0 without one) wherever its
    bias is deterministic, and that constant mapped through the ops between (ReLU, the BatchNorm affine,
    the per-unit Add/Mul, …, in float32) is exactly 0 at C;
(c) as (b) but the constant c_j reaching C is not 0, C's columns of unit j are deterministic (σ = 0) and C is
    a ``Gemm`` or an unpadded ``Conv`` whose bias is a float initializer (or absent): c_j · Σ W_C[:, cols_j]
    is folded into C's bias (an affine identity; float32 rounding of the sum aside).

Removing unit j drops row j of P's weight (``Encoding.select``: the codes are kept exactly), its bias entry,
the unit's parameters of every op between (BatchNorm scale/bias/mean/var, a per-unit constant, a dropout
mask), the Reshape target's width, and unit j's columns of C; shape annotations of the values in between are
dropped (``value_info``). Removing P's rows can leave columns of P itself all zero, so the pass repeats until
nothing changes. It never removes the last unit of a layer, keeps a Gemm/MatMul's width even where it was
(:data:`EVEN_WIDTH`: one dead unit stays rather than lose the int4 weight format), and leaves alone (reported
under ``skipped`` where the layer has dead rows) anything it cannot prove exact: a unit read by two nodes or by
a graph output (residual Add joins, Concat, shared weights), any other op between, grouped convolutions, and
encodings that do not override ``Encoding.select`` (deep-ensemble members, SWAG's low-rank and the
Kronecker/dense Laplace families).

Draws: the stream of weight i stays ``default_rng([seed, i])``, but a smaller weight consumes it in a
smaller shape, so ``baked`` members of the shrunk model are other draws of the same posterior than the
unshrunk model's (the moment modes, ``analytic``, agree to float rounding).

Report: one row per changed encoded weight (``name``, ``layer``, ``shape_before``, ``shape``,
``units_removed`` {``outputs``, ``inputs``}), ``edges`` (per producer → consumer: units before, removed, and
how many by each rule) and ``skipped`` (``layer``, ``reason``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from edgebnn.ir import DOMAIN, ENCODINGS, BNNModel, EncodedWeight, Encoding, attrs_of
from edgebnn.passes.base import Pass, PassConfig, PassResult

MAX_ROUNDS = 4  # removals per node at most (each removal shrinks a layer; a bound, not a tuning knob)
_DEFAULT_DOMAINS = ("", "ai.onnx")
# A Gemm/MatMul layer with an even number of units keeps an even number (one dead unit stays when the count of dead
# ones is odd; keeping a dead unit is exact): ``baked --weights int4`` stores a dense weight in int4 only with an
# even output dim (TensorRT's weight-only int4 GEMMs, exporters/layers.py), else in int8. On the Bayesian
# Compression digits CNN, fc1 shrunk from 32 to 25 units made its baked int4 export 18% larger than unshrunk.
EVEN_WIDTH = True


@dataclass(frozen=True)
class ShrinkConfig(PassConfig):
    """``shrink`` has no settings: every removal it makes is exact."""


class _Param:
    """A tensor a layer reads: a float initializer or an encoded weight (read by exactly one node).

    An encoded weight is decoded only when asked for, one at a time, and what the planning needs of it is kept
    as small per-axis summaries (:meth:`zero_along`, :meth:`fixed_along`), so a survey of the whole model holds
    one layer's arrays at a time, as every pass does.
    """

    def __init__(self, model: BNNModel, name: str, *, array: np.ndarray | None = None,
                 node: onnx.NodeProto | None = None, summaries: dict[str, dict[int, tuple[np.ndarray, ...]]]) -> None:
        self.model, self.name, self.array, self.node = model, name, array, node
        self._summaries = summaries
        if node is not None:
            self.shape = tuple(next(list(a.ints) for a in node.attribute if a.name == "shape"))
            self.kind = node.op_type
        else:
            self.shape, self.kind = tuple(np.asarray(array).shape), "tensor"

    @property
    def sliceable(self) -> bool:
        """Whether :meth:`select` keeps this kind's codes exactly (``Encoding.select`` overridden)."""
        return self.node is None or ENCODINGS[self.kind].select is not Encoding.select

    def encoding(self) -> Encoding:
        return self.model.encoded_weight(self.name).encoding

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, standard deviation), float32, decoded now (not kept)."""
        if self.node is None:
            value = np.asarray(self.array, np.float32)
            return value, np.zeros_like(value)
        enc = self.encoding()
        return enc.mean(), enc.stddev()

    def _summary(self, axis: int) -> tuple[np.ndarray, ...]:
        if self.name not in self._summaries:
            mean, sd = self.moments()
            fixed = sd == 0
            zero = fixed & (mean == 0)
            del mean, sd
            self._summaries[self.name] = {
                a: (zero.all(axis=others), fixed.all(axis=others))
                for a in range(zero.ndim) for others in [tuple(i for i in range(zero.ndim) if i != a)]}
        return self._summaries[self.name][axis]

    def zero_along(self, axis: int) -> np.ndarray:
        """Per index along ``axis``: whether the whole slice is 0 in every draw (μ = σ = 0; a float 0)."""
        return self._summary(axis)[0]

    def fixed_along(self, axis: int) -> np.ndarray:
        """Per index along ``axis``: whether the whole slice is deterministic (σ = 0: every draw is the mean)."""
        return self._summary(axis)[1]

    def select(self, axis: int, index: np.ndarray) -> np.ndarray | Encoding:
        """The kept slices (decoded now; :attr:`sliceable` says whether an encoding can be)."""
        if self.node is None:
            return np.take(self.array, index, axis)  # type: ignore[arg-type]
        new = self.encoding().select(axis, index)
        assert new is not None, f"{self.kind} overrides select but returned None"
        return new


@dataclass
class _Layer:
    """A Gemm / MatMul / Conv node whose weight is a :class:`_Param`."""

    node: onnx.NodeProto
    weight: _Param
    out_axis: int  # the weight's axis along output units
    in_axis: int  # the weight's axis along input features / channels
    bias: _Param | None
    conv: bool
    alpha: float = 1.0  # Gemm: Y = alpha·A·B + beta·C
    beta: float = 1.0

    @property
    def units(self) -> int:
        return self.weight.shape[self.out_axis]

    def bias_value(self) -> np.ndarray:
        """Per unit: the deterministic bias (beta·C, 0 without one), NaN where the bias is random."""
        if self.bias is None:
            return np.zeros(self.units)
        return self.beta * _unit_values(self.bias, self.units)

    @property
    def from_end(self) -> int:
        """Position of the unit axis in the layer's output, counted from the right."""
        return len(self.weight.shape) - 1 if self.conv else 1


@dataclass
class _Edge:
    """A producer, the per-unit ops after it, and the layer that reads the result."""

    producer: _Layer
    ops: list[tuple[onnx.NodeProto, _Op]]
    consumer: _Layer
    values: list[str]  # the values whose width changes (producer output ... consumer input)
    flatten: onnx.NodeProto | None = None


@dataclass
class _Plan:
    """What removing ``dead`` units of an edge writes."""

    slices: list[tuple[_Param, int, np.ndarray]] = field(default_factory=list)  # (param, axis, kept), in order
    values: dict[str, np.ndarray] = field(default_factory=dict)  # small tensors written whole (bias, Reshape target)
    removed: int = 0
    by_rule: dict[str, int] = field(default_factory=dict)


# -- per-unit ops -------------------------------------------------------------------------------------------------
class _Op:
    """An op between producer and consumer that acts on each unit alone."""

    conv_only = False  # only on a Conv output (spatial axes after the channel axis)

    def params(self, node: onnx.NodeProto, graph: _Graph, producer: _Layer) -> list[tuple[_Param, int]] | str:
        """The per-unit parameters to slice, with their unit axis, or why the op cannot be followed."""
        return []

    def constant(self, node: onnx.NodeProto, graph: _Graph, c: np.ndarray) -> np.ndarray:
        """The op's output for a unit that is the constant c (NaN: not provably constant), float32 maths."""
        return c


class _Elementwise(_Op):
    def __init__(self, fn: Callable[[np.ndarray, dict[str, Any]], np.ndarray]) -> None:
        self.fn = fn

    def constant(self, node: onnx.NodeProto, graph: _Graph, c: np.ndarray) -> np.ndarray:
        attrs = attrs_of(node)
        with np.errstate(all="ignore"):
            return self.fn(c.astype(np.float32), attrs).astype(np.float64)


class _Pool(_Op):
    conv_only = True

    def constant(self, node: onnx.NodeProto, graph: _Graph, c: np.ndarray) -> np.ndarray:
        attrs = attrs_of(node)
        padded = any(attrs.get("pads", [])) or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID")
        if node.op_type == "AveragePool" and padded and attrs.get("count_include_pad", 0):
            return np.where(c == 0, 0.0, np.nan)  # a padded border averages c with zeros
        return c  # a max or average of a constant map (MaxPool pads with -inf)


def _per_unit(graph: _Graph, name: str, units: int, from_end: int) -> tuple[_Param, int | None] | str:
    """A parameter broadcast per unit (unit axis ``from_end`` from the right): (param, its axis or None)."""
    p = graph.param(name)
    if p is None:
        return f"its operand {name!r} is not a constant read by it alone"
    shape = p.shape
    axis = len(shape) - from_end
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or (axis >= 0 and shape[axis] not in (1, units)):
        return f"its operand {name!r} of shape {list(shape)} is not per unit"
    return p, (axis if axis >= 0 and shape[axis] == units and units > 1 else None)


def _unit_values(p: _Param, units: int) -> np.ndarray:
    """Per unit: the parameter's deterministic value (NaN where it is random)."""
    mean, sd = p.moments()
    value = np.where(sd == 0, mean, np.nan).reshape(-1)
    return np.broadcast_to(value, (units,)) if value.size == 1 else value


_ARITHMETIC: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


class _Binary(_Op):
    """Add / Sub / Mul / Div with a per-unit constant (the unit value first for Sub and Div)."""

    def _other(self, node: onnx.NodeProto, value: str) -> str | None:
        a, b = node.input[0], node.input[1]
        if a == value and b != value:
            return b
        if b == value and a != value and node.op_type in ("Add", "Mul"):
            return a
        return None

    def params(self, node: onnx.NodeProto, graph: _Graph, producer: _Layer) -> list[tuple[_Param, int]] | str:
        other = self._other(node, graph.current)
        if other is None:
            return "the unit value is its second operand"
        found = _per_unit(graph, other, producer.units, producer.from_end)
        if isinstance(found, str):
            return found
        p, axis = found
        return [] if axis is None else [(p, axis)]

    def constant(self, node: onnx.NodeProto, graph: _Graph, c: np.ndarray) -> np.ndarray:
        p = graph.param(self._other(node, graph.current) or "")
        assert p is not None
        k = _unit_values(p, c.size).astype(np.float32)
        with np.errstate(all="ignore"):
            out = _ARITHMETIC[node.op_type](c.astype(np.float32), k).astype(np.float64)
        # 0 times any draw (a dropout mask; every verified tensor is finite) is 0
        return np.where(c == 0, 0.0, out) if node.op_type == "Mul" else out


class _BatchNorm(_Op):
    def params(self, node: onnx.NodeProto, graph: _Graph, producer: _Layer) -> list[tuple[_Param, int]] | str:
        attrs = attrs_of(node)
        if attrs.get("training_mode", 0) or len(node.output) != 1:
            return "a training-mode BatchNormalization"
        if not (producer.conv or producer.node.op_type == "Gemm"):  # a MatMul output's rank is not known here
            return "a BatchNormalization whose channel axis may not be the unit axis"
        out = []
        for name in node.input[1:5]:
            p = graph.param(name)
            if p is None or p.shape != (producer.units,):
                return f"its parameter {name!r} is not a per-unit constant read by it alone"
            out.append((p, 0))
        return out

    def constant(self, node: onnx.NodeProto, graph: _Graph, c: np.ndarray) -> np.ndarray:
        attrs = attrs_of(node)
        scale, bias, mean, var = (_unit_values(graph.param(n), c.size).astype(np.float32)  # type: ignore[arg-type]
                                  for n in node.input[1:5])
        eps = np.float32(attrs.get("epsilon", 1e-5))
        with np.errstate(all="ignore"):
            return ((c.astype(np.float32) - mean) / np.sqrt(var + eps) * scale + bias).astype(np.float64)


def _leaky(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    return np.where(x >= 0, x, np.float32(a.get("alpha", 0.01)) * x)


def _elu(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    return np.where(x >= 0, x, np.float32(a.get("alpha", 1.0)) * np.expm1(x))


OPS: dict[str, _Op] = {
    "Relu": _Elementwise(lambda x, a: np.maximum(x, np.float32(0))),
    "LeakyRelu": _Elementwise(_leaky),
    "Tanh": _Elementwise(lambda x, a: np.tanh(x)),
    "Sigmoid": _Elementwise(lambda x, a: 1 / (1 + np.exp(-x))),
    "Elu": _Elementwise(_elu),
    "Identity": _Elementwise(lambda x, a: x),
    "BatchNormalization": _BatchNorm(),
    "Add": _Binary(), "Sub": _Binary(), "Mul": _Binary(), "Div": _Binary(),
    "MaxPool": _Pool(), "AveragePool": _Pool(), "GlobalMaxPool": _Pool(), "GlobalAveragePool": _Pool(),
}
_LAYERS = ("Gemm", "MatMul", "Conv")


# -- the graph ----------------------------------------------------------------------------------------------------
class _Graph:
    """Who produces and reads each value, and the layers' parameters (decoded once, cached across rounds)."""

    def __init__(self, model: BNNModel, cache: dict[str, dict[int, tuple[np.ndarray, ...]]]) -> None:
        g = model.proto.graph
        self.model, self.cache = model, cache
        self.inits = {t.name: t for t in g.initializer}
        self.encoded = {n.output[0]: n for n in g.node if n.domain == DOMAIN and n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in g.node:
            for i in n.input:
                if i:
                    self.readers[i].append(n)
        self.outputs = {o.name for o in g.output}
        self.current = ""  # the value an op handler is asked about
        self._shapes: dict[str, int] | None = None

    def param(self, name: str) -> _Param | None:
        """The constant ``name`` when exactly one node reads it and it is no graph output."""
        if len(self.readers.get(name, [])) != 1 or name in self.outputs:
            return None
        if name in self.inits:
            t = self.inits[name]
            if t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
                return None
            return _Param(self.model, name, array=numpy_helper.to_array(t), summaries={})
        if name in self.encoded:
            return _Param(self.model, name, node=self.encoded[name], summaries=self.cache)
        return None

    def sole_reader(self, value: str) -> onnx.NodeProto | None:
        readers = self.readers.get(value, [])
        if value in self.outputs or len(readers) != 1 or readers[0].domain not in _DEFAULT_DOMAINS:
            return None
        return readers[0]

    def layer(self, node: onnx.NodeProto) -> _Layer | str:
        """``node`` as a layer, or why it is not one this pass can shrink."""
        attrs = attrs_of(node)
        if len(node.input) < 2 or len(node.output) != 1:
            return f"{node.op_type} without a weight"
        weight = self.param(node.input[1])
        if weight is None:
            return f"its weight {node.input[1]!r} is not a constant read by it alone"
        bias_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
        bias = self.param(bias_name) if bias_name else None
        if bias_name and bias is None:
            return f"its bias {bias_name!r} is not a constant read by it alone"
        shape = weight.shape
        if node.op_type == "Gemm":
            if attrs.get("transA", 0) or len(shape) != 2:
                return "a Gemm with transA or a weight that is not 2-D"
            out_axis = 0 if attrs.get("transB", 0) else 1
            layer = _Layer(node, weight, out_axis, 1 - out_axis, bias, False, float(attrs.get("alpha", 1.0)),
                           float(attrs.get("beta", 1.0)))
        elif node.op_type == "MatMul":
            if len(shape) != 2:
                return "a MatMul whose weight is not 2-D"
            layer = _Layer(node, weight, 1, 0, None, False)
        else:
            if int(attrs.get("group", 1)) != 1 or len(shape) < 3:
                return "a grouped Conv"
            layer = _Layer(node, weight, 0, 1, bias, True)
        if bias is not None and bias.shape not in ((layer.units,), (1, layer.units), (1,), ()):
            return f"its bias of shape {list(bias.shape)} is not per unit"
        return layer

    def edge(self, producer: _Layer) -> _Edge | str:
        """Follow ``producer``'s output through per-unit ops to the layer that reads it."""
        value = producer.node.output[0]
        values = [value]
        ops: list[tuple[onnx.NodeProto, _Op]] = []
        flatten: onnx.NodeProto | None = None
        for _ in range(len(self.model.proto.graph.node)):
            node = self.sole_reader(value)
            if node is None:
                return f"its output {value!r} is read by several nodes, none, or a graph output"
            if node.op_type in _LAYERS and node.input[0] == value and value not in node.input[1:]:
                consumer = self.layer(node)
                if isinstance(consumer, str):
                    return f"its reader {node.name or node.output[0]!r}: {consumer}"
                return _Edge(producer, ops, consumer, values, flatten)
            if flatten is not None:
                return f"{node.op_type} after the flatten"
            if node.op_type in ("Flatten", "Reshape") and producer.conv:
                why = self._flatten(node)
                if why:
                    return why
                flatten = node
            else:
                op = OPS.get(node.op_type)
                if op is None or len([o for o in node.output if o]) != 1 or (op.conv_only and not producer.conv):
                    return f"a {node.op_type} between it and the next layer"
                self.current = value
                params = op.params(node, self, producer)
                if isinstance(params, str):
                    return f"a {node.op_type} between: {params}"
                ops.append((node, op))
            value = node.output[0]
            values.append(value)
        return "a cycle"

    def per_example(self, value: str) -> int | None:
        """Elements of ``value`` per batch row, from ONNX shape inference (None: not static); inferred once."""
        if self._shapes is None:
            self._shapes = {}
            try:
                inferred = shape_inference.infer_shapes(self.model.weights_as_inputs(), strict_mode=False,
                                                        data_prop=True)
            except (shape_inference.InferenceError, onnx.checker.ValidationError, ValueError):
                return None
            for vi in inferred.graph.value_info:
                dims = vi.type.tensor_type.shape.dim
                if len(dims) > 1 and all(d.HasField("dim_value") for d in dims[1:]):
                    self._shapes[vi.name] = math.prod(d.dim_value for d in dims[1:])
        return self._shapes.get(value)

    def _flatten(self, node: onnx.NodeProto) -> str | None:
        attrs = attrs_of(node)
        if node.op_type == "Flatten":
            return None if attrs.get("axis", 1) == 1 else "a Flatten on an axis other than 1"
        target = self.inits.get(node.input[1])
        if target is None or list(target.dims) != [2] or len(self.readers[node.input[1]]) != 1:
            return "a Reshape whose target is not a 2-entry constant of its own"
        return None


# -- planning and applying ----------------------------------------------------------------------------------------
def _plan(graph: _Graph, edge: _Edge) -> tuple[np.ndarray, _Plan] | str:
    """The units of ``edge`` to remove and what removing them writes (empty plan: none), or why not."""
    p, c = edge.producer, edge.consumer
    units, features = p.units, c.weight.shape[c.in_axis]
    if features % units or (edge.flatten is None and features != units):
        return f"{features} input features of {c.node.name or c.node.op_type!r} do not split into {units} units"
    span = features // units  # columns per unit: H·W after a flatten, else 1
    if edge.flatten is not None and edge.flatten.op_type == "Reshape" and graph.per_example(
            edge.flatten.input[0]) != features:  # [B, C, H, W] -> [B, C·H·W] only, not [k·B, C·H·W / k]
        return f"the Reshape before {c.node.name or c.node.op_type!r} is not a flatten to {features} per example"
    zero_in = c.weight.zero_along(c.in_axis).reshape(units, span).all(axis=1)
    # rule (b): P's row is 0 in every draw, so the unit is its deterministic bias, mapped through the ops
    const = np.where(p.weight.zero_along(p.out_axis), p.bias_value(), np.nan)
    for node, op in edge.ops:
        graph.current = node.input[0] if node.input[0] in edge.values else node.input[1]
        const = op.constant(node, graph, const)
    fold = _foldable(c, span) if np.any(np.isfinite(const) & (const != 0) & ~zero_in) else None
    fixed_in = c.weight.fixed_along(c.in_axis).reshape(units, span).all(axis=1) if fold else np.zeros(units, bool)
    folds = np.isfinite(const) & (const != 0) & ~zero_in & fixed_in
    dead = zero_in | (const == 0) | folds
    if dead.all():
        dead[np.argmax(dead)] = False  # never the last unit
    if EVEN_WIDTH and not p.conv and units % 2 == 0 and dead.sum() % 2:  # an even width stays even (see EVEN_WIDTH)
        dead[np.argmax(dead & folds) if (dead & folds).any() else np.argmax(dead)] = False
    folds &= dead
    if not dead.any():
        return dead, _Plan()
    keep = np.flatnonzero(~dead)
    cols = (keep[:, None] * span + np.arange(span)).reshape(-1)
    plan = _Plan(removed=int(dead.sum()), by_rule={
        "zero_columns": int((dead & zero_in).sum()), "constant_zero": int((dead & ~zero_in & (const == 0)).sum()),
        "folded": int((dead & folds & ~zero_in & (const != 0)).sum())})
    todo: list[tuple[_Param, int, np.ndarray]] = [(p.weight, p.out_axis, keep), (c.weight, c.in_axis, cols)]
    if p.bias is not None and p.bias.shape and p.bias.shape[-1] == units and units > 1:
        todo.append((p.bias, len(p.bias.shape) - 1, keep))
    for node, op in edge.ops:
        graph.current = node.input[0] if node.input[0] in edge.values else node.input[1]
        found = op.params(node, graph, p)
        assert not isinstance(found, str)
        todo += [(param, axis, keep) for param, axis in found]
    for param, _, _ in todo:
        if not param.sliceable:
            return f"{param.name!r} is a {param.kind}, which cannot be sliced exactly"
    plan.slices = todo
    if folds.any() and fold is not None:
        fold(plan, const, folds, span)
    if edge.flatten is not None and edge.flatten.op_type == "Reshape":
        target = numpy_helper.to_array(graph.inits[edge.flatten.input[1]]).copy()
        if target[1] == features:
            target[1] = cols.size
        elif target[1] != -1:
            return f"the Reshape target {target.tolist()} is not [-1, {features}]"
        plan.values[edge.flatten.input[1]] = target
    return dead, plan


def _foldable(c: _Layer, span: int) -> Callable[[_Plan, np.ndarray, np.ndarray, int], None] | None:
    """How to fold constant units into ``c``'s bias (rule (c)), or None where it cannot be exact."""
    attrs = attrs_of(c.node)
    if c.node.op_type == "MatMul" or (c.bias is not None and c.bias.node is not None):
        return None
    if c.node.op_type == "Gemm" and c.beta == 0:
        return None
    if c.conv and (any(attrs.get("pads", [])) or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID")):
        return None  # a padded border sees zeros, not the constant
    out_units = c.weight.shape[1 - c.in_axis] if not c.conv else c.weight.shape[0]

    def fold(plan: _Plan, const: np.ndarray, folds: np.ndarray, span_: int) -> None:
        mean = c.weight.moments()[0].astype(np.float64)
        moved = np.moveaxis(mean, c.in_axis, -1)  # [out, (kernel...), features]
        per_unit = moved.reshape(moved.shape[0], -1, const.size, span_).sum(axis=(1, 3))  # [out, units]
        add = per_unit[:, folds] @ const[folds] * (c.alpha / c.beta)
        if c.bias is None:
            plan.values[_new_bias_name(c)] = add.astype(np.float32)
            return
        old = np.asarray(c.bias.array, np.float64)
        plan.values[c.bias.name] = (old + add.reshape(old.shape) if old.size == out_units
                                    else old + add).astype(c.bias.array.dtype)  # type: ignore[union-attr]

    return fold


def _new_bias_name(c: _Layer) -> str:
    return f"{c.weight.name}.folded_bias"


def _apply(model: BNNModel, graph: _Graph, edge: _Edge, plan: _Plan) -> None:
    g = model.proto.graph
    for param, axis, index in plan.slices:  # one weight decoded at a time
        new = param.select(axis, index)
        graph.cache.pop(param.name, None)
        if isinstance(new, Encoding):  # the node found again by name: an earlier replace moved the graph's nodes
            node = next(n for n in g.node if n.domain == DOMAIN and n.output and n.output[0] == param.name)
            layer = next((a.s.decode("utf-8", "replace") for a in node.attribute if a.name == "layer"), "")
            model.replace_encoding(EncodedWeight(param.name, layer, node, new), new)
        else:
            plan.values[param.name] = new
        del new
    for name, value in plan.values.items():
        if name in graph.inits:
            t = graph.inits[name]
            t.CopyFrom(numpy_helper.from_array(np.asarray(value, helper.tensor_dtype_to_np_dtype(t.data_type)), name))
        else:  # a bias created by folding
            g.initializer.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
            node = edge.consumer.node
            while len(node.input) < 3:
                node.input.append("")
            node.input[2] = name
    stale = set(edge.values)
    keep = [vi for vi in g.value_info if vi.name not in stale]
    if len(keep) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(keep)


class ShrinkPass(Pass):
    """Remove dead units (see the module docstring); a model with none is returned as it came, unrecorded."""

    name = "shrink"
    config_type = ShrinkConfig

    def __call__(self, model: BNNModel, *, seed: int = 0, consume: bool = False) -> PassResult:
        """Like :meth:`Pass.__call__` (report keys ``layers``, ``edges``, ``skipped``), but a model with nothing to
        remove is neither verified again nor recorded in ``manifest.passes``: ``lower`` runs this pass on every
        lowering, and a model without dead units keeps its bytes."""
        removable, skipped = _survey(model)
        if not removable:
            return PassResult(model if consume else model.copy(), False, {
                "pass": self.name, "options": self.config.options(), "seed": seed, "layers": [], "edges": [],
                "skipped": skipped})
        self._edges: list[dict[str, Any]] = []
        result = super().__call__(model, seed=seed, consume=consume)
        result.report["edges"] = self._edges
        result.report["skipped"] = _survey(result.model)[1]
        return result

    def run(self, model: BNNModel, seed: int) -> tuple[list[dict[str, Any]], bool]:
        rows, self._edges = _shrink(model)
        return rows, bool(rows)


def _edges(graph: _Graph) -> Iterator[_Edge | tuple[_Layer, str]]:
    """Every layer whose output this pass can follow to the next layer, or the layer and why not."""
    for node in list(graph.model.proto.graph.node):
        if node.domain not in _DEFAULT_DOMAINS or node.op_type not in _LAYERS:
            continue
        layer = graph.layer(node)
        if isinstance(layer, str):
            continue
        edge = graph.edge(layer)
        yield edge if isinstance(edge, _Edge) else (layer, edge)


def _layer_name(layer: _Layer) -> str:
    node = layer.weight.node
    attr = next((a.s.decode("utf-8", "replace") for a in node.attribute if a.name == "layer"), "") if node else ""
    return attr or layer.node.name or layer.node.output[0]


def _survey(model: BNNModel) -> tuple[bool, list[dict[str, str]]]:
    """(whether any unit can be removed, the layers with units that are zero in every draw that the pass leaves
    alone, and why)."""
    graph = _Graph(model, {})
    removable, skipped = False, []
    for edge in _edges(graph):
        if isinstance(edge, _Edge):
            planned = _plan(graph, edge)
            if isinstance(planned, str):
                skipped.append({"layer": _layer_name(edge.producer), "reason": planned})
            else:
                removable = removable or planned[1].removed > 0
            continue
        layer, reason = edge
        if layer.weight.zero_along(layer.out_axis).any():
            skipped.append({"layer": _layer_name(layer), "reason": reason})
    return removable, skipped


def _shapes(model: BNNModel) -> dict[str, list[int]]:
    return {n.output[0]: next(list(a.ints) for a in n.attribute if a.name == "shape")
            for n in model.proto.graph.node if n.domain == DOMAIN and n.output}


def _shrink(model: BNNModel) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Remove units edge by edge until none can be; (rows of the changed encoded weights, removals per edge)."""
    cache: dict[str, dict[int, tuple[np.ndarray, ...]]] = {}
    before = _shapes(model)
    removed: dict[str, dict[str, int]] = defaultdict(lambda: {"outputs": 0, "inputs": 0})
    edges: list[dict[str, Any]] = []
    for _ in range(MAX_ROUNDS * max(1, len(model.proto.graph.node))):
        graph = _Graph(model, cache)
        for edge in _edges(graph):
            if not isinstance(edge, _Edge):
                continue
            planned = _plan(graph, edge)
            if isinstance(planned, str) or not planned[1].removed:
                continue
            plan = planned[1]
            p, c = edge.producer, edge.consumer
            span = c.weight.shape[c.in_axis] // p.units
            edges.append({"producer": _layer_name(p), "consumer": _layer_name(c), "units": p.units,
                          "removed": plan.removed, **plan.by_rule})
            for param, _, _ in plan.slices:  # the producer's weight and bias, the per-unit parameters between
                if param.name != c.weight.name and param.node is not None:
                    removed[param.name]["outputs"] += plan.removed
            removed[c.weight.name]["inputs"] += plan.removed * span
            _apply(model, graph, edge, plan)
            break  # the graph changed: enumerate the edges again
        else:
            break
    after = _shapes(model)
    rows = [{"name": name, "shape_before": before[name], "shape": after[name], "units_removed": dict(count)}
            for name, count in removed.items() if name in after]
    return rows, edges
