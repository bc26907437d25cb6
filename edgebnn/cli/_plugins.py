"""``edgebnn plugins``: what is loaded (the package's families, plug-ins) and what each registered."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from edgebnn.cli._common import console, main, write_json
from edgebnn.cli._paths import OutputPath
from edgebnn.schemas import PLUGINS
from edgebnn.tables import print_table


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
                              "families": [f.describe() for f in families()], "tasks": sorted(TASKS)}
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
        lowerings = sorted({s for schemes in f["lowerings"].values() for s in schemes})
        fams.add_row(f["name"], "\n".join(f["encodings"]), "\n".join(f["importers"]) or "-",
                     "own" if f["draws"] else "μ + σ ε" if f["gaussian_draws"] else "-",
                     "yes" if f["stores"] else "-", ", ".join(lowerings) or "-",
                     ", ".join(f["analytic"]))
    print_table(console, fams)
    console.print(f"tasks: {', '.join(report['tasks'])}", highlight=False)
    write_json(as_json, report, PLUGINS)
