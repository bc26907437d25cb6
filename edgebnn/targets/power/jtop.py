"""``jtop``: Jetson power through jetson-stats (``from jtop import jtop``), imported only when used."""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

from edgebnn.targets.power import probes
from edgebnn.targets.power.probes import Counter, SensorError, Stream
from edgebnn.targets.power.window import DEFAULT_IDLE_S, PowerMeter


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

    def _open(self) -> Counter | Stream:
        return _JtopStream(self.rail, self.interval_s)


class _JtopStream(Stream):
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
            t = probes.now()
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
