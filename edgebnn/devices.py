"""Device profiles: what a deployment target can run and how its energy can be measured.

A profile is static knowledge about a class of device, not a probe of the machine edgebnn runs on:
``get_device("jetson-agx-orin")`` answers the same on a laptop and on the board. Runners and meters
check the real machine themselves. It lives outside ``edgebnn.targets`` so that the exporters (the TensorRT
builder checks DLA cores and the TensorRT generation) can read it without importing a target.

Known profiles: ``cpu``, ``rtx``, ``jetson-orin-nano``, ``jetson-orin-nx``, ``jetson-agx-orin``; the
alias ``jetson`` names ``jetson-orin-nano``; for exports, ``arm64`` names ``cpu`` (onnxruntime's CPU provider on an
ARM host: :func:`export_device`).

It is the one table the exporters read for "what does device X run" (:func:`export_device`): the exported weight
formats (``weight_formats``: TensorRT 10.3 on Jetson does not parse the opset-21 int4 DequantizeLinear, so Orin
takes fp32 and int8), whether the runtime runs a store's in-graph decode of packed codes (``decodes``:
onnxruntime folds it at session creation; TensorRT-RTX parses and builds it, checked by real builds in
tests/integration/test_tensorrt_rtx.py; Jetson's TensorRT 10.3 is unverified, so it gets the float store), whether
random ops run with their seeds (``random_ops``: TensorRT imports them as a Fill layer that ignores the seed and
DLA does not run them, so ``noise`` defaults to host-filled noise inputs there), and which TensorRT builds its
engines (``builder``: TensorRT-RTX on any machine for ``rtx``, the board's TensorRT for Jetson).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edgebnn.errors import InvalidOptionError

DeviceKind = Literal["cpu", "rtx", "jetson"]
BASELINE_RUNNERS = ("auto", "onnxruntime", "torch")
"""Where ``profile`` times the float baselines (:meth:`edgebnn.targets.Target.plan`): the target's own pick, or
both baselines on one runtime."""


@dataclass(frozen=True)
class DeviceProfile:
    """One deployment target.

    Attributes:
        name: Canonical profile name (``jetson-orin-nano``, never an alias).
        kind: ``cpu`` (onnxruntime on the host), ``rtx`` (discrete NVIDIA GPU) or ``jetson``.
        precisions: Weight/activation precisions the target's runtime can execute
            (``int4`` means weight-only INT4 through block-wise DequantizeLinear).
        dla_cores: Number of NVIDIA Deep Learning Accelerator cores (0 when absent).
        memory_gib: Memory of the largest module of the family, shared CPU/GPU on Jetson;
            None where it depends on the host (``cpu``, ``rtx``).
        power_meters: Meter names tried in this order when none is given (see ``edgebnn.targets.power``).
        tensorrt: TensorRT generation expected on the target (None: no TensorRT).
        description: One line for humans.
        runtime: The runtime exported graphs run on (``onnxruntime CPU``, ``TensorRT 10.3``, ...).
        weight_formats: ``--weights`` formats the exported graph may use on this device.
        decodes: Whether the runtime runs the stores' in-graph decode of packed codes (:mod:`edgebnn.exporters.stores`).
        random_ops: Whether the runtime runs RandomNormal/RandomUniform(Like) with their seeds (``noise --rng graph``
            by default).
        builder: What builds the device's engines (:data:`edgebnn.exporters.tensorrt.BUILDERS`): ``tensorrt-rtx``
            (ahead of time, any machine), ``tensorrt`` (on the device), None without TensorRT.
        export_mode: The mode ``edgebnn export`` writes when none is given (:mod:`edgebnn.exporters.export`):
            ``noise`` keeps the lowered codes in one self-contained graph (onnxruntime decodes them and draws
            the noise); ``baked`` stores S drawn members.
    """

    name: str
    kind: DeviceKind
    precisions: tuple[str, ...]
    dla_cores: int
    memory_gib: float | None
    power_meters: tuple[str, ...]
    tensorrt: str | None
    description: str
    runtime: str = "onnxruntime CPU"
    weight_formats: tuple[str, ...] = ("fp32", "int8", "int4")
    decodes: bool = True
    random_ops: bool = True
    builder: str | None = None
    export_mode: str = "baked"

    @property
    def on_tensorrt(self) -> bool:
        """Exported graphs run on TensorRT (explicit Q/DQ weights, no random ops)."""
        return self.tensorrt is not None


_JETSON_METERS = ("ina3221", "tegrastats", "jtop")
# Orin is an Ampere GPU (SM 8.7): no FP8/FP4; INT4 is weight-only and not verified on a board yet.
_ORIN_PRECISIONS = ("fp32", "fp16", "int8", "int4")
# TensorRT 10.3 on Jetson does not parse the opset-21 int4 DequantizeLinear an int4 export writes
_ORIN_WEIGHTS = ("fp32", "int8")

DEVICES: dict[str, DeviceProfile] = {
    profile.name: profile
    for profile in (
        DeviceProfile(
            name="cpu",
            kind="cpu",
            # onnxruntime's CPU provider dequantizes block-wise INT4 weights (DequantizeLinear, opset 21)
            precisions=("fp32", "int8", "int4"),
            dla_cores=0,
            memory_gib=None,
            power_meters=("rapl",),
            tensorrt=None,
            description="host CPU through onnxruntime",
            export_mode="noise",
        ),
        DeviceProfile(
            name="rtx",
            kind="rtx",
            # FP8 needs Ada (SM 8.9) or newer; the runner checks the actual GPU.
            precisions=("fp32", "fp16", "bf16", "int8", "fp8", "int4"),
            dla_cores=0,
            memory_gib=None,
            power_meters=("nvml",),
            tensorrt="11",
            description="desktop/laptop NVIDIA RTX GPU; engines built ahead of time by TensorRT for RTX",
            runtime="TensorRT-RTX", random_ops=False, builder="tensorrt-rtx",
        ),
        DeviceProfile(
            name="jetson-orin-nano",
            kind="jetson",
            precisions=_ORIN_PRECISIONS,
            dla_cores=0,
            memory_gib=8.0,
            power_meters=_JETSON_METERS,
            tensorrt="10.3",
            description="Jetson Orin Nano 8GB, JetPack 6 (TensorRT 10.3), no DLA",
            runtime="TensorRT 10.3", weight_formats=_ORIN_WEIGHTS, decodes=False, random_ops=False,
            builder="tensorrt",
        ),
        DeviceProfile(
            name="jetson-orin-nx",
            kind="jetson",
            precisions=_ORIN_PRECISIONS,
            dla_cores=2,
            memory_gib=16.0,
            power_meters=_JETSON_METERS,
            tensorrt="10.3",
            description="Jetson Orin NX 16GB, JetPack 6 (TensorRT 10.3), 2 DLA cores (the 8GB module has 1)",
            runtime="TensorRT 10.3", weight_formats=_ORIN_WEIGHTS, decodes=False, random_ops=False,
            builder="tensorrt",
        ),
        DeviceProfile(
            name="jetson-agx-orin",
            kind="jetson",
            precisions=_ORIN_PRECISIONS,
            dla_cores=2,
            memory_gib=64.0,
            power_meters=_JETSON_METERS,
            tensorrt="10.3",
            description="Jetson AGX Orin 64GB, JetPack 6 (TensorRT 10.3), 2 DLA cores",
            runtime="TensorRT 10.3", weight_formats=_ORIN_WEIGHTS, decodes=False, random_ops=False,
            builder="tensorrt",
        ),
    )
}

ALIASES: dict[str, str] = {"jetson": "jetson-orin-nano"}
# export-only names (``edgebnn export --device``): onnxruntime's CPU provider on an ARM host exports as ``cpu``
EXPORT_ALIASES: dict[str, str] = {"arm64": "cpu"}


def device_names() -> list[str]:
    """Return every accepted device name, canonical names first, then aliases."""
    return [*DEVICES, *ALIASES]


def get_device(name: str) -> DeviceProfile:
    """Look up a device profile by name or alias.

    Args:
        name: A profile name or alias, case-insensitive.

    Returns:
        The profile.

    Raises:
        InvalidOptionError: The name is unknown; the message lists the known names.
    """
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in DEVICES:
        raise InvalidOptionError(f"unknown device {name!r}; known devices: {', '.join(device_names())}")
    return DEVICES[key]


def export_device_names() -> list[str]:
    """Every name ``edgebnn export --device`` accepts: the profiles, their aliases and :data:`EXPORT_ALIASES`."""
    return [*device_names(), *EXPORT_ALIASES]


def export_device(name: str) -> DeviceProfile:
    """The profile an export for ``name`` targets (:func:`get_device`, plus the export-only aliases).

    Raises:
        InvalidOptionError: The name is unknown; the message lists the accepted names.
    """
    key = name.strip().lower()
    if key not in EXPORT_ALIASES and ALIASES.get(key, key) not in DEVICES:
        raise InvalidOptionError(f"--device {name}: choose one of {', '.join(export_device_names())}")
    return get_device(EXPORT_ALIASES.get(key, key))
