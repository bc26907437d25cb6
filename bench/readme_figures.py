"""The documented figures, from the commands the docs name: run them, print what they print, and compare.

The README quotes no figure; the guides that do are docs/export-modes.md (the default export, ``--mode baked``,
``--weights int8``, the ``--budget`` lowering and its default export, ``--hoist auto``) and docs/demo.md (the demo's
table and profile). This runs ``edgebnn demo`` (or reads a finished ``--demo DIR``), then those pages' commands on
the demo's trained digits CNN through the CLI, collects the figures they print, and sets each beside the page's
figure (:data:`FIGURES`: the page, a pattern that finds the figure in it, and the measured key). Prints one JSON
line, then a table; ``--check`` exits 1 when a size or metric is more than 10% away from what the commands print
today (timings are reported, not checked: they move by 10-50% between runs on a shared machine).

    PYTHONPATH=$PWD .venv/bin/python bench/readme_figures.py [--demo demo-out] [--runs 200] [--check]

``tests/integration/test_readme.py`` runs :func:`measure` on the demo of its own run and checks the same figures, so
a documented figure that drifts more than 10% fails the tests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Timings (unchecked) move by tens of percent between runs; figures marked training=True are held only where the
# demo trains the documented weights (same_training).
EXPORT_MODES, DEMO = "docs/export-modes.md", "docs/demo.md"
TOLERANCE = 0.10


@dataclass(frozen=True)
class Figure:
    """One documented figure: ``pattern`` finds it in ``doc`` (group 1: the number as written), ``key`` is what
    :func:`measure` measured, ``checked`` whether ``--check`` holds it to :data:`TOLERANCE`; ``training``: it
    depends on the exact trained weights (a discrete choice: the budget's bits, which layers hoist), so it is held
    only where the demo trained the documented weights (torch's CPU kernels differ between processors; the demo's
    NLL in docs/demo.md, to 4 decimals, tells)."""

    key: str
    pattern: str
    checked: bool = True
    training: bool = False
    doc: str = "docs/export-modes.md"


def _kib(n: float) -> float:
    return n / 1024


FIGURES: tuple[Figure, ...] = (
    # docs/export-modes.md, "The default export keeps the compression": the demo's CNN lowered with fixed
    Figure("default_kib", r"the\s+default writes ([\d.]+) KiB"),
    Figure("default_ratio", r"the\s+default writes [\d.]+ KiB, ([\d.]+)x smaller than the fp32 BNN"),
    Figure("fp32_bnn_kib", r"smaller than the fp32 BNN \(([\d.]+) KiB\), where"),
    Figure("baked_kib", r"`--mode baked` writes ([\d.]+) KiB"),
    Figure("baked_ratio", r"`--mode baked` writes [\d.]+ KiB of\s+fp32 members \(([\d.]+)x larger"),
    # "Lowered for a budget instead" (lower --budget nll=+0.1,ece=+0.03, no --scheme): what it certified on the
    # validation rows, its default export, what it keeps on the test split, and the tighter budget's export
    Figure("budget_nll", r"validation rows \(NLL \+([\d.]+), bound", training=True),
    Figure("budget_nll_bound", r"validation rows \(NLL \+[\d.]+, bound \+([\d.]+);", training=True),
    Figure("budget_ece", r"validation rows \(NLL [^)]*; ECE \+([\d.]+), bound", training=True),
    Figure("budget_ece_bound", r"validation rows \(NLL [^)]*; ECE \+[\d.]+, bound \+([\d.]+)\)", training=True),
    Figure("budget_kib", r"the same default export writes\s+([\d.]+) KiB", training=True),
    Figure("budget_ratio", r"the same default export writes\s+[\d.]+ KiB, ([\d.]+)x smaller", training=True),
    Figure("budget_test_nll", r"without `--budget`\) NLL \+([\d.]+), ECE", training=True),
    Figure("budget_test_ece", r"without `--budget`\) NLL \+[\d.]+, ECE \+(\d[\d.]*\d)", training=True),
    Figure("tight_kib", r"`--budget nll=\+0\.02,ece=\+0\.01` is certified at ([\d.]+) KiB", training=True),
    Figure("tight_ratio", r"`--budget nll=\+0\.02,ece=\+0\.01` is certified at [\d.]+ KiB, ([\d.]+)x", training=True),
    # docs/demo.md: the demo's table and profile
    Figure("demo_fp32_accuracy", r"\| digits test accuracy / NLL / ECE \| ([\d.]+) /", doc=DEMO),
    Figure("demo_fp32_nll", r"\| digits test accuracy / NLL / ECE \| [\d.]+ / ([\d.]+) /", doc=DEMO),
    Figure("demo_int8_accuracy", r"\| digits test accuracy / NLL / ECE \| [\d./ ]+ \| ([\d.]+) /", doc=DEMO),
    Figure("demo_noise_accuracy", r"\| digits test accuracy / NLL / ECE \| [\d./ ]+ \| [\d./ ]+ \| ([\d.]+) /",
           doc=DEMO),
    Figure("demo_noise_nll", r"\| digits test accuracy / NLL / ECE \| [\d./ ]+ \| [\d./ ]+ \| [\d.]+ / ([\d.]+) /",
           doc=DEMO),
    Figure("demo_ir_kib", r"\| `\.ebnn` IR size \| ([\d.]+) KiB", doc=DEMO),
    Figure("demo_fixed_ir_kib", r"\| `\.ebnn` IR size \| [\d.]+ KiB \| ([\d.]+) KiB", doc=DEMO),
    Figure("demo_fp32_onnx_kib", r"\| ONNX ensemble \(16 members\) \| ([\d.]+) KiB", doc=DEMO),
    Figure("demo_int8_onnx_kib", r"\| ONNX ensemble \(16 members\) \| [\d.]+ KiB \| ([\d.]+) KiB", doc=DEMO),
    Figure("demo_noise_onnx_kib", r"\| ONNX ensemble \(16 members\) \| [\d.]+ KiB \| [\d.]+ KiB \| ([\d.]+) KiB",
           doc=DEMO),
    Figure("baked_int8_kib", r"into a file as large as the fp32 one \(([\d.]+) KiB", doc=DEMO),
    Figure("demo_p50_ms", r"the fp32\s+ensemble's p50 ([\d.]+) ms", checked=False, doc=DEMO),
    Figure("demo_vs_deterministic", r"ms, ([\d.]+)x one float pass", checked=False, doc=DEMO),
    Figure("demo_speedup", r"\), ([\d.]+)x faster than 16 sampled float-BNN passes", checked=False, doc=DEMO),
    # hoisting: at the earlier default noise fraction 0.25, and at today's
    Figure("hoist25_mi_off", r"noise_fraction=0\.25`[^)]*\) it hoisted [^(]*\(mean mutual information ([\d.]+) ->",
           training=True),
    Figure("hoist25_mi_auto", r"noise_fraction=0\.25`[^)]*\) it hoisted [^(]*\(mean mutual information [\d.]+ -> "
                              r"([\d.]+)", training=True),
    Figure("hoist_mi_off", r"today's 0\.1 [^(]*\(mean mutual information ([\d.]+) ->", training=True),
    Figure("hoist_mi_auto", r"today's 0\.1 [^(]*\(mean mutual information [\d.]+ -> ([\d.]+)", training=True),
)


def documents(root: Path = ROOT) -> dict[str, str]:
    """The text of every page a figure is in, by its path relative to ``root``."""
    return {doc: (root / doc).read_text() for doc in sorted({f.doc for f in FIGURES})}


def doc_value(text: str, figure: Figure) -> float | None:
    m = re.search(figure.pattern, " ".join(text.split()))  # a sentence wraps anywhere in the Markdown
    return None if m is None else float(m.group(1))


def _cli(*args: object) -> str:
    from click.testing import CliRunner

    from edgebnn.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    if r.exit_code != 0:
        raise SystemExit(f"edgebnn {' '.join(map(str, args))} failed:\n{r.output}")
    return r.output


def _deployed(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())["deployed"]


def _mean_mi(onnx_path: Path) -> float:
    from edgebnn.data import digits
    from edgebnn.runtime import Session

    x = digits(0).split("test")[0]
    return float(Session(onnx_path, seed=0).predict(x).mutual_info.mean())


def measure(demo: Path, work: Path) -> dict[str, Any]:
    """Every figure's key -> what the documented commands print today, on the finished demo in ``demo``."""
    weights = demo / "digits_cnn.safetensors"
    model = ["--model", "edgebnn.models:digits_cnn", "--weights", weights, "--input-shape", "1,1,8,8"]
    out: dict[str, Any] = {}
    summary = json.loads((demo / "demo.json").read_text())
    for prefix, column in (("", "fp32"), ("small_", "int8"), ("compact_", "noise")):
        out[f"demo_{column}_accuracy"] = summary[f"{prefix}accuracy"]
        out[f"demo_{column}_nll"] = summary[f"{prefix}nll"]
        out[f"demo_{column}_ece"] = summary[f"{prefix}ece"]
    out["demo_fp32_onnx_kib"] = _kib(summary["artifact_bytes"])
    out["demo_int8_onnx_kib"] = _kib(summary["small_artifact_bytes"])
    out["demo_noise_onnx_kib"] = _kib(summary["compact_artifact_bytes"])
    out["demo_ir_kib"] = _kib(summary["ebnn_bytes"])
    out["demo_fixed_ir_kib"] = _kib(summary["small_ebnn_bytes"])
    out["demo_p50_ms"] = summary["latency_ms_p50"]
    out["demo_vs_deterministic"] = summary["ratios"]["vs_float_deterministic"]
    out["demo_speedup"] = summary["ratios"]["speedup_vs_float_bnn"]

    _cli("lower", *model, "--scheme", "fixed", "-o", work / "model.ebnn")
    _cli("export", work / "model.ebnn", "--target", "onnx", "--samples", 16, "-o", work / "model.onnx",
         "--json", work / "default.json")
    default = _deployed(work / "default.json")
    out["default_kib"] = _kib(default["file_bytes"])
    out["fp32_bnn_kib"] = _kib(default["float_bnn_bytes"])
    out["default_ratio"] = default["float_bnn_bytes"] / default["file_bytes"]
    _cli("export", work / "model.ebnn", "--samples", 16, "--mode", "baked", "-o", work / "baked.onnx",
         "--json", work / "baked.json")
    baked = _deployed(work / "baked.json")
    out["baked_kib"] = _kib(baked["file_bytes"])
    out["baked_ratio"] = baked["file_bytes"] / baked["float_bnn_bytes"]
    _cli("export", work / "model.ebnn", "--samples", 16, "--mode", "baked", "--weights", "int8", "-o",
         work / "int8.onnx", "--json", work / "int8.json")
    out["baked_int8_kib"] = _kib(_deployed(work / "int8.json")["file_bytes"])
    hoisted = _cli("export", work / "model.ebnn", "--samples", 16, "--hoist", "auto", "-o", work / "hoist.onnx")
    m = re.search(r"hoisted \(run once\): ([^\n]+)", hoisted)
    out["hoist_layers"] = m.group(1).strip() if m else None
    out["hoist_mi_off"] = _mean_mi(work / "model.onnx")
    out["hoist_mi_auto"] = _mean_mi(work / "hoist.onnx")

    _cli("lower", *model, "--scheme", "fixed", "--set", "options.noise_fraction=0.25", "-o", work / "f25.ebnn")
    _cli("export", work / "f25.ebnn", "--samples", 16, "-o", work / "f25.onnx")
    hoisted = _cli("export", work / "f25.ebnn", "--samples", 16, "--hoist", "auto", "-o", work / "f25h.onnx")
    m = re.search(r"hoisted \(run once\): ([^\n]+)", hoisted)
    out["hoist25_layers"] = m.group(1).strip() if m else None
    out["hoist25_mi_off"] = _mean_mi(work / "f25.onnx")
    out["hoist25_mi_auto"] = _mean_mi(work / "f25h.onnx")

    _cli("lower", *model, "--eval", "digits", "--budget", "nll=+0.1,ece=+0.03", "-o", work / "small.ebnn",
         "--report", work / "budget.json")
    bounds = {b["metric"]: b for b in json.loads((work / "budget.json").read_text())["budget"]["bounds"]}
    for metric in ("nll", "ece"):
        out[f"budget_{metric}"] = bounds[metric]["delta"]
        out[f"budget_{metric}_bound"] = bounds[metric]["bound"]
    _cli("export", work / "small.ebnn", "--target", "onnx", "--samples", 16, "-o", work / "small.onnx", "--json",
         work / "small.json")
    small = _deployed(work / "small.json")
    out["budget_kib"] = _kib(small["file_bytes"])
    out["budget_ratio"] = small["float_bnn_bytes"] / small["file_bytes"]
    _cli("lower", *model, "-o", work / "float.ebnn")
    _cli("eval", work / "small.onnx", "--data", "digits", "--json", work / "eval_small.json")
    _cli("eval", work / "float.ebnn", "--data", "digits", "--json", work / "eval_float.json")
    kept, before = (json.loads((work / f"eval_{n}.json").read_text()) for n in ("small", "float"))
    out["budget_test_nll"] = kept["nll"] - before["nll"]
    out["budget_test_ece"] = kept["ece"] - before["ece"]
    _cli("lower", *model, "--eval", "digits", "--budget", "nll=+0.02,ece=+0.01", "-o", work / "tight.ebnn")
    _cli("export", work / "tight.ebnn", "--target", "onnx", "--samples", 16, "-o", work / "tight.onnx", "--json",
         work / "tight.json")
    tight = _deployed(work / "tight.json")
    out["tight_kib"] = _kib(tight["file_bytes"])
    out["tight_ratio"] = tight["float_bnn_bytes"] / tight["file_bytes"]
    return out


def same_training(texts: dict[str, str], measured: dict[str, Any]) -> bool:
    """Whether this machine's demo trained the documented weights: its fp32 ensemble's NLL to docs/demo.md's 4
    decimals."""
    nll = next(f for f in FIGURES if f.key == "demo_fp32_nll")
    written = doc_value(texts[nll.doc], nll)
    return written is not None and abs(float(measured["demo_fp32_nll"]) - written) < 5e-5


def compare(texts: dict[str, str], measured: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: the documented value (``texts``: :func:`documents`), the measured one, their relative
    difference, whether it is held."""
    rows = []
    same = same_training(texts, measured)
    for fig in FIGURES:
        written, now = doc_value(texts[fig.doc], fig), measured.get(fig.key)
        diff = None if written is None or now is None or not written else abs(now - written) / abs(written)
        checked = fig.checked and (same or not fig.training)
        rows.append({"key": fig.key, "doc": fig.doc, "written": written, "measured": now, "rel_diff": diff,
                     "checked": checked,
                     "ok": written is not None and ((not checked) or (diff is not None and diff <= TOLERANCE))})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, help="a finished `edgebnn demo --out DIR` (default: run one)")
    parser.add_argument("--runs", type=int, default=200, help="timed runs of the demo's profile")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository whose docs/ pages to compare with")
    parser.add_argument("--check", action="store_true", help="exit 1 when a checked figure is off by more than 10%")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgebnn-figures-") as tmp:
        demo = args.demo
        if demo is None:
            demo = Path(tmp) / "demo-out"
            _cli("demo", "--out", demo, "--runs", args.runs)
        measured = measure(demo, Path(tmp))
    rows = compare(documents(args.root), measured)
    from edgebnn._version import __version__

    print(json.dumps({"schema": "edgebnn.bench.readme_figures/2", "edgebnn_version": __version__,
                      "measured": measured, "figures": rows}), flush=True)
    from rich.console import Console
    from rich.table import Table

    table = Table(title="documented figures: as written vs what the commands print today", title_justify="left")
    for col in ("figure", "page", "as written", "today", "diff", ""):
        table.add_column(col, justify="left" if col in ("figure", "") else "right")
    for r in rows:
        table.add_row(r["key"], r["doc"], "missing" if r["written"] is None else f"{r['written']:g}",
                      "-" if r["measured"] is None else f"{r['measured']:.4g}",
                      "-" if r["rel_diff"] is None else f"{r['rel_diff']:.1%}",
                      "ok" if r["ok"] and r["checked"] else "OFF" if not r["ok"] else "not held here")
    Console(stderr=True).print(table)
    if args.check and not all(r["ok"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
