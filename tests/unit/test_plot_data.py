"""The data the pictures draw: the reliability diagram's bins and the search front's points (not pixels)."""

from __future__ import annotations

import numpy as np
import pytest

from edgebnn.plots import MIN_BIN_COUNT, bytes_axis, plot_evaluation, plot_search_front, reliability_bins
from edgebnn.search.report import front_data


def test_reliability_bins_put_each_dot_at_its_bins_mean_confidence_and_count_its_inputs():
    """3 bins of [0, 1]: an empty one is left out; the dot's x is the bin's mean confidence (not its centre), its y
    the accuracy; a bin of fewer than MIN_BIN_COUNT inputs is hollow."""
    rel = {"count": [0, 2, 40], "confidence": [float("nan"), 0.40, 0.95], "accuracy": [float("nan"), 0.5, 0.9]}
    b = reliability_bins(rel)
    np.testing.assert_allclose(b["left"], [1 / 3, 2 / 3])
    np.testing.assert_allclose(b["width"], [1 / 3, 1 / 3])
    np.testing.assert_array_equal(b["count"], [2, 40])
    np.testing.assert_allclose(b["confidence"], [0.40, 0.95])  # centres would be 0.5 and 0.833
    np.testing.assert_allclose(b["accuracy"], [0.5, 0.9])
    assert b["solid"].tolist() == [False, True] and MIN_BIN_COUNT > 2


def test_the_evaluation_picture_is_written(tmp_path):
    rel = {"count": [0, 2, 40], "confidence": [float("nan"), 0.40, 0.95], "accuracy": [float("nan"), 0.5, 0.9]}
    path = plot_evaluation(rel, np.array([0.01, 0.02]), np.array([0.3]), tmp_path / "e.png", title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _trial(number: int, size: float, nll: float, ece: float) -> dict:
    return {"number": number, "state": "complete", "bytes": size, "metrics": {"nll": nll, "ece": ece}}


def _report(objectives: list[str], budget: dict | None) -> dict:
    trials = [_trial(0, 20_000, 0.30, 0.02), _trial(1, 50_000, 0.10, 0.05), _trial(2, 400_000, 0.05, 0.01),
              _trial(3, 60_000, 0.40, 0.06), {"number": 4, "state": "failed", "bytes": None, "metrics": None}]
    return {"objectives": [{"name": n} for n in objectives], "trials": trials, "pareto": trials[2::-1],
            "best": trials[1] if budget else trials[0], "budget": budget,
            "baseline": {"bytes": 110_000, "metrics": {"nll": 0.06, "ece": 0.02}}, "settings": {"device": "cpu"}}


@pytest.mark.parametrize(("objectives", "step"), [(["bytes", "nll", "ece"], False), (["bytes", "nll"], True)])
def test_the_front_is_points_with_a_step_line_only_in_two_dimensions(objectives, step):
    """The Pareto set sorted by bytes; a 3-objective set is not joined (it zig-zags in the bytes-NLL plane); the
    budget line sits at the float BNN's NLL + its allowed change."""
    data = front_data(_report(objectives, {"nll": 0.1, "ece": 0.03}))
    assert data["pareto"] == [(20_000, 0.30), (50_000, 0.10), (400_000, 0.05)] and data["step"] is step
    assert len(data["trials"]) == 4  # the failed trial is not drawn
    assert data["budget_y"] == pytest.approx(0.06 + 0.1) and data["best"] == [(50_000, 0.10)]
    assert data["baseline"] == (110_000, 0.06) and data["log_x"]
    assert front_data(_report(objectives, None))["budget_y"] is None


def test_the_bytes_axis_has_few_readable_ticks(tmp_path):
    """Powers of 2 labelled in KiB/MiB, at most 8 over 16 KB..4 MB, no minor labels (they overlapped)."""
    from matplotlib.figure import Figure

    path = plot_search_front(front_data(_report(["bytes", "nll", "ece"], {"nll": 0.1})), tmp_path / "f.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    ax = Figure().add_subplot()
    ax.plot([16_000, 4_000_000], [0, 1])
    bytes_axis(ax)
    ax.set_xlim(16_000, 4_000_000)
    ticks = [t for t in ax.get_xticks() if 16_000 <= t <= 4_000_000]
    labels = [ax.xaxis.get_major_formatter()(t) for t in ticks]
    assert 3 <= len(ticks) <= 8 and all(np.log2(t) == int(np.log2(t)) for t in ticks), ticks
    assert "32.0 KiB" in labels and "1.0 MiB" in labels, labels
    assert ax.xaxis.get_minor_formatter()(20_000) == ""
