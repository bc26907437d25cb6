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


# -- every table at 80 columns: words whole (tables.print_table) ---------------------------------------------------


def _render_table(table, width: int = 80) -> str:
    from edgebnn.tables import print_table

    buf = io.StringIO()
    print_table(Console(file=buf, width=width, force_terminal=False, color_system=None), table)
    text = buf.getvalue()
    assert all(len(line) <= width for line in text.splitlines()), text
    return text


def _families_table():
    from rich.table import Table

    table = Table(title="posterior families", title_justify="left")
    for col in ("family", "encodings", "importers", "draw", "store", "lowerings", "analytic"):
        table.add_column(col, overflow="fold")
    table.add_row("gaussian", "GaussianWeight", "bayesian-torch\nblitz", "μ + σ ε", "-", "-", "exact")
    table.add_row("laplace", "KronGaussianWeight\nDenseFixedWeight", "-", "own", "yes", "fixed, float", "per encoding")
    return table


def _words(table) -> set[str]:
    return {w for col in table.columns for cell in (col.header, *col.cells) for w in str(cell).split()}


@pytest.mark.parametrize("width", [80, 100, 160])
def test_a_table_never_splits_a_word(width):
    """rich alone folds 'GaussianWeight' into 'GaussianW' / 'eight' at 80 columns; every word stays whole here: in a
    table where the words fit, else in the records layout."""
    table = _families_table()
    text = _render_table(table, width)
    tokens = set(text.replace("│", " ").replace("┃", " ").split())
    assert _words(table) <= tokens, (_words(table) - tokens, text)


def test_too_narrow_a_table_prints_records_and_a_wide_one_is_unchanged():
    from edgebnn.tables import fitted_widths

    table = _families_table()
    narrow = Console(width=60, file=io.StringIO())
    assert fitted_widths(narrow, table) is None  # the longest words (18 + 14 + ...) and the frame exceed 60
    text = _render_table(table, 60)
    assert "┃" not in text and "family       laplace" in text and "  encodings  KronGaussianWeight" in text, text
    assert fitted_widths(Console(width=160, file=io.StringIO()), table) == [None] * 7


def test_the_profile_table_at_80_columns_keeps_names_and_says_what_inf_s_is():
    from edgebnn.tables import print_profile

    row = {"latency_ms": {"p50": 0.407, "p90": 0.497, "p99": 0.602, "mean": 0.434}, "throughput_per_s": 2305.2,
           "energy_mj_per_inference": None}
    report = {"device": "cpu", "runner": "onnxruntime", "batch": 1, "samples": 16, **row, "energy_reason": "none",
              "baselines": {"float_deterministic": dict(row), "float_bnn": dict(row)},
              "ratios": {"vs_float_deterministic": 6.0, "speedup_vs_float_bnn": 7.2, "of": "p50s"}}
    buf = io.StringIO()
    print_profile(Console(file=buf, width=80, force_terminal=False, color_system=None), report)
    text = buf.getvalue()
    assert "float_deterministic" in text and "…" not in text, text
    flat = " ".join(text.split())
    assert "inf/s (mean): batch / mean ms" in flat and "2305.2" in flat, text
