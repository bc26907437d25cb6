"""The training recipes over seeds: does each keep its paper's claim on this machine?

Runs ``examples/train_<recipe>.py --seed N`` (each in its own process, one torch thread, as the examples set)
for every recipe and seed, reads the JSON line each prints last, checks the recipe's claim on it
(:mod:`edgebnn.train.claims`), and reports per recipe how many seeds meet it, whether the example's default seed
(0) does, and mean ± sd over the seeds of the metrics docs/recipes.md shows. Prints one JSON line, then a table.

Run from the repository root (about 25 minutes for the 25 runs on a shared 2-core machine with ``--jobs 2``;
VNQ's 250 epochs are most of it):

    PYTHONPATH=$PWD .venv/bin/python bench/recipe_seeds.py [--recipes vnq,bc,2dgbnn,ebp,bbb] [--seeds 0,1,2,3,4]
        [--jobs 2] [--json recipe_seeds.json] [--arg 2dgbnn=--stage3-epochs=60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("vnq", "bc", "2dgbnn", "ebp", "bbb")
DEFAULT_SEED = 0
# (row label, path into the result): the figures docs/recipes.md shows per recipe
FIGURES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "vnq": (("before acc", ("before", "accuracy")), ("after acc", ("after", "accuracy")),
            ("after NLL", ("after", "nll")), ("after ECE", ("after", "ece")),
            ("posterior-mean acc", ("posterior_mean", "accuracy")), ("gap (images)", ("gap_images",))),
    "bc": (("before acc", ("before", "accuracy")), ("after acc", ("after", "accuracy")),
           ("after NLL", ("after", "nll")), ("after ECE", ("after", "ece")),
           ("weights pruned", ("weights_pruned",)), ("after bytes", ("after", "bytes"))),
    "2dgbnn": (("plain acc", ("plain_bnn", "accuracy")), ("plain NLL", ("plain_bnn", "nll")),
               ("plain ECE", ("plain_bnn", "ece")), ("after acc", ("after", "accuracy")),
               ("after NLL", ("after", "nll")), ("after ECE", ("after", "ece")),
               ("direct NLL", ("direct_codebook", "nll")), ("after bytes", ("after", "bytes")),
               ("direct bytes", ("direct_codebook", "bytes"))),
    "ebp": (("EBP-P CV error", ("cv", "ebp_p", "error")), ("EBP-P CV NLL", ("cv", "ebp_p", "nll")),
            ("EBP-D CV error", ("cv", "ebp_d", "error")), ("EBP-D CV NLL", ("cv", "ebp_d", "nll")),
            ("EBP-P acc", ("ebp_p", "accuracy")), ("EBP-D acc", ("ebp_d", "accuracy")),
            ("after acc", ("after", "accuracy")), ("after NLL", ("after", "nll"))),
    "bbb": (("predictive acc", ("before", "accuracy")), ("predictive NLL", ("before", "nll")),
            ("predictive ECE", ("before", "ece")), ("mean-net acc", ("posterior_mean", "accuracy")),
            ("SNR half-pruned acc", ("snr_pruned", "0.5", "accuracy")),
            ("mean-net NLL", ("posterior_mean", "nll")), ("export acc", ("after", "accuracy"))),
}


def run_one(recipe: str, seed: int, extra: list[str]) -> dict[str, Any]:
    """One example run: its JSON line (with ``wall_s``), or ``{"error": ...}``."""
    script = ROOT / "examples" / f"train_{recipe}.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(script), "--seed", str(seed), *extra], capture_output=True,
                          text=True, env=env, cwd=ROOT, check=False)
    wall = round(time.perf_counter() - t0, 1)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"recipe": recipe, "seed": seed, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1],
                "wall_s": wall}
    return {**json.loads(lines[-1]), "seed": seed, "wall_s": wall}


def dig(result: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = result
    for key in path:
        value = value[key]
    return float(value)


def summarize(recipe: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    from edgebnn.train.claims import CLAIMS

    claim = CLAIMS[recipe]
    ok = [r for r in runs if "error" not in r]
    verdicts = {r["seed"]: claim.check(r) for r in ok}
    figures = {}
    for label, path in FIGURES[recipe]:
        values = [dig(r, path) for r in ok]
        figures[label] = {"mean": statistics.fmean(values) if values else None,
                          "sd": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}
    return {
        "claim": claim.text,
        "seeds": [r["seed"] for r in runs],
        "held": sorted(s for s, (holds, _) in verdicts.items() if holds),
        "failed": sorted(s for s, (holds, _) in verdicts.items() if not holds),
        "errors": {r["seed"]: r["error"] for r in runs if "error" in r},
        "default_seed_holds": bool(verdicts.get(DEFAULT_SEED, (False, {}))[0]),
        "judged": {s: figs for s, (_, figs) in verdicts.items()},
        "figures": figures,
        "wall_s": [r["wall_s"] for r in runs],
        "runs": runs,
    }


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for recipe, s in report["recipes"].items():
        n = len(s["seeds"])
        table = Table(title=f"{recipe}: claim held on {len(s['held'])} of {n} seeds "
                            f"(default seed {DEFAULT_SEED}: {'yes' if s['default_seed_holds'] else 'NO'}); "
                            f"{s['claim']}", title_justify="left")
        table.add_column("")
        table.add_column("mean ± sd", justify="right")
        table.add_column("per seed " + " / ".join(str(x) for x in s["seeds"]), justify="right")
        for label, f in s["figures"].items():
            if f["mean"] is None:
                continue
            fmt = "{:.0f}" if "bytes" in label or "images" in label else "{:.4f}"
            table.add_row(label, f"{fmt.format(f['mean'])} ± {fmt.format(f['sd'])}",
                          " / ".join(fmt.format(v) for v in f["values"]))
        console.print(table)
        for seed, figs in s["judged"].items():
            console.print(f"  seed {seed}: {'held' if seed in s['held'] else 'FAILED'} {figs}", highlight=False)
        for seed, err in s["errors"].items():
            console.print(f"  seed {seed}: error {err}", highlight=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--jobs", type=int, default=2, help="example processes at a time (each one torch thread)")
    parser.add_argument("--arg", action="append", default=[], metavar="RECIPE=--flag=value",
                        help="extra argument for one recipe's example (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    recipes = [r for r in args.recipes.split(",") if r]
    unknown = sorted(set(recipes) - set(RECIPES))
    if unknown:
        parser.error(f"unknown recipe(s) {', '.join(unknown)}; choose from {', '.join(RECIPES)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    extra: dict[str, list[str]] = {r: [] for r in recipes}
    for item in args.arg:
        recipe, _, flag = item.partition("=")
        extra.setdefault(recipe, []).append(flag)
    jobs = [(r, s) for r in recipes for s in seeds]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda job: run_one(job[0], job[1], extra.get(job[0], [])), jobs))
    from edgebnn._version import __version__

    report = {
        "schema": "edgebnn.bench.recipe_seeds/1",
        "edgebnn_version": __version__,
        "seeds": seeds,
        "extra_args": {r: e for r, e in extra.items() if e},
        "recipes": {r: summarize(r, [x for x in results if x["recipe"] == r]) for r in recipes},
    }
    line = json.dumps(report)
    print(line, flush=True)
    if args.json:
        args.json.write_text(line + "\n")
    print_table(report)


if __name__ == "__main__":
    main()
