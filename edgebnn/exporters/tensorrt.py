"""ONNX -> TensorRT engine, with a build manifest and the equivalent trtexec command.

``build_engine(onnx, engine, device)`` checks the model (:mod:`edgebnn.exporters.trt_compat`; errors stop
the build), parses it with the TensorRT ONNX parser of the device's builder (``DeviceProfile.builder``), builds
a strongly typed engine and writes, each atomically, beside the engine path given (``model.engine``):

* ``model.engine``: the serialized engine (not in a dry run);
* ``model.engine.manifest.json``: builder and version (null in a dry run), flags, input/output shapes, the
  optimization profile, compute capabilities, the builder's warnings, what the parsed network holds (layer
  types, quantized weights, random fills), build seconds, engine bytes and SHA-256, the trtexec command;
* ``model.engine.trtexec.txt``: the same build as a trtexec command line (the pip wheels ship no trtexec;
  JetPack does, under ``/usr/src/tensorrt/bin``).

The CLI writes the ONNX it compiles as ``model.engine.onnx``: every file a build writes is named after the
engine, so a build never replaces a file it was not asked to write (a ``model.onnx`` exported earlier).

Builders (:data:`BUILDERS`):

* ``rtx``: **TensorRT for RTX** (module ``tensorrt_rtx``, ``pip install 'edgebnn[tensorrt]'``) builds ahead of
  time on any machine, no GPU needed; the engine runs on the compute capabilities asked for (default: the
  builder's portable set, Ampere and later; Turing, SM 7.5, must be asked for and has no FP32 GEMM) and the
  device compiles its kernels just in time. Weightless engines (``STRIP_PLAN``) need a GPU to build.
* Jetson: the board's own TensorRT 10.3 (module ``tensorrt``, JetPack): build there, or dry-run here and run the
  trtexec command there (engines are tied to the TensorRT version and GPU that built them).

:func:`check_engine` refuses an engine whose manifest does not match the file, the installed TensorRT or the
requested device, and bytes that are not a serialized engine, before any native library reads them.

Dynamic shapes: only axis 0 may be dynamic: the batch (``batch``) or, for a ``noise --rng host`` graph's noise
inputs, batch x S rows (``batch_x_samples``); the engine gets one optimization profile over
``min_batch..max_batch`` (``opt_batch``, default ``max_batch``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shlex
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from edgebnn._io import atomic_write_bytes, atomic_write_json, atomic_write_text
from edgebnn.devices import DEVICES, DeviceProfile, get_device
from edgebnn.errors import EdgeBNNError, InvalidArtifactError, InvalidOptionError, MissingDependencyError
from edgebnn.exporters.noise import ROWS  # axis 0 of a host-noise input: batch x S rows
from edgebnn.exporters.trt_compat import check_trt_compat, format_findings, has_errors

DEFAULT_WORKSPACE_MIB = 1024
MANIFEST_FORMAT = "edgebnn-tensorrt-manifest"
MANIFEST_VERSION = 2

# builder name -> (Python module, how to get it)
BUILDERS: dict[str, tuple[str, str]] = {
    "tensorrt-rtx": ("tensorrt_rtx", "pip install 'edgebnn[tensorrt]' (TensorRT for RTX, tensorrt-rtx-cu12: "
                                     "builds RTX engines on any machine, no GPU needed)"),
    "tensorrt": ("tensorrt", "on Jetson it comes with JetPack (python3-libnvinfer; use a venv with "
                             "--system-site-packages); on an x86 machine with an NVIDIA GPU, pip install tensorrt"),
}
# a serialized TensorRT-RTX engine starts with this tag; bytes 16-24 hold its length (little-endian)
RTX_ENGINE_TAG = b"vtrt"

_log = logging.getLogger(__name__)

ShapeProfile = dict[str, tuple[list[int], list[int], list[int]]]
"""Input name -> (min, opt, max) shapes, for inputs with a dynamic axis 0."""


def manifest_path(engine_path: str | Path) -> Path:
    """``<engine>.manifest.json`` next to the engine (``model.engine.manifest.json``)."""
    engine = Path(engine_path)
    return engine.with_name(f"{engine.name}.manifest.json")


def trtexec_path(engine_path: str | Path) -> Path:
    """``<engine>.trtexec.txt`` next to the engine."""
    engine = Path(engine_path)
    return engine.with_name(f"{engine.name}.trtexec.txt")


def engine_onnx_path(engine_path: str | Path) -> Path:
    """``<engine>.onnx``: where ``export --target tensorrt`` writes the ONNX it compiles."""
    engine = Path(engine_path)
    return engine.with_name(f"{engine.name}.onnx")


def import_builder(profile: DeviceProfile) -> Any:
    """The TensorRT module that builds (and runs) ``profile``'s engines, or MissingDependencyError saying how to
    install it."""
    if profile.builder is None:
        raise InvalidOptionError(f"device {profile.name} has no TensorRT; choose an rtx or jetson device")
    module, how = BUILDERS[profile.builder]
    try:
        return __import__(module)
    except ImportError as e:
        raise MissingDependencyError(f"TensorRT Python package not found: {module}; {how}") from e


def _check_options(profile: DeviceProfile, workspace_mib: int, dla_core: int | None, batches: Sequence[int]) -> None:
    if profile.tensorrt is None:
        raise InvalidOptionError(f"device {profile.name} has no TensorRT; choose an rtx or jetson device")
    if workspace_mib < 1:
        raise InvalidOptionError(f"workspace must be at least 1 MiB, got {workspace_mib}")
    lo, opt, hi = batches
    if hi < 1:
        raise InvalidOptionError(f"max batch must be at least 1, got {hi}")
    if not 1 <= lo <= opt <= hi:
        raise InvalidOptionError(f"batch range: need 1 <= min ({lo}) <= opt ({opt}) <= max ({hi})")
    if dla_core is not None:
        if profile.dla_cores == 0:
            raise InvalidOptionError(f"device {profile.name} has no DLA cores; drop the DLA core option")
        if not 0 <= dla_core < profile.dla_cores:
            raise InvalidOptionError(
                f"DLA core {dla_core} out of range for {profile.name} (cores 0-{profile.dla_cores - 1})"
            )


def compute_capabilities(profile: DeviceProfile, values: Sequence[str] | None) -> list[str]:
    """``--compute-capability`` values (``8.6``, ``86`` or ``sm86``) as TensorRT-RTX names (``SM86``); [] for the
    builder's default set. Only TensorRT-RTX builds for named compute capabilities."""
    if not values:
        return []
    if profile.builder != "tensorrt-rtx":
        raise InvalidOptionError(f"--compute-capability: {profile.name} engines are built on the device for its "
                                 "own GPU")
    known = ("SM75", "SM80", "SM86", "SM89", "SM120", "SM121")
    out = []
    for v in values:
        name = "SM" + v.strip().lower().removeprefix("sm").replace(".", "")
        if name not in known:
            raise InvalidOptionError(f"--compute-capability {v}: choose from "
                                     f"{', '.join(k[2:-1] + '.' + k[-1] for k in known)}")
        out.append(name)
    return out


def trtexec_command(
    onnx_path: str | Path,
    engine_path: str | Path,
    device: str,
    *,
    workspace_mib: int = DEFAULT_WORKSPACE_MIB,
    dla_core: int | None = None,
    timing_cache: str | Path | None = None,
    shape_profile: Mapping[str, tuple[Sequence[int], Sequence[int], Sequence[int]]] | None = None,
) -> list[str]:
    """The trtexec command line equivalent to :func:`build_engine` (JetPack ships trtexec; the pip wheels do not).

    Args:
        onnx_path: TensorRT-ready ONNX model.
        engine_path: Where trtexec saves the engine.
        device: Device profile name (DLA flags only where the device has DLA and ``dla_core`` is set).
        workspace_mib: Workspace memory pool limit in MiB.
        dla_core: DLA core to build for (GPU fallback allowed), or None for the GPU.
        timing_cache: Timing cache file to read and update.
        shape_profile: ``(min, opt, max)`` shapes of inputs with a dynamic axis 0.

    Returns:
        argv, starting with ``trtexec``.

    Raises:
        InvalidOptionError: Unknown device, device without TensorRT, or a DLA core it lacks.
    """
    profile = get_device(device)
    _check_options(profile, workspace_mib, dla_core, (1, 1, 1))
    argv = [
        "trtexec",
        f"--onnx={onnx_path}",
        f"--saveEngine={engine_path}",
        "--stronglyTyped",
        f"--memPoolSize=workspace:{workspace_mib}M",
    ]
    if dla_core is not None:
        argv += [f"--useDLACore={dla_core}", "--allowGPUFallback"]
    if timing_cache is not None:
        argv.append(f"--timingCacheFile={timing_cache}")
    if shape_profile:
        for flag, k in (("--minShapes", 0), ("--optShapes", 1), ("--maxShapes", 2)):
            spec = ",".join(f"{name}:{'x'.join(map(str, shapes[k]))}" for name, shapes in shape_profile.items())
            argv.append(f"{flag}={spec}")
    return argv


def _load_onnx(onnx_path: Path) -> onnx.ModelProto:
    if not onnx_path.is_file():
        raise InvalidArtifactError(f"{onnx_path}: ONNX model not found")
    try:
        return onnx.load(str(onnx_path))
    except (OSError, DecodeError, ValueError) as e:
        raise InvalidArtifactError(f"{onnx_path}: not a readable ONNX model ({e})") from e


def _tensor_info(values: Sequence[onnx.ValueInfoProto]) -> list[dict[str, Any]]:
    info = []
    for v in values:
        ttype = v.type.tensor_type
        shape: list[int | str | None] | None = None
        if ttype.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in ttype.shape.dim]
        dtype = onnx.TensorProto.DataType.Name(ttype.elem_type).lower()
        info.append({"name": v.name, "dtype": dtype, "shape": shape})
    return info


def _samples(model: onnx.ModelProto) -> int | None:
    """S of an edgebnn export (its metadata), for the batch x S rows of host-noise inputs."""
    from edgebnn.exporters.metadata import EXPORT_KEY

    for p in model.metadata_props:
        if p.key == EXPORT_KEY:
            try:
                samples = json.loads(p.value).get("samples")
            except (ValueError, AttributeError):
                return None
            return samples if isinstance(samples, int) and samples > 0 else None
    return None


def _shape_profile(onnx_path: Path, model: onnx.ModelProto, inputs: list[dict[str, Any]],
                   batches: Sequence[int]) -> ShapeProfile:
    profile: ShapeProfile = {}
    for inp in inputs:
        shape = inp["shape"]
        if shape is None:
            raise InvalidArtifactError(f"{onnx_path}: input {inp['name']} has no shape; TensorRT needs one")
        dynamic = [i for i, d in enumerate(shape) if not isinstance(d, int)]
        if any(i > 0 for i in dynamic):
            raise InvalidArtifactError(
                f"{onnx_path}: input {inp['name']} has dynamic dimension(s) "
                f"{', '.join(str(i) for i in dynamic if i > 0)}; only the batch (axis 0) may be dynamic"
            )
        if dynamic:
            rows = 1
            if shape[0] == ROWS:
                samples = _samples(model)
                if samples is None:
                    raise InvalidArtifactError(f"{onnx_path}: input {inp['name']} has {ROWS} rows but the model "
                                               "records no ensemble size S (edgebnn export metadata)")
                rows = samples
            rest = list(shape[1:])
            lo, opt, hi = ([b * rows, *rest] for b in batches)
            profile[inp["name"]] = (lo, opt, hi)
    return profile


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class BuildOptions:
    """How TensorRT builds an engine (:func:`build_engine`, :func:`compile_engine`).

    Attributes:
        workspace_mib: Workspace memory pool limit in MiB.
        dla_core: DLA core to build for, with GPU fallback; only on devices with DLA.
        timing_cache: Timing cache file, loaded when it exists and saved after the build.
        dry_run: Check the model and write the manifest and trtexec files only; TensorRT is not imported.
        max_batch: Largest batch of inputs whose axis 0 is dynamic.
        min_batch: Smallest such batch.
        opt_batch: The batch TensorRT tunes for (default ``max_batch``).
        compute_capability: rtx: GPUs the engine runs on (``8.6``, ``12.0``, ...); default the builder's
            portable set (Ampere and later).
    """

    workspace_mib: int = DEFAULT_WORKSPACE_MIB
    dla_core: int | None = None
    timing_cache: str | Path | None = None
    dry_run: bool = False
    max_batch: int = 1
    min_batch: int = 1
    opt_batch: int | None = None
    compute_capability: Sequence[str] | None = None

    @property
    def batches(self) -> tuple[int, int, int]:
        """(min, opt, max) batch of the inputs whose axis 0 is dynamic."""
        return self.min_batch, self.opt_batch if self.opt_batch is not None else self.max_batch, self.max_batch

    @property
    def cache(self) -> Path | None:
        return Path(self.timing_cache) if self.timing_cache is not None else None


def build_engine(onnx_path: str | Path, engine_path: str | Path, device: str,
                 options: BuildOptions | None = None) -> dict[str, Any]:
    """Build a TensorRT engine from an ONNX model and write its manifest and trtexec command.

    Args:
        onnx_path: TensorRT-ready ONNX model (standard domain only).
        engine_path: Engine file to write; the manifest and trtexec files go next to it, named after it.
        device: Device profile name (``rtx``, ``jetson-orin-nano``, ...); its ``builder`` builds.
        options: How to build (:class:`BuildOptions`; default its defaults).

    Returns:
        The manifest (also written to ``<engine>.manifest.json``).

    Raises:
        InvalidOptionError: Bad device/DLA/workspace/batch options, or a real Jetson build off the Jetson.
        InvalidArtifactError: Unreadable ONNX, compatibility errors, shapes TensorRT cannot profile,
            a parser error, or a timing cache from another TensorRT version.
        MissingDependencyError: A real build without the device's TensorRT package.
        EdgeBNNError: TensorRT could not start or the build failed.
    """
    opts = options or BuildOptions()
    profile = get_device(device)
    _check_options(profile, opts.workspace_mib, opts.dla_core, opts.batches)
    caps = compute_capabilities(profile, opts.compute_capability)
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    model = _load_onnx(onnx_path)
    findings = _checked(onnx_path, model, profile, opts.dla_core)
    inputs = _tensor_info([i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}])
    shapes = _shape_profile(onnx_path, model, inputs, opts.batches)
    side_by_side = onnx_path.parent == engine_path.parent  # the command then runs from that folder, wherever it is
    command = trtexec_command(onnx_path.name if side_by_side else onnx_path,
                              engine_path.name if side_by_side else engine_path, profile.name,
                              workspace_mib=opts.workspace_mib, dla_core=opts.dla_core, timing_cache=opts.cache,
                              shape_profile=shapes)
    manifest = _manifest(onnx_path, engine_path, profile, opts, model)
    manifest.update(compute_capabilities=caps or None, inputs=inputs, findings=[asdict(f) for f in findings],
                    shape_profile={name: {"min": s[0], "opt": s[1], "max": s[2]} for name, s in shapes.items()} or None,
                    trtexec=command)
    if not opts.dry_run:
        _build_into(manifest, onnx_path, engine_path, profile, (opts, shapes, caps))
    atomic_write_text(trtexec_path(engine_path), shlex.join(command) + "\n")
    atomic_write_json(manifest_path(engine_path), manifest)
    return manifest


def _checked(onnx_path: Path, model: onnx.ModelProto, profile: DeviceProfile, dla_core: int | None) -> list[Any]:
    """The static compatibility findings of ``model`` for the device's TensorRT (logged); refuses errors."""
    assert profile.tensorrt is not None  # _check_options
    findings = check_trt_compat(model, tensorrt=profile.tensorrt, dla=dla_core is not None)
    if has_errors(findings):
        first = next(f for f in findings if f.severity == "error")
        count = sum(f.severity == "error" for f in findings)
        raise InvalidArtifactError(
            f"{onnx_path}: not TensorRT-compatible ({count} error(s)); first: {first.op} {first.node!r}: "
            f"{first.message}"
        )
    for line in format_findings(findings).splitlines()[1:]:
        _log.info("%s: %s", onnx_path, line.strip())
    return findings


def _manifest(onnx_path: Path, engine_path: Path, profile: DeviceProfile, opts: BuildOptions,
              model: onnx.ModelProto) -> dict[str, Any]:
    """The build manifest before the build: what is built, from what, for which device, how (the build's results
    null)."""
    dla = opts.dla_core is not None
    return {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "engine": engine_path.name,
        "onnx": onnx_path.name,
        "onnx_sha256": _sha256(onnx_path),
        "onnx_bytes": onnx_path.stat().st_size,
        "device": profile.name,
        "device_kind": profile.kind,
        "builder": profile.builder,
        "tensorrt_expected": profile.tensorrt,
        "tensorrt_version": None,
        "dry_run": opts.dry_run,
        "flags": ["STRONGLY_TYPED", *(["GPU_FALLBACK"] if dla else [])],
        "default_device_type": "DLA" if dla else "GPU",
        "dla_core": opts.dla_core,
        "compute_capabilities": None,
        "workspace_mib": opts.workspace_mib,
        "timing_cache": str(opts.cache) if opts.cache is not None else None,
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        "inputs": None,
        "outputs": _tensor_info(model.graph.output),
        "shape_profile": None,
        "findings": None,
        "trtexec": None,
        "builder_warnings": [],
        "network": None,
        "build_seconds": None,
        "engine_sha256": None,
        "engine_bytes": None,
    }


def _build_into(manifest: dict[str, Any], onnx_path: Path, engine_path: Path, profile: DeviceProfile,
                how: tuple[BuildOptions, ShapeProfile, list[str]]) -> None:
    """Build the engine with the device's TensorRT, write it, and record the build in ``manifest``."""
    opts, shapes, caps = how
    if profile.kind == "jetson" and platform.machine() != "aarch64":
        raise InvalidOptionError(
            f"{engine_path}: a {profile.name} engine must be built on the Jetson; use --dry-run here and "
            f"run {trtexec_path(engine_path).name} there"
        )
    trt = import_builder(profile)
    manifest["tensorrt_version"] = str(trt.__version__)
    t0 = time.perf_counter()
    engine, network, warnings = _build(trt, onnx_path, engine_path, opts.workspace_mib, opts.dla_core, opts.cache,
                                       shapes, caps)
    manifest["build_seconds"] = round(time.perf_counter() - t0, 3)
    manifest["builder_warnings"], manifest["network"] = warnings, network
    atomic_write_bytes(engine_path, engine)
    manifest["engine_sha256"] = hashlib.sha256(engine).hexdigest()
    manifest["engine_bytes"] = len(engine)


def compile_engine(proto: onnx.ModelProto, engine_path: str | Path, device: str,
                   options: BuildOptions | None = None) -> dict[str, Any]:
    """Write ``proto`` as ``<engine>.onnx`` and build ``<engine>`` from it (:func:`build_engine`), all or nothing.

    Everything is written in a temporary folder beside the engine and moved into place only once the build has
    succeeded, so a refused model (the static check, the parser, the builder) leaves no file behind and replaces
    none; each file is named after the engine, so none replaces a file the caller did not ask for.

    Args:
        proto: The ONNX to compile (an edgebnn export).
        engine_path: The engine to write (``model.engine``; not an ``.onnx`` path).
        device: Device profile name.
        options: How to build (:class:`BuildOptions`; ``dry_run``: write the ONNX, the manifest and the trtexec
            command only).

    Returns:
        The build manifest.
    """
    engine_path = Path(engine_path)
    if engine_path.suffix == ".onnx":
        raise InvalidOptionError(f"-o {engine_path}: give the engine path (e.g. model.engine), not an .onnx path")
    opts = options or BuildOptions()
    dry_run = opts.dry_run
    profile = get_device(device)
    if dry_run:
        check_dry_run_path(engine_path, device)
    findings = check_trt_compat(proto, tensorrt=profile.tensorrt or "11", dla=opts.dla_core is not None)
    if profile.tensorrt is not None and has_errors(findings):
        first = next(f for f in findings if f.severity == "error")
        raise InvalidArtifactError(f"{engine_path}: not TensorRT-compatible: {first.op} {first.node!r}: "
                                   f"{first.message}")
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=engine_path.parent, prefix=".edgebnn-build-") as tmp:
        staged = Path(tmp) / engine_path.name
        atomic_write_bytes(engine_onnx_path(staged), proto.SerializeToString(deterministic=True))
        try:
            manifest = build_engine(engine_onnx_path(staged), staged, device, opts)
        except EdgeBNNError as e:  # name the user's files, not the staging folder
            message = str(e).replace(str(Path(tmp)), str(engine_path.parent))
            raise type(e)(message) from e
        for where in (engine_onnx_path, manifest_path, trtexec_path, *(() if dry_run else (Path,))):
            os.replace(where(staged), where(engine_path))
    return manifest


def check_dry_run_path(engine_path: str | Path, device: str) -> None:
    """Refuse a dry run to the path of an engine that exists: it would replace the engine's ONNX and manifest
    with those of a build that has no engine, and ``profile --engine`` would read another build's manifest.

    Raises:
        InvalidOptionError: An engine is at ``engine_path``.
    """
    engine_path = Path(engine_path)
    if engine_path.exists():
        name = engine_path.with_name(f"{engine_path.stem}-{get_device(device).name}.engine")
        raise InvalidOptionError(
            f"-o {engine_path}: an engine is there{_built_for(engine_path)}; a dry run writes no engine, so the ONNX "
            f"and manifest it writes beside {engine_path.name} would describe another build than that engine: give "
            f"the dry run its own name, e.g. -o {name}")


def _built_for(engine: Path) -> str:
    """`` (built for rtx, its manifest says)``, or nothing when the manifest beside it does not say."""
    try:
        manifest = json.loads(manifest_path(engine).read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return ""
    device = manifest.get("device") if isinstance(manifest, dict) else None
    return f" (built for {device}, its manifest says)" if isinstance(device, str) else ""


class _Messages:
    """What TensorRT logged during one build: errors and warnings (INFO and VERBOSE are dropped)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []


_LOGGERS: dict[int, Any] = {}


def _logger(trt: Any) -> Any:
    """One logger per TensorRT module and process: TensorRT keeps the first logger a builder registers and
    ignores later ones ("The logger passed into createInferBuilder differs from one already registered"), so
    each build points the one logger at its own :class:`_Messages`."""
    if id(trt) not in _LOGGERS:

        class _Logger(trt.ILogger):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self.sink = _Messages()

            def log(self, severity: Any, msg: str) -> None:
                if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                    self.sink.errors.append(msg)
                elif severity == trt.ILogger.Severity.WARNING and msg not in self.sink.warnings:
                    self.sink.warnings.append(msg)

        _LOGGERS[id(trt)] = _Logger()
    return _LOGGERS[id(trt)]


def network_summary(trt: Any, network: Any) -> dict[str, Any]:
    """What the parser made of the ONNX, read without a GPU: layer types, the DequantizeLinear layers on constant
    weights by stored type (``int8``, ``int4``) and whether activations are quantized too, random fill layers."""
    types: Counter[str] = Counter()
    producer: dict[str, str] = {}
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    for layer in layers:
        kind = str(layer.type).rsplit(".", 1)[-1]
        types[kind] += 1
        for k in range(layer.num_outputs):
            producer[layer.get_output(k).name] = kind
    weights: Counter[str] = Counter()
    activations = 0
    for layer in layers:
        if str(layer.type).rsplit(".", 1)[-1] != "DEQUANTIZE" or layer.get_input(0) is None:
            continue
        source = layer.get_input(0)
        if producer.get(source.name) == "CONSTANT":
            weights[str(source.dtype).rsplit(".", 1)[-1].lower()] += 1
        else:
            activations += 1
    random = 0
    for layer in layers:
        if str(layer.type).rsplit(".", 1)[-1] == "FILL" and hasattr(trt, "IFillLayer"):
            layer.__class__ = trt.IFillLayer  # the bindings hand out ILayer; the fill's operation needs the subclass
            random += "RANDOM" in str(layer.operation)  # RANDOM_NORMAL / RANDOM_UNIFORM; Range is LINSPACE
    return {"layers": len(layers), "layer_types": dict(sorted(types.items())),
            "quantized_weights": dict(sorted(weights.items())), "quantized_activations": activations,
            "random_fills": random}


def _build(
    trt: Any,
    onnx_path: Path,
    engine_path: Path,
    workspace_mib: int,
    dla_core: int | None,
    timing_cache: Path | None,
    shapes: ShapeProfile,
    caps: Sequence[str] = (),
) -> tuple[bytes, dict[str, Any], list[str]]:
    """Run the TensorRT builder; returns the serialized engine, the parsed network's summary and the builder's
    warnings, and saves the timing cache."""
    logger = _logger(trt)
    messages = logger.sink = _Messages()
    try:
        builder = trt.Builder(logger)
    except (TypeError, RuntimeError) as e:
        raise EdgeBNNError(f"{engine_path}: TensorRT cannot create a builder (no CUDA device?): {e}") from e
    if dla_core is not None and builder.num_DLA_cores <= dla_core:
        raise InvalidOptionError(
            f"{engine_path}: DLA core {dla_core} requested, this machine has {builder.num_DLA_cores}"
        )
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes(), path=str(onnx_path)):
        details = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)) or "; ".join(messages.errors)
        raise InvalidArtifactError(f"{onnx_path}: TensorRT ONNX parser failed: {_one_line(details)}")
    summary = network_summary(trt, network) if hasattr(network, "num_layers") else {}
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    if caps:
        config.num_compute_capabilities = len(caps)
        for i, cap in enumerate(caps):
            config.set_compute_capability(getattr(trt.ComputeCapability, cap), i)
    if dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = dla_core
        config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
    if shapes:
        opt_profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            opt_profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(opt_profile)
    if timing_cache is not None:
        cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.exists() else b"")
        if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
            raise InvalidArtifactError(
                f"{timing_cache}: timing cache is corrupt or from another TensorRT version/GPU; delete it"
            )
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EdgeBNNError(f"{engine_path}: TensorRT build failed: "
                           f"{_one_line('; '.join(messages.errors[-3:])) or 'see log'}")
    if timing_cache is not None:
        atomic_write_bytes(timing_cache, bytes(config.get_timing_cache().serialize()))
    for msg in messages.warnings:
        _log.info("TensorRT: %s", msg)
    return bytes(serialized), summary, [_one_line(m) for m in messages.warnings]


def _one_line(text: str, limit: int = 400) -> str:
    """A TensorRT message on one line (the parser's errors span several), at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _check_engine_bytes(engine: Path, builder: str | None) -> None:
    """A TensorRT-RTX engine starts with its tag and records its own length: refuse anything else before the
    native runtime reads it."""
    if builder != "tensorrt-rtx":
        return
    with engine.open("rb") as f:
        head = f.read(24)
    size = engine.stat().st_size
    if len(head) < 24 or head[:4] != RTX_ENGINE_TAG or int.from_bytes(head[16:24], "little") != size:
        raise InvalidArtifactError(f"{engine}: not a TensorRT-RTX engine (bad header or length); rebuild it")


def read_engine_manifest(engine_path: str | Path, device: str | None = None) -> dict[str, Any]:
    """The build manifest of an engine, checked against the engine file and ``device`` (no TensorRT needed).

    Checked before anything is imported, so an engine built for another device is named as such even where that
    device's TensorRT is not installed.

    Raises:
        InvalidArtifactError: Engine or manifest missing or unreadable, a dry-run manifest, an engine that does not
            match its manifest or is no engine, or an engine built for another device than ``device``.
    """
    engine = Path(engine_path)
    manifest_file = manifest_path(engine)
    if not engine.is_file():
        dry = manifest_file.is_file() and _is_dry_run(manifest_file)
        raise InvalidArtifactError(
            f"{engine}: engine file not found" + (f" ({manifest_file.name} is a dry run's: build the engine on the "
                                                  f"device with the command in {trtexec_path(engine).name})"
                                                  if dry else ""))
    if not manifest_file.is_file():
        raise InvalidArtifactError(f"{engine}: no build manifest {manifest_file.name}; rebuild the engine")
    try:
        if manifest_file.stat().st_size > 16 << 20:
            raise InvalidArtifactError(f"{manifest_file}: {manifest_file.stat().st_size:,} bytes is no build manifest")
        manifest = json.loads(manifest_file.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InvalidArtifactError(f"{manifest_file}: unreadable build manifest ({_one_line(str(e), 120)})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise InvalidArtifactError(f"{manifest_file}: not an edgebnn TensorRT build manifest")
    if manifest.get("builder") not in (*BUILDERS, None) or manifest.get("device") not in DEVICES:
        raise InvalidArtifactError(f"{manifest_file}: unknown builder or device in the build manifest")
    if manifest.get("dry_run") or not manifest.get("engine_sha256"):
        raise InvalidArtifactError(f"{manifest_file}: written by a dry run (no engine was built with it), so it does "
                                   f"not describe {engine.name}: rebuild the engine (edgebnn export --target tensorrt "
                                   f"-o {engine})")
    if _sha256(engine) != manifest["engine_sha256"]:
        raise InvalidArtifactError(f"{engine}: engine does not match its manifest (rebuilt or corrupted)")
    _check_engine_bytes(engine, manifest.get("builder"))
    if device is not None and get_device(device).name != manifest.get("device"):
        raise InvalidArtifactError(
            f"{engine}: built for {manifest.get('device')}, not {get_device(device).name}: profile it with --device "
            f"{manifest.get('device')}, or build one for {get_device(device).name} (edgebnn export --target tensorrt "
            f"--device {get_device(device).name})"
        )
    return manifest


def _is_dry_run(manifest_file: Path) -> bool:
    try:
        return bool(json.loads(manifest_file.read_text()).get("dry_run"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, AttributeError):
        return False


def check_engine(
    engine_path: str | Path, device: str | None = None, *, tensorrt_version: str | None = None
) -> dict[str, Any]:
    """Check an engine against its manifest, the installed TensorRT and the device before running it.

    Args:
        engine_path: The engine file; its ``<engine>.manifest.json`` must sit next to it.
        device: Device profile the engine is about to run on, or None to skip that check.
        tensorrt_version: Installed TensorRT version; None reads it from the builder's package (the
            manifest's ``builder``: ``tensorrt_rtx`` for rtx engines, ``tensorrt`` for Jetson's).

    Returns:
        The manifest.

    Raises:
        InvalidArtifactError: Engine or manifest missing or unreadable, a dry-run manifest, an engine that
            does not match its manifest or is no engine, or a TensorRT version or device other than the engine's.
        MissingDependencyError: ``tensorrt_version`` is None and TensorRT is not installed.
    """
    engine = Path(engine_path)
    manifest = read_engine_manifest(engine, device)
    installed = (tensorrt_version if tensorrt_version is not None
                 else str(import_builder(get_device(manifest["device"])).__version__))
    if installed != manifest.get("tensorrt_version"):
        raise InvalidArtifactError(
            f"{engine}: built with TensorRT {manifest.get('tensorrt_version')}, installed is {installed}; "
            "engines do not carry across TensorRT versions, rebuild it"
        )
    return manifest
