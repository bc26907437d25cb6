"""Static TensorRT-compatibility check of an ONNX model, run at export and before every engine build.

The check reads the graph only (no TensorRT needed) and reports findings: an ``error`` is something the
TensorRT ONNX parser rejects or that would make the engine compute something else than onnxruntime; a
``warning`` is something that builds but deserves a look (GPU fallback from DLA, dynamic shapes, an op
outside edgebnn's table, an opset above the documented range).

What it knows, by TensorRT version (``tensorrt=`` argument, e.g. ``"10.3"``, ``"10.15"``, ``"11"``):

* ONNX opset: 9-20 documented for 10.0 and 10.3 (JetPack 6); 10.1-10.14 are taken to be the same
  (assumption); 9-24 documented for 10.15. TensorRT 11: 9-24 is an assumption (same parser lineage as
  10.15, not checked against an 11.x operator table). The parser itself only refuses opsets below 7, so an
  opset above the range is a warning (INT4 DequantizeLinear needs opset 21), below 9 an error.
* TensorRT 11 removed implicit precision flags: networks are strongly typed and quantized with explicit
  Q/DQ, which is what edgebnn emits for every version.
* Q/DQ (parser rules, 10.x): zero points must be constant zeros (symmetric); UINT8 data or zero points are
  rejected; scales must be positive; per-channel (1-D) scales only on constant weights and with the
  length of the quantized axis; block-wise scales (same rank as the data) need exactly one blocked axis,
  the last or second-to-last, on constant weights; INT4 is weight-only (DequantizeLinear of a constant)
  with an even last dimension. A QuantizeLinear without zero point is UINT8 for onnxruntime but INT8
  for TensorRT (warning: results differ).
* Random ops (RandomNormal/RandomUniform and their *Like forms) import as a Fill layer that ignores
  ``seed`` (TensorRT-RTX builds them and warns; the engine draws at run time, its bytes do not grow with the
  noise; a *Like form of a constant input builds too): warning.
* Initializers: an INT8 or INT4 constant may only feed Q/DQ nodes, as data or zero point (TensorRT-RTX:
  "Quantized constant is only allowed before DQ"): error. TensorRT imports no 16-bit or unsigned 32/64-bit
  integer weights (INT16, UINT16, UINT32, UINT64): error (TensorRT-RTX's parser, on a 16-bit code stream).
* DLA: Gather and random ops do not run on DLA and fall back to the GPU (warning).
* Graph inputs: every dimension but the batch (axis 0) should be static (warning).
* Custom domains: error; ``ai.edgebnn`` nodes are edgebnn's own IR ops and must be lowered first, and
  ``com.microsoft`` contrib ops (e.g. MatMulNBits) have no TensorRT importer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from edgebnn.errors import InvalidOptionError

Severity = Literal["error", "warning"]


def _ops(names: str) -> frozenset[str]:
    return frozenset(names.split())


# ONNX ops the TensorRT 10 parser imports (onnx-tensorrt operator table), limited to what edgebnn models
# use plus common neighbours. Restrictions that matter are checked in code below.
SUPPORTED_OPS = _ops(
    """
    Abs Add And ArgMax ArgMin AveragePool BatchNormalization Cast CastLike Ceil Clip Concat Constant
    ConstantOfShape Conv ConvTranspose Cos CumSum DepthToSpace DequantizeLinear Div Dropout Einsum Elu Equal
    Erf Exp Expand Flatten Floor Gather GatherElements GatherND Gemm GlobalAveragePool GlobalMaxPool Greater
    GreaterOrEqual HardSigmoid HardSwish Identity If InstanceNormalization LayerNormalization LeakyRelu Less
    LessOrEqual Log LogSoftmax Loop MatMul Max MaxPool Mean Min Mul Neg Not Or Pad Pow PRelu QuantizeLinear
    RandomNormal RandomNormalLike RandomUniform RandomUniformLike Range Reciprocal ReduceL2 ReduceLogSumExp
    ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize Shape Sigmoid
    Sign Sin Size Slice Softmax Softplus Softsign Split Sqrt Squeeze Sub Sum Tanh Tile TopK Transpose
    Unsqueeze Where
    """
)

# Marked unsupported in the onnx-tensorrt operator table (10.x).
UNSUPPORTED_OPS = _ops(
    """
    AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Col2Im CenterCropPad Compress
    ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear ImageDecoder MatMulInteger MaxRoiPool
    MaxUnpool MelWeightMatrix Multinomial NegativeLogLikelihoodLoss Optional OptionalGetElement
    OptionalHasElement QLinearConv QLinearMatMul RegexFullMatch SequenceAt SequenceConstruct SequenceEmpty
    SequenceErase SequenceInsert SequenceLength SequenceMap SoftmaxCrossEntropyLoss SplitToSequence
    StringConcat StringNormalizer StringSplit TfIdfVectorizer Unique
    """
)

# TensorRT's "quantized constants": only a DequantizeLinear may read them (a Cast of one is refused at build)
_QUANTIZED_CONSTANT_TYPES = frozenset({TensorProto.INT8, TensorProto.INT4})
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
_UNIMPORTED_WEIGHT_TYPES = frozenset({TensorProto.INT16, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike"})
_DLA_FALLBACK_OPS = RANDOM_OPS | {"Gather"}
# op -> first opset where ``axes`` is input 1 rather than an attribute
_AXES_INPUT = {
    "Squeeze": 13,
    "Unsqueeze": 13,
    "ReduceSum": 13,
    **{op: 18 for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp")},
    "ReduceSumSquare": 18,
}
_MATMUL_LIKE = frozenset({"Conv", "Gemm", "MatMul"})
_DEFAULT_DOMAINS = ("", "ai.onnx")
_INT4 = (TensorProto.INT4, TensorProto.UINT4)
_EIGHT_BIT = (TensorProto.INT8, TensorProto.FLOAT8E4M3FN)


@dataclass(frozen=True)
class Finding:
    """One compatibility issue.

    Attributes:
        severity: ``error`` (the build fails or computes something else) or ``warning``.
        node: Node name (``Op#index`` when unnamed), graph input name, or ``""`` for the model.
        op: ONNX op type, ``input`` for a graph input, ``model`` for model-level findings.
        message: One line saying what is wrong and what to do.
    """

    severity: Severity
    node: str
    op: str
    message: str


def opset_range(tensorrt: str) -> tuple[int, int, bool]:
    """ONNX opset range accepted by a TensorRT version's parser.

    Args:
        tensorrt: TensorRT version, ``"10.3"``, ``"10.3.0.30"``, ``"11"``...

    Returns:
        ``(min_opset, max_opset, documented)``; ``documented`` is False where the range is an assumption.

    Raises:
        InvalidOptionError: Not a version string, or older than TensorRT 10.
    """
    major, minor = _version(tensorrt)
    if major == 10:
        return (9, 24, True) if minor >= 15 else (9, 20, minor in (0, 3))
    return 9, 24, False


def _version(tensorrt: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)(?:\.(\d+))?(?:\.\d+)*", tensorrt.strip())
    if m is None:
        raise InvalidOptionError(f"TensorRT version {tensorrt!r} is not a version number like 10.3")
    major, minor = int(m.group(1)), int(m.group(2) or 0)
    if major < 10:
        raise InvalidOptionError(f"TensorRT {tensorrt} is not supported: edgebnn targets TensorRT 10 and 11")
    return major, minor


def check_trt_compat(model: onnx.ModelProto, *, tensorrt: str = "10.3", dla: bool = False) -> list[Finding]:
    """Check an ONNX model against what the TensorRT ONNX parser accepts.

    Args:
        model: The ONNX model (external data, if any, already loaded).
        tensorrt: Target TensorRT version (10.x or 11.x).
        dla: Whether the engine will be built for a DLA core (with GPU fallback).

    Returns:
        Findings in graph order, model-level ones first; empty when nothing was found.

    Raises:
        InvalidOptionError: ``tensorrt`` is not a supported version.
    """
    return _Checker(model, tensorrt, dla).run()


def has_errors(findings: Sequence[Finding]) -> bool:
    """Whether any finding is an error."""
    return any(f.severity == "error" for f in findings)


def format_findings(findings: Sequence[Finding]) -> str:
    """Render findings for humans, one per line, with a count line first."""
    if not findings:
        return "TensorRT compatibility: no findings"
    errors = sum(f.severity == "error" for f in findings)
    lines = [f"TensorRT compatibility: {errors} error(s), {len(findings) - errors} warning(s)"]
    for f in findings:
        where = f"{f.op} {f.node!r}" if f.node else f.op
        lines.append(f"  {f.severity:<7} {where}: {f.message}")
    return "\n".join(lines)


class _Checker:
    def __init__(self, model: onnx.ModelProto, tensorrt: str, dla: bool) -> None:
        self.model = model
        self.tensorrt = tensorrt
        self.dla = dla
        self.findings: list[Finding] = []
        self.opset = next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), None)
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.consts: dict[str, TensorProto] = {}
        self.producers: dict[str, onnx.NodeProto] = {}
        self.consumer_ops: dict[str, set[str]] = {}  # value -> op types that read it
        self.value_types: dict[str, onnx.TypeProto] = {}
        graph = model.graph
        for vi in [*graph.input, *graph.value_info, *graph.output]:
            self.value_types[vi.name] = vi.type
        for init in graph.initializer:
            self.consts[init.name] = init
        for sub in self._subgraphs(graph):  # Loop bodies, If branches: their own constants (names are unique)
            for init in sub.initializer:
                self.consts[init.name] = init
            for vi in [*sub.input, *sub.value_info, *sub.output]:
                self.value_types[vi.name] = vi.type
        for node, _ in self._nodes():
            for out in node.output:
                self.producers[out] = node
            for value in node.input:
                self.consumer_ops.setdefault(value, set()).add(node.op_type)
            if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    self.consts[node.output[0]] = value

    @staticmethod
    def _subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
        for node in graph.node:
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    yield sub
                    yield from _Checker._subgraphs(sub)

    def add(self, severity: Severity, node: str, op: str, message: str) -> None:
        self.findings.append(Finding(severity, node, op, message))

    def _nodes(self) -> Iterator[tuple[onnx.NodeProto, str]]:
        """Every node with a display name: the graph, subgraphs, and bodies of called local functions."""
        seen_functions: set[tuple[str, str]] = set()

        def walk(nodes: Sequence[onnx.NodeProto], prefix: str) -> Iterator[tuple[onnx.NodeProto, str]]:
            for i, node in enumerate(nodes):
                name = node.name or f"{prefix}{node.op_type}#{i}"
                key = (node.domain, node.op_type)
                if key in self.functions:
                    if key not in seen_functions:
                        seen_functions.add(key)
                        yield from walk(self.functions[key].node, f"{name}/")
                    continue
                yield node, name
                for attr in node.attribute:
                    for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                        yield from walk(sub.node, f"{name}/{attr.name}/")

        yield from walk(self.model.graph.node, "")

    def run(self) -> list[Finding]:
        self.check_opset()
        self.check_inputs()
        self.check_initializers()
        for node, name in self._nodes():
            self.check_node(node, name)
        return self.findings

    def check_initializers(self) -> None:
        for name, tensor in self.consts.items():
            if tensor.data_type in _UNIMPORTED_WEIGHT_TYPES:
                self.add("error", name, "initializer", f"TensorRT imports no {_type_name(tensor.data_type)} weights")
            elif tensor.data_type in _QUANTIZED_CONSTANT_TYPES:
                others = self.consumer_ops.get(name, set()) - _QDQ
                if others:
                    self.add("error", name, "initializer", f"a {_type_name(tensor.data_type)} constant may only "
                                                           f"feed Q/DQ nodes in TensorRT (it feeds "
                                                           f"{', '.join(sorted(others))})")

    def check_opset(self) -> None:
        low, high, documented = opset_range(self.tensorrt)
        if self.opset is None:
            self.add("error", "", "model", "no default-domain (ai.onnx) opset import")
            return
        if self.opset < low:
            self.add("error", "", "model", f"opset {self.opset} is below {low}, the oldest TensorRT parses; re-export")
        elif self.opset > high:
            basis = "documented" if documented else "assumed"
            self.add(
                "warning",
                "",
                "model",
                f"opset {self.opset} is above the {low}-{high} {basis} for TensorRT {self.tensorrt}; the parser "
                "does not refuse it but imports ops by older semantics; verify with a real build",
            )

    def check_inputs(self) -> None:
        for inp in self.model.graph.input:
            if inp.name in self.consts or not inp.type.HasField("tensor_type"):
                continue
            dims = inp.type.tensor_type.shape.dim
            dynamic = [str(i) for i, d in enumerate(dims) if i > 0 and not d.HasField("dim_value")]
            if dynamic:
                self.add(
                    "warning",
                    inp.name,
                    "input",
                    f"dynamic dimension(s) {', '.join(dynamic)}: only the batch (axis 0) should vary; "
                    "an optimization profile must then cover every shape",
                )

    def check_node(self, node: onnx.NodeProto, name: str) -> None:
        op, domain = node.op_type, node.domain
        if domain not in _DEFAULT_DOMAINS:
            if domain == "ai.edgebnn":
                message = "edgebnn IR op reached the TensorRT export; it must be lowered to standard ONNX"
            else:
                message = f"custom domain {domain!r} has no TensorRT importer"
            self.add("error", name, op, message)
            return
        if op in RANDOM_OPS:
            self.add("warning", name, op, "TensorRT imports random ops as a Fill layer that ignores seed: "
                                          "draws are not reproducible (--rng host keeps them so)")
        elif op in UNSUPPORTED_OPS:
            self.add("error", name, op, "not supported by the TensorRT ONNX parser")
        elif op not in SUPPORTED_OPS:
            self.add("warning", name, op, "not in edgebnn's table of TensorRT-parsable ops; verify with a build")
        if self.dla and op in _DLA_FALLBACK_OPS:
            self.add("warning", name, op, "does not run on DLA: falls back to the GPU")
        if op in ("QuantizeLinear", "DequantizeLinear"):
            self.check_qdq(node, name)
        elif op == "Constant":
            bad = [a.name for a in node.attribute if a.name in ("sparse_value", "value_string", "value_strings")]
            if bad:
                self.add("error", name, op, f"attribute {bad[0]} is not supported by TensorRT")
        elif op == "MaxPool" and len([o for o in node.output if o]) > 1:
            self.add("error", name, op, "the Indices output is not supported by TensorRT")
        elif op in _MATMUL_LIKE:
            self.check_quantized_inputs(node, name)
        axes_is_input = op in _AXES_INPUT and self.opset is not None and self.opset >= _AXES_INPUT[op]
        if axes_is_input and len(node.input) > 1 and node.input[1] and node.input[1] not in self.consts:
            self.add("error", name, op, "axes must be a constant (initializer or Constant) for TensorRT")

    # --- Q/DQ ----------------------------------------------------------------------------------------

    def elem_type(self, value: str) -> int | None:
        if value in self.consts:
            return self.consts[value].data_type
        vtype = self.value_types.get(value)
        if vtype is not None and vtype.HasField("tensor_type"):
            return vtype.tensor_type.elem_type
        producer = self.producers.get(value)
        if producer is not None and producer.op_type == "QuantizeLinear":
            return self.quantized_type(producer)
        return None

    def quantized_type(self, node: onnx.NodeProto) -> int | None:
        """Integer/FP8 type a Q/DQ node works in (None when it cannot be told statically)."""
        if node.op_type == "DequantizeLinear":
            return self.elem_type(node.input[0])
        if len(node.input) > 2 and node.input[2]:
            return self.elem_type(node.input[2])
        return _attr(node, "output_dtype", 0) or TensorProto.UINT8

    def is_constant(self, value: str) -> bool:
        """A constant, or a constant passed through QuantizeLinear/Identity (weights quantized in-graph)."""
        if value in self.consts:
            return True
        producer = self.producers.get(value)
        return (
            producer is not None
            and producer.op_type in ("QuantizeLinear", "Identity")
            and self.is_constant(producer.input[0])
        )

    def shape(self, value: str) -> list[int] | None:
        if value in self.consts:
            return list(self.consts[value].dims)
        vtype = self.value_types.get(value)
        if vtype is None or not vtype.HasField("tensor_type") or not vtype.tensor_type.HasField("shape"):
            return None
        dims = vtype.tensor_type.shape.dim
        return [d.dim_value if d.HasField("dim_value") else -1 for d in dims]

    def check_qdq(self, node: onnx.NodeProto, name: str) -> None:
        op = node.op_type
        data, scale = node.input[0], node.input[1] if len(node.input) > 1 else ""
        zero = node.input[2] if len(node.input) > 2 else ""
        qtype = self.quantized_type(node)
        producer = self.producers.get(data)
        typed_here = op == "QuantizeLinear" or producer is None or producer.op_type != "QuantizeLinear"
        implicit_uint8 = op == "QuantizeLinear" and not zero and not _attr(node, "output_dtype", 0)
        if implicit_uint8:
            self.add(
                "warning",
                name,
                op,
                "no zero point: onnxruntime quantizes to UINT8 but TensorRT to INT8, so results differ; "
                "give an INT8 zero point of 0",
            )
        elif typed_here and qtype in (TensorProto.UINT8, TensorProto.UINT4):
            self.add("error", name, op, f"{_type_name(qtype)} quantization: TensorRT needs signed, symmetric types")
        if zero:
            if zero not in self.consts:
                self.add("warning", name, op, "zero point is not a constant; TensorRT requires it to be 0")
            elif np.any(numpy_helper.to_array(self.consts[zero]).astype(np.float64) != 0):
                self.add("error", name, op, "zero point must be 0: TensorRT supports symmetric quantization only")
        if scale in self.consts and np.any(numpy_helper.to_array(self.consts[scale]).astype(np.float64) <= 0):
            self.add("error", name, op, "scales must all be positive")
        constant_data = self.is_constant(data)
        if qtype in _INT4:
            if op == "QuantizeLinear" and not constant_data:
                self.add("error", name, op, "INT4 is weight-only in TensorRT: quantize constant weights only")
            data_shape = self.shape(data)
            if data_shape and data_shape[-1] > 0 and data_shape[-1] % 2:
                self.add("error", name, op, f"INT4 weights need an even last dimension, got {data_shape[-1]}")
        self.check_scale_layout(node, name, constant_data)

    def check_scale_layout(self, node: onnx.NodeProto, name: str, constant_data: bool) -> None:
        op = node.op_type
        scale_shape = self.shape(node.input[1]) if len(node.input) > 1 else None
        data_shape = self.shape(node.input[0])
        if scale_shape is None or int(np.prod(scale_shape)) == 1:
            return
        if len(scale_shape) == 1:
            if not constant_data:
                self.add("error", name, op, "per-channel scales are only supported on constant weights")
                return
            axis = _attr(node, "axis", 1)
            if data_shape is not None and -len(data_shape) <= axis < len(data_shape):
                size = data_shape[axis]
                if size != scale_shape[0]:
                    self.add("error", name, op, f"{scale_shape[0]} per-channel scales for axis {axis} of size {size}")
            return
        if data_shape is None or len(scale_shape) != len(data_shape):
            self.add("error", name, op, f"scale of rank {len(scale_shape)} is neither per-tensor, 1-D nor block-wise")
            return
        if not constant_data:
            self.add("error", name, op, "block-wise scales are only supported on constant weights")
        blocked = [i for i, (d, s) in enumerate(zip(data_shape, scale_shape, strict=True)) if d != s]
        rank = len(data_shape)
        if len(blocked) != 1:
            self.add("error", name, op, f"block-wise scales need exactly one blocked axis, found {len(blocked)}")
        elif blocked[0] < rank - 2:
            self.add("error", name, op, f"blocked axis {blocked[0]} must be the last or second-to-last")
        elif data_shape[blocked[0]] % scale_shape[blocked[0]]:
            self.add(
                "error",
                name,
                op,
                f"axis {blocked[0]} of size {data_shape[blocked[0]]} is not a multiple of "
                f"{scale_shape[blocked[0]]} blocks",
            )

    def check_quantized_inputs(self, node: onnx.NodeProto, name: str) -> None:
        """Conv/Gemm/MatMul with an 8-bit DQ on one input but a float other input runs unfused."""
        kinds = []
        for value in node.input[:2]:
            producer = self.producers.get(value)
            if producer is not None and producer.op_type == "DequantizeLinear":
                kinds.append(self.quantized_type(producer))
            else:
                kinds.append(None)
        eight_bit = [k in _EIGHT_BIT for k in kinds]
        if any(eight_bit) and not all(eight_bit):
            self.add(
                "warning",
                name,
                node.op_type,
                "only some inputs come from 8-bit DequantizeLinear; quantize all inputs for an INT8/FP8 kernel "
                "(unless weight-only quantization is intended)",
            )


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _type_name(elem_type: int | None) -> str:
    return TensorProto.DataType.Name(elem_type) if elem_type is not None else "unknown"
