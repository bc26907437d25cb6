"""``edgebnn profile --remote``, with ssh and scp replaced by local scripts that run the CLI in a subprocess.

Moved from tests/unit/test_profiler.py: it spawns the CLI (the unit lane spawns none).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from profile_checks import check_report
from synthetic import synthetic_cnn

from edgebnn import ir
from edgebnn.cli import main
from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.targets import remote

FAKE_SSH = """\
import json, subprocess, sys
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(["ssh", *args]) + "\\n")
{fail}
i = args.index("--")
target, command = args[i + 1], args[i + 2:]
assert len(command) == 1, command  # one string for the remote shell
sys.exit(subprocess.run(["sh", "-c", command[0]]).returncode)
"""

FAKE_SCP = """\
import json, shutil, sys
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(["scp", *args]) + "\\n")
i = args.index("--")
src, dst = (p.split(":", 1)[1] if ":" in p and not p.startswith("/") else p for p in args[i + 1 : i + 3])
shutil.copy(src, dst)
"""


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    log = tmp_path / "ssh.log"

    def install(fail: str = "") -> Path:
        ssh, scp = tmp_path / "fake_ssh.py", tmp_path / "fake_scp.py"
        ssh.write_text(FAKE_SSH.format(log=str(log), fail=fail))
        scp.write_text(FAKE_SCP.format(log=str(log)))
        monkeypatch.setattr(remote, "DEFAULT_SSH", (sys.executable, str(ssh)))
        monkeypatch.setattr(remote, "DEFAULT_SCP", (sys.executable, str(scp)))
        return log

    return install


@pytest.fixture
def ebnn_with_space(tmp_path):
    folder = tmp_path / "my models"
    folder.mkdir()
    path = folder / "syn cnn.ebnn"
    ir.save(synthetic_cnn(), path)
    return path


def test_remote_profile_over_fake_ssh(fake_ssh, ebnn_with_space, tmp_path):
    log = fake_ssh()
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, [
        "profile", str(ebnn_with_space), "--samples", "2", "--runs", "3", "--warmup", "1", "--power-meter", "none",
        "--remote", "jetson@orin.local", "--remote-edgebnn", f"{sys.executable} -m edgebnn",
        "--json", str(out), "--plot", str(tmp_path / "p.png"),
    ], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    check_report(report, "cpu")
    assert report["remote"]["host"] == "jetson@orin.local"
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [c[0] for c in calls]
    assert kinds == ["ssh", "scp", "ssh", "scp", "ssh"]  # mktemp, copy, profile, fetch, rm
    remote_cmd = shlex.split(calls[2][-1])
    remote_dir = shlex.split(calls[0][-1])  # mktemp -d -t ...
    assert remote_dir[:2] == ["mktemp", "-d"]
    artifact = remote_cmd[remote_cmd.index("profile") + 1]
    assert artifact.endswith("/syn cnn.ebnn")  # the space survived the remote shell as one word
    assert remote_cmd[remote_cmd.index("--device") + 1] == "cpu" and "--mode" not in remote_cmd
    assert calls[-1][-1].startswith("rm -rf -- ")
    assert not Path(shlex.split(calls[-1][-1])[-1]).exists()  # the remote temp directory is gone


def test_remote_connection_failure_is_one_clear_error(fake_ssh, ebnn_with_space):
    fake_ssh(fail='print("ssh: connect to host orin.local port 22: Connection refused", file=sys.stderr)\n'
                  "sys.exit(255)")
    with pytest.raises(EdgeBNNError, match="--remote orin.local: creating a remote directory failed "
                                           r"\(status 255\): ssh: connect to host orin.local port 22: Connection"):
        remote.profile_remote("orin.local", ebnn_with_space, {"device": "jetson"})


def test_remote_edgebnn_error_is_quoted_and_cleanup_runs(fake_ssh, ebnn_with_space, tmp_path):
    log = fake_ssh()
    with pytest.raises(EdgeBNNError, match=r"remote `.* profile` failed \(status 2\): error: no TensorRT here to "
                                           "build a jetson-orin-nano engine"):
        remote.profile_remote("orin", ebnn_with_space, {"device": "jetson", "samples": 2},
                              remote_edgebnn=f"{sys.executable} -m edgebnn")
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[-1][-1].startswith("rm -rf -- ")


@pytest.mark.parametrize("target", ["-oProxyCommand=touch /tmp/x", "user@", "a b", "host;rm", ""])
def test_remote_target_is_validated(target, ebnn_with_space):
    with pytest.raises(InvalidOptionError, match="expected user@host or host"):
        remote.profile_remote(target, ebnn_with_space, {})
