"""TensorRT exporter without a GPU: dry runs, trtexec commands, manifests, engine checks.

Jetson's build path (the board's ``tensorrt`` module, which cannot be installed here) is exercised against
FakeTensorRT, a stand-in module that records the API calls (it builds nothing); rtx engines are built for real
by TensorRT for RTX in tests/integration/test_tensorrt_rtx.py, and tests/device/test_tensorrt_build.py runs
the Jetson path on a board.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import types
from pathlib import Path

import pytest
from synthetic import synthetic_cnn
from synthetic import write_trt_model as write_model

from edgebnn.devices import get_device
from edgebnn.errors import EdgeBNNError, InvalidArtifactError, InvalidOptionError, MissingDependencyError
from edgebnn.exporters import tensorrt as trt_exporter
from edgebnn.exporters.tensorrt import (
    BuildOptions,
    build_engine,
    check_engine,
    manifest_path,
    trtexec_command,
    trtexec_path,
)


@pytest.fixture
def no_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import tensorrt` and `import tensorrt_rtx` fail even where they are installed."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", None)


# --- dry run ------------------------------------------------------------------------------------------


def test_dry_run_writes_manifest_and_trtexec_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_tensorrt: None
) -> None:
    onnx_path = write_model(tmp_path / "lenet.onnx")
    engine = tmp_path / "lenet.engine"
    written: list[str] = []
    for name in ("atomic_write_json", "atomic_write_text", "atomic_write_bytes"):
        real = getattr(trt_exporter, name)

        def spy(path, data, _real=real, _name=name):
            written.append(f"{_name}:{Path(path).name}")
            return _real(path, data)

        monkeypatch.setattr(trt_exporter, name, spy)
    manifest = build_engine(onnx_path, engine, "rtx", BuildOptions(workspace_mib=512, dry_run=True))

    assert written == ["atomic_write_text:lenet.engine.trtexec.txt", "atomic_write_json:lenet.engine.manifest.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "lenet.engine.manifest.json", "lenet.engine.trtexec.txt", "lenet.onnx"]
    assert json.loads(manifest_path(engine).read_text()) == manifest
    assert manifest["tensorrt_version"] is None and manifest["dry_run"] is True
    assert manifest["engine_sha256"] is None
    assert manifest["device"] == "rtx" and manifest["tensorrt_expected"] == "11"
    assert manifest["builder"] == "tensorrt-rtx" and manifest["engine_bytes"] is None
    assert manifest["flags"] == ["STRONGLY_TYPED"] and manifest["dla_core"] is None
    assert manifest["workspace_mib"] == 512
    assert manifest["inputs"] == [{"name": "x", "dtype": "float", "shape": [1, 8]}]
    assert manifest["outputs"] == [{"name": "probs", "dtype": "float", "shape": [1, 4]}]
    assert manifest["onnx_sha256"] == hashlib.sha256(onnx_path.read_bytes()).hexdigest()
    assert manifest["shape_profile"] is None and manifest["findings"] == []
    assert shlex.split(trtexec_path(engine).read_text()) == manifest["trtexec"]


def test_dry_run_keeps_previous_manifest_when_check_fails(tmp_path: Path) -> None:
    good = write_model(tmp_path / "m.onnx")
    engine = tmp_path / "m.engine"
    build_engine(good, engine, "rtx", BuildOptions(dry_run=True))
    before = manifest_path(engine).read_bytes()
    write_model(good, unsupported=True)
    with pytest.raises(InvalidArtifactError):
        build_engine(good, engine, "rtx", BuildOptions(dry_run=True))
    assert manifest_path(engine).read_bytes() == before


def test_dynamic_batch_gets_a_shape_profile(tmp_path: Path) -> None:
    onnx_path = write_model(tmp_path / "m.onnx", batch="N")
    manifest = build_engine(onnx_path, tmp_path / "m.engine", "jetson", BuildOptions(dry_run=True, max_batch=16))
    assert manifest["inputs"][0]["shape"] == ["N", 8]
    assert manifest["shape_profile"] == {"x": {"min": [1, 8], "opt": [16, 8], "max": [16, 8]}}
    assert manifest["trtexec"][-3:] == ["--minShapes=x:1x8", "--optShapes=x:16x8", "--maxShapes=x:16x8"]


def test_dynamic_non_batch_dimension_is_refused(tmp_path: Path) -> None:
    onnx_path = write_model(tmp_path / "m.onnx", width="W")
    with pytest.raises(InvalidArtifactError, match=r"input x has dynamic dimension\(s\) 1"):
        build_engine(onnx_path, tmp_path / "m.engine", "rtx", BuildOptions(dry_run=True))


def test_unreadable_onnx(tmp_path: Path) -> None:
    with pytest.raises(InvalidArtifactError, match="ONNX model not found"):
        build_engine(tmp_path / "missing.onnx", tmp_path / "m.engine", "rtx", BuildOptions(dry_run=True))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\x00not protobuf")
    with pytest.raises(InvalidArtifactError, match="not a readable ONNX model"):
        build_engine(bad, tmp_path / "m.engine", "rtx", BuildOptions(dry_run=True))


# --- trtexec commands ---------------------------------------------------------------------------------

BASE = ["trtexec", "--onnx=m.onnx", "--saveEngine=m.engine", "--stronglyTyped", "--memPoolSize=workspace:256M"]


@pytest.mark.parametrize(
    ("device", "dla_core", "extra"),
    [
        ("rtx", None, []),
        ("jetson", None, []),
        ("jetson-orin-nano", None, []),
        ("jetson-orin-nx", None, []),
        ("jetson-orin-nx", 0, ["--useDLACore=0", "--allowGPUFallback"]),
        ("jetson-agx-orin", 1, ["--useDLACore=1", "--allowGPUFallback"]),
    ],
)
def test_trtexec_command_per_device(device: str, dla_core: int | None, extra: list[str]) -> None:
    cmd = trtexec_command("m.onnx", "m.engine", device, workspace_mib=256, dla_core=dla_core)
    assert cmd == BASE + extra


def test_trtexec_command_timing_cache() -> None:
    cmd = trtexec_command("m.onnx", "m.engine", "rtx", workspace_mib=256, timing_cache=Path("t.cache"))
    assert cmd == [*BASE, "--timingCacheFile=t.cache"]


@pytest.mark.parametrize(
    ("device", "dla_core", "message"),
    [
        ("rtx", 0, "device rtx has no DLA cores"),
        ("jetson-orin-nano", 0, "device jetson-orin-nano has no DLA cores"),
        ("jetson-agx-orin", 2, r"DLA core 2 out of range for jetson-agx-orin \(cores 0-1\)"),
        ("cpu", None, "device cpu has no TensorRT"),
        ("tpu", None, "unknown device 'tpu'"),
    ],
)
def test_bad_device_options(device: str, dla_core: int | None, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        trtexec_command("m.onnx", "m.engine", device, dla_core=dla_core)


def test_workspace_and_batch_must_be_positive(tmp_path: Path) -> None:
    onnx_path = write_model(tmp_path / "m.onnx")
    with pytest.raises(InvalidOptionError, match="workspace"):
        build_engine(onnx_path, tmp_path / "m.engine", "rtx", BuildOptions(workspace_mib=0, dry_run=True))
    with pytest.raises(InvalidOptionError, match="max batch"):
        build_engine(onnx_path, tmp_path / "m.engine", "rtx", BuildOptions(max_batch=0, dry_run=True))
    with pytest.raises(InvalidOptionError, match=r"need 1 <= min \(4\) <= opt \(2\) <= max \(8\)"):
        build_engine(onnx_path, tmp_path / "m.engine", "rtx", BuildOptions(min_batch=4, opt_batch=2, max_batch=8,
                                                                           dry_run=True))


def test_batch_range_covers_host_noise_rows(tmp_path: Path) -> None:
    """A host-noise input has batch x S rows: its profile is the batch range times S (S from the metadata)."""
    import onnx

    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model

    proto = export_model(synthetic_cnn(), ExportConfig(4, mode="noise", rng="host", device="rtx")).proto
    onnx.save(proto, str(tmp_path / "n.onnx"))
    manifest = build_engine(tmp_path / "n.onnx", tmp_path / "n.engine", "rtx", BuildOptions(dry_run=True, min_batch=2,
                                                                                            max_batch=8))
    rows = {name: p for name, p in manifest["shape_profile"].items() if name != "input"}
    assert rows and all(p["min"][0] == 8 and p["max"][0] == 32 for p in rows.values())
    assert manifest["shape_profile"]["input"] == {"min": [2, 1, 6, 6], "opt": [8, 1, 6, 6], "max": [8, 1, 6, 6]}


@pytest.mark.parametrize(("values", "expected"), [(("8.6",), ["SM86"]), (("sm75", "120"), ["SM75", "SM120"])])
def test_compute_capabilities(values: tuple[str, ...], expected: list[str]) -> None:
    assert trt_exporter.compute_capabilities(get_device("rtx"), values) == expected
    assert trt_exporter.compute_capabilities(get_device("rtx"), ()) == []


def test_compute_capabilities_refused() -> None:
    with pytest.raises(InvalidOptionError, match=r"--compute-capability 9\.0: choose from 7\.5, 8\.0"):
        trt_exporter.compute_capabilities(get_device("rtx"), ["9.0"])
    with pytest.raises(InvalidOptionError, match="built on the device for its own GPU"):
        trt_exporter.compute_capabilities(get_device("jetson"), ["8.7"])


# --- missing TensorRT, compat errors ------------------------------------------------------------------


def test_missing_tensorrt_says_what_to_install(tmp_path: Path, no_tensorrt: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    onnx_path = write_model(tmp_path / "m.onnx")
    with pytest.raises(MissingDependencyError) as info:
        build_engine(onnx_path, tmp_path / "m.engine", "rtx")
    assert "pip install 'edgebnn[tensorrt]'" in str(info.value) and "tensorrt_rtx" in str(info.value)
    monkeypatch.setattr(trt_exporter.platform, "machine", lambda: "aarch64")
    with pytest.raises(MissingDependencyError, match="JetPack"):
        build_engine(onnx_path, tmp_path / "m.engine", "jetson")
    assert not manifest_path(tmp_path / "m.engine").exists()
    assert not (tmp_path / "m.engine").exists()


@pytest.mark.parametrize("dry_run", [True, False])
def test_compat_errors_stop_the_build_before_tensorrt(tmp_path: Path, no_tensorrt: None, dry_run: bool) -> None:
    onnx_path = write_model(tmp_path / "m.onnx", unsupported=True)
    with pytest.raises(
        InvalidArtifactError, match=r"not TensorRT-compatible \(1 error\(s\)\); first: Unique"
    ):
        build_engine(onnx_path, tmp_path / "m.engine", "rtx", BuildOptions(dry_run=dry_run))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_jetson_engine_is_not_built_off_the_jetson(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trt_exporter.platform, "machine", lambda: "x86_64")
    onnx_path = write_model(tmp_path / "m.onnx")
    with pytest.raises(InvalidOptionError, match="must be built on the Jetson; use --dry-run"):
        build_engine(onnx_path, tmp_path / "m.engine", "jetson-orin-nano")


# --- real-build path against a fake TensorRT -----------------------------------------------------------


class FakeTensorRT(types.ModuleType):
    """FAKE tensorrt module: the subset of the API build_engine calls, recording every call."""

    def __init__(self, *, parse_ok: bool = True, build_ok: bool = True, dla_cores: int = 2) -> None:
        super().__init__("tensorrt")
        self.__version__ = "10.3.0.30"
        self.calls: list[tuple] = []
        fake = self

        class Severity:
            INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

        class ILogger:
            def __init__(self) -> None:
                pass

        ILogger.Severity = Severity

        class Config:
            default_device_type = "GPU"
            DLA_core = -1

            def set_memory_pool_limit(self, pool, size):
                fake.calls.append(("set_memory_pool_limit", pool, size))

            def set_flag(self, flag):
                fake.calls.append(("set_flag", flag))

            def create_timing_cache(self, data):
                fake.calls.append(("create_timing_cache", bytes(data)))
                return data + b"+tuned"

            def set_timing_cache(self, cache, ignore_mismatch):
                fake.calls.append(("set_timing_cache", cache, ignore_mismatch))
                self.cache = cache
                return True

            def get_timing_cache(self):
                return types.SimpleNamespace(serialize=lambda: self.cache)

            def add_optimization_profile(self, profile):
                fake.calls.append(("add_optimization_profile", profile.shapes))

        class Profile:
            def __init__(self) -> None:
                self.shapes = {}

            def set_shape(self, name, lo, opt, hi):
                self.shapes[name] = (lo, opt, hi)

        class Builder:
            num_DLA_cores = dla_cores  # noqa: N815 (TensorRT's name)

            def __init__(self, logger) -> None:
                self.logger = logger

            def create_network(self, flags):
                fake.calls.append(("create_network", flags))
                return "network"

            def create_builder_config(self):
                fake.config = Config()
                return fake.config

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                fake.calls.append(("build_serialized_network", network))
                if not build_ok:
                    self.logger.log(Severity.ERROR, "out of workspace")
                    return None
                return memoryview(b"ENGINE-BYTES")

        class OnnxParser:
            num_errors = 0 if parse_ok else 1

            def __init__(self, network, logger) -> None:
                pass

            def parse(self, data, path=None):
                fake.calls.append(("parse", len(data), path))
                return parse_ok

            def get_error(self, i):
                return "In node 0 (importGemm): UNSUPPORTED_NODE"

        self.ILogger = ILogger
        self.Builder = Builder
        self.OnnxParser = OnnxParser
        self.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=1)
        self.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
        self.DeviceType = types.SimpleNamespace(DLA="DLA", GPU="GPU")
        self.BuilderFlag = types.SimpleNamespace(GPU_FALLBACK="GPU_FALLBACK")


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch):
    def install(**kwargs) -> FakeTensorRT:
        module = FakeTensorRT(**kwargs)
        monkeypatch.setitem(sys.modules, "tensorrt", module)
        monkeypatch.setattr(trt_exporter.platform, "machine", lambda: "aarch64")  # a Jetson builds its engines
        return module

    return install


def test_fake_tensorrt_build_jetson(tmp_path: Path, fake_trt) -> None:
    trt = fake_trt()
    onnx_path = write_model(tmp_path / "m.onnx", batch="N")
    engine = tmp_path / "m.engine"
    cache = tmp_path / "timing.cache"
    manifest = build_engine(onnx_path, engine, "jetson", BuildOptions(workspace_mib=64, timing_cache=cache,
                                                                      max_batch=8))

    assert engine.read_bytes() == b"ENGINE-BYTES"
    assert cache.read_bytes() == b"+tuned"
    assert trt.calls == [
        ("create_network", 1 << 1),
        ("parse", onnx_path.stat().st_size, str(onnx_path)),
        ("set_memory_pool_limit", "WORKSPACE", 64 << 20),
        ("add_optimization_profile", {"x": ([1, 8], [8, 8], [8, 8])}),
        ("create_timing_cache", b""),
        ("set_timing_cache", b"+tuned", False),
        ("build_serialized_network", "network"),
    ]
    assert trt.config.default_device_type == "GPU"
    assert manifest["tensorrt_version"] == "10.3.0.30" and manifest["dry_run"] is False
    assert manifest["engine_sha256"] == hashlib.sha256(b"ENGINE-BYTES").hexdigest()
    assert manifest["builder"] == "tensorrt" and manifest["build_seconds"] >= 0
    assert check_engine(engine, "jetson") == manifest  # installed version read from the (fake) module
    build_engine(onnx_path, engine, "jetson", BuildOptions(workspace_mib=64, timing_cache=cache, max_batch=8))
    assert ("create_timing_cache", b"+tuned") in trt.calls  # the saved cache is loaded on the next build


def test_fake_tensorrt_build_dla(tmp_path: Path, fake_trt) -> None:
    trt = fake_trt()
    onnx_path = write_model(tmp_path / "m.onnx")
    manifest = build_engine(onnx_path, tmp_path / "m.engine", "jetson-agx-orin", BuildOptions(dla_core=1))
    assert trt.config.default_device_type == "DLA" and trt.config.DLA_core == 1
    assert ("set_flag", "GPU_FALLBACK") in trt.calls
    assert manifest["flags"] == ["STRONGLY_TYPED", "GPU_FALLBACK"] and manifest["default_device_type"] == "DLA"
    fake_trt(dla_cores=1)
    with pytest.raises(InvalidOptionError, match="DLA core 1 requested, this machine has 1"):
        build_engine(onnx_path, tmp_path / "m.engine", "jetson-agx-orin", BuildOptions(dla_core=1))


def test_fake_tensorrt_parser_and_build_failures(tmp_path: Path, fake_trt) -> None:
    onnx_path = write_model(tmp_path / "m.onnx")
    fake_trt(parse_ok=False)
    with pytest.raises(InvalidArtifactError, match=r"TensorRT ONNX parser failed: In node 0 \(importGemm\)"):
        build_engine(onnx_path, tmp_path / "m.engine", "jetson")
    fake_trt(build_ok=False)
    with pytest.raises(EdgeBNNError, match="TensorRT build failed: out of workspace"):
        build_engine(onnx_path, tmp_path / "m.engine", "jetson")
    assert not (tmp_path / "m.engine").exists() and not manifest_path(tmp_path / "m.engine").exists()


# --- check_engine ---------------------------------------------------------------------------------------


@pytest.fixture
def built(tmp_path: Path, fake_trt) -> Path:
    fake_trt()
    engine = tmp_path / "m.engine"
    build_engine(write_model(tmp_path / "m.onnx"), engine, "jetson")
    return engine


def test_check_engine_accepts_matching_engine(built: Path) -> None:
    assert check_engine(built, "jetson", tensorrt_version="10.3.0.30")["engine"] == "m.engine"


def test_check_engine_version_mismatch(built: Path) -> None:
    with pytest.raises(InvalidArtifactError, match=r"built with TensorRT 10\.3\.0\.30, installed is 10\.15\.1"):
        check_engine(built, tensorrt_version="10.15.1")


def test_check_engine_device_mismatch(built: Path) -> None:
    with pytest.raises(InvalidArtifactError, match="built for jetson-orin-nano, not rtx"):
        check_engine(built, "rtx", tensorrt_version="10.3.0.30")


def test_check_engine_tampered_or_missing(built: Path) -> None:
    built.write_bytes(b"ENGINE-BYTES-but-other")
    with pytest.raises(InvalidArtifactError, match="does not match its manifest"):
        check_engine(built, tensorrt_version="10.3.0.30")
    manifest_path(built).unlink()
    with pytest.raises(InvalidArtifactError, match=r"no build manifest m\.engine\.manifest\.json"):
        check_engine(built, tensorrt_version="10.3.0.30")
    built.unlink()
    with pytest.raises(InvalidArtifactError, match="engine file not found"):
        check_engine(built, tensorrt_version="10.3.0.30")


def test_check_engine_refuses_dry_run_manifest(tmp_path: Path) -> None:
    engine = tmp_path / "m.engine"
    build_engine(write_model(tmp_path / "m.onnx"), engine, "rtx", BuildOptions(dry_run=True))
    engine.write_bytes(b"stale")
    with pytest.raises(InvalidArtifactError, match=r"written by a dry run \(no engine was built with it\)"):
        check_engine(engine, tensorrt_version="10.3.0.30")
    manifest_path(engine).write_text("{not json")
    with pytest.raises(InvalidArtifactError, match="unreadable build manifest"):
        check_engine(engine, tensorrt_version="10.3.0.30")
