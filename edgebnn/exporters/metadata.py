"""The ``edgebnn.export`` metadata of an exported ONNX: one typed record, one writer, one reader.

Every exported graph (and every INT8 model ``edgebnn calibrate`` writes) carries exactly one
``metadata_props`` entry, key :data:`EXPORT_KEY`, whose value is ``json.dumps(record, sort_keys=True)``.
:func:`write_metadata` writes it; :func:`read_metadata` is the only reader: it refuses anything but one
well-typed record that fits the graph it describes, with an :class:`InvalidArtifactError` naming the file,
so a tampered file stops with one line instead of a traceback deep inside onnxruntime.

Fields (``None`` optionals are left out of the JSON, so the bytes are those the exporters always wrote):

    edgebnn_version, mode, samples, seed (None unless baked), scheme, source_library, input_name,
    input_shape ([batch, ...]), num_classes, outputs (graph outputs the predictive is read from)
    weights         baked: fp32 | int8 | int4
    stores          noise/shared/analytic with compact moments: {store: tensors it decodes in the graph}
                    (:mod:`edgebnn.exporters.stores`: an encoding's op type, int8, int4 or float)
    rng             noise/shared: host (noise graph inputs) | graph (seeded random ops inside the graph)
    compact         baked with folded weights: the compact alternative (the export command's options)
    layers          baked/noise: {"sampled": [layer], "hoisted": [layer]}
    noise           noise/shared: the noise variant
    noise_inputs    noise/shared: [{"name", "shape" ([-1 | S, dims...]), "per" (row | sample), "dist"}]
    quadrature, quadrature_seed   analytic: the logit quadrature
    approximations  analytic: one line per family whose moments drop a dependence, with the bound it states
    float_bnn_bytes, ebnn_bytes   the fp32 BNN's bytes (μ and σ of every Bayesian weight in fp32) and the
                    ``.ebnn``'s, so the file alone gives its size ratios (:mod:`edgebnn.exporters.sizes`)
    precision, calibration        INT8 calibration (``calibrate``): "int8" and its settings
    task, task_options            the graph's task unless classification (:meth:`edgebnn.tasks.Task.record`;
                                  absent: classification), whose outputs are the task's
    anytime         an anytime ensemble (``--samples auto``, :mod:`edgebnn.exporters.anytime`): its stopping rule
                    (:meth:`edgebnn.stopping.StoppingRule.to_dict`); ``samples`` is then the largest count, and the
                    outputs end with ``samples`` (members each input used)
    config          the export configuration that reproduces the graph, every ``auto`` decided
                    (:meth:`edgebnn.exporters.config.ExportConfig.to_dict`; absent: a float baseline, or a file
                    written before edgebnn recorded it)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from edgebnn._version import __version__
from edgebnn.errors import EdgeBNNError, InvalidArtifactError
from edgebnn.exporters import MODES, NOISE_VARIANTS, WEIGHT_FORMATS
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.forms import FORMS
from edgebnn.ir import MANIFEST_KEY, BNNModel, proto_writer
from edgebnn.stopping import StoppingRule
from edgebnn.tasks import Task

EXPORT_KEY = "edgebnn.export"
BASELINE_MODES = ("float_deterministic", "float_bnn")  # one-pass float baselines, not ensembles
NOISE_PER = ("row", "sample")
NOISE_DISTS = ("normal", "uniform")


@dataclass(frozen=True)
class ExportMetadata:
    """What an exported graph is: read back by ``Session``, ``eval``, ``compare``, ``calibrate``, ``profile``."""

    mode: str
    samples: int
    seed: int | None
    scheme: str
    source_library: str
    input_name: str
    input_shape: tuple[int, ...]
    num_classes: int
    outputs: tuple[str, ...]
    edgebnn_version: str = __version__
    float_bnn_bytes: int | None = None
    ebnn_bytes: int | None = None
    weights: str | None = None
    form: str | None = None
    form_reason: str | None = None
    integer_min_bytes: int | None = None
    layers: Mapping[str, list[str]] | None = None
    noise: str | None = None
    noise_inputs: tuple[Mapping[str, Any], ...] | None = None
    quadrature: str | None = None
    quadrature_seed: int | None = None
    precision: str | None = None
    calibration: Mapping[str, Any] | None = None
    stores: Mapping[str, int] | None = None
    rng: str | None = None
    compact: str | None = None
    task: str | None = None
    task_options: Mapping[str, Any] | None = None
    input_range: tuple[float, float] | None = None
    approximations: tuple[str, ...] | None = None
    anytime: Mapping[str, Any] | None = None
    config: Mapping[str, Any] | None = None

    @classmethod
    def describe(cls, model: BNNModel, *, mode: str, samples: int, seed: int | None, **extra: Any) -> ExportMetadata:
        """The record of a graph exported from ``model`` (``extra``: the optional fields of its mode), with the
        fp32 BNN's and the ``.ebnn``'s bytes (computed from the IR unless ``extra`` gives them)."""
        from edgebnn.passes import ebnn_bytes, float_bnn_bytes

        m = model.manifest
        if extra.get("noise_inputs") is not None:
            extra["noise_inputs"] = tuple(extra["noise_inputs"])
        extra.setdefault("float_bnn_bytes", float_bnn_bytes(model))
        extra.setdefault("ebnn_bytes", ebnn_bytes(model))
        if m.input_range is not None:
            extra.setdefault("input_range", (float(m.input_range[0]), float(m.input_range[1])))
        task = m.task_spec(model.where)
        extra.update(task.record())
        return cls(mode=mode, samples=samples, seed=seed, scheme=m.scheme, source_library=m.source_library,
                   input_name=m.input_name, input_shape=tuple(m.input_shape), num_classes=m.num_classes,
                   outputs=("probs",) if mode in BASELINE_MODES else task.outputs, **extra)

    def task_spec(self, where: str = "<model>") -> Task:
        """The task of the graph (:class:`edgebnn.tasks.Task`; classification when none is recorded)."""
        return Task.parse(self.task, self.task_options, where)

    @property
    def is_baseline(self) -> bool:
        """A float baseline graph (one pass, output ``probs`` only), not an ensemble."""
        return self.mode in BASELINE_MODES

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (keys sorted): every required field, the optional ones that are set."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            if isinstance(value, tuple):
                value = [dict(v) if isinstance(v, Mapping) else v for v in value]
            out[f.name] = dict(value) if isinstance(value, Mapping) else value
        return dict(sorted(out.items()))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> ExportMetadata:
        """Parse and validate; every defect is an :class:`InvalidArtifactError` naming ``where`` and the field."""
        bad = f"{where}: {EXPORT_KEY} metadata"
        try:
            raw = json.loads(text, object_pairs_hook=_no_duplicates)
        except _DuplicateKeyError as e:
            raise InvalidArtifactError(f"{bad} has the key {e.args[0]!r} twice") from e
        except json.JSONDecodeError as e:
            raise InvalidArtifactError(f"{bad} is not valid JSON ({e.msg})") from e
        except (ValueError, RecursionError) as e:  # nested too deeply, an integer of thousands of digits
            raise InvalidArtifactError(f"{bad} is not valid JSON ({type(e).__name__})") from e
        if not isinstance(raw, dict):
            raise InvalidArtifactError(f"{bad} must be a JSON object, got {_json_type(raw)}")
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(names))
        if unknown:
            raise InvalidArtifactError(f"{bad} has unknown field(s) {unknown} (written by edgebnn "
                                       f"{_short(raw.get('edgebnn_version'))}; this is edgebnn {__version__})")
        missing = [n for n, f in names.items() if f.default is dataclasses.MISSING and n not in raw]
        if missing:
            raise InvalidArtifactError(f"{bad} has no {', '.join(missing)}")
        for name, value in raw.items():
            optional = names[name].default is None
            if not (value is None and optional) and not _CHECKS[name](value):
                raise InvalidArtifactError(f"{bad}: {name} {_short(value)} is not {_DESCRIBE[name]}")

        choices = (("mode", (*MODES, *BASELINE_MODES)), ("noise", NOISE_VARIANTS), ("weights", WEIGHT_FORMATS),
                   ("form", ("fp32", *(f for f in FORMS if f != "auto"))))  # fp32 weights: one form
        for name, allowed in choices:
            if raw.get(name) is not None and raw[name] not in allowed:
                raise InvalidArtifactError(f"{bad}: {name} {_short(raw[name])} is not one of {', '.join(allowed)}")
        raw["input_shape"] = tuple(raw["input_shape"])
        raw["outputs"] = tuple(raw["outputs"])
        if raw.get("noise_inputs") is not None:
            raw["noise_inputs"] = tuple(raw["noise_inputs"])
        if raw.get("approximations") is not None:
            raw["approximations"] = tuple(raw["approximations"])
        if raw.get("input_range") is not None:
            raw["input_range"] = (float(raw["input_range"][0]), float(raw["input_range"][1]))
        return cls(**raw)


def write_metadata(proto: onnx.ModelProto, meta: ExportMetadata) -> None:
    """Record ``meta`` as the export entry of ``proto`` (replacing one in place, else appended).

    The IR manifest an exporter's graph was copied from is dropped: it describes the ``.ebnn``, not this
    graph. Other entries (onnxruntime's quantization tools add a few) stay where they are.
    """
    entries: dict[str, str] = {}  # key -> value, in first-seen order: one entry per key
    for p in proto.metadata_props:
        if p.key != MANIFEST_KEY:
            entries.setdefault(p.key, p.value)
    entries[EXPORT_KEY] = meta.to_json()
    del proto.metadata_props[:]
    for key, value in entries.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value


def read_metadata(proto: onnx.ModelProto, where: str) -> ExportMetadata:
    """The validated export record of ``proto``, checked against its graph's inputs and outputs.

    Raises:
        InvalidArtifactError: No record, more than one, malformed, or one that does not fit the graph.
    """
    entries = [p.value for p in proto.metadata_props if p.key == EXPORT_KEY]
    if not entries:
        raise InvalidArtifactError(f"{where}: not exported by edgebnn (no {EXPORT_KEY} metadata)")
    if len(entries) > 1:
        raise InvalidArtifactError(f"{where}: {len(entries)} {EXPORT_KEY} metadata entries; an export has one")
    meta = ExportMetadata.from_json(entries[0], where)
    meta.task_spec(where)  # a task no loaded module registered is named before anything else reads the graph
    _check_graph(proto, meta, f"{where}: {EXPORT_KEY} metadata")
    return meta


def _check_graph(proto: onnx.ModelProto, meta: ExportMetadata, bad: str) -> None:
    """The record names the graph's real inputs (with their static dims) and outputs."""
    inputs = {i.name: i for i in proto.graph.input}
    if meta.input_name not in inputs:
        raise InvalidArtifactError(f"{bad}: input_name {meta.input_name!r} is not a graph input "
                                   f"({sorted(inputs)})")
    dims = inputs[meta.input_name].type.tensor_type.shape.dim
    declared = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    if len(declared) != len(meta.input_shape) or any(
        d is not None and d != m for d, m in zip(declared[1:], meta.input_shape[1:], strict=True)
    ):
        raise InvalidArtifactError(f"{bad}: input_shape {list(meta.input_shape)} does not fit the graph input "
                                   f"{meta.input_name!r} of shape {declared}")
    noise = {str(r["name"]) for r in meta.noise_inputs or ()}
    extra = sorted(set(inputs) - noise - {meta.input_name})
    absent = sorted(noise - set(inputs))
    if extra or absent:
        raise InvalidArtifactError(f"{bad}: noise_inputs do not match the graph inputs (graph only: {extra}; "
                                   f"metadata only: {absent})")
    outputs = {o.name for o in proto.graph.output}
    if not set(meta.outputs) <= outputs:
        raise InvalidArtifactError(f"{bad}: outputs {list(meta.outputs)} are not all graph outputs ({sorted(outputs)})")
    want = ("probs",) if meta.is_baseline else meta.task_spec(bad).outputs
    if meta.anytime is not None:
        want = (*want, "samples")
    if tuple(meta.outputs) != want:
        raise InvalidArtifactError(f"{bad}: outputs {list(meta.outputs)} of a {meta.mode} graph must be {list(want)}")


class _DuplicateKeyError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_text(v: object) -> bool:
    return isinstance(v, str) and bool(v)


def _is_text_list(v: object) -> bool:
    return isinstance(v, list) and all(_is_text(x) for x in v)


def _is_noise_input(v: object) -> bool:
    if not (isinstance(v, dict) and set(v) <= {"name", "shape", "per", "dist"} and {"name", "shape", "per"} <= set(v)):
        return False
    shape = v["shape"]
    return (_is_text(v["name"]) and v["per"] in NOISE_PER and v.get("dist", "normal") in NOISE_DISTS
            and isinstance(shape, list) and len(shape) >= 1 and all(_is_int(d) for d in shape)
            and (shape[0] == -1 or shape[0] > 0) and all(d >= 0 for d in shape[1:]))


_CHECKS: dict[str, Any] = {
    "edgebnn_version": _is_text,
    "mode": _is_text,
    "samples": lambda v: _is_int(v) and v > 0,
    "seed": lambda v: v is None or (_is_int(v) and v >= 0),
    "scheme": _is_text,
    "source_library": _is_text,
    "input_name": _is_text,
    "input_shape": lambda v: isinstance(v, list) and len(v) >= 2 and all(_is_int(d) and d > 0 for d in v),
    "num_classes": lambda v: _is_int(v) and v > 0,
    "outputs": lambda v: _is_text_list(v) and len(v) > 0,
    "weights": _is_text,
    "form": _is_text,
    "form_reason": _is_text,
    "integer_min_bytes": lambda v: _is_int(v) and v >= 0,
    "float_bnn_bytes": lambda v: _is_int(v) and v >= 0,
    "ebnn_bytes": lambda v: _is_int(v) and v >= 0,
    "layers": lambda v: isinstance(v, dict) and set(v) == {"sampled", "hoisted"} and all(
        _is_text_list(x) for x in v.values()),
    "noise": _is_text,
    "noise_inputs": lambda v: isinstance(v, list) and all(_is_noise_input(x) for x in v),
    "quadrature": _is_text,
    "quadrature_seed": lambda v: _is_int(v) and v >= 0,
    "precision": _is_text,
    "calibration": lambda v: isinstance(v, dict) and _is_text(v.get("method")),
    "stores": lambda v: isinstance(v, dict) and all(_is_text(k) and _is_int(x) and x > 0 for k, x in v.items()),
    "rng": lambda v: v in ("host", "graph"),
    "compact": _is_text,
    "task": _is_text,
    "task_options": lambda v: isinstance(v, dict),
    "approximations": _is_text_list,
    "anytime": lambda v: isinstance(v, dict) and _parses(StoppingRule.from_dict, v),
    "config": lambda v: isinstance(v, dict) and _parses(ExportConfig.from_dict, v),
    "input_range": lambda v: isinstance(v, list) and len(v) == 2 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v) and v[0] <= v[1],
}
_DESCRIBE = {
    "samples": "a positive integer", "seed": "null or a non-negative integer",
    "input_shape": "a list of at least 2 positive integers", "num_classes": "a positive integer",
    "outputs": "a non-empty list of names", "layers": 'an object {"sampled": [names], "hoisted": [names]}',
    "noise_inputs": 'a list of {"name", "shape", "per": row|sample, "dist": normal|uniform} objects',
    "quadrature_seed": "a non-negative integer", "integer_min_bytes": "a non-negative integer",
    "float_bnn_bytes": "a non-negative integer", "ebnn_bytes": "a non-negative integer",
    "calibration": "an object with a method", "stores": "an object {store: tensors}", "rng": "host or graph",
    "input_range": "[min, max] of finite numbers", "approximations": "a list of non-empty strings",
    "anytime": "a stopping rule (edgebnn.stopping)", "config": "an export configuration (edgebnn.exporters.config)",
}
_DESCRIBE.update({k: "a non-empty string" for k in _CHECKS if k not in _DESCRIBE})


def _parses(parse: Callable[[Any, str], object], v: dict[str, Any]) -> bool:
    """Whether ``parse`` (a ``from_dict``: :class:`edgebnn.stopping.StoppingRule`'s, :class:`ExportConfig`'s) accepts
    ``v``."""
    try:
        parse(v, "<metadata>")
    except EdgeBNNError:
        return False
    return True


def _json_type(v: object) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(v), "null")


def _short(v: object) -> str:
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


def load_onnx(source: onnx.ModelProto | bytes | str | os.PathLike[str]) -> tuple[onnx.ModelProto, int, str]:
    """``(model, its serialized bytes, name for messages)`` of an ONNX file, its bytes or a proto. A file written
    with external data (past 2 GiB, :func:`edgebnn.exporters.ensemble.save_onnx`) is read without it (its
    tensors keep naming ``<file>.data``; :func:`external_data_folder` tells onnxruntime where it is); its bytes
    count that file too.

    Raises:
        InvalidArtifactError: a missing or unreadable file, bytes that are not ONNX, or external data that is
            missing or not beside the file (one line naming it).
    """
    if isinstance(source, onnx.ModelProto):  # sized as written: upb's ByteSize serializes, and refuses past 2 GiB
        return source, proto_writer(source)[0], "<model>"
    where = "<bytes>" if isinstance(source, bytes) else str(source)
    try:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
    except FileNotFoundError as e:
        raise InvalidArtifactError(f"{where}: no such file") from e
    except OSError as e:
        raise InvalidArtifactError(f"{where}: cannot read ({e.strerror or e})") from e
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidArtifactError(f"{where}: not an ONNX file") from e
    return proto, len(data) + _external_bytes(proto, where), where


def _external_locations(proto: onnx.ModelProto) -> set[str]:
    """The files a model's external-data tensors name (:func:`edgebnn.exporters.ensemble.save_onnx`)."""
    return {e.value for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
            for e in t.external_data if e.key == "location"}


def _external_bytes(proto: onnx.ModelProto, where: str) -> int:
    """The bytes of the files beside ``where`` that hold its external data (0 for a self-contained file); only a
    plain file name in the model's folder is followed.

    Raises:
        InvalidArtifactError: bytes or a proto with external data, a location that is not a file name beside
            the model, or a missing one.
    """
    total = 0
    for location in sorted(_external_locations(proto)):
        if where.startswith("<"):
            raise InvalidArtifactError(f"{where}: its constants are external data ({location!r}): load it from "
                                       "its file, beside which that data lies")
        if Path(location).name != location or location in (".", ".."):
            raise InvalidArtifactError(f"{where}: external data location {location!r} is not a file beside it")
        data = Path(where).parent / location
        if not data.is_file():
            raise InvalidArtifactError(f"{where}: its external data {data} is missing (it is written beside the "
                                       ".onnx and travels with it)")
        total += data.stat().st_size
    return total


def external_data_folder(proto: onnx.ModelProto, where: str) -> str | None:
    """The folder onnxruntime reads an export's external data from (the file's own), or None when it has none."""
    if not _external_locations(proto) or where.startswith("<"):
        return None
    return str(Path(where).resolve().parent)
