"""``edgebnn eval``'s tables at 80 columns: an artifact's name is never split over lines, no number is cut."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from edgebnn.tables import print_eval

LONG = "a_model_with_a_rather_long_name_v2.onnx"
METRICS = {"accuracy": 0.9733, "nll": 0.1021, "ece": 0.0187, "brier": 0.0441}
OOD = {"data": "permuted.npz", "n": 360, "auroc_mutual_info": 0.9712, "auroc_entropy": 0.9034,
       "aupr_mutual_info": 0.9655, "fpr_at_95_tpr": 0.1861, "mean_mutual_info_in": 0.0123,
       "mean_mutual_info_ood": 0.2345}


def _report(name: str) -> dict:
    return {"artifact": f"/some/dir/{name}", "runtime": "onnxruntime", "data": "digits", "split": "test", "n": 360,
            "samples": 16, **METRICS, "ood": OOD}


def _render(reports: list[dict], width: int = 80) -> list[str]:
    buf = io.StringIO()
    print_eval(Console(file=buf, width=width, force_terminal=False, color_system=None), reports)
    lines = buf.getvalue().splitlines()
    assert all(len(line) <= width for line in lines)
    return lines


@pytest.mark.parametrize("names", [[LONG], ["digits_cnn.onnx"], ["digits_cnn.ebnn", "digits_cnn.onnx", LONG]])
def test_each_name_and_number_whole_on_one_line_at_80_columns(names):
    lines = _render([_report(n) for n in names])
    text = "\n".join(lines)
    for name in names:
        assert any(name in line for line in lines), text
    for value in [*METRICS.values(), *(v for k, v in OOD.items() if k not in ("data", "n"))]:
        assert f"{value:.4f}" in text, text  # neither cut with an ellipsis nor folded
    assert "…" not in text, text


def test_short_names_stay_in_the_table():
    lines = _render([_report("digits_cnn.onnx")])
    assert sum("digits_cnn.onnx" in line and "0.9733" in line for line in lines) == 1
