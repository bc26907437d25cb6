"""``edgebnn profile --remote user@host``: profile on a Jetson (or any machine with edgebnn) over ssh.

Steps, each a subprocess with an argument list (never ``shell=True``); ssh and scp run in batch mode, so a
missing key fails with ssh's message instead of a password prompt:

1. ``ssh HOST mktemp -d``: a fresh directory on the remote machine;
2. ``scp`` the artifact (and the engine, its manifest and ONNX, or the ``--onnx`` ensemble) into it;
3. ``ssh HOST edgebnn profile DIR/ARTIFACT ... --json DIR/profile.json`` (the remote command line is built
   with :func:`shlex.join`, so every argument reaches the remote edgebnn as one word);
4. ``scp`` the JSON back, and ``ssh HOST rm -rf DIR`` (also when a step fails).

The remote machine needs edgebnn installed (``--remote-edgebnn`` names the command, e.g.
``~/venv/bin/edgebnn``); it measures with its own runners and sensors, so the report is the remote one,
plus a ``remote`` entry naming the host.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgebnn.errors import EdgeBNNError, InvalidArtifactError, InvalidOptionError

DEFAULT_SSH: tuple[str, ...] = ("ssh", "-o", "BatchMode=yes")
DEFAULT_SCP: tuple[str, ...] = ("scp", "-q", "-o", "BatchMode=yes")
REMOTE_TIMEOUT_S = 3600.0
_TARGET_RE = re.compile(r"(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9][A-Za-z0-9._:-]*|(?:[A-Za-z0-9._-]+@)?\[[0-9A-Fa-f:.]+\]")


def check_target(target: str) -> str:
    """Validate ``user@host`` (or ``host``); refuses anything ssh could read as an option or a path."""
    if not _TARGET_RE.fullmatch(target or ""):
        raise InvalidOptionError(f"--remote {target!r}: expected user@host or host")
    return target


class _Remote:
    def __init__(self, target: str, ssh: Sequence[str], scp: Sequence[str], timeout_s: float) -> None:
        self.target = check_target(target)
        self.ssh, self.scp, self.timeout_s = list(ssh), list(scp), timeout_s

    def _run(self, argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s,
                                  stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError as e:
            raise EdgeBNNError(f"--remote {self.target}: {argv[0]!r} not found (needs an OpenSSH client)") from e
        except subprocess.TimeoutExpired as e:
            raise EdgeBNNError(f"--remote {self.target}: {what} took longer than {self.timeout_s:g} s") from e
        if proc.returncode != 0:
            raise EdgeBNNError(f"--remote {self.target}: {what} failed (status {proc.returncode}): "
                               f"{_last_line(proc.stderr, proc.stdout)}")
        return proc

    def shell(self, argv: Sequence[str], what: str) -> subprocess.CompletedProcess[str]:
        # ssh hands the remote shell one string; shlex.join quotes each argument so it arrives as one word
        return self._run([*self.ssh, "--", self.target, shlex.join(argv)], what)

    def put(self, local: Path, remote_dir: str) -> str:
        self._run([*self.scp, "--", str(local), f"{self.target}:{remote_dir}/{local.name}"], f"copying {local.name}")
        return f"{remote_dir}/{local.name}"

    def get(self, remote: str, local: Path) -> None:
        self._run([*self.scp, "--", f"{self.target}:{remote}", str(local)], "fetching the profile")


def _last_line(*texts: str) -> str:
    for text in texts:
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error:")]
        if errors:
            return errors[-1]
        if lines:
            return lines[-1]
    return "no output"


def _files_to_copy(target: str, artifact: str | Path, engine: str | Path | None,
                   onnx_path: str | Path | None) -> list[Path]:
    """The local files ``profile_remote`` copies over: the artifact, an engine with its manifest and the ONNX the
    manifest names (where it is beside the engine), and an ensemble.

    Raises:
        InvalidArtifactError: One of them is missing.
    """
    files = [Path(artifact)]
    if engine is not None:
        from edgebnn.exporters.tensorrt import manifest_path

        eng = Path(engine)
        files += [eng, manifest_path(eng)]
        try:
            onnx_name = json.loads(manifest_path(eng).read_text()).get("onnx")
        except (OSError, json.JSONDecodeError):
            onnx_name = None
        if onnx_name and (eng.parent / onnx_name).is_file():
            files.append(eng.parent / onnx_name)
    if onnx_path is not None:
        files.append(Path(onnx_path))
    for f in files:
        if not f.is_file():
            raise InvalidArtifactError(f"{f}: no such file to copy to {target}")
    return files


def profile_remote(
    target: str,
    artifact: str | Path,
    options: dict[str, Any],
    *,
    engine: str | Path | None = None,
    onnx_path: str | Path | None = None,
    remote_edgebnn: str = "edgebnn",
    ssh: Sequence[str] | None = None,
    scp: Sequence[str] | None = None,
    timeout_s: float = REMOTE_TIMEOUT_S,
) -> dict[str, Any]:
    """Run ``edgebnn profile`` on ``target`` and return its JSON report.

    Args:
        target: ``user@host`` or an ssh config host name.
        artifact: Local .ebnn to profile; copied over.
        options: ``edgebnn profile`` options as ``{"device": "jetson", "samples": 16, ...}`` (``None`` values
            are left out; ``True`` is a flag); ``--json`` is added here.
        engine: Local engine to copy and pass as ``--engine`` (its manifest and ONNX go with it).
        onnx_path: Local ensemble to copy and pass as ``--onnx``.
        remote_edgebnn: The edgebnn command on the remote machine (may carry arguments, e.g.
            ``python3 -m edgebnn``).
        ssh, scp: Client command prefixes (default :data:`DEFAULT_SSH`, :data:`DEFAULT_SCP`; tests pass fakes).
        timeout_s: Limit for each remote step.

    Raises:
        InvalidOptionError: A bad target.
        InvalidArtifactError: A local file to copy is missing.
        EdgeBNNError: ssh/scp failed, or the remote edgebnn failed (its one-line error is quoted).
    """
    remote = _Remote(target, DEFAULT_SSH if ssh is None else ssh, DEFAULT_SCP if scp is None else scp, timeout_s)
    files = _files_to_copy(target, artifact, engine, onnx_path)
    workdir = remote.shell(["mktemp", "-d", "-t", "edgebnn-profile.XXXXXX"], "creating a remote directory")
    remote_dir = workdir.stdout.strip().splitlines()[-1] if workdir.stdout.strip() else ""
    if not remote_dir.startswith("/"):
        raise EdgeBNNError(f"--remote {target}: mktemp printed {workdir.stdout.strip()!r}, not a directory")
    try:
        copied = {f: remote.put(f, remote_dir) for f in files}
        argv = [*shlex.split(remote_edgebnn), "profile", copied[Path(artifact)]]
        for key, value in options.items():
            if value is None or value is False:
                continue
            argv.append(f"--{key.replace('_', '-')}")
            if value is not True:
                argv.append(str(value))
        if engine is not None:
            argv += ["--engine", copied[Path(engine)]]
        if onnx_path is not None:
            argv += ["--onnx", copied[Path(onnx_path)]]
        remote_json = f"{remote_dir}/profile.json"
        argv += ["--json", remote_json]
        remote.shell(argv, f"remote `{remote_edgebnn} profile`")
        with tempfile.TemporaryDirectory(prefix="edgebnn-remote-") as tmp:
            local = Path(tmp) / "profile.json"
            remote.get(remote_json, local)
            try:
                report = json.loads(local.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise EdgeBNNError(f"--remote {target}: the fetched profile is not JSON ({e})") from e
    finally:
        # the measurement (or its error) matters more than a leftover temp directory
        with contextlib.suppress(EdgeBNNError):
            remote.shell(["rm", "-rf", "--", remote_dir], "removing the remote directory")
    report["remote"] = {"host": target, "command": shlex.join(argv)}
    return report
