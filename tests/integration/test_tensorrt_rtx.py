"""Real TensorRT engines, built by TensorRT for RTX on this machine without a GPU (issue 28).

``make test`` and CI install ``edgebnn[tensorrt]`` (``tensorrt-rtx-cu12``), so every run compiles real engines;
elsewhere the module skips. Running an engine needs an NVIDIA GPU: these tests build, read the build manifest and
the parsed network (which TensorRT describes without a GPU), and check what a build writes.

The matrix: every export mode x ``--weights`` x task x posterior family x the zoo's layer kinds, at small widths
and S = 4 (S changes sizes, not which ops a graph holds). Each (model, mode, weights) that the CPU target exports
must export for ``rtx`` and build an engine; what edgebnn refuses for rtx alone must be refused in one line.
The static checker (:mod:`edgebnn.exporters.trt_compat`) must agree with the parser on every graph of the matrix
and on hand-made corner cases.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import edgebnn
from edgebnn.devices import get_device
from edgebnn.errors import EdgeBNNError, InvalidArtifactError, InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.tensorrt import (
    BuildOptions,
    check_engine,
    compile_engine,
    engine_onnx_path,
    import_builder,
    manifest_path,
    trtexec_path,
)
from edgebnn.exporters.trt_compat import check_trt_compat, has_errors

trt = pytest.importorskip("tensorrt_rtx")
torch = pytest.importorskip("torch")
nn = torch.nn
S = 4

pytestmark = pytest.mark.slow


# -- models: one per family, task and layer kind, small and untrained (a build checks ops, not accuracy) ---------


def _vi(model: str | Callable[[], Any], shape: tuple[int, ...], **kw: Any) -> Any:
    """A model with edgebnn's Bayesian layers (a zoo name or a factory), given the synthetic digits posterior."""
    from edgebnn.models import FACTORIES, synthetic_posterior

    torch.manual_seed(0)
    build = FACTORIES[model] if isinstance(model, str) else model
    return edgebnn.from_torch(synthetic_posterior(build()), shape, **kw)


def _resnet18_stem() -> Any:
    """ResNet-18's stem (7x7 s2 conv, BN, overlapping 3x3 s2 max-pool with padding) and one basic block with a
    strided 1x1 downsample, as edgebnn Bayesian layers."""
    from edgebnn import nn as bnn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = bnn.BayesConv2d(3, 8, 7, stride=2, padding=3, bias=False)
            self.bn = nn.BatchNorm2d(8)
            self.pool = nn.MaxPool2d(3, stride=2, padding=1)
            self.c1 = bnn.BayesConv2d(8, 16, 3, stride=2, padding=1, bias=False)
            self.b1 = nn.BatchNorm2d(16)
            self.c2 = bnn.BayesConv2d(16, 16, 3, padding=1, bias=False)
            self.b2 = nn.BatchNorm2d(16)
            self.down = bnn.BayesConv2d(8, 16, 1, stride=2, bias=False)
            self.fc = bnn.BayesLinear(16, 10)

        def forward(self, x: Any) -> Any:
            x = self.pool(torch.relu(self.bn(self.stem(x))))
            y = torch.relu(self.b1(self.c1(x)))
            y = torch.relu(self.b2(self.c2(y)) + self.down(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))

    return Block()


def _conv1d() -> Any:
    bl = pytest.importorskip("bayesian_torch.layers")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = bl.Conv1dReparameterization(2, 8, 3, padding=1, posterior_rho_init=-3.0)
            self.bn = nn.BatchNorm1d(8)
            self.pool = nn.MaxPool1d(2)
            self.fc = bl.LinearReparameterization(8 * 8, 4, posterior_rho_init=-3.0)

        def forward(self, x: Any) -> Any:
            return self.fc(torch.flatten(self.pool(torch.relu(self.bn(self.c(x)[0]))), 1))[0]

    torch.manual_seed(0)
    return edgebnn.from_torch(Net().eval(), (1, 2, 16))


def _regression() -> Any:
    from edgebnn import nn as bnn

    return nn.Sequential(nn.Flatten(), bnn.BayesLinear(8, 16), nn.ReLU(), bnn.BayesLinear(16, 4))


def _segmentation() -> Any:
    from edgebnn import nn as bnn

    return nn.Sequential(bnn.BayesConv2d(1, 8, 3, padding=1), nn.ReLU(), bnn.BayesConv2d(8, 3, 1))


def _lstm() -> Any:
    bl = pytest.importorskip("bayesian_torch.layers")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = bl.LSTMReparameterization(2, 8, posterior_rho_init=-2.0)
            self.head = bl.LinearReparameterization(8, 3, posterior_rho_init=-2.0)

        def forward(self, x: Any) -> Any:
            y, _, _ = self.rnn(x)
            return self.head(y[:, -1])[0]

    torch.manual_seed(0)
    return edgebnn.from_torch(Net().eval(), (1, 6, 2))


def _gru() -> Any:
    bl = pytest.importorskip("bayesian_torch.layers")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(2, 8, batch_first=True)
            self.head = bl.LinearReparameterization(8, 3, posterior_rho_init=-2.0)

        def forward(self, x: Any) -> Any:
            _y, h = self.rnn(x)
            return self.head(h[-1])[0]

    torch.manual_seed(0)
    return edgebnn.from_torch(Net().eval(), (1, 6, 2))


def _mlp(seed: int) -> Any:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10)).eval()


def _mc_dropout() -> Any:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Dropout2d(0.2), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Dropout(0.3), nn.Linear(8 * 16, 10)).eval()
    return edgebnn.from_torch(net, (1, 1, 8, 8), mc_dropout=True)


def _laplace() -> Any:
    laplace = pytest.importorskip("laplace")
    from torch.utils.data import DataLoader, TensorDataset

    net = _mlp(0)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((64, 1, 8, 8)).astype(np.float32))
    y = torch.from_numpy(np.random.default_rng(1).integers(0, 10, 64))
    la = laplace.Laplace(net, "classification", subset_of_weights="last_layer", hessian_structure="kron",
                         prior_precision=1.0)
    la.fit(DataLoader(TensorDataset(x, y), batch_size=64))
    return edgebnn.from_torch(la, (1, 1, 8, 8))


def _swag() -> Any:
    net = _mlp(0)
    rng = np.random.default_rng(0)
    stats = {}
    for name, p in net.named_parameters():
        mean = p.detach().numpy()
        stats[f"{name}_mean"] = mean
        stats[f"{name}_sq_mean"] = mean**2 + 0.01
        stats[f"{name}_covariance_sqrt"] = 0.05 * rng.standard_normal((3, mean.size)).astype(np.float32)
    return edgebnn.from_swag(net, stats, (1, 1, 8, 8))


MODELS: dict[str, Callable[[], Any]] = {
    "vi_digits_cnn": lambda: _vi("digits_cnn", (1, 1, 8, 8)),
    "vi_lenet5": lambda: _vi("lenet5", (1, 1, 28, 28)),
    "vi_resnet20": lambda: _vi("resnet20", (1, 3, 32, 32)),
    "vi_resnet18_stem": lambda: _vi(_resnet18_stem, (1, 3, 32, 32)),
    "bt_conv1d": _conv1d,
    "vi_regression": lambda: _vi(_regression, (1, 8), task="regression"),
    "vi_segmentation": lambda: _vi(_segmentation, (1, 1, 8, 8), task="segmentation"),
    "bt_lstm": _lstm,
    "gru_head": _gru,
    "mc_dropout": _mc_dropout,
    "deep_ensemble": lambda: edgebnn.from_torch([_mlp(i) for i in range(3)], (1, 1, 8, 8)),
    "laplace_kron_ll": _laplace,
    "swag": _swag,
}

# mode, --weights, --rng: the matrix each model goes through
EXPORTS = [("baked", w, "auto") for w in ("ir", "fp32", "int8", "int4")] + \
          [("noise", w, "host") for w in ("ir", "fp32", "int8", "int4")] + \
          [("noise", "ir", "graph"), ("analytic", "ir", "auto"), ("analytic", "int8", "auto")]


# large models: one export per mode (their layer kinds are what they add to the matrix)
SHORT = {"vi_resnet20", "vi_resnet18_stem", "bt_lstm", "gru_head"}
SHORT_EXPORTS = [("baked", "int8", "auto"), ("noise", "ir", "host"), ("noise", "ir", "graph"),
                 ("analytic", "ir", "auto")]


def _lowered(name: str) -> list[tuple[str, Any]]:
    ir = MODELS[name]()
    out = [("fixed", edgebnn.lower(ir, "fixed"))]
    if name == "vi_digits_cnn":
        from edgebnn.passes import lower

        out.append(("float", ir))
        out.append(("codebook_shared", lower(ir, "codebook", seed=0, sampling="shared").model))
    return out


def _exports(name: str) -> list[tuple[str, onnx.ModelProto | None, str]]:
    """(label, the rtx export or None, why not) for every export the CPU target writes."""
    out = []
    for scheme, ir in _lowered(name):
        modes = (SHORT_EXPORTS if name in SHORT else EXPORTS) + \
            ([("shared", "ir", "host")] if scheme == "codebook_shared" else [])
        for mode, weights, rng in modes:
            label = f"{name}/{scheme}/{mode}/{weights}/{rng}"
            samples = 3 if name == "deep_ensemble" else S
            try:
                proto = export_model(ir, ExportConfig(samples, mode=mode, weights=weights, device="rtx", rng=rng)).proto
            except EdgeBNNError as e:
                try:
                    export_model(ir, ExportConfig(samples, mode=mode, weights=weights, device="cpu", rng=rng))
                except EdgeBNNError:
                    continue  # not an export of this model on any device (a family's exact modes)
                out.append((label, None, str(e)))
                continue
            out.append((label, proto, ""))
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engines")


@pytest.mark.parametrize("name", list(MODELS))
def test_every_export_builds_an_engine(name: str, workdir: Path) -> None:
    """Each export the CPU target writes also exports for rtx and builds a real engine; the static checker and the
    parser agree on it (no error <=> parsed and built)."""
    built, refused = [], []
    for label, proto, why in _exports(name):
        if proto is None:
            assert "\n" not in why and why, label
            refused.append((label, why))
            continue
        findings = check_trt_compat(proto, tensorrt="11")
        engine = workdir / (label.replace("/", "_") + ".engine")
        try:
            manifest = compile_engine(proto, engine, "rtx", BuildOptions(max_batch=2))
        except EdgeBNNError as e:
            assert has_errors(findings), f"{label}: the checker passed what TensorRT-RTX refused: {e}"
            refused.append((label, str(e)))
            continue
        assert not has_errors(findings), f"{label}: TensorRT-RTX built what the checker refused: {findings}"
        assert engine.stat().st_size == manifest["engine_bytes"] > 0
        assert engine.read_bytes()[:4] == b"vtrt"
        built.append(label)
    assert built, f"{name}: nothing built"
    assert not refused, f"{name}: refused for rtx: {refused}"


def test_engine_and_manifest_say_what_was_built(workdir: Path) -> None:
    ir = edgebnn.lower(MODELS["vi_digits_cnn"](), "fixed")
    engine = workdir / "digits.engine"
    manifest = compile_engine(export_model(ir, ExportConfig(S, mode="baked", weights="int8", device="rtx")).proto,
                              engine, "rtx", BuildOptions(min_batch=1, opt_batch=4, max_batch=8))
    assert manifest["builder"] == "tensorrt-rtx" and manifest["tensorrt_version"] == trt.__version__
    assert manifest["shape_profile"]["input"] == {"min": [1, 1, 8, 8], "opt": [4, 1, 8, 8], "max": [8, 1, 8, 8]}
    assert manifest["build_seconds"] > 0
    net = manifest["network"]
    # int8 baked weights reach TensorRT as int8 constants behind DequantizeLinear (weight-only: no activation Q/DQ)
    assert net["quantized_weights"].get("int8", 0) >= 3 and net["quantized_activations"] == 0
    assert net["random_fills"] == 0
    assert check_engine(engine, "rtx") == manifest
    for path in (engine_onnx_path(engine), manifest_path(engine), trtexec_path(engine)):
        assert path.is_file()
    assert trtexec_path(engine).read_text().split()[1:3] == ["--onnx=digits.engine.onnx", "--saveEngine=digits.engine"]


def test_graph_rng_builds_with_the_ignored_seed_said(workdir: Path) -> None:
    """``--rng graph`` on rtx: the Fill layers draw at run time (the engine does not grow with the noise) and the
    builder's warning that it ignores the seed reaches the manifest."""
    ir = edgebnn.lower(MODELS["vi_digits_cnn"](), "fixed")
    manifest = compile_engine(export_model(ir, ExportConfig(S, mode="noise", device="rtx", rng="graph")).proto,
                              workdir / "g.engine", "rtx")
    assert manifest["network"]["random_fills"] > 0
    assert any("seed" in w for w in manifest["builder_warnings"])
    assert export_model(ir, ExportConfig(S, mode="noise", device="rtx",
                                         rng="host")).proto.graph.input[1:]  # rtx's default stays host noise


@pytest.mark.parametrize("op", ["RandomNormal", "RandomNormalLike"])
def test_random_fills_are_drawn_at_run_time_not_folded_into_the_engine(op: str, tmp_path: Path) -> None:
    """16 or 4,000,000 random numbers give engines of the same size (4,000,000 folded floats would add 16 MB): the
    Fill layer draws when the engine runs. Whether it draws afresh on every run needs a GPU (docs/tensorrt.md)."""
    sizes = []
    for n in (16, 4_000_000):
        node = (helper.make_node(op, [], ["r"], shape=[1, n], seed=1.0) if op == "RandomNormal"
                else helper.make_node(op, ["x"], ["r"], seed=1.0))
        graph = helper.make_graph([node, helper.make_node("Add", ["x", "r"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 10
        manifest = compile_engine(model, tmp_path / f"r{n}.engine", "rtx")
        assert manifest["network"]["random_fills"] == 1 and any("seed" in w for w in manifest["builder_warnings"])
        sizes.append(manifest["engine_bytes"])
    assert abs(sizes[1] - sizes[0]) < 1 << 20, sizes


def test_compute_capability_turing_refuses_fp32_gemm_in_one_line(workdir: Path) -> None:
    ir = MODELS["vi_regression"]()
    proto = export_model(ir, ExportConfig(S, mode="baked", device="rtx")).proto
    manifest = compile_engine(proto, workdir / "amp.engine", "rtx", BuildOptions(compute_capability=["8.6"]))
    assert manifest["compute_capabilities"] == ["SM86"]
    with pytest.raises(EdgeBNNError, match="Turing") as info:
        compile_engine(proto, workdir / "turing.engine", "rtx", BuildOptions(compute_capability=["7.5"]))
    assert "\n" not in str(info.value) and str(info.value).startswith(str(workdir / "turing.engine"))
    assert not list(workdir.glob("turing.engine*"))  # all or nothing


def test_a_refused_build_writes_nothing_and_replaces_nothing(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"the user's own export")
    graph = helper.make_graph([helper.make_node("Unique", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    bad = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidArtifactError, match="not TensorRT-compatible: Unique"):
        compile_engine(bad, tmp_path / "model.engine", "rtx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    with pytest.raises(InvalidOptionError, match=r"not an \.onnx path"):
        compile_engine(bad, tmp_path / "model.onnx", "rtx")


def test_check_engine_refuses_bytes_that_are_no_engine(workdir: Path) -> None:
    ir = MODELS["vi_regression"]()
    engine = workdir / "r.engine"
    compile_engine(export_model(ir, ExportConfig(S, mode="baked", device="rtx")).proto, engine, "rtx")
    manifest = json.loads(manifest_path(engine).read_text())
    engine.write_bytes(b"vtrt" + bytes(40))
    import hashlib

    manifest["engine_sha256"] = hashlib.sha256(engine.read_bytes()).hexdigest()
    manifest_path(engine).write_text(json.dumps(manifest))
    with pytest.raises(InvalidArtifactError, match="not a TensorRT-RTX engine"):
        check_engine(engine, "rtx")


# -- the static checker against the parser: corner cases ---------------------------------------------------------


def _model(nodes: list[Any], inits: list[Any], opset: int = 17, out_shape: list[Any] | None = None) -> Any:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _const(name: str, value: Any) -> Any:
    return numpy_helper.from_array(np.asarray(value), name)


W8 = np.ones((4, 4, 1, 1), np.int8)
W16 = np.ones((4, 4, 1, 1), np.int16)
CASES = {
    "maxpool_indices": _model([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])], []),
    "maxpool": _model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], []),
    "random_like_of_input": _model([helper.make_node("RandomNormalLike", ["x"], ["r"]),
                                    helper.make_node("Add", ["x", "r"], ["y"])], []),
    "random_like_of_constant": _model([helper.make_node("RandomNormalLike", ["c"], ["r"]),
                                       helper.make_node("Add", ["x", "r"], ["y"])],
                                      [_const("c", np.zeros((1, 4, 4, 4), np.float32))]),
    "unique": _model([helper.make_node("Unique", ["x"], ["y"])], []),
    "int8_per_channel_dq_conv": _model(
        [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], axis=0),
         helper.make_node("Conv", ["x", "wf"], ["y"])],
        [_const("w", W8), _const("s", np.full(4, 0.1, np.float32))]),
    "uint8_dq": _model(
        [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"]),
         helper.make_node("Conv", ["x", "wf"], ["y"])],
        [_const("w", W8.astype(np.uint8)), _const("s", np.float32(0.1)), _const("z", np.uint8(0))]),
    "int8_nonzero_zero_point": _model(
        [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"]),
         helper.make_node("Conv", ["x", "wf"], ["y"])],
        [_const("w", W8), _const("s", np.float32(0.1)), _const("z", np.int8(3))]),
    "int16_weights": _model([helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
                             helper.make_node("Conv", ["x", "wf"], ["y"])], [_const("w", W16)]),
    "uint16_weights": _model([helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
                              helper.make_node("Conv", ["x", "wf"], ["y"])], [_const("w", W16.astype(np.uint16))]),
    "int32_gather_decode": _model([helper.make_node("Gather", ["t", "i"], ["g"], axis=0),
                                   helper.make_node("Reshape", ["g", "shape"], ["wf"]),
                                   helper.make_node("Conv", ["x", "wf"], ["y"])],
                                  [_const("t", np.linspace(-1, 1, 4).astype(np.float32)),
                                   _const("i", np.arange(16, dtype=np.int32) % 4),
                                   _const("shape", np.array([4, 4, 1, 1]))]),
    "topk": _model([helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=-1)], [_const("k", np.array([2]))]),
    "custom_domain": _model([helper.make_node("Foo", ["x"], ["y"], domain="my.domain")], []),
}


def _parses_and_builds(proto: Any, tmp: Path) -> bool:
    path = tmp / "m.onnx"
    onnx.save(proto, str(path))
    try:
        _raw_build(path)
    except EdgeBNNError:
        return False
    return True


def _raw_build(path: Path, shapes: dict | None = None) -> int:
    """TensorRT-RTX alone, without edgebnn's check in front (what a user's plain build does); the engine's bytes."""
    from edgebnn.exporters.tensorrt import _build

    trt_module = import_builder(get_device("rtx"))
    return len(_build(trt_module, path, path.with_suffix(".engine"), 256, None, None, shapes or {})[0])


@pytest.mark.parametrize(("mode", "weights"), [("baked", "int8"), ("noise", "ir"), ("analytic", "ir")])
def test_the_engine_is_the_builders_own(mode: str, weights: str, tmp_path: Path) -> None:
    """A plain TensorRT-RTX build (builder defaults, batch 1) of the ONNX edgebnn compiled gives an engine of the
    same size within 2x: edgebnn adds a profile and a manifest, not bytes."""
    ir = edgebnn.lower(MODELS["vi_lenet5"](), "fixed")
    proto = export_model(ir, ExportConfig(S, mode=mode, weights=weights, device="rtx", rng="host")).proto
    manifest = compile_engine(proto, tmp_path / "m.engine", "rtx")
    shapes = {name: (p["min"], p["opt"], p["max"]) for name, p in (manifest["shape_profile"] or {}).items()}
    plain = _raw_build(engine_onnx_path(tmp_path / "m.engine"), shapes)
    assert 0.5 <= plain / manifest["engine_bytes"] <= 2.0, (plain, manifest["engine_bytes"])


@pytest.mark.parametrize("case", list(CASES))
def test_checker_agrees_with_the_parser(case: str, tmp_path: Path) -> None:
    proto = CASES[case]
    checker_ok = not has_errors(check_trt_compat(proto, tensorrt="11"))
    assert checker_ok == _parses_and_builds(proto, tmp_path), case


def test_cli_export_builds_and_reports_the_engine(tmp_path: Path) -> None:
    from edgebnn.cli import main

    ir = edgebnn.lower(MODELS["vi_digits_cnn"](), "fixed")
    edgebnn.save(ir, tmp_path / "m.ebnn")
    (tmp_path / "model.onnx").write_bytes(b"exported a moment ago")
    runner = CliRunner()
    result = runner.invoke(main, ["export", str(tmp_path / "m.ebnn"), "--target", "tensorrt", "--device", "rtx",
                                  "--samples", "4", "--max-batch", "4", "-o", str(tmp_path / "model.engine"),
                                  "--json", str(tmp_path / "e.json")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "model.onnx").read_bytes() == b"exported a moment ago"  # never clobbered
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["engine"]["engine_bytes"] == (tmp_path / "model.engine").stat().st_size
    assert "engine (what the device loads)" in result.output
    assert report["file"] == str(tmp_path / "model.engine.onnx")


# -- anytime ensembles (--samples auto, issue 36): a Loop (in-graph draws) or an If per chunk (baked members, host
# noise), each built for rtx; the checker agrees with the parser on every one ------------------------------------

ANYTIME_EXPORTS = [("baked", "int8", "auto"), ("baked", "fp32", "auto"), ("noise", "ir", "host"),
                   ("noise", "ir", "graph")]


@pytest.mark.parametrize("name", ["vi_digits_cnn", "vi_lenet5", "deep_ensemble", "vi_regression", "vi_segmentation"])
def test_anytime_exports_build_an_engine(name: str, workdir: Path) -> None:

    ir = edgebnn.lower(MODELS[name](), "fixed")
    built = []
    for mode, weights, rng in ANYTIME_EXPORTS:
        label = f"anytime/{name}/{mode}/{weights}/{rng}"
        try:
            proto = export_model(ir, ExportConfig("auto", mode=mode, weights=weights, rng=rng, device="rtx")).proto
        except InvalidOptionError:
            assert name == "deep_ensemble" and mode == "noise", label  # a deep ensemble exports baked only
            continue
        assert not has_errors(check_trt_compat(proto, tensorrt="11")), label
        assert any(n.op_type in ("Loop", "If") for n in proto.graph.node), label
        manifest = compile_engine(proto, workdir / (label.replace("/", "_") + ".engine"), "rtx",
                                  BuildOptions(max_batch=2))
        assert manifest["engine_bytes"] > 0, label
        built.append(label)
    assert len(built) == (2 if name == "deep_ensemble" else len(ANYTIME_EXPORTS))


def test_anytime_cli_builds_for_rtx_and_dry_runs_for_jetson(tmp_path: Path) -> None:
    """``edgebnn export --target tensorrt --samples auto``: an engine for rtx; Jetson's dry run writes the ONNX, the
    manifest and the trtexec command."""
    from edgebnn.cli import main

    ir = tmp_path / "m.ebnn"
    edgebnn.save(edgebnn.lower(MODELS["vi_digits_cnn"](), "fixed"), ir)
    rtx = CliRunner().invoke(main, ["export", str(ir), "--target", "tensorrt", "--device", "rtx", "--samples", "auto",
                                    "--max-batch", "2", "-o", str(tmp_path / "m.engine")])
    assert rtx.exit_code == 0, rtx.output
    assert (tmp_path / "m.engine").read_bytes()[:4] == b"vtrt" and "anytime:" in rtx.output
    jetson = CliRunner().invoke(main, ["export", str(ir), "--target", "tensorrt", "--device", "jetson-orin-nano",
                                       "--samples", "auto", "--dry-run", "-o", str(tmp_path / "j.engine")])
    assert jetson.exit_code == 0, jetson.output
    assert not (tmp_path / "j.engine").exists()
    for path in (engine_onnx_path(tmp_path / "j.engine"), manifest_path(tmp_path / "j.engine"),
                 trtexec_path(tmp_path / "j.engine")):
        assert path.is_file()
    exported = onnx.load(str(engine_onnx_path(tmp_path / "j.engine")))
    assert [o.name for o in exported.graph.output][-1] == "samples"
    assert not has_errors(check_trt_compat(exported, tensorrt="10.3"))
