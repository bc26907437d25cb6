"""The fuzz lane: a fixed, seeded corpus of mutants of every file format, through every command that reads one.

Each target (``campaign.TARGETS``: a command line reading one user file) gets a fixed number of mutants of seed
``LANE_SEED`` (bit flips, random bytes, interesting integers, truncations, zeroed, duplicated, deleted and
inserted spans: ``mutate.py``), run in worker processes as ``edgebnn`` would run them. Every mutant must end in
exit status 0 (a harmless corruption, e.g. a flipped bit inside a float weight) or 2 with at most three lines and
nothing written; never a traceback, another status, a signal or a hang. Every crash a campaign found is a file
in ``regressions/`` (named after its target) and runs here too. ``make fuzz`` runs the same with a random seed
and many more mutants (``campaign.py``).
"""

from __future__ import annotations

import importlib.util
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from campaign import TARGETS, run_campaign, target_of
from mutate import OPERATORS, mutate

pytestmark = pytest.mark.fuzz

HERE = Path(__file__).parent
REGRESSIONS = sorted(p for p in (HERE / "regressions").iterdir() if p.is_file())
STUDY = HERE / "regressions" / "study"  # search study files (Optuna journals): base.jsonl, and what broke its loader
LANE_SEED = 20261127
PER_TARGET = 5  # mutants per torch-free target (each runs in well under a second)
PER_TORCH_TARGET = 1  # lower imports through torch.onnx.export: seconds per mutant that loads
HAS_TORCH = importlib.util.find_spec("torch") is not None
SLOW_TARGETS = {"laplace-lower"}  # importing laplace-torch and fitting the base state: make fuzz runs it, the lane not


def _explain(summary: dict) -> str:
    return "\n".join(f"{f['verdict']} {f['target']} index={f['index']} ({f['mutation']}) argv={f['argv']}:\n"
                     f"{f['traceback'] or f['stderr'] or f['crash']}" for f in summary["failures"])


@pytest.fixture(scope="module")
def lane(tmp_path_factory: pytest.TempPathFactory) -> dict:
    quota = {t.name: PER_TORCH_TARGET if t.torch else PER_TARGET for t in TARGETS if t.name not in SLOW_TARGETS}
    return run_campaign(LANE_SEED, 0, workers=2, torch=HAS_TORCH, quota=quota, extra=REGRESSIONS,
                        timeout=120, work=tmp_path_factory.mktemp("fuzz"))


def test_every_mutant_ends_in_status_0_or_2_with_one_short_message(lane):
    assert not lane["failures"], _explain(lane)


def test_the_lane_covers_every_target_and_both_outcomes(lane):
    """Every target ran; the corpus is not all refusals (bases that fail would make every mutant 'pass')."""
    expected = {t.name for t in TARGETS if (HAS_TORCH or not t.torch) and t.name not in SLOW_TARGETS}
    assert set(lane["targets"]) == expected
    assert set(lane["by_target"]) == expected
    assert lane["counts"].get("ok", 0) >= 5 and lane["counts"].get("exit2", 0) >= 50, lane["counts"]
    assert {"ebnn", "onnx", "npz", "safetensors" if HAS_TORCH else "npy"} <= set(lane["by_format"])


def test_every_regression_file_names_a_target():
    assert REGRESSIONS
    for path in REGRESSIONS:
        assert path.suffix == Path(target_of(path).file).suffix, path.name


# -- the mutator ----------------------------------------------------------------------------------------


def test_mutants_are_reproducible_and_differ():
    data = bytes(range(256)) * 8
    first = [mutate(data, 7, i) for i in range(50)]
    assert first == [mutate(data, 7, i) for i in range(50)]
    assert sum(m != data for m, _ in first) >= 45
    assert len({m for m, _ in first}) > 40
    assert mutate(data, 8, 0) != first[0]


@pytest.mark.parametrize("operator", list(OPERATORS))
def test_each_operator_changes_the_bytes(operator):
    data = bytes(range(256)) * 4
    changed = sum(mutate(data, 1, i, (operator,))[0] != data for i in range(20))
    assert changed >= 18, operator  # a flip of one bit twice, or a duplicate of a span onto itself, may undo


# -- the crash, built from its description ------------------------------------------------------


def test_npz_with_a_flipped_bit_in_compressed_data_is_one_line(tmp_path):
    """Issue 31: one flipped bit inside x.npy's deflate stream ended ``edgebnn eval`` in a BadZipFile traceback."""
    from click.testing import CliRunner
    from hostile import digits_shaped

    from edgebnn.cli import main
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.ensemble import save_onnx
    from edgebnn.exporters.export import export_model

    buf = io.BytesIO()
    x = np.random.default_rng(0).uniform(0, 1, (16, 1, 8, 8)).astype(np.float32)
    np.savez_compressed(buf, x=x, y=np.arange(16) % 10)
    data = bytearray(buf.getvalue())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as zf:
        info = zf.getinfo("x.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)  # the local header, then the data
    data[start + info.compress_size // 2] ^= 0x10
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(data))
    model = save_onnx(export_model(digits_shaped(), ExportConfig(2, mode="baked")).proto, tmp_path / "model.onnx")
    result = CliRunner().invoke(main, ["eval", str(model), "--data", str(bad), "--json", str(tmp_path / "e.json")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}['x']: unreadable"), result.stderr
    assert not (tmp_path / "e.json").exists()


# -- the search study file (an Optuna journal), through its loader ---------------------------------------


STUDY_SETTINGS = {"model": "m.ebnn", "seed": 0, "objectives": ["bytes", "nll"]}  # what base.jsonl was made with


def _open_each(paths: list[Path]) -> dict[str, int]:
    """``open_study`` on each file: it gives the study or raises an EdgeBNNError; anything else propagates."""
    pytest.importorskip("optuna")
    from edgebnn.errors import EdgeBNNError
    from edgebnn.search.study import open_study

    out = {"ok": 0, "refused": 0}
    for path in paths:
        try:
            open_study(path, STUDY_SETTINGS, ["minimize", "minimize"])
            out["ok"] += 1
        except EdgeBNNError as e:
            assert str(path) in str(e) and "\n" not in str(e), str(e)
            out["refused"] += 1
    return out


def test_study_file_base_opens(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes((STUDY / "base.jsonl").read_bytes())
    assert _open_each([path]) == {"ok": 1, "refused": 0}


def test_study_file_mutants_open_or_are_refused_in_one_line(tmp_path):
    """Optuna's journal replay raised UnicodeDecodeError, TypeError and AssertionError("Should not reach") on
    corrupt files (kept in regressions/study); 300 mutants of the lane's seed and those files."""
    base = (STUDY / "base.jsonl").read_bytes()
    paths = []
    for i in range(300):
        path = tmp_path / f"m{i}.jsonl"
        path.write_bytes(mutate(base, LANE_SEED, i)[0])
        paths.append(path)
    for kept in sorted(STUDY.glob("*-s*-i*.jsonl")):
        path = tmp_path / kept.name
        path.write_bytes(kept.read_bytes())
        paths.append(path)
    counts = _open_each(paths)
    assert counts["ok"] >= 10 and counts["refused"] >= 100, counts
