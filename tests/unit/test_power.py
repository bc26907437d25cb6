"""Power meters: tegrastats parsing, sysfs sensors, counters, the idle/window/per-inference arithmetic.

Sensors are faked: recorded tegrastats lines, sysfs trees in tmp_path, a fake tegrastats process
(tests/fixtures/fake_tegrastats.py), a fake clock for counter meters and monkeypatched pynvml.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import time
import types
from pathlib import Path

import pytest

from edgebnn.errors import InvalidOptionError
from edgebnn.targets import power
from edgebnn.targets.power import (
    EnergyResult,
    Ina3221Meter,
    JtopMeter,
    NullMeter,
    NvmlMeter,
    RaplMeter,
    TegrastatsMeter,
    board_total_mw,
    open_meter,
    parse_tegrastats,
    probes,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAKE_TEGRASTATS = [sys.executable, str(FIXTURES / "fake_tegrastats.py")]

# Step-response tolerance for sampled meters. The power steps from 3000 to 5000 mW right after start()
# returns; with zero-order hold the meter sees the step at the first sample after it, i.e. at most one
# sampling interval late, plus the time the sampling thread or process waits to be scheduled. So
#     ΔP·(T - interval - SCHED_SLACK_S)/n  <=  E  <=  ΔP·T/n
# where T is the window the meter measured; nothing can make E exceed ΔP·T/n, since no load sample is
# timestamped before the window opens. SCHED_SLACK_S allows for a loaded CI machine.
DELTA_MW = 2000.0
SCHED_SLACK_S = 0.05


def assert_step_energy(result: EnergyResult, n: int, interval_s: float) -> None:
    full = DELTA_MW * result.window_s / n
    lag = DELTA_MW * (interval_s + SCHED_SLACK_S) / n
    assert full - lag <= result.energy_mj_per_inference <= full + 1e-6


def fixture_lines(name: str) -> list[str]:
    text = (FIXTURES / "tegrastats" / name).read_text()
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


# --- tegrastats lines -------------------------------------------------------------------------------

PARSED = {
    "orin_nano_jp6.txt": [
        {"VDD_IN": 5704, "VDD_CPU_GPU_CV": 831, "VDD_SOC": 1624},
        {"VDD_IN": 9871, "VDD_CPU_GPU_CV": 4012, "VDD_SOC": 2290},
    ],
    "agx_orin_jp6.txt": [
        {"VDD_GPU_SOC": 2389, "VDD_CPU_CV": 398, "VIN_SYS_5V0": 2422, "VDDQ_VDD2_1V8AO": 605},
        {"VDD_GPU_SOC": 13977, "VDD_CPU_CV": 2386, "VIN_SYS_5V0": 4240, "VDDQ_VDD2_1V8AO": 1302},
    ],
    "nano_jp4.txt": [
        {"POM_5V_IN": 2247, "POM_5V_GPU": 0, "POM_5V_CPU": 208},
        {"POM_5V_IN": 6583, "POM_5V_GPU": 2783, "POM_5V_CPU": 1491},
    ],
    "nano_jp4_off_cores.txt": [{"POM_5V_IN": 2615, "POM_5V_GPU": 82, "POM_5V_CPU": 410}],
    "jp7.txt": [{"VDD_GPU_SOC": 5139, "VDD_CPU_CV": 812, "VIN_SYS_5V0": 3912}],
    "unknown_rail.txt": [{"VDD_IN": 4400, "VDD_CPU_GPU_CV": 600, "VDD_SOC": 1300, "VDD_AUX_SENSOR": 77}],
    "no_rails.txt": [{}],
}


@pytest.mark.parametrize("name", sorted(PARSED))
def test_parse_tegrastats_recorded_lines(name: str) -> None:
    lines = fixture_lines(name)
    assert [parse_tegrastats(line) for line in lines] == PARSED[name]


def test_parse_ignores_memory_cpu_engines_and_temperatures() -> None:
    rails = parse_tegrastats(fixture_lines("nano_jp4_off_cores.txt")[0])
    assert not {"RAM", "SWAP", "IRAM", "CPU", "GR3D_FREQ", "EMC_FREQ", "APE", "GPU", "thermal"} & set(rails)


@pytest.mark.parametrize(
    ("name", "total", "how"),
    [
        ("orin_nano_jp6.txt", 5704, "VDD_IN"),
        ("nano_jp4.txt", 2247, "POM_5V_IN"),
        ("agx_orin_jp6.txt", 2389 + 398 + 2422, "VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0"),
        ("jp7.txt", 5139 + 812 + 3912, "VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0"),
        ("unknown_rail.txt", 4400, "VDD_IN"),
    ],
)
def test_board_total(name: str, total: float, how: str) -> None:
    assert board_total_mw(parse_tegrastats(fixture_lines(name)[0])) == (total, how)


def test_board_total_other_boards_sum_all_rails_and_empty_is_none() -> None:
    assert board_total_mw({"VDD_GPU": 100.0, "VDD_CPU": 50.0}) == (150.0, "VDD_GPU+VDD_CPU")
    assert board_total_mw({}) is None


# --- fake clock for counter meters -----------------------------------------------------------------


class FakeClock:
    """Replaces the meters' clock (probes.now/sleep); integrates a settable power into energy as fake time advances."""

    def __init__(self, power_mw: float) -> None:
        self.t = 100.0
        self.power_mw = power_mw
        self.energy_mj = 0.0
        self.on_advance: list = []

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.energy_mj += self.power_mw * seconds
        for hook in self.on_advance:
            hook()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock(power_mw=3000.0)
    monkeypatch.setattr(probes, "now", lambda: fake.t)
    monkeypatch.setattr(probes, "sleep", fake.advance)
    return fake


def run_window(meter: power.PowerMeter, clock: FakeClock, load_mw: float, window_s: float, n: int):
    meter.start()  # idle_s of fake time at clock.power_mw
    clock.power_mw = load_mw
    clock.advance(window_s)
    return meter.stop(n)


# --- RAPL ------------------------------------------------------------------------------------------


def rapl_tree(root: Path, energy_uj: int, range_uj: int) -> Path:
    zone = root / "class" / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{range_uj}\n")
    return zone


@pytest.mark.parametrize("start_uj", [0, 18_500_000, 9_000_000], ids=["no-wrap", "idle-wraps", "window-wraps"])
def test_rapl_idle_baseline_window_and_wraparound(tmp_path: Path, clock: FakeClock, start_uj: int) -> None:
    range_uj = 20_000_000
    zone = rapl_tree(tmp_path, start_uj, range_uj)
    clock.on_advance.append(
        lambda: (zone / "energy_uj").write_text(f"{(start_uj + round(clock.energy_mj * 1000)) % range_uj}\n")
    )
    meter = RaplMeter(root=tmp_path, idle_s=1.0)
    assert meter.unavailable_reason() is None
    # idle 1 s at 3000 mW, then 2 s at 5000 mW for 4 inferences: (5000 - 3000) * 2 / 4 = 1000 mJ each.
    result = run_window(meter, clock, load_mw=5000.0, window_s=2.0, n=4)
    assert result.source == "rapl"
    assert result.reason is None
    assert result.idle_power_mw == pytest.approx(3000.0)
    assert result.mean_power_mw == pytest.approx(5000.0)
    assert result.energy_mj_per_inference == pytest.approx(1000.0)
    assert result.window_s == pytest.approx(2.0)


def deny(monkeypatch: pytest.MonkeyPatch, denied: Path) -> None:
    """Make reading one file raise PermissionError (chmod does not stop root, so patch the read)."""
    real = Path.read_text

    def read_text(self: Path, *args, **kwargs) -> str:
        if self == denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)


def test_rapl_permission_denied_gives_reason_not_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    zone = rapl_tree(tmp_path, 1000, 20_000_000)
    deny(monkeypatch, zone / "energy_uj")
    why = RaplMeter(root=tmp_path).unavailable_reason()
    assert why is not None and "permission denied" in why and "root" in why
    meter = open_meter("rapl", "cpu", settings={"rapl": {"root": tmp_path}})
    assert isinstance(meter, NullMeter)
    meter.start()
    result = meter.stop(10)
    assert result.energy_mj_per_inference is None
    assert result.source == "rapl"
    assert "permission denied" in result.reason


def test_rapl_permission_lost_mid_window(tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    zone = rapl_tree(tmp_path, 1000, 20_000_000)
    meter = RaplMeter(root=tmp_path, idle_s=0.5)
    meter.start()
    deny(monkeypatch, zone / "energy_uj")
    clock.advance(1.0)
    result = meter.stop(5)
    assert result.energy_mj_per_inference is None
    assert "permission denied" in result.reason


def test_rapl_missing(tmp_path: Path) -> None:
    assert "no RAPL counter" in RaplMeter(root=tmp_path).unavailable_reason()


# --- NVML (fake pynvml) ----------------------------------------------------------------------------


def patch_fake_nvml(monkeypatch: pytest.MonkeyPatch, energy_mj, power_mw) -> dict:
    """FAKE NVML: replace the pynvml calls the meter makes; no GPU or driver involved.

    ``energy_mj()`` / ``power_mw()`` give the counter and power readings; ``energy_mj=None`` makes the
    energy counter NotSupported, as on GPUs older than Volta. Returns the init/shutdown balance.
    """
    pynvml = pytest.importorskip("pynvml")
    state = {"inits": 0}

    def init() -> None:
        state["inits"] += 1

    def shutdown() -> None:
        state["inits"] -= 1

    def energy(handle: object) -> int:
        if energy_mj is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return round(energy_mj())

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    monkeypatch.setattr(pynvml, "nvmlShutdown", shutdown)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: ("gpu", index))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", energy)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda handle: round(power_mw()))
    return state


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> dict:
    """Fake NVML whose energy counter integrates the fake clock's power."""
    return patch_fake_nvml(monkeypatch, lambda: 7_000_000 + clock.energy_mj, lambda: clock.power_mw)


def test_fake_nvml_energy_counter(fake_nvml: dict, clock: FakeClock) -> None:
    meter = open_meter("nvml", "rtx", idle_s=1.0)
    assert isinstance(meter, NvmlMeter)
    result = run_window(meter, clock, load_mw=250_000.0, window_s=4.0, n=100)
    # (250 W - 3 W) * 4 s / 100 = 9880 mJ per inference
    assert result.energy_mj_per_inference == pytest.approx(9880.0)
    assert result.sensor == "energy counter, GPU 0"
    assert result.reason is None
    assert fake_nvml["inits"] == 0  # every nvmlInit matched by nvmlShutdown


def test_fake_nvml_short_window_warns_but_measures(fake_nvml: dict, clock: FakeClock) -> None:
    result = run_window(NvmlMeter(idle_s=1.0), clock, load_mw=5000.0, window_s=0.25, n=1)
    assert result.energy_mj_per_inference == pytest.approx(500.0)
    assert "shorter than the advised 1 s" in result.reason


def test_fake_nvml_without_counter_samples_power(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real clock and polling thread; the power steps 3000 -> 5000 mW right after start()."""
    level = {"mw": 3000.0}
    state = patch_fake_nvml(monkeypatch, None, lambda: level["mw"])
    interval = 0.01
    meter = NvmlMeter(idle_s=0.1, interval_s=interval)
    meter.start()
    level["mw"] = 5000.0
    time.sleep(0.5)
    result = meter.stop(2)
    assert result.sensor == "power usage, GPU 0"
    # A poll timestamped just before the window opens may read the new level: idle within 1 %.
    assert result.idle_power_mw == pytest.approx(3000.0, rel=0.01)
    assert_step_energy(result, 2, interval)
    assert "shorter than the advised 1 s" in result.reason
    assert state["inits"] == 0


def test_nvml_without_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    pynvml = pytest.importorskip("pynvml")

    def init() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    meter = open_meter(None, "rtx")
    assert isinstance(meter, NullMeter)
    meter.start()
    result = meter.stop(1)
    assert result.energy_mj_per_inference is None and result.source == "none"
    assert "tried nvml: NVML initialisation failed" in result.reason


# --- INA3221 sysfs ---------------------------------------------------------------------------------


def write(path: Path, text: str) -> None:
    """Atomic replace, so a polling reader never sees a half-written value."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def hwmon_tree(root: Path) -> Path:
    """JetPack 5/6 hwmon layout: an Orin Nano module monitor plus an AGX-style chip with NC channels."""
    base = root / "bus" / "i2c" / "drivers" / "ina3221"
    chip = base / "1-0040" / "hwmon" / "hwmon3"
    write(chip / "name", "ina3221")
    for n, (label, mv, ma) in enumerate(
        [("VDD_IN", 5000, 600), ("VDD_CPU_GPU_CV", 5000, 160), ("VDD_SOC", 5000, 320)], start=1
    ):
        write(chip / f"in{n}_label", label)
        write(chip / f"in{n}_input", str(mv))
        write(chip / f"curr{n}_input", str(ma))
    write(chip / "in7_label", "sum of shunt voltages")
    write(chip / "in7_input", "12")
    other = base / "1-0041" / "hwmon" / "hwmon4"
    for n, label in enumerate(["NC", "VDDQ_VDD2_1V8AO", "NC"], start=1):
        write(other / f"in{n}_label", label)
        write(other / f"in{n}_input", "5000")
        write(other / f"curr{n}_input", "100")
    return chip


def iio_tree(root: Path) -> Path:
    """JetPack 4 ina3221x iio layout (Jetson Nano): in_power{n}_input in mW, rail_name_{n}."""
    dev = root / "bus" / "i2c" / "drivers" / "ina3221x" / "6-0040" / "iio:device0"
    for n, (name, mw) in enumerate([("POM_5V_IN", 2247), ("POM_5V_GPU", 0), ("POM_5V_CPU", 208)]):
        write(dev / f"rail_name_{n}", name)
        write(dev / f"in_power{n}_input", str(mw))
    return dev


def test_ina3221_hwmon_layout(tmp_path: Path) -> None:
    hwmon_tree(tmp_path)
    meter = Ina3221Meter(root=tmp_path)
    assert meter.unavailable_reason() is None
    assert meter.read_rails() == {
        "VDD_IN": 3000.0,
        "VDD_CPU_GPU_CV": 800.0,
        "VDD_SOC": 1600.0,
        "VDDQ_VDD2_1V8AO": 500.0,
    }


def test_ina3221_iio_layout(tmp_path: Path) -> None:
    iio_tree(tmp_path)
    meter = Ina3221Meter(root=tmp_path, rail="POM_5V_CPU")
    assert meter.unavailable_reason() is None
    assert meter.read_rails() == {"POM_5V_IN": 2247.0, "POM_5V_GPU": 0.0, "POM_5V_CPU": 208.0}


def test_ina3221_missing_rail_and_missing_driver(tmp_path: Path) -> None:
    assert "no INA3221 sensors" in Ina3221Meter(root=tmp_path).unavailable_reason()
    iio_tree(tmp_path)
    assert "no rail 'VDD_IN'" in Ina3221Meter(root=tmp_path, rail="VDD_IN").unavailable_reason()


def test_ina3221_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chip = hwmon_tree(tmp_path)
    deny(monkeypatch, chip / "curr1_input")
    assert "permission denied" in Ina3221Meter(root=tmp_path).unavailable_reason()


def test_ina3221_measures_step_with_polling_thread(tmp_path: Path) -> None:
    chip = hwmon_tree(tmp_path)
    interval = 0.01
    meter = open_meter(
        None, "jetson-orin-nano", idle_s=0.1, settings={"ina3221": {"root": tmp_path, "interval_s": interval}}
    )
    assert isinstance(meter, Ina3221Meter)
    with meter:
        meter.start()
        write(chip / "curr1_input", "1000")  # VDD_IN 3000 mW -> 5000 mW
        time.sleep(0.5)
        result = meter.stop(4)
    assert result.source == "ina3221" and result.sensor == "VDD_IN"
    assert result.idle_power_mw == pytest.approx(3000.0, rel=0.01)
    assert_step_energy(result, 4, interval)


# --- tegrastats with a fake sensor process ---------------------------------------------------------


def test_fake_tegrastats_idle_baseline_and_energy_per_inference(tmp_path: Path) -> None:
    """Fake sensor prints VDD_IN 3000 mW until the load flag exists, then 5000 mW, every 20 ms.

    The fake checks the flag once per line, so the step shows at most one interval (plus scheduling)
    after the window opens; see assert_step_energy. Lines are timestamped on receipt, after the fake
    printed them, so the idle baseline only sees 3000 mW lines and must be exact.
    """
    flag = tmp_path / "load"
    interval_ms = 20
    meter = TegrastatsMeter(binary=[*FAKE_TEGRASTATS, "--load-flag", str(flag)], interval_ms=interval_ms, idle_s=0.2)
    assert meter.unavailable_reason() is None
    n = 10
    with meter:
        meter.start()
        flag.touch()
        time.sleep(0.5)
        result = meter.stop(n)
    assert result.source == "tegrastats" and result.sensor == "VDD_IN"
    assert result.reason is None
    assert result.idle_power_mw == 3000.0
    assert result.samples >= 2
    assert_step_energy(result, n, interval_ms / 1000)
    assert 3000.0 < result.mean_power_mw <= 5000.0


def test_fake_tegrastats_rail_selection(tmp_path: Path) -> None:
    meter = TegrastatsMeter(binary=FAKE_TEGRASTATS, interval_ms=10, idle_s=0.05, rail="VDD_SOC")
    meter.start()
    time.sleep(0.1)
    result = meter.stop(1)
    assert result.sensor == "VDD_SOC"
    assert result.idle_power_mw == 1624.0 and result.mean_power_mw == 1624.0
    assert result.energy_mj_per_inference == 0.0


def test_fake_tegrastats_process_failure_is_a_reason() -> None:
    meter = TegrastatsMeter(binary=[*FAKE_TEGRASTATS, "--fail"], idle_s=0.05)
    meter.start()
    result = meter.stop(3)
    assert result.energy_mj_per_inference is None
    assert "exited with status 3" in result.reason and "Permission denied" in result.reason


def test_fake_tegrastats_lines_without_rails() -> None:
    meter = TegrastatsMeter(binary=[*FAKE_TEGRASTATS, "--no-rails"], interval_ms=5, idle_s=0.05)
    meter.start()
    result = meter.stop(3)
    assert result.energy_mj_per_inference is None
    assert "3 lines without power rails" in result.reason


def test_fake_tegrastats_window_shorter_than_sampling() -> None:
    meter = TegrastatsMeter(binary=FAKE_TEGRASTATS, interval_ms=1000, idle_s=0.05)
    meter.start()
    result = meter.stop(3)
    assert result.energy_mj_per_inference is None
    assert "0 power sample(s)" in result.reason


def test_tegrastats_missing_binary(tmp_path: Path) -> None:
    meter = open_meter("tegrastats", "jetson", settings={"tegrastats": {"binary": str(tmp_path / "nope")}})
    assert isinstance(meter, NullMeter)
    meter.start()
    result = meter.stop(1)
    assert result == EnergyResult(None, "tegrastats", result.reason, None, None, 0)
    assert result.reason.startswith("tegrastats unavailable:") and "not found" in result.reason


# --- open_meter ------------------------------------------------------------------------------------


def test_open_meter_auto_jetson_reports_every_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    meter = open_meter(
        None,
        "jetson-agx-orin",
        settings={"ina3221": {"root": tmp_path}, "tegrastats": {"binary": str(tmp_path / "tegrastats")}},
    )
    meter.start()
    result = meter.stop(1)
    assert result.energy_mj_per_inference is None and result.source == "none"
    assert result.reason.startswith("no power meter available for jetson-agx-orin (tried ina3221: ")
    assert "; tegrastats: " in result.reason and "; jtop: jetson-stats is not installed" in result.reason


def test_open_meter_auto_falls_through_to_tegrastats(tmp_path: Path) -> None:
    meter = open_meter(
        None, "jetson", settings={"ina3221": {"root": tmp_path}, "tegrastats": {"binary": FAKE_TEGRASTATS}}
    )
    assert isinstance(meter, TegrastatsMeter)


def test_open_meter_none_and_unknown_names() -> None:
    meter = open_meter("none", "cpu")
    meter.start()
    result = meter.stop(5)
    assert result.energy_mj_per_inference is None and result.source == "none" and result.reason
    with pytest.raises(InvalidOptionError, match=r"unknown power meter 'watts'.*nvml"):
        open_meter("watts", "cpu")
    with pytest.raises(InvalidOptionError, match="unknown device"):
        open_meter(None, "tpu")


def test_open_meter_jtop_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    meter = open_meter("jtop", "jetson")
    assert isinstance(meter, NullMeter)
    meter.start()
    assert meter.stop(1).reason == "jtop unavailable: jetson-stats is not installed (pip install jetson-stats)"


class FakeJtop:
    """FAKE jetson-stats ``jtop`` object: one update per interval, totals from a settable level."""

    level_mw = 3000.0

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.closed = False

    def start(self) -> None:
        pass

    def ok(self) -> bool:
        time.sleep(self.interval)
        return not self.closed

    @property
    def power(self) -> dict:
        entry = {"power": FakeJtop.level_mw, "avg": FakeJtop.level_mw}
        return {"rail": {"VDD_IN": entry}, "tot": entry}

    def close(self) -> None:
        self.closed = True


def test_fake_jtop_measures_step(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("jtop")
    module.__spec__ = importlib.machinery.ModuleSpec("jtop", None)
    module.jtop = FakeJtop
    module.JtopException = RuntimeError
    monkeypatch.setitem(sys.modules, "jtop", module)
    monkeypatch.setattr(FakeJtop, "level_mw", 3000.0)
    interval = 0.01
    meter = open_meter("jtop", "jetson", idle_s=0.1, settings={"jtop": {"interval_s": interval}})
    assert isinstance(meter, JtopMeter)
    meter.start()
    FakeJtop.level_mw = 5000.0
    time.sleep(0.5)
    result = meter.stop(5)
    assert result.source == "jtop" and result.sensor == "jtop total"
    assert result.idle_power_mw == pytest.approx(3000.0, rel=0.01)
    assert_step_energy(result, 5, interval)


def test_misuse_is_an_error() -> None:
    meter = open_meter("none", "cpu")
    with pytest.raises(InvalidOptionError, match="before start"):
        meter.stop(1)
    meter.start()
    with pytest.raises(InvalidOptionError, match="twice"):
        meter.start()
    with pytest.raises(InvalidOptionError, match="inferences"):
        meter.stop(0)
    with pytest.raises(InvalidOptionError, match="idle_s must be > 0"):
        TegrastatsMeter(idle_s=0)
    with pytest.raises(InvalidOptionError, match="interval_s must be > 0"):
        Ina3221Meter(interval_s=0)
