"""The measurement window: idle power, then power integrated over the timed inferences.

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

Counters (:class:`~edgebnn.targets.power.probes.Counter`) give the energies directly. For sampled power
(:class:`~edgebnn.targets.power.probes.Stream`) power between samples is held at the last sample (zero-order
hold, no look-ahead), so a step change is seen at most one sampling interval late. A window needs at least
two samples inside it, otherwise its energy is null with the reason.

A meter that cannot measure (no sensor, no permission, the sensor process died, the window too short)
returns an ``EnergyResult`` whose ``energy_mj_per_inference`` is None and whose ``reason`` says why: a
number is only ever computed from sensor readings. ``reason`` may also carry a warning next to a number
(e.g. an NVML window shorter than 1 s, or load power below idle).
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, ClassVar

from edgebnn.errors import InvalidOptionError
from edgebnn.targets.power import probes
from edgebnn.targets.power.probes import Counter, SensorError, Stream

DEFAULT_IDLE_S = 0.5
"""Idle period measured by ``start()`` before the window opens, in seconds."""

_STARTUP_TIMEOUT_S = 5.0

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
    probe: Counter | Stream
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
    def _open(self) -> Counter | Stream:
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

    def _idle(self, probe: Counter | Stream) -> _Window:
        if isinstance(probe, Counter):
            t_idle, e_idle = probes.now(), probe.read_mj()
            probes.sleep(self.idle_s)
            t_start, e_start = probes.now(), probe.read_mj()
            return _Window(probe, t_idle, t_start, e_idle, e_start)
        probe.begin()
        if not probe.wait_first(_STARTUP_TIMEOUT_S):
            raise SensorError(f"{self.name}: no power reading within {_STARTUP_TIMEOUT_S:g} s")
        if probe.error is not None:
            raise SensorError(probe.error)
        t_idle = probe.samples()[0][0]
        probes.sleep(self.idle_s)
        return _Window(probe, t_idle, probes.now())

    @staticmethod
    def _release(probe: Counter | Stream) -> None:
        if isinstance(probe, Counter):
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
        t_end = probes.now()
        self._started = False
        window, self._window = self._window, None
        if window is None:
            return self._null(self._failure or f"{self.name}: sensor not opened")
        try:
            if isinstance(window.probe, Counter):
                return self._counter_result(window, window.probe, t_end, inferences)
            window.probe.end()
            return self._stream_result(window, window.probe, t_end, inferences)
        except SensorError as e:
            return self._null(str(e))
        finally:
            self._release(window.probe)

    def _counter_result(self, w: _Window, counter: Counter, t_end: float, n: int) -> EnergyResult:
        e_end = counter.read_mj()
        idle_mw = counter.delta_mj(w.e_idle, w.e_start) / (w.t_start - w.t_idle)
        window_s = t_end - w.t_start
        if not window_s > 0:
            return self._null(f"{self.name}: empty window")
        mean_mw = counter.delta_mj(w.e_start, e_end) / window_s
        return self._result(idle_mw, mean_mw, window_s, n, samples=3, sensor=counter.sensor)

    def _stream_result(self, w: _Window, stream: Stream, t_end: float, n: int) -> EnergyResult:
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
