"""``edgebnn lower --config/--set``: the config the manifest stores replays the lowering byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgebnn import ir
from edgebnn.cli import main

MODEL = "edgebnn.models:digits_cnn"


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """An untrained digits_cnn (seed 0): lowering needs a posterior, not a good one."""
    import torch
    from safetensors.torch import save_file

    from edgebnn.models import digits_cnn

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("w") / "digits_cnn.safetensors"
    save_file({k: v.contiguous() for k, v in digits_cnn().state_dict().items()}, str(path))
    return path


def lower(weights: Path, out: Path, *args: str) -> Path:
    r = CliRunner().invoke(main, ["lower", "--model", MODEL, "--weights", str(weights), "--input-shape", "1,1,8,8",
                                  *args, "-o", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out


def test_replaying_a_config_gives_a_byte_identical_ebnn(weights, tmp_path) -> None:
    first = lower(weights, tmp_path / "a.ebnn", "--scheme", "fixed", "--seed", "2",
                  "--set", "options.noise_fraction=0.5",
                  "--set", '[{"pattern": "fc*", "scheme": "codebook", "options": {"clusters": 4}}]'.join(
                      ["overrides=", ""]), "--report", str(tmp_path / "a.json"))
    stored = ir.load(first).manifest.lower_config
    assert stored == {"version": 1, "scheme": "fixed", "bits": "auto", "seed": 2, "options": {"noise_fraction": 0.5},
                      "overrides": [{"pattern": "fc*", "scheme": "codebook", "options": {"clusters": 4}}]}
    kinds = {w.name: w.encoding.op_type for w in ir.load(first).encoded_weights()}
    assert {k for k, v in kinds.items() if v == "CodebookWeight"} == {"fc1.weight", "fc2.weight"}  # biases: fixed
    assert kinds["conv1.weight"] == kinds["conv2.weight"] == "FixedPointWeight"

    from_ebnn = lower(weights, tmp_path / "b.ebnn", "--config", str(first))
    assert from_ebnn.read_bytes() == first.read_bytes()
    config_file = tmp_path / "cfg.json"
    config_file.write_text(json.dumps(stored))
    assert lower(weights, tmp_path / "c.ebnn", "--config", str(config_file)).read_bytes() == first.read_bytes()
    from_report = lower(weights, tmp_path / "d.ebnn", "--config", str(tmp_path / "a.json"))
    assert from_report.read_bytes() == first.read_bytes()
    # flags and --set apply on top of the file
    reseeded = lower(weights, tmp_path / "e.ebnn", "--config", str(first), "--seed", "3")
    assert ir.load(reseeded).manifest.lower_config == {**stored, "seed": 3}
    assert reseeded.read_bytes() != first.read_bytes()
