"""``tegrastats``: Jetson ``tegrastats --interval MS``, parsed line by line in a reader thread."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from typing import IO

from edgebnn.targets.power import probes
from edgebnn.targets.power.parsing import parse_tegrastats, select_mw
from edgebnn.targets.power.probes import Counter, SensorError, Stream
from edgebnn.targets.power.window import DEFAULT_IDLE_S, PowerMeter

_MAX_LINES_WITHOUT_RAILS = 3


class TegrastatsMeter(PowerMeter):
    """Jetson ``tegrastats --interval MS``, parsed line by line in a reader thread.

    Args:
        idle_s: Idle period before the window, in seconds.
        binary: The tegrastats executable, or a command prefix (tests pass a fake sensor script);
            ``--interval MS`` is appended.
        interval_ms: Sampling interval passed to tegrastats.
        rail: Rail to integrate; None for the board total (:func:`board_total_mw`).
    """

    name = "tegrastats"

    def __init__(
        self,
        *,
        idle_s: float = DEFAULT_IDLE_S,
        binary: str | Sequence[str] = "tegrastats",
        interval_ms: int = 50,
        rail: str | None = None,
    ) -> None:
        super().__init__(idle_s=idle_s)
        self._positive("interval_ms", interval_ms)
        self.command = [binary] if isinstance(binary, str) else list(binary)
        self.interval_ms = interval_ms
        self.rail = rail

    def unavailable_reason(self) -> str | None:
        exe = self.command[0]
        if shutil.which(exe) is None:
            return f"{exe!r} not found (tegrastats ships with JetPack)"
        return None

    def _open(self) -> Counter | Stream:
        return _TegrastatsStream([*self.command, "--interval", str(self.interval_ms)], self.rail)


class _TegrastatsStream(Stream):
    def __init__(self, argv: list[str], rail: str | None) -> None:
        super().__init__()
        self._argv = argv
        self._rail = rail
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._ending = False

    def begin(self) -> None:
        # stderr goes to a file, not a pipe, so a chatty sensor cannot block; closed in end().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                self._argv, stdout=subprocess.PIPE, stderr=self._stderr, stdin=subprocess.DEVNULL, text=True
            )
        except OSError as e:
            self._stderr.close()
            raise SensorError(f"tegrastats: cannot run {self._argv[0]!r}: {e.strerror or e}") from e
        self._thread = threading.Thread(target=self._run, name="edgebnn-tegrastats", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None and self._stderr is not None
        lines = 0
        for line in iter(self._proc.stdout.readline, ""):
            t = probes.now()
            lines += 1
            picked = select_mw(parse_tegrastats(line), self._rail)
            if picked is not None:
                self.record(t, *picked)
            elif lines == _MAX_LINES_WITHOUT_RAILS and not self.samples():
                self.fail(f"tegrastats: {lines} lines without {self._what()}")
        if self._ending:
            return
        code = self._proc.wait()
        self._stderr.seek(0)
        err = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        detail = f": {err[-1]}" if err else ""
        if lines and not self.samples():
            detail += f" after {lines} line(s) without {self._what()}"
        self.fail(f"tegrastats exited with status {code}{detail}")

    def _what(self) -> str:
        return f"rail {self._rail}" if self._rail else "power rails"

    def end(self) -> None:
        if self._proc is None:
            return
        self._ending = True
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._thread is not None:
            self._thread.join()
        assert self._proc.stdout is not None and self._stderr is not None
        self._proc.stdout.close()
        self._stderr.close()
        self._proc = None
