"""What an exported ONNX file costs a device: its bytes on disk, split by what they store.

:func:`deployed_bytes` reads any ONNX file (an edgebnn export of any mode, a calibrated INT8 model, a plain
graph) and splits its serialized bytes exactly into four parts, so that the parts sum to the file size:

    file = codes + tables + float_weights + graph

- ``codes``: integer tensors that hold weights in their packed form: quantized weights (the input of
  DequantizeLinear, MatMulInteger, MatMulNBits), codebook indices (Gather indices), integer counts and packed
  bits (Cast / BitShift / BitwiseAnd inputs), any integer tensor too large to be a shape;
- ``tables``: the small float (and zero-point) tensors that decode codes: DequantizeLinear scales and zero
  points, the per-channel scale multiplied into an integer product, a codebook's component table (the data a
  Gather over codes reads, traced back through the elementwise ops that make it), the affine terms applied to
  decoded codes;
- ``float_weights``: every other float tensor with more than one element (fp32 μ and σ, baked members, biases,
  BatchNorm parameters, quadrature points);
- ``graph``: the rest: nodes, names, value infos, metadata, shape constants and float scalars.

Each initializer (or ``Constant`` node value) is charged what it adds to the file: its serialized message plus
the field tag and length prefix protobuf writes before it, so only the graph is found by subtraction. Tensors kept
as ONNX external data (edgebnn never writes any) are outside the file and not counted.

A tensor's class comes from its dtype and from the ops that consume it (:data:`INPUT_ROLES`, by op type and
input index), then from the data flow: a tensor computed from codes by decode ops (:data:`DECODE_OPS`) is
*decoded*; a float tensor combined with a decoded one, or with an integer product (:data:`INTEGER_PRODUCT_OPS`)
by Mul/Div, is a table, provided it has fewer elements than the largest code tensor (one that large is weights).
So a new store (a new op chain from codes to a weight) is classified without being
named here, and one that is not still sums to the file.

The ratios compare the file with the fp32 BNN (μ and σ of every Bayesian weight in fp32,
:func:`edgebnn.passes.float_bnn_bytes`) and with the ``.ebnn`` it was exported from; an export records both
in its metadata, so a file alone has its ratios. Ratio = reference bytes / file bytes (above 1: smaller).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import TensorProto

from edgebnn.errors import InvalidArtifactError
from edgebnn.exporters.metadata import load_onnx

CATEGORIES = ("codes", "tables", "float_weights", "graph")
SHAPE_MAX = 16
"""An integer tensor (int32/int64) of at most this many elements that no op reads as codes is a shape constant."""

_FLOAT = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16,
                    *(getattr(TensorProto, n) for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
                                                        "FLOAT8E5M2FNUZ", "FLOAT4E2M1") if hasattr(TensorProto, n))})
_SHAPE_INTS = frozenset({TensorProto.INT32, TensorProto.INT64})

# (op type, input index) -> the class of an initializer read there ("index": codes unless a small shape constant).
# Anything not listed: by dtype and data flow.
INPUT_ROLES: dict[tuple[str, int], str] = {
    **{("DequantizeLinear", i): r for i, r in ((0, "codes"), (1, "tables"), (2, "tables"))},
    **{("QuantizeLinear", i): "tables" for i in (1, 2)},
    **{(op, i): r for op in ("MatMulInteger", "ConvInteger") for i, r in ((0, "codes"), (1, "codes"),
                                                                         (2, "tables"), (3, "tables"))},
    **{("MatMulNBits", i): r for i, r in ((1, "codes"), (2, "tables"), (3, "tables"), (4, "codes"))},
    **{("QLinearMatMul", i): r for i, r in enumerate(("codes", "tables", "tables", "codes", "tables", "tables",
                                                      "tables", "tables"))},
    **{("QLinearConv", i): r for i, r in enumerate(("codes", "tables", "tables", "codes", "tables", "tables",
                                                    "tables", "tables", "codes"))},
    **{(op, 0): "codes" for op in ("BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot")},
    **{(op, 1): "index" for op in ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND")},
    **{(op, i): "graph" for op, idx in (("Reshape", (1,)), ("Expand", (1,)), ("Tile", (1,)),
                                        ("Slice", (1, 2, 3, 4)), ("Unsqueeze", (1,)), ("Squeeze", (1,)),
                                        ("Pad", (1, 3)), ("Split", (1,)), ("ConstantOfShape", (0,)),
                                        ("Range", (0, 1, 2)), ("TopK", (1,)), ("OneHot", (1,)),
                                        ("Resize", (1, 2, 3)), ("ReduceSum", (1,)), ("ReduceMean", (1,)),
                                        ("ReduceMax", (1,)), ("ReduceMin", (1,)), ("ReduceProd", (1,)),
                                        ("ReduceL2", (1,)), ("ReduceLogSumExp", (1,)), ("CumSum", (1,)))
       for i in idx},
}
DECODE_OPS = frozenset({
    "Cast", "CastLike", "DequantizeLinear", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand",
    "Tile", "Slice", "Concat", "Split", "Identity", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    "BitwiseNot", "Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "Where", "Mul", "Div",
    "Add", "Sub", "Neg", "Abs", "Sign", "Pow", "Exp", "Mod", "Clip",
})
"""Ops that turn codes into weights: their output is decoded when an input is and the others are constants."""
INTEGER_PRODUCT_OPS = frozenset({"MatMulInteger", "ConvInteger", "MatMulNBits", "QLinearMatMul", "QLinearConv"})
"""Ops that compute on codes directly: a float constant multiplied into their (cast) output is a scale."""
_AFFINE = frozenset({"Mul", "Div", "Add", "Sub"})
_TABLE_SOURCES = frozenset({"Mul", "Div", "Add", "Sub", "Cast", "Reshape", "Concat", "Identity", "Unsqueeze",
                            "Squeeze", "Transpose", "Neg", "Exp", "Sqrt", "Abs"})
"""Walking back from a Gather's data over codes: the ops whose constant inputs are still parts of the table."""


@dataclass(frozen=True)
class DeployedSize:
    """The bytes an exported ONNX file costs on a device, and what they store.

    Attributes:
        file_bytes: Size of the file (or of the serialized model).
        codes, tables, float_weights, graph: The exact split of ``file_bytes`` (module docstring).
        inputs: The graph inputs a caller must fill (initializers excluded).
        data_input: The data input among them (the export metadata's, else the first).
        float_bnn_bytes: μ and σ of the IR's Bayesian weights in fp32 (None: unknown for this file).
        ebnn_bytes: The ``.ebnn`` the file was exported from (None: unknown).
        tensors: Per class, how many tensors it holds.
    """

    file_bytes: int
    codes: int
    tables: int
    float_weights: int
    graph: int
    inputs: tuple[str, ...]
    data_input: str | None
    float_bnn_bytes: int | None = None
    ebnn_bytes: int | None = None
    tensors: dict[str, int] = field(default_factory=dict)

    @property
    def breakdown(self) -> dict[str, int]:
        """``{"codes", "tables", "float_weights", "graph"}`` -> bytes; sums to :attr:`file_bytes`."""
        return {c: int(getattr(self, c)) for c in CATEGORIES}

    @property
    def noise_inputs(self) -> tuple[str, ...]:
        """Graph inputs other than the data: noise the host must draw and feed on every call."""
        return tuple(i for i in self.inputs if i != self.data_input)

    @property
    def self_contained(self) -> bool:
        """One graph input, the data: any ONNX runtime computes the predictive with nothing else."""
        return len(self.inputs) == 1 and self.data_input in self.inputs

    @property
    def ratio_float_bnn(self) -> float | None:
        """fp32 BNN bytes / file bytes (above 1: the file is smaller)."""
        return _ratio(self.float_bnn_bytes, self.file_bytes)

    @property
    def ratio_ebnn(self) -> float | None:
        """``.ebnn`` bytes / file bytes (above 1: the file is smaller)."""
        return _ratio(self.ebnn_bytes, self.file_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The ``deployed`` object of the ``export``/``inspect``/``search`` JSON reports."""
        return {
            "file_bytes": self.file_bytes,
            "breakdown": self.breakdown,
            "tensors": dict(self.tensors),
            "inputs": len(self.inputs),
            "input_names": list(self.inputs),
            "noise_inputs": list(self.noise_inputs),
            "self_contained": self.self_contained,
            "float_bnn_bytes": self.float_bnn_bytes,
            "ebnn_bytes": self.ebnn_bytes,
            "ratio_float_bnn": self.ratio_float_bnn,
            "ratio_ebnn": self.ratio_ebnn,
        }


def _ratio(reference: int | None, size: int) -> float | None:
    return None if not reference or size <= 0 else reference / size


def deployed_bytes(source: onnx.ModelProto | bytes | str | os.PathLike[str], *, float_bnn_bytes: int | None = None,
                   ebnn_bytes: int | None = None) -> DeployedSize:
    """The bytes of an exported ONNX file and their split into codes, tables, float weights and graph.

    Args:
        source: The file (its size on disk is the total), its bytes, or a model (its serialized size).
        float_bnn_bytes: The fp32 BNN's bytes, when the file's export metadata does not record them.
        ebnn_bytes: The ``.ebnn``'s bytes, likewise.

    Raises:
        InvalidArtifactError: The file cannot be read or is not ONNX.
    """
    proto, total, _ = load_onnx(source)
    meta = _metadata(proto)
    graph = proto.graph
    flat = _flat(graph)  # an anytime export's chunks hold their constants in If branches / a Loop body
    tensors = dict(_tensors(flat))
    classes = classify(flat, tensors)
    parts = dict.fromkeys(CATEGORIES, 0)
    counts = dict.fromkeys(CATEGORIES, 0)
    for name, (_, cost) in tensors.items():
        parts[classes[name]] += cost
        counts[classes[name]] += 1
    parts["graph"] = total - parts["codes"] - parts["tables"] - parts["float_weights"]
    init_names = {t.name for t in graph.initializer}
    inputs = tuple(i.name for i in graph.input if i.name not in init_names)
    data_input = meta.get("input_name") if meta.get("input_name") in inputs else (inputs[0] if inputs else None)
    return DeployedSize(
        file_bytes=total, codes=parts["codes"], tables=parts["tables"], float_weights=parts["float_weights"],
        graph=parts["graph"], inputs=inputs, data_input=data_input,
        float_bnn_bytes=float_bnn_bytes if float_bnn_bytes is not None else meta.get("float_bnn_bytes"),
        ebnn_bytes=ebnn_bytes if ebnn_bytes is not None else meta.get("ebnn_bytes"),
        tensors={c: n for c, n in counts.items() if c != "graph"},
    )


def _flat(graph: onnx.GraphProto) -> onnx.GraphProto:
    """``graph`` with the nodes and initializers of its subgraphs (Loop bodies, If branches) appended, in order
    (value names are unique across scopes); ``graph`` itself when it has none."""
    subs = [a.g for n in graph.node for a in n.attribute if a.HasField("g")]
    if not subs:
        return graph
    flat = onnx.GraphProto()
    flat.CopyFrom(graph)
    for sub in subs:
        inner = _flat(sub)
        flat.node.extend(inner.node)
        flat.initializer.extend(inner.initializer)
    return flat


def _metadata(proto: onnx.ModelProto) -> dict[str, Any]:
    """The export record as a dict, or ``{}`` for a file edgebnn did not export (or one it cannot read)."""
    from edgebnn.exporters.metadata import EXPORT_KEY, ExportMetadata

    entries = [p.value for p in proto.metadata_props if p.key == EXPORT_KEY]
    if len(entries) != 1:
        return {}
    try:
        return ExportMetadata.from_json(entries[0], "<model>").to_dict()
    except InvalidArtifactError:
        return {}


def _varint_len(n: int) -> int:
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def _field_cost(message_bytes: int) -> int:
    """Bytes a length-delimited field with a one-byte tag (field numbers 1-15) adds to its parent."""
    return 1 + _varint_len(message_bytes) + message_bytes


def _tensors(graph: onnx.GraphProto) -> Iterator[tuple[str, tuple[TensorProto, int]]]:
    """(name, (tensor, bytes it adds to the file)) of each initializer and each ``Constant`` node's tensor."""
    for t in graph.initializer:
        external = sum(int(e.value) for e in t.external_data if e.key == "length")  # in <file>.data
        yield t.name, (t, _field_cost(t.ByteSize()) + external)
    for n in graph.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value" and a.HasField("t"):
                    yield n.output[0], (a.t, _field_cost(a.t.ByteSize()))


def _numel(t: TensorProto) -> int:
    count = 1
    for d in t.dims:
        count *= d
    return count


def classify(graph: onnx.GraphProto, tensors: dict[str, tuple[TensorProto, int]] | None = None) -> dict[str, str]:
    """The class (one of :data:`CATEGORIES`) of each initializer and ``Constant`` tensor of ``graph``."""
    tensors = dict(_tensors(graph)) if tensors is None else tensors
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    producer: dict[str, onnx.NodeProto] = {}
    for n in graph.node:
        for i, name in enumerate(n.input):
            if name:
                consumers.setdefault(name, []).append((n, i))
        for name in n.output:
            producer[name] = n

    out: dict[str, str] = {}
    for name, (t, _) in tensors.items():  # 1. by the role the consuming ops give it, else by dtype and size
        roles = {INPUT_ROLES.get((n.op_type, i)) for n, i in consumers.get(name, [])} - {None}
        integer = t.data_type not in _FLOAT
        small_shape = t.data_type in _SHAPE_INTS and _numel(t) <= SHAPE_MAX
        if "index" in roles and integer and not small_shape:
            roles.add("codes")
        if "codes" in roles and integer:
            out[name] = "codes"
        elif "tables" in roles:
            out[name] = "tables"
        elif _numel(t) <= 1 and not ("codes" in roles and integer):
            out[name] = "graph"
        elif integer:
            out[name] = "graph" if small_shape or "graph" in roles else "codes"
        else:
            out[name] = "float_weights"

    decoded, products = _flow(graph, tensors, out)
    # A table decodes codes: it is smaller than the largest code tensor (a float tensor that large is weights).
    largest = max((_numel(t) for name, (t, _) in tensors.items() if out[name] == "codes"), default=0)
    for n in graph.node:  # 2. float constants that decode codes: affine terms, scales of integer products
        if n.op_type not in _AFFINE:
            continue
        consts = [x for x in n.input if x in tensors and out[x] == "float_weights" and _numel(tensors[x][0]) < largest]
        others = [x for x in n.input if x and x not in tensors]
        if consts and any(x in decoded for x in others):
            out.update(dict.fromkeys(consts, "tables"))
        if n.op_type in ("Mul", "Div") and any(x in products for x in others):  # the scale, maybe itself a product
            for x in n.input:
                if x and x not in products:
                    _mark_table(x, tensors, out, producer, largest)
    for n in graph.node:  # 3. a codebook: the data a Gather over codes reads, back through the ops that make it
        if n.op_type in ("Gather", "GatherElements", "GatherND") and len(n.input) > 1 and (
                n.input[1] in decoded or out.get(n.input[1]) == "codes"):
            _mark_table(n.input[0], tensors, out, producer, largest)
    return out


def _flow(graph: onnx.GraphProto, tensors: dict[str, tuple[TensorProto, int]], classes: dict[str, str],
          ) -> tuple[set[str], set[str]]:
    """(values decoded from codes by decode ops, values an integer op computed on codes), in graph order."""
    decoded = {name for name, c in classes.items() if c == "codes"}
    products: set[str] = set()
    constant = set(tensors)  # values computed from constants alone (the index arithmetic of a bit unpack)
    for n in graph.node:
        ins = [x for x in n.input if x]
        if n.op_type not in ("RandomNormal", "RandomUniform") and all(x in constant for x in ins):
            constant.update(n.output)
        computes_on_codes = n.op_type in INTEGER_PRODUCT_OPS and any(x in decoded for x in ins)
        scales_a_product = n.op_type in ("Cast", "Mul", "Div", "Reshape") and any(x in products for x in ins) and all(
            x in products or x in tensors for x in ins)
        if computes_on_codes or scales_a_product:
            products.update(n.output)
        elif n.op_type in DECODE_OPS and any(x in decoded for x in ins) and all(
                x in decoded or x in constant for x in ins):
            decoded.update(n.output)
    return decoded, products


def _mark_table(name: str, tensors: dict[str, tuple[TensorProto, int]], out: dict[str, str],
                producer: dict[str, onnx.NodeProto], largest: int, depth: int = 0) -> None:
    """Mark the float constants ``name`` is built from (through :data:`_TABLE_SOURCES`, 8 ops deep) as tables."""
    if name in tensors:
        if out[name] == "float_weights" and _numel(tensors[name][0]) < largest:
            out[name] = "tables"
        return
    node = producer.get(name)
    if node is None or node.op_type not in _TABLE_SOURCES or depth > 8:
        return
    for x in node.input:
        if x:
            _mark_table(x, tensors, out, producer, largest, depth + 1)
