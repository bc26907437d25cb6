"""What ``lower --budget`` and ``search --budget`` print about the guarantee: each metric's bound beside its budget."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgebnn.budget import DEFAULT_CONFIDENCE, LABELS, check_confidence

CONFIDENCE_HELP = ("With --budget: the probability that the chosen lowering keeps the budget on new data from the "
                   "same distribution as the --eval/--data rows. Each metric's change is bounded at "
                   "this confidence over the rows (docs/uncertainty_budget.md); higher asks for more rows or "
                   "less compression.")


def confidence_option(func: Any) -> Any:
    """``--confidence P``, checked (a probability in [0.5, 1))."""

    def check(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
        return check_confidence(value)

    return click.option("--confidence", type=float, default=DEFAULT_CONFIDENCE, show_default=True,
                        metavar="P", callback=check, help=CONFIDENCE_HELP)(func)


def bounds_table(bounds: list[dict[str, Any]], confidence: float, title: str) -> Table:
    """metric · change on the certification rows · one-sided bound · budget · kept · how bounded."""
    table = Table(title=title, title_justify="left")
    for col in ("metric", "change (device)", f"bound ({confidence:.0%})", "budget", "kept", "bound by"):
        table.add_column(col, justify="left" if col in ("metric", "bound by", "kept") else "right")
    for b in bounds:
        rows = f"{b['rows']} rows" + (f", {b['ood_rows']} OOD" if b.get("ood_rows") is not None else "")
        table.add_row(LABELS.get(b["metric"], b["metric"]), f"{b['delta']:+.4f}", f"{b['bound']:+.4f}",
                      f"{b['limit']:+.4f}", "yes" if b["kept"] else "[bold red]no[/]", f"{b['method']}, {rows}")
    return table


def print_budget_bounds(console: Console, budget: dict[str, Any]) -> None:
    """``lower --budget``: the chosen lowering's bounds beside the budget, and what the guarantee rests on."""
    on = budget["measured_on"]
    cert = budget["certification"]
    title = (f"budget {budget['budget']}: certified at {budget['confidence']:.0%} confidence on "
             f"{on['certification_rows']} rows ({on['runtime']}, {on['draws']} device call(s) per input, against the "
             "float BNN's own export)")
    console.print(bounds_table(budget["bounds"], budget["confidence"], title))
    first = "slowest" if budget["order"] == "latency" else "largest"
    tested = f"{len(cert['tested'])} of {cert['candidates']} candidates tested in order, {first} first"
    walked = budget["evaluations"] - len(cert["tested"])  # the greedy walk's, on the selection rows
    how = (f"order: {budget['order']}" + (f" (chosen by {walked} configurations measured on {on['selection_rows']} "
                                          "other rows)" if on["selection_rows"] else " (data-free)"))
    console.print(f"chosen: {escape(budget['chosen'])}; {tested}; {how}", highlight=False)
    if cert["stopped"]:
        console.print(f"stopped: {escape(cert['stopped'])}", highlight=False)
    console.print(f"guarantee: with probability >= {budget['confidence']:.0%}, each metric's expected change on new "
                  "data exchangeable with these rows is within its bound's budget (docs/uncertainty_budget.md)",
                  highlight=False)


def print_search_certification(console: Console, certification: dict[str, Any] | None) -> None:
    """``search --budget``: every candidate tested (largest first, each at its level of the fallback procedure) and
    the best one's bounds."""
    if not certification:
        return
    tested = certification["tested"]

    def name(t: dict[str, Any]) -> str:
        return f"trial {t['number']}" if t.get("source") != "chain" else f"chain ({t['label']})"

    last = next((t for t in reversed(tested) if t["kept"]), None)  # the best: the smallest certified
    if last is not None:
        console.print(bounds_table(last["bounds"], 1 - last["level"],
                                   f"{name(last)}: certified on {certification['certification_rows']} rows "
                                   f"no trial was measured on (at level {last['level']:.3g})"))
    order = ", ".join(f"{name(t)}{'' if t['kept'] else ' (not certified)'}" for t in tested)
    console.print(f"candidates tested, largest first ({certification['trial_candidates']} trial(s), "
                  f"{certification['chain_candidates']} of lower --budget's chain; fallback procedure: "
                  f"{certification['confidence']:.0%} confidence over all of them): {order or 'none'}",
                  highlight=False)
