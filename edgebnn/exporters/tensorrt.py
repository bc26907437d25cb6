"""ONNX -> TensorRT engine, with a build manifest and the equivalent trtexec command.

``build_engine(onnx, engine, device)`` checks the model (:mod:`edgebnn.exporters.trt_compat`; errors stop
the build), builds a strongly typed network with the TensorRT Python API (``tensorrt`` is imported only
here, only for a real build), and writes, each atomically:

* ``<stem>.engine`` (the path given), the serialized engine (not in a dry run);
* ``<stem>.manifest.json``: TensorRT version (null in a dry run), flags, input/output shapes from the
  ONNX, device, DLA core, workspace, the trtexec command and the engine's SHA-256;
* ``<stem>.trtexec.txt``: the same build as a trtexec command line, for machines without the Python API
  (the pip wheels do not ship trtexec; JetPack does, under ``/usr/src/tensorrt/bin``).

Engines are tied to the TensorRT version and GPU that built them: build on the target (the Jetson
itself), or dry-run here and run the trtexec command there. :func:`check_engine` refuses an engine whose
manifest does not match the installed TensorRT or the requested device.

Dynamic shapes: only the batch (axis 0) may be dynamic; the engine then gets one optimization profile
``min=1, opt=max=max_batch``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from edgebnn._io import atomic_write_bytes, atomic_write_json, atomic_write_text
from edgebnn.devices import DeviceProfile, get_device
from edgebnn.errors import EdgeBNNError, InvalidArtifactError, InvalidOptionError, MissingDependencyError
from edgebnn.exporters.trt_compat import check_trt_compat, format_findings, has_errors

DEFAULT_WORKSPACE_MIB = 1024
MANIFEST_FORMAT = "edgebnn-tensorrt-manifest"
MANIFEST_VERSION = 1

_log = logging.getLogger(__name__)

ShapeProfile = dict[str, tuple[list[int], list[int], list[int]]]
"""Input name -> (min, opt, max) shapes, for inputs with a dynamic batch."""


def manifest_path(engine_path: str | Path) -> Path:
    """``<stem>.manifest.json`` next to the engine."""
    engine = Path(engine_path)
    return engine.with_name(f"{engine.stem}.manifest.json")


def trtexec_path(engine_path: str | Path) -> Path:
    """``<stem>.trtexec.txt`` next to the engine."""
    engine = Path(engine_path)
    return engine.with_name(f"{engine.stem}.trtexec.txt")


def _import_tensorrt() -> Any:
    try:
        import tensorrt
    except ImportError as e:
        raise MissingDependencyError(
            "TensorRT Python package not found: on an x86 RTX machine `pip install tensorrt`; on Jetson it "
            "comes with JetPack (python3-libnvinfer; use a venv with --system-site-packages)"
        ) from e
    return tensorrt


def _check_options(profile: DeviceProfile, workspace_mib: int, dla_core: int | None, max_batch: int) -> None:
    if profile.tensorrt is None:
        raise InvalidOptionError(f"device {profile.name} has no TensorRT; choose an rtx or jetson device")
    if workspace_mib < 1:
        raise InvalidOptionError(f"workspace must be at least 1 MiB, got {workspace_mib}")
    if max_batch < 1:
        raise InvalidOptionError(f"max batch must be at least 1, got {max_batch}")
    if dla_core is not None:
        if profile.dla_cores == 0:
            raise InvalidOptionError(f"device {profile.name} has no DLA cores; drop the DLA core option")
        if not 0 <= dla_core < profile.dla_cores:
            raise InvalidOptionError(
                f"DLA core {dla_core} out of range for {profile.name} (cores 0-{profile.dla_cores - 1})"
            )


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
    """The trtexec command line equivalent to :func:`build_engine`.

    Args:
        onnx_path: TensorRT-ready ONNX model.
        engine_path: Where trtexec saves the engine.
        device: Device profile name (DLA flags only where the device has DLA and ``dla_core`` is set).
        workspace_mib: Workspace memory pool limit in MiB.
        dla_core: DLA core to build for (GPU fallback allowed), or None for the GPU.
        timing_cache: Timing cache file to read and update.
        shape_profile: ``(min, opt, max)`` shapes of inputs with a dynamic batch.

    Returns:
        argv, starting with ``trtexec``.

    Raises:
        InvalidOptionError: Unknown device, device without TensorRT, or a DLA core it lacks.
    """
    profile = get_device(device)
    _check_options(profile, workspace_mib, dla_core, 1)
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
    except (OSError, DecodeError) as e:
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


def _shape_profile(onnx_path: Path, inputs: list[dict[str, Any]], max_batch: int) -> ShapeProfile:
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
            rest = list(shape[1:])
            profile[inp["name"]] = ([1, *rest], [max_batch, *rest], [max_batch, *rest])
    return profile


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_engine(
    onnx_path: str | Path,
    engine_path: str | Path,
    device: str,
    *,
    workspace_mib: int = DEFAULT_WORKSPACE_MIB,
    dla_core: int | None = None,
    timing_cache: str | Path | None = None,
    dry_run: bool = False,
    max_batch: int = 1,
) -> dict[str, Any]:
    """Build a TensorRT engine from an ONNX model and write its manifest and trtexec command.

    Args:
        onnx_path: TensorRT-ready ONNX model (standard domain only, no random ops).
        engine_path: Engine file to write; the manifest and trtexec files go next to it.
        device: Device profile name (``rtx``, ``jetson-orin-nano``, ...).
        workspace_mib: Workspace memory pool limit in MiB.
        dla_core: DLA core to build for, with GPU fallback; only on devices with DLA.
        timing_cache: Timing cache file, loaded when it exists and saved after the build.
        dry_run: Check the model and write the manifest and trtexec files only; TensorRT is not imported.
        max_batch: Largest batch for inputs whose batch dimension is dynamic.

    Returns:
        The manifest (also written to ``<stem>.manifest.json``).

    Raises:
        InvalidOptionError: Bad device/DLA/workspace options, or a real Jetson build off the Jetson.
        InvalidArtifactError: Unreadable ONNX, compatibility errors, shapes TensorRT cannot profile,
            a parser error, or a timing cache from another TensorRT version.
        MissingDependencyError: A real build without the ``tensorrt`` package.
        EdgeBNNError: TensorRT could not start (no CUDA device) or the build failed.
    """
    profile = get_device(device)
    _check_options(profile, workspace_mib, dla_core, max_batch)
    assert profile.tensorrt is not None  # checked above
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    timing_cache = Path(timing_cache) if timing_cache is not None else None
    model = _load_onnx(onnx_path)
    findings = check_trt_compat(model, tensorrt=profile.tensorrt, dla=dla_core is not None)
    if has_errors(findings):
        first = next(f for f in findings if f.severity == "error")
        count = sum(f.severity == "error" for f in findings)
        raise InvalidArtifactError(
            f"{onnx_path}: not TensorRT-compatible ({count} error(s)); first: {first.op} {first.node!r}: "
            f"{first.message}"
        )
    for line in format_findings(findings).splitlines()[1:]:
        _log.warning("%s: %s", onnx_path, line.strip())
    inputs = _tensor_info([i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}])
    shapes = _shape_profile(onnx_path, inputs, max_batch)
    command = trtexec_command(
        onnx_path,
        engine_path,
        profile.name,
        workspace_mib=workspace_mib,
        dla_core=dla_core,
        timing_cache=timing_cache,
        shape_profile=shapes,
    )
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "engine": engine_path.name,
        "onnx": onnx_path.name,
        "onnx_sha256": _sha256(onnx_path),
        "device": profile.name,
        "device_kind": profile.kind,
        "tensorrt_expected": profile.tensorrt,
        "tensorrt_version": None,
        "dry_run": dry_run,
        "flags": ["STRONGLY_TYPED", *(["GPU_FALLBACK"] if dla_core is not None else [])],
        "default_device_type": "DLA" if dla_core is not None else "GPU",
        "dla_core": dla_core,
        "workspace_mib": workspace_mib,
        "timing_cache": str(timing_cache) if timing_cache is not None else None,
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        "inputs": inputs,
        "outputs": _tensor_info(model.graph.output),
        "shape_profile": {name: {"min": s[0], "opt": s[1], "max": s[2]} for name, s in shapes.items()} or None,
        "findings": [asdict(f) for f in findings],
        "trtexec": command,
        "engine_sha256": None,
        "engine_bytes": None,
    }
    if not dry_run:
        if profile.kind == "jetson" and platform.machine() != "aarch64":
            raise InvalidOptionError(
                f"{engine_path}: a {profile.name} engine must be built on the Jetson; use --dry-run here and "
                f"run {trtexec_path(engine_path).name} there"
            )
        trt = _import_tensorrt()
        manifest["tensorrt_version"] = str(trt.__version__)
        engine = _build(trt, onnx_path, engine_path, workspace_mib, dla_core, timing_cache, shapes)
        atomic_write_bytes(engine_path, engine)
        manifest["engine_sha256"] = hashlib.sha256(engine).hexdigest()
        manifest["engine_bytes"] = len(engine)
    atomic_write_text(trtexec_path(engine_path), shlex.join(command) + "\n")
    atomic_write_json(manifest_path(engine_path), manifest)
    return manifest


def _build(
    trt: Any,
    onnx_path: Path,
    engine_path: Path,
    workspace_mib: int,
    dla_core: int | None,
    timing_cache: Path | None,
    shapes: ShapeProfile,
) -> bytes:
    """Run the TensorRT builder; returns the serialized engine and saves the timing cache."""
    errors: list[str] = []

    class _Logger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                errors.append(msg)
            elif severity == trt.ILogger.Severity.WARNING:
                _log.warning("TensorRT: %s", msg)

    logger = _Logger()
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
        details = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)) or "; ".join(errors)
        raise InvalidArtifactError(f"{onnx_path}: TensorRT ONNX parser failed: {details}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
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
        raise EdgeBNNError(f"{engine_path}: TensorRT build failed: {'; '.join(errors[-3:]) or 'see log'}")
    if timing_cache is not None:
        atomic_write_bytes(timing_cache, bytes(config.get_timing_cache().serialize()))
    return bytes(serialized)


def check_engine(
    engine_path: str | Path, device: str | None = None, *, tensorrt_version: str | None = None
) -> dict[str, Any]:
    """Check an engine against its manifest, the installed TensorRT and the device before running it.

    Args:
        engine_path: The engine file; its ``<stem>.manifest.json`` must sit next to it.
        device: Device profile the engine is about to run on, or None to skip that check.
        tensorrt_version: Installed TensorRT version; None reads it from the ``tensorrt`` package.

    Returns:
        The manifest.

    Raises:
        InvalidArtifactError: Engine or manifest missing or unreadable, a dry-run manifest, an engine that
            does not match its manifest, or a TensorRT version or device other than the engine's.
        MissingDependencyError: ``tensorrt_version`` is None and TensorRT is not installed.
    """
    engine = Path(engine_path)
    manifest_file = manifest_path(engine)
    if not engine.is_file():
        raise InvalidArtifactError(f"{engine}: engine file not found")
    if not manifest_file.is_file():
        raise InvalidArtifactError(f"{engine}: no build manifest {manifest_file.name}; rebuild the engine")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidArtifactError(f"{manifest_file}: unreadable build manifest ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise InvalidArtifactError(f"{manifest_file}: not an edgebnn TensorRT build manifest")
    if manifest.get("dry_run") or not manifest.get("engine_sha256"):
        raise InvalidArtifactError(f"{manifest_file}: manifest of a dry run; build the engine on the target")
    if _sha256(engine) != manifest["engine_sha256"]:
        raise InvalidArtifactError(f"{engine}: engine does not match its manifest (rebuilt or corrupted)")
    if device is not None and get_device(device).name != manifest.get("device"):
        raise InvalidArtifactError(
            f"{engine}: built for {manifest.get('device')}, not {get_device(device).name}; rebuild for this device"
        )
    installed = tensorrt_version if tensorrt_version is not None else str(_import_tensorrt().__version__)
    if installed != manifest.get("tensorrt_version"):
        raise InvalidArtifactError(
            f"{engine}: built with TensorRT {manifest.get('tensorrt_version')}, installed is {installed}; "
            "engines do not carry across TensorRT versions, rebuild it"
        )
    return manifest
