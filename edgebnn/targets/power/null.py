"""``none``: a meter that measures nothing; every window is null with the reason."""

from __future__ import annotations

from edgebnn.errors import InvalidOptionError
from edgebnn.targets.power.probes import Counter, SensorError, Stream
from edgebnn.targets.power.window import DEFAULT_IDLE_S, EnergyResult, PowerMeter


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

    def _open(self) -> Counter | Stream:
        raise SensorError(self.reason)

    def start(self) -> None:
        """Open a (null) window; does not wait."""
        if self._started:
            raise InvalidOptionError(f"power meter {self.name}: start() called twice without stop()")
        self._started = True

    def _null(self, reason: str, sensor: str | None = None) -> EnergyResult:
        return EnergyResult(None, self.source, self.reason, None, None, 0, None, sensor)
