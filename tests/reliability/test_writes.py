"""Writes that fail or are interrupted half way leave the previous artifact intact and no temp file behind.

The failure is injected inside the writer callback of ``edgebnn._io.atomic_write`` (after part of the
artifact has gone to the temp file), or at the rename; a full disk is ``OSError(ENOSPC)`` there, an
interrupt ``KeyboardInterrupt`` (what Ctrl-C raises).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hostile import break_writer, snapshot
from synthetic import synthetic_cnn

from edgebnn import _io, ir
from edgebnn.cli import main
from edgebnn.errors import ArtifactWriteError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import save_onnx
from edgebnn.exporters.export import export_model

PREVIOUS = b"previous artifact: must survive byte for byte"


def _save_ebnn(path: Path) -> None:
    ir.save(synthetic_cnn(), path)


def _save_onnx(path: Path) -> None:
    save_onnx(export_model(synthetic_cnn(), ExportConfig(2, mode="baked")).proto, path)


def _save_json(path: Path) -> None:
    _io.atomic_write_json(path, {"schema": "test/1", "values": list(range(1000))})


WRITERS = {"ebnn": (_save_ebnn, "m.ebnn"), "onnx": (_save_onnx, "m.onnx"), "json": (_save_json, "r.json")}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_interrupt_mid_write_keeps_previous_artifact(kind, tmp_path, monkeypatch):
    save, name = WRITERS[kind]
    target = tmp_path / name
    target.write_bytes(PREVIOUS)
    before = snapshot(tmp_path)
    break_writer(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        save(target)
    assert target.read_bytes() == PREVIOUS
    assert snapshot(tmp_path) == before  # no .m.ebnn.XXXX.tmp left


@pytest.mark.parametrize("kind", list(WRITERS))
def test_full_disk_keeps_previous_artifact(kind, tmp_path, monkeypatch):
    save, name = WRITERS[kind]
    target = tmp_path / name
    target.write_bytes(PREVIOUS)
    before = snapshot(tmp_path)
    break_writer(monkeypatch, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    with pytest.raises(ArtifactWriteError, match="No space left on device") as e:
        save(target)
    assert str(target) in str(e.value)
    assert snapshot(tmp_path) == before


def test_failed_rename_keeps_previous_artifact(tmp_path, monkeypatch):
    target = tmp_path / "m.ebnn"
    target.write_bytes(PREVIOUS)
    before = snapshot(tmp_path)

    def rename_fails(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(_io.os, "replace", rename_fails)
    with pytest.raises(ArtifactWriteError, match="write failed"):
        _save_ebnn(target)
    assert snapshot(tmp_path) == before


def test_first_write_interrupted_leaves_nothing(tmp_path, monkeypatch):
    break_writer(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _save_onnx(tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_cli_interrupt_mid_write_exits_130_and_keeps_previous(tmp_path, monkeypatch):
    src = ir.save(synthetic_cnn(), tmp_path / "m.ebnn")
    out = tmp_path / "m.onnx"
    out.write_bytes(PREVIOUS)
    before = snapshot(tmp_path)
    break_writer(monkeypatch, KeyboardInterrupt())
    r = CliRunner().invoke(main, ["export", str(src), "-S", "2", "-o", str(out)])
    assert r.exit_code == 130, r.output
    assert "interrupted" in r.stderr and "Traceback" not in r.output
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into a read-only directory")
def test_real_read_only_directory(tmp_path):
    src = ir.save(synthetic_cnn(), tmp_path / "m.ebnn")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "m.onnx").write_bytes(PREVIOUS)
    locked.chmod(0o500)
    try:
        r = CliRunner().invoke(main, ["export", str(src), "-S", "2", "-o", str(locked / "m.onnx")])
        assert r.exit_code == 2 and "cannot write to" in r.stderr, r.output
        assert (locked / "m.onnx").read_bytes() == PREVIOUS
        assert sorted(p.name for p in locked.iterdir()) == ["m.onnx"]
    finally:
        locked.chmod(0o700)
