"""Readable tables for people (rich); the JSON reports are for machines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from edgebnn import __version__
from edgebnn._io import atomic_write_json


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


def print_lower_report(console: Console, report: dict[str, Any], output: str) -> None:
    table = Table(title=f"{output} · scheme {report['scheme']}", title_justify="left")
    for col in ("layer", "encoding", "weights", "bits", "sparsity", "bytes", "note"):
        table.add_column(col, justify="right" if col in ("weights", "bits", "sparsity", "bytes") else "left")
    for layer in report["layers"]:
        table.add_row(
            layer["name"], str(layer.get("kind", "")), f"{layer['n_weights']:,}", str(layer.get("bits", "")),
            f"{layer.get('sparsity', 0.0):.1%}", fmt_bytes(int(layer["bytes"])),
            str(layer.get("skipped") or layer.get("note") or ""),
        )
    console.print(table)
    console.print(
        f"total {fmt_bytes(report['total_bytes'])} vs fp32 BNN {fmt_bytes(report['float_bnn_bytes'])}: "
        f"{report['compression_ratio']:.1f}x smaller"
    )


def print_eval(console: Console, reports: list[dict[str, Any]]) -> None:
    table = Table(title=f"{reports[0]['data']}/{reports[0]['split']}", title_justify="left")
    for col in ("artifact", "runtime", "accuracy", "nll", "ece", "brier", "S", "n"):
        table.add_column(col, justify="left" if col in ("artifact", "runtime") else "right")
    for r in reports:
        metrics = [f"{r[k]:.4f}" for k in ("accuracy", "nll", "ece", "brier")]
        table.add_row(Path(r["artifact"]).name, r["runtime"], *metrics, str(r["samples"]), str(r["n"]))
    console.print(table)


def print_profile(console: Console, report: dict[str, Any]) -> None:
    title = f"{report['device']} · {report['runner']} · batch {report['batch']} · S={report['samples']}"
    table = Table(title=title, title_justify="left")
    for col in ("graph", "p50 ms", "p90 ms", "p99 ms", "mean ms", "inf/s", "mJ/inf"):
        table.add_column(col, justify="left" if col == "graph" else "right")
    for name, r in [("ensemble", report), *report["baselines"].items()]:
        lat = r["latency_ms"]
        energy = r["energy_mj_per_inference"]
        table.add_row(name, f"{lat['p50']:.3f}", f"{lat['p90']:.3f}", f"{lat['p99']:.3f}", f"{lat['mean']:.3f}",
                      f"{r['throughput_per_s']:.1f}", "n/a" if energy is None else f"{energy:.3f}")
    console.print(table)
    if report["energy_mj_per_inference"] is None:
        console.print(f"energy: n/a — {report['energy_reason']}", highlight=False)
    ratios = report["ratios"]
    console.print(
        f"ensemble = {ratios['vs_float_deterministic']:.2f}x one float pass; "
        f"{ratios['speedup_vs_float_bnn']:.1f}x faster than {report['samples']} sampled float-BNN passes"
    )
