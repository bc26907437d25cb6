"""Targets by name: every device profile name or alias resolves to the target of its kind.

``get_target("jetson")`` is a :class:`~edgebnn.targets.gpu.JetsonTarget` bound to the ``jetson-orin-nano``
profile; ``get_target("cpu")`` a :class:`~edgebnn.targets.cpu.CpuTarget`. The names are those of
:mod:`edgebnn.devices`; an unknown one is an error listing the known ones.
"""

from __future__ import annotations

from edgebnn.devices import device_names, get_device
from edgebnn.targets.base import Target
from edgebnn.targets.cpu import CpuTarget
from edgebnn.targets.gpu import JetsonTarget, RtxTarget

TARGETS: dict[str, type[Target]] = {target.kind: target for target in (CpuTarget, RtxTarget, JetsonTarget)}
"""Device kind -> target class."""


def get_target(name: str) -> Target:
    """The target of a device profile name or alias (case-insensitive).

    Raises:
        InvalidOptionError: Unknown name; the message lists the known ones.
    """
    profile = get_device(name)
    return TARGETS[profile.kind](profile)


def target_names() -> list[str]:
    """Every name :func:`get_target` accepts, canonical names first, then aliases."""
    return device_names()
