"""Power meters: energy per inference measured over a timed window, or null with the reason.

One module per concern: :mod:`.parsing` (tegrastats lines, the board total of Jetson rails),
:mod:`.probes` (what a sensor gives: an energy counter or a stream of power samples),
:mod:`.window` (the idle period, the window and the per-inference arithmetic: :class:`PowerMeter`), and one
module per sensor: :mod:`.nvml`, :mod:`.tegrastats`, :mod:`.ina3221`, :mod:`.jtop`, :mod:`.rapl`,
:mod:`.null` (``none``). :func:`open_meter` opens one by name, or the first that works on a device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgebnn.devices import get_device
from edgebnn.errors import InvalidOptionError
from edgebnn.targets.power.ina3221 import Ina3221Meter
from edgebnn.targets.power.jtop import JtopMeter
from edgebnn.targets.power.null import NullMeter
from edgebnn.targets.power.nvml import NvmlMeter
from edgebnn.targets.power.parsing import board_total_mw, parse_tegrastats
from edgebnn.targets.power.probes import SensorError
from edgebnn.targets.power.rapl import RaplMeter
from edgebnn.targets.power.tegrastats import TegrastatsMeter
from edgebnn.targets.power.window import DEFAULT_IDLE_S, EnergyResult, PowerMeter

__all__ = [
    "DEFAULT_IDLE_S",
    "METERS",
    "EnergyResult",
    "Ina3221Meter",
    "JtopMeter",
    "NullMeter",
    "NvmlMeter",
    "PowerMeter",
    "RaplMeter",
    "SensorError",
    "TegrastatsMeter",
    "board_total_mw",
    "open_meter",
    "parse_tegrastats",
]

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
        device: Device profile name (see ``edgebnn.devices``).
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
