"""``rapl``: the Linux RAPL package-0 energy counter (``/sys/class/powercap/intel-rapl:0``)."""

from __future__ import annotations

from pathlib import Path

from edgebnn.targets.power.probes import Counter, SensorError, Stream, read_number
from edgebnn.targets.power.window import DEFAULT_IDLE_S, PowerMeter


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

    def _open(self) -> Counter | Stream:
        energy = self.zone / "energy_uj"
        if not energy.exists():
            raise SensorError(f"no RAPL counter at {energy}")
        counter = _RaplCounter(energy, read_number(self.zone / "max_energy_range_uj") / 1000.0)
        counter.read_mj()
        return counter


class _RaplCounter(Counter):
    def __init__(self, path: Path, range_mj: float) -> None:
        self._path = path
        self._range_mj = range_mj
        self.sensor = "intel-rapl:0 package energy"

    def read_mj(self) -> float:
        return read_number(self._path, " (root-only since Linux 5.10)") / 1000.0

    def delta_mj(self, before: float, after: float) -> float:
        return after - before if after >= before else after + self._range_mj - before

    def close(self) -> None:
        """Nothing to release: the file is opened per read."""
