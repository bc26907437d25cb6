"""Graph-building pieces every mode's exporter shares: the :class:`Builder` of one exported graph (its nodes,
constants, extra inputs, the sample fold, the final model with the opsets its ops need), the weight storage chosen
once per export (:class:`ExportFormat`), static shapes at batch 1, and writing the export metadata
(:func:`set_metadata`). The predictive head each graph ends in is the task's (:mod:`edgebnn.tasks`).

Layout convention (every mode): the sample axis is folded into the batch, batch-major (row b·S + s), so
deterministic ops run once on B·S rows and a sampled layer is one batched op.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

from edgebnn.exporters.metadata import ExportMetadata, write_metadata
from edgebnn.ir import BNNModel

P = "ens/"  # prefix of every value an exporter adds
CONTRIB = "com.microsoft"  # onnxruntime's contrib-op domain


@dataclass(frozen=True)
class ExportFormat:
    """How one export stores its weights, chosen once before the graph is built (every store and layer kind reads
    it; nothing changes it).

    Attributes:
        weights: how the stores write a posterior's tensors (:mod:`.stores`): ``ir``, the IR's own codes where its
            encoding has them (a lowering's packed codes, a lowered ensemble's members), decoded in the graph, else
            fp32; ``fp32``; ``int8`` / ``int4``, coded at export. ``--weights`` sets it for the moment modes; a
            ``baked`` export's members take ``--weights`` as their constant format (int8/int4 Q/DQ, the layer kinds'
            rule), and this field is ``ir`` or ``fp32`` for what it decodes (hoisted means, members on a grid).
        runtimes: the runtimes every decode must run on (None: any); a store whose decode does not is replaced by
            the float store.
        form: how int8/int4 constants are written (:mod:`.forms`): ``qdq``, ``folded``, ``integer``.
        integer_min_bytes: ``integer`` form: dense weights above this many fp32 bytes run in integer kernels.
        int4_layout: ``blocks`` (INT4_BLOCK inputs per scale, Gemm weights only: TensorRT's weight-only int4) or
            ``channels`` (onnxruntime / portable: every weight int4, one scale per output channel shared by the
            ``samples`` members; member biases int8).
        samples: S, for the ``channels`` layout's grouping.
    """

    weights: str = "fp32"
    runtimes: tuple[str, ...] | None = None
    form: str = "qdq"
    integer_min_bytes: int = 0
    int4_layout: str = "blocks"
    samples: int = 1

    @property
    def bias_format(self) -> str:
        """Constant (member) biases: fp32, or int8 in the ``channels`` int4 layout."""
        return "int8" if self.int4_layout == "channels" else "fp32"


class Builder:
    """One exported graph being built: its nodes, initializers, extra inputs and outputs, and the export's
    :class:`ExportFormat` (immutable). The stores' bookkeeping lives here too, as part of the graph: the code
    streams not written yet, which store wrote each decoded tensor (the export metadata), the opset the decodes
    need."""

    def __init__(self, inits: Iterable[onnx.TensorProto] = (), fmt: ExportFormat | None = None) -> None:
        self.fmt = fmt or ExportFormat()
        self.nodes: list[onnx.NodeProto] = []
        self._out = onnx.ModelProto()  # the export: its constants are built in place (:meth:`model`)
        self.inits: Any = self._out.graph.initializer  # onnx.TensorProto, appended to as a list
        self.inputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self.stored: dict[str, str] = {}  # decoded tensor -> the store that wrote it (the export metadata)
        self.min_opset = 0  # the ai.onnx opset the emitted ops need (stores' decodes)
        self.code_pool: Any = None  # the stores' pooled code streams (exporters.stores.base.CodePool)
        self.outputs: list[onnx.ValueInfoProto] | None = None  # the task head's graph outputs, once added
        self.adopt(inits)

    @property
    def store_choice(self) -> str:
        """``--weights`` (:attr:`ExportFormat.weights`): what the stores and a task's analytic head read."""
        return self.fmt.weights

    def adopt(self, inits: Iterable[onnx.TensorProto]) -> None:
        """Keep existing initializers (the skeleton's deterministic parameters)."""
        for t in inits:
            self._names.add(t.name)
            self.inits.append(t)

    def has(self, name: str) -> bool:
        """Whether the graph has a value (an initializer) of this name already."""
        return name in self._names

    def const(self, name: str, value: np.ndarray) -> str:
        if name in self._names:
            raise ValueError(f"duplicate initializer {name}")
        self._names.add(name)
        value = np.ascontiguousarray(value)
        if value.dtype.kind not in "biuf":  # what numpy_helper writes otherwise (strings)
            self.inits.append(numpy_helper.from_array(value, name))
            return name
        t = self.inits.add()  # numpy_helper.from_array's fields, written in the graph: no copy of the data
        t.dims.extend(value.shape)
        t.name = name
        t.data_type = helper.np_dtype_to_tensor_dtype(value.dtype)
        t.raw_data = value.tobytes()
        return name

    def i64(self, name: str, *values: int) -> str:
        return self.const(name, np.array(values, np.int64))

    def f32(self, name: str, value: float | np.ndarray) -> str:
        return self.const(name, np.asarray(value, np.float32))

    def int4(self, name: str, q: np.ndarray) -> str:
        """An INT4 initializer holding ``q`` (int values in [-8, 7]) as packed raw bytes: two per byte, the first in
        the low nibble (ONNX's INT4 layout; ``make_tensor`` on a list would write one int32 varint per value)."""
        from edgebnn.ir.encodings.packing import pack_int

        tensor = helper.make_tensor(name, TensorProto.INT4, q.shape, pack_int(q.reshape(-1), 4).tobytes(), raw=True)
        self._names.add(name)
        self.inits.append(tensor)
        return name

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
        """The graph: the nodes added and the head's outputs (:mod:`edgebnn.tasks`: the exporter adds a head).

        The constants were built in the model itself, so the export never holds them twice (a baked export's
        members are most of its memory); ``helper.make_model`` would copy the graph, so its fields are set here.
        """
        outputs = self.outputs
        assert outputs is not None, "the exporter added no task head"
        used = {x for node in self.nodes for x in node.input}  # skeleton parameters a rewrite replaced
        inits = self.inits
        for i in reversed([i for i, t in enumerate(inits) if t.name not in used]):
            del inits[i]
        int4 = any(t.data_type == TensorProto.INT4 for t in inits)  # int4 DequantizeLinear needs opset 21
        least = max(21 if int4 else 0, self.min_opset)
        opsets = [helper.make_opsetid(o.domain, max(o.version, least) if o.domain in ("", "ai.onnx")
                                      else o.version) for o in base.opset_import]
        if any(n.domain == CONTRIB for n in self.nodes) and all(o.domain != CONTRIB for o in opsets):
            opsets.append(helper.make_opsetid(CONTRIB, 1))  # MatMulNBits (the int4 integer form)
        out = self._out
        out.ir_version = base.ir_version
        out.producer_name = "edgebnn"
        out.opset_import.extend(opsets)
        out.graph.node.extend(self.nodes)
        out.graph.name = name
        out.graph.input.extend([*graph_inputs, *self.inputs])
        out.graph.output.extend(outputs)
        return out


CHECK_INLINE_ELEMENTS = 1 << 18  # constants up to this size stay in the graph onnx's checker sees as a whole


def check_export(proto: onnx.ModelProto) -> None:
    """onnx's checker on an export, never on the whole model's bytes (``check_model`` serializes the model and
    parses it again, twice a baked export's constants; it refuses past 2 GiB): the graph with each constant over
    :data:`CHECK_INLINE_ELEMENTS` values declared as a graph input of its type and shape instead (its data is
    ``numpy_helper``'s, of that type and shape).

    Raises:
        onnx.checker.ValidationError: What the checker finds.
    """
    graph = proto.graph
    skeleton, inner = onnx.ModelProto(), onnx.GraphProto()
    for fd, value in proto.ListFields():
        if fd.name != "graph":
            _copy(value, skeleton, fd.name)
    for fd, value in graph.ListFields():
        if fd.name != "initializer":
            _copy(value, inner, fd.name)
    declared = {v.name for v in graph.input}
    for t in graph.initializer:
        if math.prod(t.dims) <= CHECK_INLINE_ELEMENTS:  # (ByteSize would serialize it: upb counts so)
            inner.initializer.append(t)
        elif t.name not in declared:
            inner.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    skeleton.graph.CopyFrom(inner)
    onnx.checker.check_model(skeleton)


def _copy(value: Any, dst: Any, name: str) -> None:
    target = getattr(dst, name)
    if hasattr(target, "extend"):
        target.extend(value)
    elif hasattr(target, "CopyFrom"):
        target.CopyFrom(value)
    else:
        setattr(dst, name, value)


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
