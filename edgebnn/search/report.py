"""The search report as a rich table and a Pareto plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgebnn.search.objectives import OBJECTIVES
from edgebnn.tables import fmt_bytes, print_table, times_smaller


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_search(console: Console, report: dict[str, Any]) -> None:
    """One row per trial (Pareto trials marked ``*``, the best ``>``), then the float BNN and the choice."""
    base = report["baseline"]
    pareto = {t["number"] for t in report["pareto"]}
    best = report["best"]["number"] if report["best"] else None
    shown = _shown_metrics(base["metrics"])
    table = Table(title=f"edgebnn search · {len(report['trials'])} trials on {report['settings']['device']} · "
                        f"float BNN {fmt_bytes(base['bytes'])}, "
                        + ", ".join(f"{_LABELS.get(k, k)} {base['metrics'][k]:.4f}" for k in shown if k != "accuracy"),
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("#", "right"), ("config", "left"), ("bytes", "right"), ("ratio", "right"),
                          ("ms", "right"), *((_LABELS.get(k, k), "right") for k in shown)):
        table.add_column(name, justify=justify, no_wrap=name != "config")  # type: ignore[arg-type]
    notes = []
    for t in report["trials"]:
        mark = ">" if t["number"] == best else "*" if t["number"] in pareto else ""
        m = t.get("metrics") or {}
        if t["state"] != "complete":
            notes.append(f"trial {t['number']} failed: {t.get('error')}")
        elif t.get("profile_error"):
            notes.append(f"trial {t['number']}: no latency: {t['profile_error']}")
        table.add_row(f"{mark}{t['number']}", escape(_describe(t["config"])) if t.get("config") else "-",
                      "-" if t.get("bytes") is None else fmt_bytes(t["bytes"]),
                      "-" if t.get("bytes") is None else f"{base['bytes'] / t['bytes']:.1f}",
                      _num(t.get("latency_ms"), ".3f"), *(_num(m.get(k), ".4f") for k in shown[:-1]),
                      _num(m.get(shown[-1]), ".4f") if t["state"] == "complete" else "failed")
    print_table(console, table)
    console.print("* Pareto front   > best   bytes: the exported ONNX file   ratio: float BNN bytes / bytes",
                  highlight=False)
    for note in notes:
        console.print(note, highlight=False, markup=False)
    if report["best"]:
        b = report["best"]
        console.print(f"best: {escape(describe_best(b))}: {fmt_bytes(b['bytes'])}, "
                      f"{times_smaller(base['bytes'], b['bytes'], 'float BNN')}; {report['best_reason']}",
                      highlight=False)
    else:
        console.print(f"best: none: {escape(report['best_reason'])}", highlight=False)


_LABELS = {"accuracy": "acc", "nll": "NLL", "ece": "ECE"}


def _shown_metrics(metrics: dict[str, Any]) -> tuple[str, ...]:
    """The metric columns: accuracy, NLL and ECE of a classifier; another task's own report (a regression's, a
    plug-in task's), its numbers in order."""
    if all(k in metrics for k in _LABELS):
        return tuple(_LABELS)
    return tuple(k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool))


def describe_best(best: dict[str, Any]) -> str:
    """``trial 3 (fixed b4 σ1 S16 baked/int8)``, or a candidate of ``lower --budget``'s chain by its label."""
    if best.get("source") == "chain":
        return f"lower --budget's chain ({best['label']}, S{best['samples']}, the default export)"
    return f"trial {best['number']} ({_describe(best['config'])})"


def _describe(config: dict[str, Any]) -> str:
    """``fixed b4 σ1 S16 baked/int8 hoist``: scheme, bits, σ bits, S, mode/weights, ``hoist`` when hoisting."""
    sigma = "" if config.get("sigma_bits") is None else f" σ{config['sigma_bits']}"
    return (f"{config['scheme']} b{config['bits']}{sigma} S{config['samples']} {config['mode']}/{config['weights']}"
            f"{' hoist' if config['hoist'] != 'off' else ''}")


def front_data(report: dict[str, Any]) -> dict[str, Any]:
    """What the search plot draws (:func:`edgebnn.plots.plot_search_front`): the first two objectives as x and y
    (``bytes`` against the first metric when only one is searched), every completed trial and the Pareto set as
    points sorted by x, ``step`` (join the Pareto set by a step line: only for a true 2-D front, two objectives),
    the best trial, the float BNN, and ``budget_y``: the budget's bound on the y metric (the float BNN's value plus
    the allowed change), None without one."""
    names = [o["name"] for o in report["objectives"]]
    if len(names) > 1:
        x_name, y_name = names[:2]
    else:  # one objective: against bytes, or bytes against NLL
        x_name, y_name = ("bytes", "nll") if names[0] in ("bytes", "nll") else ("bytes", names[0])
    x_obj, y_obj = OBJECTIVES[x_name], OBJECTIVES[y_name]

    def points(trials: list[dict[str, Any]]) -> list[tuple[float, float]]:
        pts = [(x_obj.value(t), y_obj.value(t)) for t in trials if t["state"] == "complete"]
        return sorted((x, y) for x, y in pts if x is not None and y is not None)

    base = {"bytes": report["baseline"]["bytes"], "metrics": report["baseline"]["metrics"]}
    baseline = (x_obj.value(base), y_obj.value(base))
    budget = report.get("budget") or {}
    y_base = baseline[1]
    return {
        "x": x_name, "y": y_name, "objectives": names, "trials": points(report["trials"]),
        "pareto": points(report["pareto"]), "step": len(names) == 2,
        "best": points([report["best"]]) if report["best"] else [],
        "best_label": "best within budget" if budget else "smallest",
        "baseline": baseline if None not in baseline else None,
        "budget_y": y_base + budget[y_name] if y_name in budget and y_base is not None else None,
        "budget": budget, "log_x": x_name in ("bytes", "artifact_bytes", "ir_bytes"),
        "title": f"edgebnn search on {report['settings']['device']}: {len(report['trials'])} trials",
    }


def plot_front(report: dict[str, Any], path: str | Path) -> Path:
    """The search's picture (:func:`front_data`, drawn by :func:`edgebnn.plots.plot_search_front`)."""
    from edgebnn.plots import plot_search_front

    return plot_search_front(front_data(report), path)
