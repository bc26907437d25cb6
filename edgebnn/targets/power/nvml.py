"""``nvml``: an NVIDIA GPU through NVML (``pip install nvidia-ml-py``), imported only when used."""

from __future__ import annotations

from typing import Any

from edgebnn.targets.power.probes import Counter, PollingStream, SensorError, Stream
from edgebnn.targets.power.window import DEFAULT_IDLE_S, PowerMeter


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

    def _open(self) -> Counter | Stream:
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
        return PollingStream(read, self.interval_s, on_end=pynvml.nvmlShutdown)


class _NvmlCounter(Counter):
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
