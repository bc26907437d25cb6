"""Targets: lookup by name, option validation, compile -> Executable on the CPU, and the profile loop."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from synthetic import INPUT_SHAPE, synthetic_cnn

from edgebnn.devices import DEVICES, device_names, get_device
from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import float_bnn, float_deterministic, save_onnx
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import EXPORT_KEY
from edgebnn.runtime import Session
from edgebnn.runtime.session import read_export
from edgebnn.targets import CompileOptions, Executable, get_target, gpu, target_names
from edgebnn.targets.cpu import CpuTarget
from edgebnn.targets.gpu import JetsonTarget, RtxTarget
from edgebnn.targets.power import NullMeter
from edgebnn.targets.profiler import profile

ROOT = Path(__file__).resolve().parents[2]


def _x(batch: int = 3) -> np.ndarray:
    return np.random.default_rng(0).random((batch, *INPUT_SHAPE[1:]), dtype=np.float32)


# -- lookup by name ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "cls", "canonical"), [
    ("cpu", CpuTarget, "cpu"), ("RTX", RtxTarget, "rtx"), ("jetson", JetsonTarget, "jetson-orin-nano"),
    ("jetson-agx-orin", JetsonTarget, "jetson-agx-orin"),
])
def test_a_device_name_resolves_to_the_target_of_its_kind(name, cls, canonical):
    target = get_target(name)
    assert type(target) is cls and target.name == canonical and target.profile is DEVICES[canonical]


def test_every_device_profile_has_a_target():
    assert target_names() == device_names()
    for name in target_names():
        assert get_target(name).kind == get_device(name).kind


def test_unknown_target_lists_the_known_names():
    with pytest.raises(InvalidOptionError) as e:
        get_target("tpu")
    assert str(e.value) == ("unknown device 'tpu'; known devices: cpu, rtx, jetson-orin-nano, jetson-orin-nx, "
                            "jetson-agx-orin, jetson")


def test_a_target_class_refuses_a_profile_of_another_kind():
    with pytest.raises(InvalidOptionError, match="device rtx is a rtx device, not cpu"):
        CpuTarget(get_device("rtx"))


# -- options validated against the device ------------------------------------------------------------------


def _with_meta(model: onnx.ModelProto, **changes: str) -> onnx.ModelProto:
    """The export with changed metadata, e.g. a weight precision the exporter does not write (it writes
    fp32/int8/int4)."""
    meta = read_export(model)[1]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for prop in out.metadata_props:
        if prop.key == EXPORT_KEY:
            prop.value = json.dumps({**meta.to_dict(), **changes})
    return out


def test_weights_in_a_format_edgebnn_does_not_write_are_refused_as_a_bad_artifact():
    # every device takes every weight format the exporter writes (fp32/int8/int4); anything else is tampering
    fp8 = _with_meta(export_model(synthetic_cnn(), ExportConfig(2, mode="baked")).proto, weights="fp8")
    with pytest.raises(InvalidArtifactError, match='weights "fp8" is not one of fp32, int8, int4'):
        get_target("jetson").compile(fp8, options=CompileOptions(name="ens"))


def test_calibrated_activations_in_a_precision_the_device_lacks_are_refused():
    calibrated = _with_meta(export_model(synthetic_cnn(), ExportConfig(2, mode="baked")).proto,
                            precision="fp8")  # calibrate writes "precision"
    with pytest.raises(InvalidOptionError, match="fp8 activations do not run on cpu, which takes fp32, int8, int4"):
        get_target("cpu").compile(calibrated)


def test_every_weight_format_the_exporter_writes_runs_on_the_cpu():
    model = synthetic_cnn()
    for weights in ("fp32", "int8", "int4"):  # how close each stays to fp32 is test_ensemble_export's business
        exe = get_target("cpu").compile(export_model(model, ExportConfig(2, mode="baked", weights=weights)).proto)
        probs = exe.run(_x())[0]
        assert exe.meta.weights == weights and probs.shape == (3, 3)
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)  # a softmax mean, up to float32 rounding


def test_a_runtime_the_device_lacks_is_refused():
    with pytest.raises(InvalidOptionError) as e:
        get_target("cpu").compile(float_deterministic(synthetic_cnn()), runtime="tensorrt")
    assert str(e.value) == "model: runtime 'tensorrt' is not available on cpu, which runs onnxruntime, torch"


@pytest.mark.parametrize(("device", "core", "message"), [
    ("cpu", 0, "DLA core 0: cpu has no DLA cores"),
    ("jetson-orin-nano", 0, "DLA core 0: jetson-orin-nano has no DLA cores"),
    ("jetson-agx-orin", 2, "DLA core 2: jetson-agx-orin has cores 0-1"),
])
def test_a_dla_core_the_device_lacks_is_refused(device, core, message):
    with pytest.raises(InvalidOptionError) as e:
        get_target(device).compile(float_deterministic(synthetic_cnn()), options=CompileOptions(dla_core=core))
    assert str(e.value) == message


@pytest.mark.parametrize(("field", "value", "message"), [
    ("threads", -1, "threads must be at least 0, got -1"),
    ("max_batch", 0, "max batch must be at least 1, got 0"),
    ("workspace_mib", 0, "workspace must be at least 1, got 0"),
])
def test_compile_options_validate_themselves(field, value, message):
    with pytest.raises(InvalidOptionError) as e:
        CompileOptions(**{field: value})
    assert str(e.value) == message


def test_baseline_runner_choices():
    assert get_target("cpu").plan() == {"float_deterministic": "onnxruntime", "float_bnn": "onnxruntime"}
    assert get_target("rtx").plan() == {"float_deterministic": "tensorrt", "float_bnn": ("torch", "onnxruntime")}
    assert get_target("jetson").plan("torch") == {"float_deterministic": "torch", "float_bnn": "torch"}
    with pytest.raises(InvalidOptionError) as e:
        get_target("cpu").plan("tensorrt")
    assert str(e.value) == "--baseline-runner tensorrt: choose one of auto, onnxruntime, torch"


def test_power_meters_come_from_the_profile():
    assert get_target("cpu").power_meters == ("rapl",)
    assert get_target("rtx").power_meters == ("nvml",)
    assert get_target("jetson-orin-nx").power_meters == ("ina3221", "tegrastats", "jtop")
    assert isinstance(get_target("jetson").open_meter("none"), NullMeter)


# -- compile and run on the CPU ------------------------------------------------------------------------------


def test_cpu_compiles_an_ensemble_to_the_session_it_would_run_in():
    graph = export_model(synthetic_cnn(), ExportConfig(4, mode="baked")).proto
    exe = get_target("cpu").compile(graph)
    assert isinstance(exe, Executable) and exe.target == "cpu" and exe.meta.mode == "baked"
    assert (exe.name, exe.provider, exe.input_names) == ("onnxruntime", "CPUExecutionProvider", ["input"])
    assert exe.size_bytes == graph.ByteSize()
    want = Session(graph, threads=1).predict(_x())
    got = exe.run(_x())
    for g, w in zip(got, (want.probs, want.entropy, want.mutual_info), strict=True):
        np.testing.assert_array_equal(g, w)  # same graph, same runtime, same settings


def test_cpu_noise_ensemble_takes_one_input_and_draws_its_noise_per_call():
    exe = get_target("cpu").compile(export_model(synthetic_cnn(sigma=0.3), ExportConfig(2, mode="noise",
                                                                                        rng="host")).proto)
    assert exe.input_names == ["input"]
    call = exe.bind(_x())
    assert not np.array_equal(call().probs, call().probs)  # fresh host noise in every timed call


def test_cpu_compiles_a_file_with_either_runtime(tmp_path):
    # float32 results of the same graph in two runtimes differ by summation order only: a few ulps of values
    # of order 1 after at most a few hundred multiply-adds.
    pytest.importorskip("torch")
    path = save_onnx(float_deterministic(synthetic_cnn()), tmp_path / "det.onnx")
    cpu = get_target("cpu")
    ort_exe = cpu.compile(path)
    torch_exe = cpu.compile(path, runtime="torch", options=CompileOptions(threads=1))
    assert ort_exe.name == "onnxruntime" and torch_exe.name == "torch"
    assert ort_exe.size_bytes == torch_exe.size_bytes == path.stat().st_size
    assert ort_exe.meta.mode == "float_deterministic"
    np.testing.assert_allclose(torch_exe.run(_x())[0], ort_exe.run(_x())[0], atol=1e-5)


def test_cpu_baselines_are_the_exporters_float_graphs():
    model = synthetic_cnn()
    baselines = get_target("cpu").baselines(model)
    assert list(baselines) == ["float_deterministic", "float_bnn"]
    assert baselines["float_deterministic"] == float_deterministic(model)
    assert read_export(baselines["float_bnn"])[1] == read_export(float_bnn(model))[1]


def test_gpu_compile_puts_the_engine_in_the_workdir_or_beside_the_onnx(monkeypatch, tmp_path):
    # TensorRT cannot be installed here: the build writes a placeholder engine, the runner only names it
    built = []

    def build_engine(onnx_path, engine_path, device, options):
        built.append((Path(onnx_path), Path(engine_path), device, options.max_batch, options.dla_core))
        Path(engine_path).write_bytes(b"engine")

    monkeypatch.setattr(gpu, "import_tensorrt", lambda *a: None)
    monkeypatch.setattr("edgebnn.exporters.tensorrt.build_engine", build_engine)
    monkeypatch.setattr(gpu, "TensorRTRunner", lambda engine, device: SimpleNamespace(
        name="tensorrt", provider=f"engine for {device}", input_names=["input"], engine_path=Path(engine)))
    agx = get_target("jetson-agx-orin")
    graph = export_model(synthetic_cnn(), ExportConfig(2, mode="baked")).proto
    exe = agx.compile(graph, options=CompileOptions(name="ens", workdir=tmp_path, max_batch=4, dla_core=1))
    assert built[-1] == (tmp_path / "ens.onnx", tmp_path / "ens.engine", "jetson-agx-orin", 4, 1)
    assert (exe.name, exe.provider, exe.size_bytes, exe.meta.mode) == ("tensorrt", "engine for jetson-agx-orin",
                                                                           6, "baked")
    path = save_onnx(graph, tmp_path / "m.onnx")
    agx.compile(path)
    assert built[-1] == (path, tmp_path / "m.engine", "jetson-agx-orin", 1, None)
    with pytest.raises(InvalidOptionError, match="ens: building a TensorRT engine of an in-memory graph needs a "
                                                 "workdir"):
        agx.compile(graph, options=CompileOptions(name="ens"))


# -- the profile loop -------------------------------------------------------------------------------------


def test_profile_compiles_each_graph_through_the_target_and_runs_float_bnn_s_times(monkeypatch):
    compiled: list[tuple[str, object]] = []
    runs: dict[str, int] = {}
    real_compile, real_bind = CpuTarget.compile, Executable.bind

    def compile_(self, model, *, runtime=None, options=None):
        exe = real_compile(self, model, runtime=runtime, options=options)
        compiled.append((options.name, runtime))
        return exe

    def bind(self, inputs):
        call, mode = real_bind(self, inputs), self.meta.mode

        def counted():
            runs[mode] = runs.get(mode, 0) + 1
            return call()

        return counted

    monkeypatch.setattr(CpuTarget, "compile", compile_)
    monkeypatch.setattr(Executable, "bind", bind)
    model = synthetic_cnn()
    report = profile(model, export_model(model, ExportConfig(4, mode="baked")).proto, samples=4, runs=3, warmup=2,
                     power_meter="none")
    assert compiled == [("ensemble", None), ("float_deterministic", "onnxruntime"), ("float_bnn", "onnxruntime")]
    # warmup + runs calls per graph; one float_bnn inference is S = 4 sampled passes
    assert runs == {"baked": 5, "float_deterministic": 5, "float_bnn": 20}
    baked = export_model(model, ExportConfig(4, mode="baked")).proto
    assert report["mode"] == "baked" and report["artifact_bytes"] == baked.ByteSize()
