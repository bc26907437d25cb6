"""``edgebnn plugins``: what is loaded (the package's families, plug-ins) and what each registered."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from edgebnn.cli._common import console, main, write_json
from edgebnn.cli._paths import OutputPath
from edgebnn.schemas import PLUGINS
from edgebnn.tables import print_table


def _lowered_by(family: Any) -> dict[str, list[str]]:
    """{op type: the schemes that lower it}, in the schemes' order: a mean-field Gaussian by every scheme's pass, a
    family's own encoding by its lowerings (with the settings they honour: ``fixed (bits)``), ``float`` keeping
    it; none for one that every scheme keeps as it is (a lowered form, a dropout mask)."""
    from edgebnn.passes.base import family_lowerings, honours, lowers
    from edgebnn.passes.config import SCHEMES

    out = {}
    for op in family.op_types:
        table = family_lowerings(op) or {}
        out[op] = [s + (f" ({', '.join(sorted(honours(table[s])))})" if s in table and honours(table[s]) else "")
                   for s in SCHEMES if lowers(op, s)]
    return out


@main.command()
@click.option("--json", "as_json", type=OutputPath("json"), help="Also write the listing as JSON to this file.")
def plugins(as_json: str | None) -> None:
    """List the plug-ins loaded and what each registered (posterior families, encodings, tasks), then every
    family with its importers, draws, stores, lowerings and what --mode analytic does with it.

    \b
    A plug-in is a module that registers a family or a task on import (docs/extending.md). It loads when its
    package declares an entry point in the group 'edgebnn.plugins', or when named:
      edgebnn --plugin my_package.my_family lower ...       (repeatable)
      EDGEBNN_PLUGINS=my_package.my_family edgebnn lower ...
    """
    from edgebnn.plugins import families, load
    from edgebnn.tasks import TASKS

    loaded = load()
    report: dict[str, Any] = {"plugins": [p.describe() for p in loaded],
                              "families": [{**f.describe(), "lowered_by": _lowered_by(f)} for f in families()],
                              "tasks": sorted(TASKS)}
    table = Table(title="plug-ins loaded", title_justify="left")
    for column in ("name", "module", "from", "registered"):
        table.add_column(column)
    for p in loaded:
        what = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in p.registered.items()) or "-"
        table.add_row(p.name, p.module, p.source, what)
    print_table(console, table)
    fams = Table(title="posterior families", title_justify="left")
    for column in ("family", "encodings", "importers", "draw", "store", "lowerings", "analytic"):
        fams.add_column(column, overflow="fold")
    for f in report["families"]:
        lowerings = "\n".join(", ".join(f["lowered_by"][op]) or "kept by every scheme" for op in f["encodings"])
        fams.add_row(f["name"], "\n".join(f["encodings"]), "\n".join(f["importers"]) or "-",
                     "own" if f["draws"] else "μ + σ ε" if f["gaussian_draws"] else "-",
                     "yes" if f["stores"] else "-", lowerings,
                     ", ".join(f["analytic"]))
    print_table(console, fams)
    console.print(f"tasks: {', '.join(report['tasks'])}", highlight=False)
    write_json(as_json, report, PLUGINS)
