"""``ina3221``: the Jetson INA3221 power monitors, read from sysfs by a polling thread."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgebnn.targets.power.parsing import select_mw
from edgebnn.targets.power.probes import Counter, PollingStream, SensorError, Stream, read_number, read_text
from edgebnn.targets.power.window import DEFAULT_IDLE_S, PowerMeter


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
                label = read_text(label_file)
                volts, amps = hwmon / f"in{n}_input", hwmon / f"curr{n}_input"
                if label == "NC" or label.lower().startswith("sum") or not (volts.exists() and amps.exists()):
                    continue
                found.append(_Ina3221Channel(label, (volts, amps)))
        for iio in sorted(drivers.glob("ina3221x/*/iio:device*")):
            for power_file in sorted(iio.glob("in_power*_input")):
                n = power_file.name[len("in_power") : -len("_input")]
                name_file = iio / f"rail_name_{n}"
                label = read_text(name_file) if name_file.exists() else f"in_power{n}"
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

    def _open(self) -> Counter | Stream:
        channels = self.channels()
        if not channels:
            raise SensorError(f"no INA3221 sensors under {self.root / 'bus/i2c/drivers'}/ina3221{{,x}}")

        def read() -> tuple[float, str]:
            rails = _read_channels(channels)
            picked = select_mw(rails, self.rail)
            if picked is None:
                raise SensorError(f"ina3221: no rail {self.rail!r} (rails: {', '.join(rails)})")
            return picked

        read()
        return PollingStream(read, self.interval_s)


def _read_channels(channels: Sequence[_Ina3221Channel]) -> dict[str, float]:
    rails = {}
    for ch in channels:
        values = [read_number(path) for path in ch.files]
        rails[ch.rail] = values[0] if len(values) == 1 else values[0] * values[1] / 1000.0
    return rails
