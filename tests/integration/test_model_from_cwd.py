"""``--model mod:factory`` finds ``mod.py`` in the working directory without PYTHONPATH (as ``python -m`` does)."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from edgebnn.cli import main

torch = pytest.importorskip("torch")

MYNET = '''
from edgebnn.models import digits_cnn


def factory():
    return digits_cnn()
'''


def test_lower_imports_the_model_module_from_the_working_directory(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from edgebnn.models import digits_cnn

    (tmp_path / "mynet_cwd_probe.py").write_text(MYNET)
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in digits_cnn().state_dict().items()}, str(tmp_path / "w.safetensors"))
    monkeypatch.chdir(tmp_path)
    # as the `edgebnn` console script starts: the working directory is not on sys.path
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "mynet_cwd_probe", raising=False)
    r = CliRunner().invoke(main, ["lower", "--model", "mynet_cwd_probe:factory", "--weights", "w.safetensors",
                                  "--input-shape", "1,1,8,8", "-o", "out.ebnn"])
    sys.modules.pop("mynet_cwd_probe", None)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out.ebnn").stat().st_size > 0
    assert str(tmp_path) not in sys.path  # the working directory is on the path only while the module loads


def test_a_missing_module_still_names_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.safetensors").write_bytes(b"x")
    r = CliRunner().invoke(main, ["lower", "--model", "no_such_module_here:factory", "--weights", "w.safetensors",
                                  "--input-shape", "1,1,8,8", "-o", "out.ebnn"])
    assert r.exit_code == 2
    assert "cannot import module 'no_such_module_here'" in r.output
