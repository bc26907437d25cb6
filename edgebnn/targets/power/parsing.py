"""Jetson power-rail text: tegrastats lines and the board total of a set of rails.

Board total (Jetson): :func:`board_total_mw` uses the module input rail ``VDD_IN`` (Orin Nano/NX,
Xavier NX) or ``POM_5V_IN`` (Nano, JetPack 4) when present; on AGX Orin, which has no input rail, the sum
``VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0``; on any other board the sum of every rail it reports. The
sensors sit on the module: the carrier board is never included, and they may under-read an external meter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

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


def select_mw(rails: Mapping[str, float], rail: str | None) -> tuple[float, str] | None:
    """One rail by name, or the board total when ``rail`` is None."""
    if rail is None:
        return board_total_mw(rails)
    return (rails[rail], rail) if rail in rails else None
