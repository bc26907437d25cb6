"""What a sensor gives a power meter: a cumulative energy counter, or a stream of power samples.

* :class:`Counter` (``nvml`` total-energy counter, ``rapl``): read at idle start, window start and window end.
* :class:`Stream` (``tegrastats``, ``ina3221``, ``jtop``, ``nvml`` power usage where there is no counter):
  a background thread records ``(time, mW)``.

:func:`now` and :func:`sleep` are the meters' clock, module-level so that tests can substitute a fake one;
:func:`read_text` and :func:`read_number` read sysfs files, turning every failure into :class:`SensorError`.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from edgebnn.errors import EdgeBNNError


class SensorError(EdgeBNNError):
    """A sensor could not be read. Raised by low-level helpers such as ``Ina3221Meter.read_rails``;
    meters never raise it from ``start``/``stop`` but report it as the result's ``reason``."""


def now() -> float:
    """Monotonic time in seconds: the clock of every meter."""
    return time.monotonic()


def sleep(seconds: float) -> None:
    """Wait ``seconds`` (the idle period)."""
    time.sleep(seconds)


class Counter(ABC):
    """A cumulative energy counter."""

    sensor: str

    @abstractmethod
    def read_mj(self) -> float:
        """Current counter value in mJ; raises SensorError."""

    def delta_mj(self, before: float, after: float) -> float:
        """Energy between two readings (counters that wrap override this)."""
        return after - before

    @abstractmethod
    def close(self) -> None:
        """Release the sensor."""


class Stream(ABC):
    """Power samples recorded by a background thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: list[tuple[float, float]] = []
        self._error: str | None = None
        self._ready = threading.Event()
        self.sensor: str | None = None

    def record(self, t: float, mw: float, sensor: str) -> None:
        with self._lock:
            self._samples.append((t, mw))
            self.sensor = self.sensor or sensor
        self._ready.set()

    def fail(self, reason: str) -> None:
        with self._lock:
            self._error = self._error or reason
        self._ready.set()

    @property
    def error(self) -> str | None:
        with self._lock:
            return self._error

    def samples(self) -> list[tuple[float, float]]:
        with self._lock:
            return list(self._samples)

    def wait_first(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    @abstractmethod
    def begin(self) -> None:
        """Start sampling; raises SensorError."""

    @abstractmethod
    def end(self) -> None:
        """Stop sampling and release the sensor (idempotent)."""


class PollingStream(Stream):
    """Calls ``read()`` every ``interval_s`` in a thread; ``read`` returns ``(mW, sensor)``."""

    def __init__(
        self,
        read: Callable[[], tuple[float, str]],
        interval_s: float,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self._read = read
        self._interval_s = interval_s
        self._on_end = on_end
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        self._thread = threading.Thread(target=self._run, name="edgebnn-power-poll", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t = now()
            try:
                mw, sensor = self._read()
            except SensorError as e:
                self.fail(str(e))
                return
            self.record(t, mw, sensor)
            self._stop.wait(self._interval_s)

    def end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._on_end is not None:
            self._on_end()
            self._on_end = None


def read_text(path: Path, denied_hint: str = "") -> str:
    """A sysfs file's stripped text; ``denied_hint`` is appended to a permission error."""
    try:
        return path.read_text().strip()
    except PermissionError as e:
        raise SensorError(f"{path}: permission denied{denied_hint}") from e
    except OSError as e:
        raise SensorError(f"{path}: {e.strerror or e}") from e


def read_number(path: Path, denied_hint: str = "") -> float:
    """The first number in a sysfs file."""
    text = read_text(path, denied_hint)
    try:
        return float(text.split()[0])
    except (ValueError, IndexError) as e:
        raise SensorError(f"{path}: not a number: {text[:40]!r}") from e
