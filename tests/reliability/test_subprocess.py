"""A few corpus cases through a real ``python -m edgebnn`` process: what a user's shell sees.

No test runner stands between the user and the process here, so nothing can swallow a traceback or a
warning: stderr must be exactly one ``error:`` line, stdout empty, exit status 2. The process runs with its
address space capped at 8 GiB, so a hostile declared size that the loader tried to allocate would fail
loudly (MemoryError) instead of passing unnoticed thanks to lazy overcommit.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from hostile import snapshot
from test_corpus import CASES, Ctx

HERE = Path(__file__).parent
ADDRESS_SPACE = 8 << 30

SUBPROCESS_CASES = {
    "ebnn-random-bytes": False,
    "ebnn-manifest-nested-100k": False,
    "ebnn-shape-attribute-1T-weights": False,
    "ebnn-gemm-weight-vs-input": False,
    "weights-pickle-payload-raw": True,  # torch's weights_only unpickler warns on protocol 4: must not leak
    "weights-pt-storage-declares-256GiB": True,
}


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_edgebnn(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent), env.get("PYTHONPATH", "")])
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([sys.executable, "-m", "edgebnn", *argv], capture_output=True, text=True, env=env,
                          preexec_fn=_cap_memory, timeout=120, check=False)


@pytest.mark.parametrize("case_id", list(SUBPROCESS_CASES))
def test_user_sees_one_line_and_status_2(case_id, tmp_path, monkeypatch, request):
    if SUBPROCESS_CASES[case_id]:
        pytest.importorskip("torch")
    case = next(c for c in CASES if c.id == case_id)
    bad = case.build(Ctx(tmp_path, monkeypatch, request))
    before = snapshot(tmp_path)
    r = run_edgebnn(bad.argv)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in bad.needles:
        assert needle in lines[0]
    assert snapshot(tmp_path) == before
    if bad.marker is not None:
        assert not bad.marker.exists(), "the pickle payload ran"


def test_debug_still_shows_the_traceback(tmp_path):
    r = run_edgebnn(["--debug", "inspect", str(tmp_path / "missing.ebnn")])
    assert r.returncode == 2 and "Traceback" in r.stderr and "no such file" in r.stderr
