"""The IR container: an ONNX ``ModelProto`` whose Bayesian weights are ``ai.edgebnn`` encoding nodes,
plus a manifest stored in ``metadata_props`` (key ``edgebnn.manifest``).

The float skeleton (Conv, Gemm, BatchNorm, ReLU, ...) is whatever ``torch.onnx.export`` wrote for the
posterior-mean network; each Bayesian weight initializer is replaced by an encoding node whose output
carries the weight's name. The IR core imports neither torch nor tensorrt.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import helper

from edgebnn._version import __version__
from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings import ENCODINGS, Encoding
from edgebnn.tasks import DEFAULT_TASK, Task

DOMAIN = "ai.edgebnn"
DOMAIN_VERSION = 1
FORMAT_VERSION = 1
MANIFEST_KEY = "edgebnn.manifest"
MAX_IR_VERSION = 10  # onnxruntime 1.31 loads <= 13; TensorRT 10.3's parser wants <= 10
OPSET_RANGE = (17, 20)  # TensorRT 10.3 on Jetson Orin parses opset 9-20
# Elements of one encoded weight: a 2 GiB protobuf cannot hold more weights than this at even a byte each, and
# a zero-byte encoding (one shared level) must not make the loader allocate a hostile 'shape'.
MAX_WEIGHT_ELEMENTS = 1 << 31


@dataclass
class Manifest:
    """What an ``.ebnn`` file says about itself."""

    source_library: str
    input_name: str
    input_shape: list[int]
    num_classes: int
    scheme: str = "float"
    passes: list[dict[str, Any]] = field(default_factory=list)
    lower_config: dict[str, Any] | None = None  # the edgebnn.passes.LowerConfig of the last lower(), to replay it
    format_version: int = FORMAT_VERSION
    edgebnn_version: str = __version__
    # What the output is (edgebnn.tasks.Task): absent in files written before tasks, and for classification,
    # so those files keep their bytes; ``num_classes`` is the output's width (regression: D or 2D) or, for
    # segmentation, its channel count C.
    task: str = DEFAULT_TASK
    task_options: dict[str, Any] | None = None
    # [min, max] of the inputs the model was lowered with (lower --eval / --budget / --calibrate data): eval refuses
    # inputs far outside it (another scale). Absent when lowering saw no data, so those files keep their bytes.
    input_range: list[float] | None = None

    def to_json(self) -> str:
        raw = asdict(self)
        if self.task == DEFAULT_TASK and self.task_options is None:
            del raw["task"], raw["task_options"]
        if self.input_range is None:
            del raw["input_range"]
        return json.dumps(raw, sort_keys=True, separators=(",", ":"))

    def task_spec(self, where: str = "<model>") -> Task:
        """The task (:class:`edgebnn.tasks.Task`) this manifest records."""
        return Task.parse(self.task, self.task_options, where)

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidArtifactError(f"{where}: manifest is not valid JSON ({e.msg})") from e
        except (ValueError, RecursionError) as e:  # nested too deeply, an integer of thousands of digits
            raise InvalidArtifactError(f"{where}: manifest is not valid JSON ({type(e).__name__})") from e
        if not isinstance(raw, dict):
            raise InvalidArtifactError(f"{where}: manifest must be a JSON object")
        version = raw.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise InvalidArtifactError(f"{where}: manifest has no positive integer format_version ({version!r})")
        if version > FORMAT_VERSION:
            raise InvalidArtifactError(
                f"{where}: written by a newer edgebnn (format {version}, edgebnn "
                f"{_text(raw.get('edgebnn_version', '?'))}); this edgebnn {__version__} reads format "
                f"<= {FORMAT_VERSION}"
            )
        try:
            man = cls(**raw)
        except TypeError as e:
            raise InvalidArtifactError(f"{where}: manifest fields are wrong ({e})") from e
        shape = man.input_shape
        if not (isinstance(shape, list) and shape and all(_is_int(d) and d > 0 for d in shape)):
            raise InvalidArtifactError(f"{where}: manifest input_shape {shape!r} is not a list of positive ints")
        if not _is_int(man.num_classes) or man.num_classes < 1:
            raise InvalidArtifactError(f"{where}: manifest num_classes {man.num_classes!r} is not a positive int")
        for name in ("source_library", "input_name", "scheme", "edgebnn_version"):
            value = getattr(man, name)
            if not isinstance(value, str) or not value:
                raise InvalidArtifactError(f"{where}: manifest {name} {value!r} is not a non-empty string")
        if not (isinstance(man.passes, list) and all(isinstance(p, dict) for p in man.passes)):
            raise InvalidArtifactError(f"{where}: manifest passes {man.passes!r} is not a list of objects")
        if man.lower_config is not None and not isinstance(man.lower_config, dict):
            raise InvalidArtifactError(f"{where}: manifest lower_config {man.lower_config!r} is not an object")
        if man.task_options is not None and not isinstance(man.task_options, dict):
            raise InvalidArtifactError(f"{where}: manifest task_options {man.task_options!r} is not an object")
        if man.input_range is not None and not (
                isinstance(man.input_range, list) and len(man.input_range) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                        for v in man.input_range) and man.input_range[0] <= man.input_range[1]):
            raise InvalidArtifactError(f"{where}: manifest input_range {man.input_range!r} is not [min, max] of finite "
                                       "numbers")
        if not isinstance(man.task, str):
            raise InvalidArtifactError(f"{where}: manifest task {man.task!r} is not a string")
        man.task_spec(f"{where}: manifest")
        return man


@dataclass
class EncodedWeight:
    """One encoded weight in the graph: its node, decoded encoding and names."""

    name: str  # the weight value name consumed by Conv/Gemm
    layer: str  # source module path, e.g. "features.0"
    node: onnx.NodeProto
    encoding: Encoding


def tensor_to_array(t: onnx.TensorProto, where: str) -> np.ndarray:
    """Decode an initializer, refusing external data and sizes its bytes do not back."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise InvalidArtifactError(f"{where}: tensor {t.name!r} uses external data, which edgebnn does not follow")
    try:
        np_dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
    except KeyError as e:
        raise InvalidArtifactError(f"{where}: tensor {t.name!r} has unknown data type {t.data_type}") from e
    if any(d < 0 for d in t.dims):
        raise InvalidArtifactError(f"{where}: tensor {t.name!r} has negative dims {list(t.dims)}")
    count = math.prod(int(d) for d in t.dims)  # Python ints: a hostile shape cannot wrap around
    if t.HasField("raw_data"):
        itemsize = np.dtype(np_dtype).itemsize
        packed = t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
        need = (count + 1) // 2 if packed else count * itemsize
        if len(t.raw_data) != need:
            raise InvalidArtifactError(
                f"{where}: tensor {t.name!r} declares {list(t.dims)} ({need} bytes) but stores {len(t.raw_data)}"
            )
    try:
        return onnx.numpy_helper.to_array(t)
    except (ValueError, TypeError) as e:
        raise InvalidArtifactError(f"{where}: tensor {t.name!r} cannot be decoded ({e})") from e


class BNNModel:
    """An edgebnn IR model. Build with :func:`edgebnn.ir.load` or an importer; write with ``save``."""

    def __init__(self, proto: onnx.ModelProto, manifest: Manifest, where: str = "<model>") -> None:
        self.proto = proto
        self.manifest = manifest
        self.where = where

    # -- access ---------------------------------------------------------------------------------
    def initializers(self) -> dict[str, onnx.TensorProto]:
        return {t.name: t for t in self.proto.graph.initializer}

    def encoded_weights(self) -> list[EncodedWeight]:
        """Every encoding node, decoded and validated, in graph order."""
        return list(self.iter_encoded_weights())

    def encoded_weight_names(self) -> list[str]:
        """Names of the encoded weights in graph order, without decoding anything."""
        return [n.output[0] for n in self.proto.graph.node if n.domain == DOMAIN and n.output]

    def encoded_weight(self, name: str) -> EncodedWeight:
        """Decode one encoded weight by name (only its own tensors are read)."""
        node = next((n for n in self.proto.graph.node if n.domain == DOMAIN and n.output and n.output[0] == name),
                    None)
        if node is None:
            raise KeyError(name)
        wanted = set(node.input)
        return self._decode_node(node, {t.name: t for t in self.proto.graph.initializer if t.name in wanted})

    def iter_encoded_weights(self) -> Iterator[EncodedWeight]:
        """Like :meth:`encoded_weights`, one layer at a time: each is decoded when reached, so a caller that
        drops it keeps at most one layer's arrays alive."""
        inits = self.initializers()
        for node in self.proto.graph.node:
            if node.domain == DOMAIN:
                yield self._decode_node(node, inits)

    def _decode_node(self, node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> EncodedWeight:
        attrs = attrs_of(node)
        layer = attrs.pop("layer", b"")
        name = node.output[0] if node.output else "?"
        try:
            layer = layer.decode() if isinstance(layer, bytes) else str(layer)
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        except UnicodeDecodeError as e:
            raise InvalidArtifactError(
                f"{self.where}: encoding node {name!r} ({_text(node.op_type)}) has an attribute that is not UTF-8 "
                "text"
            ) from e
        where = f"{self.where}: layer {layer or name!r} ({_text(node.op_type)})"
        cls = encoding_class(node.op_type)
        if cls is None:
            raise InvalidArtifactError(
                f"{where}: unknown encoding {node.op_type!r}: no loaded plug-in registers it (install the plug-in "
                f"whose family wrote it, or load its module with --plugin MODULE; known: "
                f"{', '.join(sorted(ENCODINGS))})")
        if len(node.output) != 1:
            raise InvalidArtifactError(f"{where}: encoding node must have exactly one output")
        shape = attrs.pop("shape", None)
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and d > 0 for d in shape):
            raise InvalidArtifactError(f"{where}: missing or invalid 'shape' attribute {shape!r}")
        if math.prod(shape) > MAX_WEIGHT_ELEMENTS:  # checked before any decoding allocates for it
            raise InvalidArtifactError(
                f"{where}: 'shape' {shape} declares {math.prod(shape)} weights, more than {MAX_WEIGHT_ELEMENTS}"
            )
        if len(node.input) != len(cls.FIELDS):
            raise InvalidArtifactError(
                f"{where}: expected inputs {list(cls.FIELDS)}, got {len(node.input)} inputs"
            )
        fields = {}
        for fname, iname in zip(cls.FIELDS, node.input, strict=True):
            if iname not in inits:
                raise InvalidArtifactError(f"{where}: input {fname} ({iname!r}) is not an initializer")
            fields[fname] = tensor_to_array(inits[iname], where)
        enc = cls.from_fields(fields, attrs, tuple(shape), where)
        return EncodedWeight(name=name, layer=layer, node=node, encoding=enc)

    def nbytes(self) -> int:
        """Bytes of all stored tensors (encoded weights and deterministic parameters)."""
        return int(sum(_stored_bytes(t) for t in self.proto.graph.initializer))

    # -- rewriting --------------------------------------------------------------------------------
    def replace_encoding(self, weight: EncodedWeight, new: Encoding, **attrs: Any) -> None:
        """Swap ``weight``'s node and initializers for ``new`` (same output name, same position)."""
        graph = self.proto.graph
        old_inputs = set(weight.node.input)
        for t in [t for t in graph.initializer if t.name in old_inputs]:
            graph.initializer.remove(t)  # in place: the other layers' tensors are never copied
        node = make_encoding_node(graph, weight.name, weight.layer, new, **attrs)
        idx = list(graph.node).index(weight.node)
        graph.node.remove(weight.node)
        graph.node.insert(idx, node)

    def copy(self) -> BNNModel:
        proto = onnx.ModelProto()
        proto.CopyFrom(self.proto)
        man = Manifest(**json.loads(self.manifest.to_json()))
        return BNNModel(proto, man, self.where)

    def float_model(self, weights: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
        """A standard ONNX model with every encoded weight replaced by a float initializer.

        ``weights`` maps weight names to values; missing names take the posterior mean (decoded one layer at a
        time).
        """
        weights = weights or {}

        def add(graph: onnx.GraphProto, name: str, shape: list[int]) -> None:
            value = weights[name] if name in weights else self.encoded_weight(name).encoding.mean()
            graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value, np.float32), name))

        return self._strip_encodings(add)

    def weights_as_inputs(self) -> onnx.ModelProto:
        """A standard ONNX model whose encoded weights are extra graph inputs (float32, fixed shape).

        Nothing is decoded: the shapes come from the encoding nodes' ``shape`` attributes.
        """
        return self._strip_encodings(lambda g, name, shape: g.input.append(
            helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)))

    def _strip_encodings(self, add: Callable[[onnx.GraphProto, str, list[int]], None]) -> onnx.ModelProto:
        """The graph without encoding nodes or their tensors; ``add(graph, name, shape)`` supplies each weight.

        Built field by field, so the encoded tensors are never copied.
        """
        src = self.proto.graph
        encoded = [n for n in src.node if n.domain == DOMAIN]
        drop = {i for n in encoded for i in n.input}
        graph = onnx.GraphProto(name=src.name)
        graph.node.extend(n for n in src.node if n.domain != DOMAIN)
        graph.input.extend(src.input)
        graph.output.extend(src.output)
        graph.value_info.extend(src.value_info)
        graph.initializer.extend(t for t in src.initializer if t.name not in drop)
        for n in encoded:
            shape = next((list(a.ints) for a in n.attribute if a.name == "shape"), [])
            add(graph, n.output[0], shape)
        proto = helper.make_model(graph, opset_imports=[o for o in self.proto.opset_import if o.domain != DOMAIN],
                                  producer_name=self.proto.producer_name, producer_version=self.proto.producer_version)
        proto.ir_version = self.proto.ir_version
        return proto


def attrs_of(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values (``onnx.helper.get_attribute_value``), by name."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def make_encoding_node(graph: onnx.GraphProto, name: str, layer: str, enc: Encoding, **attrs: Any) -> onnx.NodeProto:
    """Add ``enc``'s tensors as initializers ``<name>.<field>`` and return its (unattached) node."""
    inputs = []
    for fname, arr in enc.fields().items():
        iname = f"{name}.{fname}"
        _append_initializer(graph, np.ascontiguousarray(arr), iname)
        inputs.append(iname)
    all_attrs = {"layer": layer, "shape": list(enc.shape), **enc.attributes(), **attrs}
    return helper.make_node(enc.op_type, inputs, [name], domain=DOMAIN, name=f"{name}.encoding", **all_attrs)


def _append_initializer(graph: onnx.GraphProto, arr: np.ndarray, name: str) -> None:
    """``graph.initializer.append(numpy_helper.from_array(arr, name))`` without the copy that appending makes:
    a plain little-endian numeric array's tensor is built in place, field by field as ``from_array`` sets them."""
    if not (arr.dtype.kind in "biuf" and arr.dtype.isnative and sys.byteorder == "little"):
        graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
        return
    tensor = graph.initializer.add()
    tensor.dims.extend(arr.shape)
    tensor.name = name
    tensor.raw_data = arr.tobytes()
    tensor.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)


def copy_field(src: Message, dst: Message, name: str) -> None:
    """Copy field ``name`` of ``src`` into ``dst`` (a repeated field is appended to, a message copied)."""
    value, target = getattr(src, name), getattr(dst, name)
    if hasattr(target, "extend"):  # a repeated field
        target.extend(value)
    elif isinstance(target, Message):
        target.CopyFrom(value)
    else:
        setattr(dst, name, value)


def _text(value: object) -> str:
    """``value`` for a one-line message: as is when printable, else its repr (no newline from a file)."""
    text = str(value)
    return text if text.isprintable() else repr(text)


def _is_int(value: object) -> bool:
    """A JSON integer (``True``/``False`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _stored_bytes(t: onnx.TensorProto) -> int:
    if t.HasField("raw_data"):
        return len(t.raw_data)
    dt = helper.tensor_dtype_to_np_dtype(t.data_type)
    return int(np.prod(t.dims, dtype=np.int64)) * np.dtype(dt).itemsize


def encoding_class(op_type: str) -> type[Encoding] | None:
    """The encoding class registered for ``op_type``; on a miss, the registry's loader hook loads the plug-ins
    (their families register encodings) and it is looked up again."""
    return ENCODINGS.find(op_type)
