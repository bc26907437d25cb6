"""Power meters: energy per inference measured over a timed window, or null with the reason.

Every meter has the same life cycle, driven by the profiler::

    with open_meter(name_or_none, device) as meter:  # a PowerMeter; never raises for a missing sensor
        meter.start()            # blocks about idle_s: measures idle power, then opens the window
        for _ in range(n):
            run_one_inference()  # the timed inferences
        result = meter.stop(n)   # closes the window, releases the sensor -> EnergyResult for n inferences

``start()``/``stop()`` may be repeated on the same meter (one window per artifact); the ``with`` block only
guarantees that a sensor process or thread is released if the profiler raises between them.

What ``stop(n)`` computes:

* idle power ``P_idle`` = mean power over the idle period measured inside ``start()`` just before the
  window opens;
* window energy ``E`` = power integrated over ``[start() return, stop() call]``, mean ``P_mean = E / T``;
* ``energy_mj_per_inference = (P_mean - P_idle) * T / n`` (mW x s = mJ).

Two sensor families feed that computation:

* counters (``nvml`` total-energy counter, ``rapl``): read at idle start, window start and window end;
* sampled power (``tegrastats``, ``ina3221``, ``jtop``, ``nvml`` power usage where there is no counter):
  a background thread records ``(time, mW)``; power between samples is held at the last sample
  (zero-order hold, no look-ahead), so a step change is seen at most one sampling interval late. A window
  needs at least two samples inside it, otherwise its energy is null with the reason.

A meter that cannot measure (no sensor, no permission, the sensor process died, the window too short)
returns an ``EnergyResult`` whose ``energy_mj_per_inference`` is None and whose ``reason`` says why: a
number is only ever computed from sensor readings. ``reason`` may also carry a warning next to a number
(e.g. an NVML window shorter than 1 s, or load power below idle).

Board total (Jetson): :func:`board_total_mw` uses the module input rail ``VDD_IN`` (Orin Nano/NX,
Xavier NX) or ``POM_5V_IN`` (Nano, JetPack 4) when present; on AGX Orin, which has no input rail, the sum
``VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0``; on any other board the sum of every rail it reports. The
sensors sit on the module: the carrier board is never included, and they may under-read an external meter.
"""

from __future__ import annotations

import bisect
import importlib.util
import re
import shutil
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar

from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.targets.devices import get_device

DEFAULT_IDLE_S = 0.5
"""Idle period measured by ``start()`` before the window opens, in seconds."""

_STARTUP_TIMEOUT_S = 5.0
_MAX_LINES_WITHOUT_RAILS = 3

_RAIL_RE = re.compile(
    r"(?<![\w@])([A-Za-z][A-Za-z0-9_]*) "
    r"(\d+(?:\.\d+)?)(?:mW)?/(\d+(?:\.\d+)?)(?:mW)?(?:/(\d+(?:\.\d+)?)(?:mW)?)?(?=\s|$)"
)
_INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
_AGX_ORIN_RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")


def parse_tegrastats(line: str) -> dict[str, float]:
    """Extract the power rails of one tegrastats line.

    Handles JetPack 4 (``POM_5V_IN 2247/2189``, mW without a unit), JetPack 5/6 (``VDD_IN 5704mW/5704mW``)
    and JetPack 7 (``VDD_GPU_SOC 5139mW/5139mW/5139mW``). RAM/SWAP/IRAM, CPU loads (``off`` cores
    included), engine loads such as ``GR3D_FREQ 16%@76`` and temperatures are ignored; a rail name not
    known here is kept as printed.

    Args:
        line: One line of tegrastats output.

    Returns:
        Rail name -> current power in mW (the first value of each rail); empty when the line has no rails.
    """
    return {m.group(1): float(m.group(2)) for m in _RAIL_RE.finditer(line)}


def board_total_mw(rails: Mapping[str, float]) -> tuple[float, str] | None:
    """Board (module) total power from rail readings.

    Rule: ``VDD_IN``, else ``POM_5V_IN``; else, when all three AGX Orin rails are present,
    ``VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0`` (other AGX Orin rails such as ``VDDQ_VDD2_1V8AO`` are left
    out); else the sum of every rail.

    Args:
        rails: Rail name -> mW, as from :func:`parse_tegrastats` or the INA3221 sysfs.

    Returns:
        ``(total_mw, how)`` where ``how`` names the rail or the summed rails, or None without rails.
    """
    for name in _INPUT_RAILS:
        if name in rails:
            return rails[name], name
    if all(name in rails for name in _AGX_ORIN_RAILS):
        return sum(rails[name] for name in _AGX_ORIN_RAILS), "+".join(_AGX_ORIN_RAILS)
    if rails:
        return sum(rails.values()), "+".join(rails)
    return None


def _select_mw(rails: Mapping[str, float], rail: str | None) -> tuple[float, str] | None:
    """One rail by name, or the board total when ``rail`` is None."""
    if rail is None:
        return board_total_mw(rails)
    return (rails[rail], rail) if rail in rails else None


@dataclass(frozen=True)
class EnergyResult:
    """Energy of one timed window.

    Attributes:
        energy_mj_per_inference: Net energy per inference in mJ (window minus idle), None if not measured.
        source: Meter name (``nvml``, ``tegrastats``, ``ina3221``, ``jtop``, ``rapl``, ``none``).
        reason: Why the energy is null, or a warning about a measured value; None when all is well.
        idle_power_mw: Mean power over the idle period before the window.
        mean_power_mw: Mean power over the window (gross, idle included).
        samples: Sensor readings inside the window (counter reads for counter meters).
        window_s: Length of the window in seconds.
        sensor: What was read, e.g. ``VDD_IN`` or ``energy counter, GPU 0``.
    """

    energy_mj_per_inference: float | None
    source: str
    reason: str | None
    idle_power_mw: float | None
    mean_power_mw: float | None
    samples: int
    window_s: float | None = None
    sensor: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields."""
        return asdict(self)


class SensorError(EdgeBNNError):
    """A sensor could not be read. Raised by low-level helpers such as ``Ina3221Meter.read_rails``;
    meters never raise it from ``start``/``stop`` but report it as the result's ``reason``."""


def _now() -> float:
    return time.monotonic()


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


class _Counter(ABC):
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


class _Stream(ABC):
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


class _PollingStream(_Stream):
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
            t = _now()
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


def _mean_power_mw(samples: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Mean of zero-order-held power over ``[start, end]``; before the first sample its value holds."""
    times = [t for t, _ in samples]
    i = max(bisect.bisect_right(times, start) - 1, 0)
    energy = 0.0
    t_prev, p_prev = start, samples[i][1]
    for t, p in samples[i + 1 :]:
        if t >= end:
            break
        energy += p_prev * (t - t_prev)
        t_prev, p_prev = t, p
    energy += p_prev * (end - t_prev)
    return energy / (end - start)


@dataclass
class _Window:
    probe: _Counter | _Stream
    t_idle: float
    t_start: float
    e_idle: float = 0.0
    e_start: float = 0.0


class PowerMeter(ABC):
    """A source of energy-per-inference measurements (see the module docstring for the life cycle).

    Args:
        idle_s: Length of the idle period measured by :meth:`start` before the window opens.
    """

    name: ClassVar[str]
    min_window_s: ClassVar[float] = 0.0
    """Windows shorter than this get a warning in ``reason``."""

    def __init__(self, *, idle_s: float = DEFAULT_IDLE_S) -> None:
        self.idle_s = self._positive("idle_s", idle_s)
        self._window: _Window | None = None
        self._failure: str | None = None
        self._started = False

    def _positive(self, option: str, value: float) -> float:
        if not value > 0:
            raise InvalidOptionError(f"power meter {self.name}: {option} must be > 0, got {value}")
        return value

    def unavailable_reason(self) -> str | None:
        """Why this meter cannot measure on this machine, or None when it can (default: try the sensor)."""
        try:
            self._release(self._open())
        except SensorError as e:
            return str(e)
        return None

    @abstractmethod
    def _open(self) -> _Counter | _Stream:
        """Open the sensor for one window; raises SensorError."""

    def start(self) -> None:
        """Measure idle power for ``idle_s`` (blocking), then open the measurement window.

        Sensor failures do not raise: they are reported by :meth:`stop`.

        Raises:
            InvalidOptionError: The meter is already started.
        """
        if self._started:
            raise InvalidOptionError(f"power meter {self.name}: start() called twice without stop()")
        self._failure = None
        try:
            probe = self._open()
        except SensorError as e:
            self._failure = str(e)
            self._started = True
            return
        opened = False
        try:
            self._window = self._idle(probe)
            opened = True
        except SensorError as e:
            self._failure = str(e)
        finally:
            if not opened:
                self._release(probe)
        self._started = True

    def _idle(self, probe: _Counter | _Stream) -> _Window:
        if isinstance(probe, _Counter):
            t_idle, e_idle = _now(), probe.read_mj()
            _sleep(self.idle_s)
            t_start, e_start = _now(), probe.read_mj()
            return _Window(probe, t_idle, t_start, e_idle, e_start)
        probe.begin()
        if not probe.wait_first(_STARTUP_TIMEOUT_S):
            raise SensorError(f"{self.name}: no power reading within {_STARTUP_TIMEOUT_S:g} s")
        if probe.error is not None:
            raise SensorError(probe.error)
        t_idle = probe.samples()[0][0]
        _sleep(self.idle_s)
        return _Window(probe, t_idle, _now())

    @staticmethod
    def _release(probe: _Counter | _Stream) -> None:
        if isinstance(probe, _Counter):
            probe.close()
        else:
            probe.end()

    def stop(self, inferences: int) -> EnergyResult:
        """Close the window and compute the energy of ``inferences`` inferences run inside it.

        Args:
            inferences: Number of inferences run between :meth:`start` and this call.

        Returns:
            The measurement; ``energy_mj_per_inference`` is None with ``reason`` when it failed.

        Raises:
            InvalidOptionError: ``inferences`` < 1, or the meter was not started.
        """
        if inferences < 1:
            raise InvalidOptionError(f"power meter {self.name}: inferences must be >= 1, got {inferences}")
        if not self._started:
            raise InvalidOptionError(f"power meter {self.name}: stop() called before start()")
        t_end = _now()
        self._started = False
        window, self._window = self._window, None
        if window is None:
            return self._null(self._failure or f"{self.name}: sensor not opened")
        try:
            if isinstance(window.probe, _Counter):
                return self._counter_result(window, window.probe, t_end, inferences)
            window.probe.end()
            return self._stream_result(window, window.probe, t_end, inferences)
        except SensorError as e:
            return self._null(str(e))
        finally:
            self._release(window.probe)

    def _counter_result(self, w: _Window, counter: _Counter, t_end: float, n: int) -> EnergyResult:
        e_end = counter.read_mj()
        idle_mw = counter.delta_mj(w.e_idle, w.e_start) / (w.t_start - w.t_idle)
        window_s = t_end - w.t_start
        if not window_s > 0:
            return self._null(f"{self.name}: empty window")
        mean_mw = counter.delta_mj(w.e_start, e_end) / window_s
        return self._result(idle_mw, mean_mw, window_s, n, samples=3, sensor=counter.sensor)

    def _stream_result(self, w: _Window, stream: _Stream, t_end: float, n: int) -> EnergyResult:
        if stream.error is not None:
            return self._null(stream.error, sensor=stream.sensor)
        samples = stream.samples()
        window_s = t_end - w.t_start
        inside = sum(1 for t, _ in samples if w.t_start < t <= t_end)
        if inside < 2:
            return self._null(
                f"{self.name}: {inside} power sample(s) in the {window_s:.3f} s window, at least 2 needed; "
                "run more inferences or sample faster",
                sensor=stream.sensor,
            )
        idle_mw = _mean_power_mw(samples, w.t_idle, w.t_start)
        mean_mw = _mean_power_mw(samples, w.t_start, t_end)
        return self._result(idle_mw, mean_mw, window_s, n, samples=inside, sensor=stream.sensor)

    def _result(
        self, idle_mw: float, mean_mw: float, window_s: float, n: int, *, samples: int, sensor: str | None
    ) -> EnergyResult:
        warnings = []
        if window_s < self.min_window_s:
            warnings.append(
                f"{self.name}: window {window_s:.3f} s is shorter than the advised {self.min_window_s:g} s; "
                "run more inferences"
            )
        if mean_mw < idle_mw:
            warnings.append(f"{self.name}: window power below idle power (sensor noise or idle drift)")
        return EnergyResult(
            energy_mj_per_inference=(mean_mw - idle_mw) * window_s / n,
            source=self.name,
            reason="; ".join(warnings) or None,
            idle_power_mw=idle_mw,
            mean_power_mw=mean_mw,
            samples=samples,
            window_s=window_s,
            sensor=sensor,
        )

    def _null(self, reason: str, sensor: str | None = None) -> EnergyResult:
        return EnergyResult(None, self.name, reason, None, None, 0, None, sensor)

    def close(self) -> None:
        """Release a sensor left open by a ``start()`` without ``stop()`` (idempotent)."""
        window, self._window = self._window, None
        self._started = False
        if window is not None:
            self._release(window.probe)

    def __enter__(self) -> PowerMeter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class NullMeter(PowerMeter):
    """Measures nothing: every window is null with the given reason.

    Args:
        reason: The reason reported by every result.
        source: Meter name reported as ``source`` (the meter that was asked for, when it is unavailable).
    """

    name = "none"

    def __init__(
        self,
        reason: str = "energy not measured: power meter 'none' chosen",
        *,
        source: str = "none",
        idle_s: float = DEFAULT_IDLE_S,
    ) -> None:
        super().__init__(idle_s=idle_s)
        self.reason = reason
        self.source = source

    def unavailable_reason(self) -> str | None:
        return None

    def _open(self) -> _Counter | _Stream:
        raise SensorError(self.reason)

    def start(self) -> None:
        """Open a (null) window; does not wait."""
        if self._started:
            raise InvalidOptionError(f"power meter {self.name}: start() called twice without stop()")
        self._started = True

    def _null(self, reason: str, sensor: str | None = None) -> EnergyResult:
        return EnergyResult(None, self.source, self.reason, None, None, 0, None, sensor)


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as e:
        raise SensorError("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from e
    return pynvml


class NvmlMeter(PowerMeter):
    """NVIDIA GPU through NVML: the total-energy counter (Volta+), else sampled power usage.

    The counter updates every 20-100 ms and ``nvmlDeviceGetPowerUsage`` is a 1-s average on Ampere+,
    so windows of at least 1 s are advised; shorter ones carry a warning in ``reason``. Only the GPU
    board is measured, not the host. On Jetson NVML reports power as not supported.

    Args:
        idle_s: Idle period before the window, in seconds.
        index: NVML device index.
        interval_s: Sampling period when only power usage is available.
    """

    name = "nvml"
    min_window_s = 1.0

    def __init__(self, *, idle_s: float = DEFAULT_IDLE_S, index: int = 0, interval_s: float = 0.02) -> None:
        super().__init__(idle_s=idle_s)
        self.index = index
        self.interval_s = self._positive("interval_s", interval_s)

    def _open(self) -> _Counter | _Stream:
        pynvml = _pynvml()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise SensorError(f"NVML initialisation failed ({e}); no NVIDIA driver?") from e
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except pynvml.NVMLError as e:
            pynvml.nvmlShutdown()
            raise SensorError(f"no NVML GPU {self.index} ({e})") from e
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError:
            pass
        else:
            return _NvmlCounter(pynvml, handle, self.index)

        def read() -> tuple[float, str]:
            try:
                return float(pynvml.nvmlDeviceGetPowerUsage(handle)), f"power usage, GPU {self.index}"
            except pynvml.NVMLError as e:
                raise SensorError(f"GPU {self.index} reports neither energy nor power ({e})") from e

        try:
            read()
        except SensorError:
            pynvml.nvmlShutdown()
            raise
        return _PollingStream(read, self.interval_s, on_end=pynvml.nvmlShutdown)


class _NvmlCounter(_Counter):
    def __init__(self, pynvml: Any, handle: Any, index: int) -> None:
        self._pynvml = pynvml
        self._handle = handle
        self.sensor = f"energy counter, GPU {index}"

    def read_mj(self) -> float:
        try:
            return float(self._pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except self._pynvml.NVMLError as e:
            raise SensorError(f"nvml: energy counter read failed ({e})") from e

    def close(self) -> None:
        self._pynvml.nvmlShutdown()


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

    def _open(self) -> _Counter | _Stream:
        return _TegrastatsStream([*self.command, "--interval", str(self.interval_ms)], self.rail)


class _TegrastatsStream(_Stream):
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
            t = _now()
            lines += 1
            picked = _select_mw(parse_tegrastats(line), self._rail)
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


@dataclass(frozen=True)
class _Ina3221Channel:
    rail: str
    files: tuple[Path, ...]  # (in{n}_input mV, curr{n}_input mA) or (in_power{n}_input mW,)


class Ina3221Meter(PowerMeter):
    """Jetson INA3221 power monitors read from sysfs by a polling thread (faster than tegrastats).

    Two driver layouts: the hwmon ``ina3221`` driver (JetPack 5+), ``<root>/bus/i2c/drivers/ina3221/*/
    hwmon/hwmon*/in{n}_label``, ``in{n}_input`` (mV) and ``curr{n}_input`` (mA), power = V x I; and the
    older ``ina3221x`` iio driver (JetPack 4), ``<root>/bus/i2c/drivers/ina3221x/*/iio:device*/
    in_power{n}_input`` (mW) named by ``rail_name_{n}``. Channels labelled ``NC`` and the
    "sum of shunt voltages" channel are skipped; a rail name met twice gets a ``#2`` suffix.

    Args:
        idle_s: Idle period before the window, in seconds.
        root: sysfs mount point (tests pass a fixture tree).
        rail: Rail to integrate; None for the board total (:func:`board_total_mw`).
        interval_s: Polling period.
    """

    name = "ina3221"

    def __init__(
        self,
        *,
        idle_s: float = DEFAULT_IDLE_S,
        root: str | Path = "/sys",
        rail: str | None = None,
        interval_s: float = 0.01,
    ) -> None:
        super().__init__(idle_s=idle_s)
        self.root = Path(root)
        self.rail = rail
        self.interval_s = self._positive("interval_s", interval_s)

    def channels(self) -> list[_Ina3221Channel]:
        """Discover the monitored rails under ``root``."""
        drivers = self.root / "bus" / "i2c" / "drivers"
        found: list[_Ina3221Channel] = []
        for hwmon in sorted(drivers.glob("ina3221/*/hwmon/hwmon*")):
            for label_file in sorted(hwmon.glob("in*_label")):
                n = label_file.name[2 : -len("_label")]
                label = _read_text(label_file)
                volts, amps = hwmon / f"in{n}_input", hwmon / f"curr{n}_input"
                if label == "NC" or label.lower().startswith("sum") or not (volts.exists() and amps.exists()):
                    continue
                found.append(_Ina3221Channel(label, (volts, amps)))
        for iio in sorted(drivers.glob("ina3221x/*/iio:device*")):
            for power_file in sorted(iio.glob("in_power*_input")):
                n = power_file.name[len("in_power") : -len("_input")]
                name_file = iio / f"rail_name_{n}"
                label = _read_text(name_file) if name_file.exists() else f"in_power{n}"
                found.append(_Ina3221Channel(label, (power_file,)))
        seen: dict[str, int] = {}
        unique = []
        for ch in found:
            k = seen[ch.rail] = seen.get(ch.rail, 0) + 1
            unique.append(ch if k == 1 else _Ina3221Channel(f"{ch.rail}#{k}", ch.files))
        return unique

    def read_rails(self) -> dict[str, float]:
        """Read every channel once.

        Returns:
            Rail name -> mW.

        Raises:
            SensorError: A file cannot be read or parsed.
        """
        return _read_channels(self.channels())

    def _open(self) -> _Counter | _Stream:
        channels = self.channels()
        if not channels:
            raise SensorError(f"no INA3221 sensors under {self.root / 'bus/i2c/drivers'}/ina3221{{,x}}")

        def read() -> tuple[float, str]:
            rails = _read_channels(channels)
            picked = _select_mw(rails, self.rail)
            if picked is None:
                raise SensorError(f"ina3221: no rail {self.rail!r} (rails: {', '.join(rails)})")
            return picked

        read()
        return _PollingStream(read, self.interval_s)


def _read_channels(channels: Sequence[_Ina3221Channel]) -> dict[str, float]:
    rails = {}
    for ch in channels:
        values = [_read_number(path) for path in ch.files]
        rails[ch.rail] = values[0] if len(values) == 1 else values[0] * values[1] / 1000.0
    return rails


def _read_text(path: Path, denied_hint: str = "") -> str:
    try:
        return path.read_text().strip()
    except PermissionError as e:
        raise SensorError(f"{path}: permission denied{denied_hint}") from e
    except OSError as e:
        raise SensorError(f"{path}: {e.strerror or e}") from e


def _read_number(path: Path, denied_hint: str = "") -> float:
    text = _read_text(path, denied_hint)
    try:
        return float(text.split()[0])
    except (ValueError, IndexError) as e:
        raise SensorError(f"{path}: not a number: {text[:40]!r}") from e


class JtopMeter(PowerMeter):
    """Jetson power through jetson-stats (``from jtop import jtop``), imported only when used.

    Needs the jtop service running on the board. Samples arrive at jtop's own ``interval_s``.

    Args:
        idle_s: Idle period before the window, in seconds.
        rail: Rail to integrate; None for jtop's total (``power["tot"]``).
        interval_s: jtop update interval.
    """

    name = "jtop"

    def __init__(self, *, idle_s: float = DEFAULT_IDLE_S, rail: str | None = None, interval_s: float = 0.1) -> None:
        super().__init__(idle_s=idle_s)
        self.rail = rail
        self.interval_s = self._positive("interval_s", interval_s)

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("jtop") is None:
            return "jetson-stats is not installed (pip install jetson-stats)"
        return None

    def _open(self) -> _Counter | _Stream:
        return _JtopStream(self.rail, self.interval_s)


class _JtopStream(_Stream):
    def __init__(self, rail: str | None, interval_s: float) -> None:
        super().__init__()
        self._rail = rail
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._jetson: Any = None
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        try:
            from jtop import JtopException, jtop
        except ImportError as e:
            raise SensorError("jetson-stats is not installed (pip install jetson-stats)") from e
        self._jetson = jtop(interval=self._interval_s)
        try:
            self._jetson.start()
        except JtopException as e:
            raise SensorError(f"jtop: cannot connect to the jtop service ({e})") from e
        self._thread = threading.Thread(target=self._run, args=(self._jetson,), name="edgebnn-jtop", daemon=True)
        self._thread.start()

    def _run(self, jetson: Any) -> None:
        while not self._stop.is_set() and jetson.ok():
            t = _now()
            power = jetson.power
            if self._rail is None:
                self.record(t, float(power["tot"]["power"]), "jtop total")
            elif self._rail in power["rail"]:
                self.record(t, float(power["rail"][self._rail]["power"]), self._rail)
            else:
                self.fail(f"jtop: no rail {self._rail!r} (rails: {', '.join(power['rail'])})")
                return

    def end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()  # jetson.ok() returns within one jtop interval
            self._thread = None
        if self._jetson is not None:
            self._jetson.close()
            self._jetson = None


class RaplMeter(PowerMeter):
    """Linux RAPL package-0 energy counter (``intel-rapl:0``, the package of the first socket only).

    ``energy_uj`` counts µJ and wraps at ``max_energy_range_uj``; it is root-only since Linux 5.10.

    Args:
        idle_s: Idle period before the window, in seconds.
        root: sysfs mount point (tests pass a fixture tree).
    """

    name = "rapl"

    def __init__(self, *, idle_s: float = DEFAULT_IDLE_S, root: str | Path = "/sys") -> None:
        super().__init__(idle_s=idle_s)
        self.zone = Path(root) / "class" / "powercap" / "intel-rapl:0"

    def _open(self) -> _Counter | _Stream:
        energy = self.zone / "energy_uj"
        if not energy.exists():
            raise SensorError(f"no RAPL counter at {energy}")
        counter = _RaplCounter(energy, _read_number(self.zone / "max_energy_range_uj") / 1000.0)
        counter.read_mj()
        return counter


class _RaplCounter(_Counter):
    def __init__(self, path: Path, range_mj: float) -> None:
        self._path = path
        self._range_mj = range_mj
        self.sensor = "intel-rapl:0 package energy"

    def read_mj(self) -> float:
        return _read_number(self._path, " (root-only since Linux 5.10)") / 1000.0

    def delta_mj(self, before: float, after: float) -> float:
        return after - before if after >= before else after + self._range_mj - before

    def close(self) -> None:
        """Nothing to release: the file is opened per read."""


METERS: dict[str, type[PowerMeter]] = {
    meter.name: meter for meter in (NvmlMeter, TegrastatsMeter, Ina3221Meter, JtopMeter, RaplMeter, NullMeter)
}
"""Meter name -> class; ``open_meter`` accepts these names."""


def open_meter(
    name: str | None,
    device: str,
    *,
    idle_s: float = DEFAULT_IDLE_S,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
) -> PowerMeter:
    """Open a power meter by name, or the first available one for a device.

    Args:
        name: A key of :data:`METERS`, or None to try the device profile's meters in order
            (jetson: ina3221, tegrastats, jtop; rtx: nvml; cpu: rapl).
        device: Device profile name (see ``edgebnn.targets.devices``).
        idle_s: Idle period measured before each window, in seconds.
        settings: Per-meter keyword arguments, e.g. ``{"tegrastats": {"interval_ms": 20}}``.

    Returns:
        A usable meter; when the named meter (or every candidate) is unavailable, a :class:`NullMeter`
        whose results are null with the reason (which meters were tried and why each failed).

    Raises:
        InvalidOptionError: Unknown meter or device name.
    """
    profile = get_device(device)
    settings = settings or {}

    def make(key: str) -> PowerMeter:
        return METERS[key](idle_s=idle_s, **settings.get(key, {}))

    if name is not None:
        key = name.strip().lower()
        if key not in METERS:
            raise InvalidOptionError(f"unknown power meter {name!r}; known meters: {', '.join(METERS)}")
        meter = make(key)
        why = meter.unavailable_reason()
        return meter if why is None else NullMeter(f"{key} unavailable: {why}", source=key, idle_s=idle_s)
    tried = []
    for key in profile.power_meters:
        meter = make(key)
        why = meter.unavailable_reason()
        if why is None:
            return meter
        tried.append(f"{key}: {why}")
    return NullMeter(f"no power meter available for {profile.name} (tried {'; '.join(tried)})", idle_s=idle_s)
