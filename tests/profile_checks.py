"""What a profile report must hold (docs/design.md's keys): shared by tests/unit/test_profiler.py and
tests/integration/test_remote_profile.py."""

from __future__ import annotations

FIELDS = {"latency_ms", "throughput_per_s", "energy_mj_per_inference", "energy_source", "energy_reason"}


def check_report(report: dict, device: str) -> None:
    """The keys docs/design.md promises, for the ensemble and both baselines."""
    assert report["schema"] == "edgebnn.profile/1" and report["edgebnn_version"]
    assert report["device"] == device
    for key in ("runner", "batch", "baselines", *FIELDS):
        assert key in report, key
    assert set(report["baselines"]) == {"float_deterministic", "float_bnn"}
    for row in (report, *report["baselines"].values()):
        assert set(row) >= FIELDS
        assert {"p50", "p90", "p99", "mean"} <= set(row["latency_ms"])
        assert row["energy_mj_per_inference"] is None and row["energy_reason"]  # no sensor: null, with why
