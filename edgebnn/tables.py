"""Readable tables for people (rich); the JSON reports are for machines."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgebnn._io import atomic_write_json
from edgebnn._version import __version__


def write_json(console: Console, path: str | Path | None, report: dict[str, Any], schema: str) -> None:
    """Write ``report`` with ``schema`` and ``edgebnn_version`` atomically and say so (no-op without a path)."""
    if not path:
        return
    atomic_write_json(path, {"schema": schema, "edgebnn_version": __version__, **report})
    console.print(f"wrote {path}")


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


COMPACT_ROWS = 24  # more layers than this: one row per (encoding, bits) group unless verbose


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` so that no word is split: rich narrows the widest column of a table too wide for the console
    below its longest word (``GaussianW``/``eight``); here every column keeps at least its longest word (a ``no_wrap``
    column its longest line) and the room left makes whole the columns it takes the least room to. A table whose
    words alone do not fit prints as records instead (:func:`_print_records`)."""
    widths = fitted_widths(console, table)
    if widths is None:
        _print_records(console, table)
        return
    for column, width in zip(table.columns, widths, strict=True):
        if width is not None:
            column.width = width
    console.print(table)


def fitted_widths(console: Console, table: Table) -> list[int | None] | None:
    """Content widths that keep every word of ``table`` whole within ``console.width`` (:func:`print_table`):
    ``[None, ...]`` where it fits as it is, None where it cannot (records)."""
    texts = [[console.render_str(c).plain if isinstance(c, str) else str(c) for c in (col.header, *col.cells)]
             for col in table.columns]
    natural = [max(cell_len(line) for t in col for line in (t.splitlines() or [""])) for col in texts]
    least = [n if col.no_wrap else max((cell_len(w) for t in texts[i] for w in t.split()), default=1)
             for i, (col, n) in enumerate(zip(table.columns, natural, strict=True))]
    least = [max(m, col.min_width or 0) for m, col in zip(least, table.columns, strict=True)]
    # rich's frame: each column's padding (Table._get_padding_width) and the borders (Table._extra_width)
    frame = table._extra_width + sum(table._get_padding_width(i) for i in range(len(table.columns)))
    room = console.width - frame
    if sum(natural) <= room:
        return [None] * len(natural)
    if sum(least) > room:
        return None
    widths = list(least)
    left = room - sum(widths)
    # the cheapest columns to make whole first (fewest lines wrapped), what is left to the one short the most
    for i in sorted(range(len(widths)), key=lambda i: natural[i] - widths[i]):
        if 0 < natural[i] - widths[i] <= left:
            left -= natural[i] - widths[i]
            widths[i] = natural[i]
    short = [n - w for n, w in zip(natural, widths, strict=True)]
    widths[short.index(max(short))] += min(left, max(short))
    return list(widths)


def _print_records(console: Console, table: Table) -> None:
    """``table`` one row at a time: its first column's header and cell in bold, then each other column's header and
    value (indented; empty values left out)."""
    if table.title:
        console.print(table.title, highlight=False)
    columns = table.columns
    headers = [console.render_str(c.header).plain if isinstance(c.header, str) else str(c.header) for c in columns]
    for row in zip(*(list(c.cells) for c in columns), strict=True):
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row(f"[bold]{escape(headers[0])}[/]", f"[bold]{row[0]}[/]" if isinstance(row[0], str) else row[0])
        for header, cell in zip(headers[1:], row[1:], strict=True):
            if str(cell).strip():
                grid.add_row(f"  {header}", cell)
        console.print(grid)
    if table.caption:
        console.print(table.caption, highlight=False)


def _header(console: Console, rows: list[tuple[str, str]]) -> None:
    """A two-column summary: label, value (values wrap; labels never do)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(label, value)
    console.print(grid)


def _model_rows(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The source row of an IR manifest or an export's metadata (read and checked: its task is a known one)."""
    from edgebnn.tasks import Task  # here, as below: the command line imports this module for --help

    shape = manifest.get("input_shape") or []
    what = Task.parse(manifest.get("task"), manifest.get("task_options"), "manifest").describe(
        int(manifest.get("num_classes", 0)))
    return [("source", f"{manifest.get('source_library', '?')} · input {tuple(shape)} · {what}")]


class _Footnotes:
    """Long notes leave the table: the cell shows ``[n]``, the note is printed once under the table."""

    def __init__(self) -> None:
        self.notes: dict[str, int] = {}

    def ref(self, note: str) -> str:
        if not note:
            return ""
        return f"[{self.notes.setdefault(note, len(self.notes) + 1)}]"

    def print(self, console: Console) -> None:
        for note, i in self.notes.items():
            console.print(f"[{i}] {note}", highlight=False, markup=False)


def print_lower_report(console: Console, report: dict[str, Any], output: str, *, model: str | None = None,
                       manifest: dict[str, Any] | None = None, verbose: bool = False) -> None:
    """The lowering report: a summary header, then the layers in a table that fits the console.

    Args:
        console: Where to print.
        report: The lowering report (:func:`edgebnn.passes.lower`).
        output: The .ebnn written.
        model: What was lowered (e.g. the factory and weights), for the header.
        manifest: The IR's manifest (source library, input shape, classes), for the header.
        verbose: One row per layer however many there are (otherwise a model with more than
            ``COMPACT_ROWS`` layers gets one row per encoding and bit width).
    """
    layers = report["layers"]
    rows = [("model", f"{model} → {output}" if model else output)]
    rows += _model_rows(manifest) if manifest else []
    rows += [
        ("scheme", f"{report['scheme']} · seed {report.get('seed', 0)} · {len(layers)} Bayesian weights"),
        ("size", f"{fmt_bytes(report['total_bytes'])} of IR tensors (weights and their codes; the file adds its "
                 f"graph): {times_smaller(report['float_bnn_bytes'], report['total_bytes'], 'fp32 BNN')}"),
    ]
    calibration = report.get("calibration")
    if calibration:
        done = [r for r in layers if r.get("rounding") == "gptq"]
        after = sum(r["output_error"] for r in done) / max(len(done), 1)
        before = sum(r["output_error_nearest"] for r in done) / max(len(done), 1)
        rows.append(("rounding", f"GPTQ on {calibration['inputs']} inputs of {calibration['data']}: {len(done)} "
                                 f"weights, mean output error {after:.2%} (nearest rounding: {before:.2%})"))
    _header(console, rows)
    notes = _Footnotes()
    sparse = any(layer.get("sparsity") for layer in layers)
    if verbose or len(layers) <= COMPACT_ROWS:
        table = Table(title_justify="left")
        table.add_column("layer", overflow="fold", ratio=1, min_width=12)
        for col in ("encoding", "weights", "bits", *(("sparsity",) if sparse else ()), "bytes", "note"):
            table.add_column(col, justify="left" if col in ("encoding", "note") else "right", no_wrap=True)
        for layer in layers:
            table.add_row(
                layer["name"], str(layer.get("kind", "")).removesuffix("Weight"), f"{layer['n_weights']:,}",
                str(layer.get("bits", "")),
                *((f"{layer.get('sparsity', 0.0):.1%}",) if sparse else ()), fmt_bytes(int(layer["bytes"])),
                notes.ref(str(layer.get("skipped") or layer.get("note") or "")),
            )
    else:
        table = _grouped(layers, [("kind", "encoding"), ("bits", "bits")], sparse)
    print_table(console, table)
    notes.print(console)
    if not verbose and len(layers) > COMPACT_ROWS:
        console.print(f"{len(layers)} layers grouped by encoding and bits; --verbose lists each layer "
                      "(--report FILE writes them all as JSON)", highlight=False)


def _grouped(layers: list[dict[str, Any]], keys: list[tuple[str, str]], sparse: bool) -> Table:
    """One row per distinct value of ``keys``: how many layers, weights and bytes."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for layer in layers:
        groups.setdefault(tuple(str(layer.get(k, "")).removesuffix("Weight") for k, _ in keys), []).append(layer)
    table = Table(title_justify="left")
    for _, title in keys:
        table.add_column(title)
    for col in ("layers", "weights", *(("sparsity",) if sparse else ()), "bytes", "first layer"):
        table.add_column(col, justify="left" if col == "first layer" else "right",
                         overflow="ellipsis" if col == "first layer" else "fold")
    for key, members in groups.items():
        n = sum(m["n_weights"] for m in members)
        zeros = sum(m.get("sparsity", 0.0) * m["n_weights"] for m in members)
        table.add_row(*key, str(len(members)), f"{n:,}", *((f"{zeros / max(n, 1):.1%}",) if sparse else ()),
                      fmt_bytes(sum(int(m["bytes"]) for m in members)), members[0]["name"])
    return table


def print_inspect(console: Console, info: dict[str, Any], *, verbose: bool = False) -> None:
    """``edgebnn inspect``: a summary header, then the encoded weights in a table that fits the console."""
    ops = ", ".join(f"{k} {v}" for k, v in sorted(info.get("ops", {}).items(), key=lambda kv: -kv[1]))
    if "export" in info:  # an exported .onnx
        meta = info["export"]
        rows = [("file", info["file"]), *_model_rows(meta),
                ("ensemble", f"{meta.get('mode')} · S={meta.get('samples')} · scheme {meta.get('scheme')} · "
                             f"{fmt_bytes(info['bytes'])}"),
                ("opset", ", ".join(f"{d} {v}" for d, v in info["opset"]))]
        rows += [("approximates", note) for note in meta.get("approximations") or ()]
        layers = meta.get("layers")
        if layers:
            rows.append(("sampled", ", ".join(layers.get("sampled", [])) or "none"))
            rows.append(("hoisted", ", ".join(layers.get("hoisted", [])) or "none"))
        _header(console, [*rows, ("ops", ops)])
        if info.get("deployed"):
            print_deployed(console, info["deployed"])
        return
    manifest = info["manifest"]
    weights = info["layers"]
    n = sum(w["n_weights"] for w in weights)
    passes = " → ".join(p.get("name", "?") for p in manifest.get("passes", [])) or "none"
    _header(console, [
        ("file", info["file"]), *_model_rows(manifest),
        ("scheme", f"{manifest.get('scheme')} · passes: {passes}"),
        ("size", f"{fmt_bytes(info['total_bytes'])} for {n:,} Bayesian weights in {len(weights)} tensors"),
        ("format", f"edgebnn IR {manifest.get('format_version')} · edgebnn {manifest.get('edgebnn_version')}"),
        ("ops", ops),
    ])
    if not weights:
        return
    if verbose or len(weights) <= COMPACT_ROWS:
        table = Table(title_justify="left", pad_edge=False)  # 80 columns (a pipe) hold all seven, borders included
        table.add_column("weight", overflow="fold", ratio=1, min_width=12)  # names wrap, never truncate
        for col in ("encoding", "shape", "weights", "bytes", "mean|μ|", "mean σ"):
            wraps = col in ("encoding", "shape")  # the columns that may fold when the console is narrower still
            table.add_column(col, justify="left" if wraps else "right", overflow="fold" if wraps else "ellipsis",
                             no_wrap=not wraps)
        for row in weights:
            table.add_row(row["name"], row["encoding"].removesuffix("Weight"), "x".join(map(str, row["shape"])),
                          f"{row['n_weights']:,}", fmt_bytes(row["bytes"]), f"{row['mean_abs_mu']:.4g}",
                          f"{row['mean_sigma']:.4g}")
        print_table(console, table)
        return
    print_table(console, _grouped(weights, [("encoding", "encoding")], sparse=False))
    console.print(f"{len(weights)} weights grouped by encoding; --verbose lists each, --json prints everything",
                  highlight=False)


_DEPLOYED_ROWS = (("codes", "codes", "quantized levels, indices, counts, packed bits"),
                  ("tables", "scales and tables", "scales, zero points, codebooks"),
                  ("float_weights", "float weights", "μ/σ, baked members, biases, BatchNorm"),
                  ("graph", "graph", "nodes, names, shapes, metadata"))


def times_smaller(reference: int | None, size: int, what: str) -> str:
    """``3.84x smaller than the fp32 BNN (157.3 KiB)``, or ``1.75x larger than ...``; unknown reference: said so."""
    if not reference or size <= 0:
        return f"{what}: not recorded"
    ratio = reference / size
    word = f"{ratio:.2f}x smaller" if ratio >= 1 else f"{1 / ratio:.2f}x larger"
    return f"{word} than the {what} ({fmt_bytes(reference)})"


def print_deployed(console: Console, deployed: dict[str, Any], *, title: str = "deployed") -> None:
    """What an exported file costs the device (:meth:`edgebnn.exporters.sizes.DeployedSize.to_dict`): the bytes,
    the ratios to the fp32 BNN and the ``.ebnn``, the breakdown and the inputs a caller must fill."""
    total = int(deployed["file_bytes"])
    _header(console, [
        (title, f"{fmt_bytes(total)} ({total:,} bytes): "
                f"{times_smaller(deployed.get('float_bnn_bytes'), total, 'fp32 BNN')}; "
                f"{times_smaller(deployed.get('ebnn_bytes'), total, '.ebnn')}"),
    ])
    table = Table(title_justify="left")
    for col in ("part", "bytes", "share", "tensors", "what"):
        table.add_column(col, justify="left" if col in ("part", "what") else "right",
                         overflow="fold" if col == "what" else "ellipsis", no_wrap=col != "what")
    counts = deployed.get("tensors", {})
    for key, label, what in _DEPLOYED_ROWS:
        n = int(deployed["breakdown"][key])
        table.add_row(label, f"{n:,}", f"{n / total:.1%}" if total else "-",
                      "" if key == "graph" else str(counts.get(key, "")), what)
    print_table(console, table)
    noise = deployed.get("noise_inputs") or []
    if deployed.get("self_contained"):
        inputs = "1 (the data): self-contained, runs on the data alone"
    else:
        inputs = (f"{deployed['inputs']}: the data + {len(noise)} noise input(s) the host must draw on every call "
                  f"({', '.join(noise[:4])}{', ...' if len(noise) > 4 else ''})")
    console.print(f"graph inputs: {inputs}", highlight=False, markup=False)


def _artifact_table(console: Console, title: str, columns: tuple[str, ...], names: list[str],
                    rows: list[list[str]]) -> tuple[Table, _Footnotes]:
    """A table whose first column names the artifacts, each on one line.

    A name never wraps (a file name split over two lines cannot be copied): when the names do not fit the
    console's width beside the other columns, the cells show ``[n]`` and the names follow the table as footnotes.
    Headers wrap at spaces when the table would not fit otherwise; cells never do.
    """
    notes = _Footnotes()
    keyed = False
    for keyed in (False, True):
        first = [notes.ref(n) for n in names] if keyed else [escape(n) for n in names]
        cells = [first, *zip(*rows, strict=True)]
        # every cell on one line, headers whole (natural) or wrapped at spaces (narrowest); 3 per column for the
        # padding and the rule, 1 for the closing border
        natural = [max(cell_len(col), *map(cell_len, c)) for col, c in zip(columns, cells, strict=True)]
        narrowest = [max(*map(cell_len, col.split()), *map(cell_len, c)) for col, c in zip(columns, cells,
                                                                                              strict=True)]
        frame = 3 * len(columns) + 1
        if sum(narrowest) + frame <= console.width:
            break
    fixed = sum(natural) + frame > console.width and sum(narrowest) + frame <= console.width
    table = Table(title=title, title_justify="left")
    for col, width in zip(columns, narrowest, strict=True):
        table.add_column(col, justify="left" if col in ("artifact", "runtime") else "right", no_wrap=col == columns[0],
                         width=width if fixed else None)
    for row in zip(first, *zip(*rows, strict=True), strict=True):
        table.add_row(*row)
    return table, notes


def eval_columns(report: dict[str, Any]) -> tuple[str, ...]:
    """The metric columns of an ``eval`` or ``compare`` report's task (:attr:`edgebnn.tasks.Task.columns`)."""
    from edgebnn.tasks import DEFAULT_TASK, task_class

    return task_class(report.get("task") or DEFAULT_TASK, "report").columns


def print_eval(console: Console, reports: list[dict[str, Any]]) -> None:
    """The task's metric rows (one per artifact; a classifier's accuracy/NLL/ECE/Brier), the task's line under
    them (:meth:`edgebnn.tasks.Task.summary`), and the OOD detection metrics when present."""
    first = reports[0]
    title = f"{first['data']}/{first['split']}" if first.get("split") else str(first["data"])
    names = [Path(r["artifact"]).name for r in reports]
    keys = eval_columns(first)
    rows = [[r["runtime"], *(f"{r[k]:.4f}" for k in keys), str(r["samples"])] for r in reports]
    table, notes = _artifact_table(console, f"{title} (n={first['n']})", ("artifact", "runtime", *keys, "S"),
                                   names, rows)
    console.print(table)
    notes.print(console)
    from edgebnn.tasks import DEFAULT_TASK, task_class

    for r in reports:
        line = task_class(r.get("task") or DEFAULT_TASK, "report").summary(r)
        if line:
            console.print(f"{Path(r['artifact']).name}: {line}", highlight=False)
    oods = [r for r in reports if r.get("ood")]
    if not oods:
        return
    ood = oods[0]["ood"]
    rows = [[f"{r['ood'][k]:.4f}" for k in ("auroc_mutual_info", "auroc_entropy", "aupr_mutual_info",
                                             "fpr_at_95_tpr", "mean_mutual_info_in", "mean_mutual_info_ood")]
            for r in oods]
    total, epistemic = ood_labels(ood)
    table, notes = _artifact_table(
        console, f"OOD: {ood['data']} (n={ood['n']}) vs {title}",
        ("artifact", f"AUROC {epistemic}", f"AUROC {total}", f"AUPR {epistemic}", "FPR@95TPR", f"{epistemic} in",
         f"{epistemic} OOD"),
        [Path(r["artifact"]).name for r in oods], rows)
    console.print(table)
    notes.print(console)


def ood_labels(ood: dict[str, Any]) -> tuple[str, str]:
    """How tables name an OOD report's (total, epistemic) scores: the task's (``ood.scores``; reports written
    before it: entropy and MI)."""
    total, epistemic = (ood.get("scores") or {}).get("short", ("entropy", "MI"))
    return str(total), str(epistemic)


_EVAL_ROWS = (("accuracy", "accuracy", False), ("nll", "NLL", True), ("ece", "ECE", True), ("brier", "Brier", True),
              ("rmse", "RMSE", True), ("mae", "MAE", True), ("calibration_error", "calibration error", True),
              ("pixel_accuracy", "pixel accuracy", False), ("mean_iou", "mean IoU", False))


def print_lower_eval(console: Console, ev: dict[str, Any], budget: dict[str, Any] | None = None, *,
                     lowered: str = "lowered", path: str | None = None) -> None:
    """``lower --eval``: the float BNN and the lowered model side by side with the change (and the budget).

    Args:
        console: Where to print.
        ev: The ``eval`` part of a lowering report (:func:`edgebnn.api.lowering_quality`).
        budget: The ``budget`` part (``lower --budget``): adds each metric's limit, the layers' bits and why,
            and a warning line per broken limit.
        lowered: The lowered model's name, for the column header.
        path: The ``.ebnn`` written, for the export command the budget's deployed line names.
    """
    title = f"{ev['data']}/{ev['split']}" if ev.get("split") else str(ev["data"])
    title += f" (n={ev['n']}, S={ev['samples']}, seed {ev['seed']})"
    if ev.get("ood_data"):
        title += f" · OOD {ev['ood_data']}"
    if budget is not None:
        title += " · reference runtime, all rows"
    table = Table(title=title, title_justify="left")
    for col in ("metric", "float BNN", lowered, "change"):
        table.add_column(col, justify="left" if col == "metric" else "right", overflow="fold")
    before, after = ev["float_bnn"], ev["lowered"]
    rows = [(key, label, before[key], after[key]) for key, label, _ in _EVAL_ROWS if key in before and key in after]
    if "ood" in before and "ood" in after:
        rows.append(("auroc", f"{ood_labels(after['ood'])[1]}-AUROC (OOD)", before["ood"]["auroc_mutual_info"],
                     after["ood"]["auroc_mutual_info"]))
    for _key, label, b, a in rows:
        table.add_row(label, f"{b:.4f}", f"{a:.4f}", f"{a - b:+.4f}")
    print_table(console, table)
    if budget is None:
        return
    console.print("the budget is certified on the device's export instead (the bounds below: their change is that "
                  "export's, on the certification rows, against the float BNN's own export)", highlight=False)
    layers = Table(title=f"budget {budget['budget']}: bits per layer of the lowering chosen", title_justify="left")
    for col in ("layer", "scheme", "bits", "bytes", "why"):
        layers.add_column(col, justify="right" if col in ("bits", "bytes") else "left",
                          overflow="fold", ratio=1 if col == "why" else None)
    for row in budget["layers"]:
        sigma = row["options"].get("sigma_bits")
        scheme = row["scheme"] + (f" · σ {sigma} bits" if sigma is not None else "")
        layers.add_row(escape(row["layer"]), scheme, str(row["bits"]), fmt_bytes(row["bytes"]), escape(row["reason"]))
    print_table(console, layers)
    for line in [*(f"budget broken: {v}" for v in budget["violations"]), *budget["warnings"]]:
        console.print(f"[bold yellow]warning:[/] {escape(line)}", highlight=False)
    sizes = budget.get("sizes")
    if sizes:
        print_budget_sizes(console, sizes, path or lowered)


def print_budget_sizes(console: Console, sizes: dict[str, Any], path: str = "model.ebnn") -> None:
    """``lower --budget``: the IR's bytes (what the budget minimizes) and the deployed bytes of the default export of
    ``path``, with the command that writes it."""
    ref = sizes.get("float_bnn_bytes")
    rows = [("IR", f"{fmt_bytes(sizes['ir_bytes'])} of tensors ({times_smaller(ref, sizes['ir_bytes'], 'fp32 BNN')}); "
                   f".ebnn file {fmt_bytes(sizes['ebnn_bytes'])}")]
    deployed, what = sizes.get("deployed"), sizes.get("export") or {}
    if deployed:
        how = ", ".join(f"{k} {v}" for k, v in what.items())
        size = deployed["file_bytes"]
        command = shlex.join(["edgebnn", "export", path, "-o", str(Path(path).with_suffix(".onnx")),
                              *shlex.split(sizes.get("flags", ""))])
        rows.append(("deployed", f"{fmt_bytes(size)} ({times_smaller(ref, size, 'fp32 BNN')}) written by `{command}` "
                                 f"({'its defaults: ' if 'flags' not in sizes else ''}{how}), which prints the "
                                 "breakdown"))
    else:
        rows.append(("deployed", f"the default export is refused: {sizes.get('deployed_error')}"))
    _header(console, [(label, escape(value)) for label, value in rows])


def print_closest(console: Console, closest: dict[str, Any]) -> None:
    """``lower --budget`` when nothing keeps the budget: the closest configuration and its figures."""
    ratio = closest["compression_ratio"]
    grid = [("closest", f"{fmt_bytes(closest['total_bytes'])} of IR tensors, "
                        f"{f'{ratio:.2f}x smaller' if ratio >= 1 else f'{1 / ratio:.2f}x larger'} than the fp32 BNN"),
            ("changes", ", ".join(f"{k} {v:+.4f}" for k, v in closest["deltas"].items())),
            ("broken", "; ".join(closest["violations"])),
            ("config", json.dumps(closest["config"], sort_keys=True))]
    _header(console, [(label, escape(value)) for label, value in grid])


THROUGHPUT_NOTE = "inf/s (mean): batch / mean ms, the timed runs' throughput; the ratios below compare p50s"


def print_profile(console: Console, report: dict[str, Any]) -> None:
    title = f"{report['device']} · {report['runner']} · batch {report['batch']} · S={report['samples']}"
    table = Table(title=title, title_justify="left", caption=THROUGHPUT_NOTE, caption_justify="left")
    for col in ("graph", "p50 ms", "p90 ms", "p99 ms", "mean ms", "inf/s (mean)", "mJ/inf"):
        table.add_column(col, justify="left" if col == "graph" else "right")
    for name, r in [("ensemble", report), *report["baselines"].items()]:
        lat = r["latency_ms"]
        energy = r["energy_mj_per_inference"]
        table.add_row(name, f"{lat['p50']:.3f}", f"{lat['p90']:.3f}", f"{lat['p99']:.3f}", f"{lat['mean']:.3f}",
                      f"{r['throughput_per_s']:.1f}", "n/a" if energy is None else f"{energy:.3f}")
    print_table(console, table)
    if report["energy_mj_per_inference"] is None:
        console.print(f"energy: n/a — {report['energy_reason']}", highlight=False)
    ratios = report["ratios"]
    console.print(
        f"ensemble = {ratios['vs_float_deterministic']:.2f}x one float pass; "
        f"{ratios['speedup_vs_float_bnn']:.1f}x faster than {report['samples']} sampled float-BNN passes "
        f"(ratios of the {ratios.get('of', 'p50s')})", highlight=False
    )
