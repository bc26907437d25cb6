"""Exports past protobuf's 2 GiB are written as ONNX external data, and every reader loads them.

At reduced size: ``EXTERNAL_DATA_BYTES`` (2 GiB less room for the graph) is lowered so that the synthetic CNN's
baked S = 16 export (about 9 kB) is past it. ``bench/memory.py`` and ``bench/scale.py`` measure the real sizes.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from synthetic import synthetic_cnn

from edgebnn.cli import main
from edgebnn.errors import InvalidArtifactError
from edgebnn.exporters import ensemble
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import save_onnx
from edgebnn.exporters.export import export_model
from edgebnn.exporters.sizes import deployed_bytes
from edgebnn.exporters.tensorrt import BuildOptions, build_engine
from edgebnn.runtime import Session
from edgebnn.targets import get_target

X = np.random.default_rng(3).standard_normal((5, 1, 6, 6)).astype(np.float32)


@pytest.fixture
def past_the_limit(monkeypatch):
    # stand for 2 GiB and 1 KiB: the synthetic CNN's S=16 exports are 2-9 kB, its largest constants 0.4-7 kB
    monkeypatch.setattr(ensemble, "EXTERNAL_DATA_BYTES", 1_000)
    monkeypatch.setattr(ensemble, "EXTERNAL_MIN_TENSOR", 256)


def _external(proto: onnx.ModelProto) -> list[str]:
    return [t.name for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]


def test_an_export_under_the_limit_is_one_file_of_the_bytes_protobuf_writes(tmp_path):
    proto = export_model(synthetic_cnn(), ExportConfig(16, mode="baked")).proto
    path = save_onnx(proto, tmp_path / "m.onnx")
    assert path.read_bytes() == proto.SerializeToString(deterministic=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("mode", ["baked", "noise", "analytic"])
def test_an_export_past_the_limit_writes_external_data_every_reader_loads(mode, past_the_limit, tmp_path):
    proto = export_model(synthetic_cnn(), ExportConfig(16, mode=mode, rng="host")).proto
    before = proto.SerializeToString(deterministic=True)
    path = save_onnx(proto, tmp_path / "m.onnx")
    assert proto.SerializeToString(deterministic=True) == before  # the proto itself is not changed
    data = tmp_path / "m.onnx.data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]  # no temp file left
    small = onnx.load(str(path), load_external_data=False)
    moved = _external(small)
    big = [t.name for t in proto.graph.initializer if len(t.raw_data) >= ensemble.EXTERNAL_MIN_TENSOR]
    assert moved == big and moved  # every constant of 1 KiB or more, in graph order
    assert path.stat().st_size + data.stat().st_size < len(before) + 200 * len(moved)  # each moved once
    onnx.checker.check_model(str(path))
    full = onnx.load(str(path))  # onnx reads the data back: the same constants
    assert {t.name: t.raw_data for t in full.graph.initializer} == {t.name: t.raw_data for t in proto.graph.initializer}

    # every reader: Session (eval's runtime), the CPU target (profile), deployed sizes (inspect), the same outputs
    want = Session(proto, seed=0).predict(X)
    got = Session(path, seed=0).predict(X)
    np.testing.assert_array_equal(got.probs, want.probs)  # same graph, same constants, same runtime
    exe = get_target("cpu").compile(path)  # a fresh Session on the file: host noise from seed 0, as a fresh one
    assert exe.size_bytes == path.stat().st_size + data.stat().st_size
    np.testing.assert_array_equal(exe.run(X)[0], Session(proto).predict(X).probs)
    sizes = deployed_bytes(path)
    assert sizes.file_bytes == path.stat().st_size + data.stat().st_size
    assert sizes.float_weights + sizes.codes + sizes.tables >= data.stat().st_size  # the data counted as weights


def test_the_cli_reads_an_export_with_external_data(past_the_limit, tmp_path):
    path = save_onnx(export_model(synthetic_cnn(), ExportConfig(16, mode="baked")).proto, tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=X, y=np.arange(5) % 3)
    r = CliRunner().invoke(main, ["inspect", str(path), "--json"])
    assert r.exit_code == 0, r.output
    both = path.stat().st_size + (tmp_path / "m.onnx.data").stat().st_size
    assert json.loads(r.output)["deployed"]["file_bytes"] == both
    r = CliRunner().invoke(main, ["eval", str(path), "--data", str(tmp_path / "d.npz"), "--json",
                                  str(tmp_path / "e.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "e.json").read_text())["n"] == 5


def test_a_tensorrt_build_reads_an_export_with_external_data(past_the_limit, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # a dry run: its checks and manifest, trtexec's command
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", None)
    path = save_onnx(export_model(synthetic_cnn(), ExportConfig(16, mode="baked")).proto, tmp_path / "m.onnx")
    manifest = build_engine(path, tmp_path / "m.engine", "rtx", BuildOptions(dry_run=True))
    assert manifest["inputs"][0]["name"] == "input" and manifest["findings"] == []


def test_missing_or_outside_external_data_is_one_line_naming_it(past_the_limit, tmp_path):
    path = save_onnx(export_model(synthetic_cnn(), ExportConfig(16, mode="baked")).proto, tmp_path / "m.onnx")
    (tmp_path / "m.onnx.data").rename(tmp_path / "elsewhere.data")
    with pytest.raises(InvalidArtifactError, match=r"m\.onnx: its external data .*m\.onnx\.data is missing"):
        Session(path)
    small = onnx.load(str(path), load_external_data=False)
    for t in small.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../elsewhere.data"  # never followed out of the model's folder
    (tmp_path / "evil.onnx").write_bytes(small.SerializeToString())
    with pytest.raises(InvalidArtifactError, match=r"location '\.\./elsewhere\.data' is not a file beside"):
        Session(tmp_path / "evil.onnx")


@pytest.mark.parametrize("external", [False, True])
def test_writing_reports_the_bytes_written_rising_to_the_files_sizes(external, monkeypatch, tmp_path):
    if external:
        monkeypatch.setattr(ensemble, "EXTERNAL_DATA_BYTES", 1_000)
        monkeypatch.setattr(ensemble, "EXTERNAL_MIN_TENSOR", 256)
    calls: list[tuple[int, int]] = []
    proto = export_model(synthetic_cnn(), ExportConfig(16, mode="baked")).proto
    path = save_onnx(proto, tmp_path / "m.onnx", progress=lambda done, total: calls.append((done, total)))
    written = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert (tmp_path / "m.onnx.data").exists() == external
    done = [d for d, _ in calls]
    assert {t for _, t in calls} == {written} and done[-1] == written  # one total over both files, reached
    assert len(done) > 2 and done == sorted(set(done))  # rising at every write
    assert path.read_bytes() == proto.SerializeToString(deterministic=True) or external
