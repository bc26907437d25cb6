"""``edgebnn search``: the Pareto front of size, latency and uncertainty."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from edgebnn.cli._budget import confidence_option, print_search_certification
from edgebnn.cli._common import (
    DATA,
    _check_output_dir,
    _status,
    console,
    err_console,
    main,
    write_json,
)
from edgebnn.cli._paths import InputPath, OutputPath
from edgebnn.errors import InvalidOptionError
from edgebnn.search.objectives import DEFAULT_OBJECTIVES
from edgebnn.search.study import DEFAULT_POPULATION

if TYPE_CHECKING:
    pass


# -- search -----------------------------------------------------------------------------------------------


def _choices(text: str | None, option: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(p.strip() for p in text.split(","))
    if not all(items):
        raise InvalidOptionError(f"{option} {text!r}: give comma-separated values")
    return items


@main.command()
@click.argument("model", type=InputPath())
@click.option("--data", required=True, metavar="digits|FILE|DIR", type=DATA,
              help="Labelled search data ('digits': its val split; an .npz with x and y; a folder of shards). "
                   "Keep a test set apart: the search chooses on this data.")
@click.option("--ood-data", default=None, metavar="FILE|DIR", type=DATA, help="Out-of-distribution inputs: adds auroc.")
@click.option("--device", default="cpu", show_default=True,
              help="Device profile each trial is profiled on: cpu, rtx, jetson, jetson-orin-*.")
@click.option("--trials", default=24, show_default=True, help="Trials the study holds when the search ends.")
@click.option("--budget", default=None, metavar="METRIC=DELTA,...",
              help="Allowed loss vs the float BNN, e.g. nll=+0.05,ece=+0.01 (accuracy=-0.01), kept on new data with "
                   "--confidence: trials are measured on half of --data (at random), the best is certified on the "
                   "other half (docs/uncertainty_budget.md). None certified: exit 2 naming the closest.")
@confidence_option
@click.option("--objectives", default=",".join(DEFAULT_OBJECTIVES), show_default=True,
              help="Minimized/maximized together (NSGA-II): bytes (the exported ONNX file a trial deploys), ir_bytes "
                   "(the lowered IR's tensors), artifact_bytes (= bytes), latency, energy, accuracy, nll, ece, brier, "
                   "auroc. latency/energy are timings: with them, later generations depend on them.")
@click.option("--schemes", default=None, help="Schemes to explore (default mcq,fixed,codebook,ternary,binary,"
                                              "prune+fixed).")
@click.option("--bits", "bits_choices", default=None, help="Bit widths to explore (default auto,3,4,6).")
@click.option("--sigma-bits", "sigma_choices", default=None,
              help="Bits of the σ codes to explore (default 2,1,0; 0: one σ per layer).")
@click.option("--samples", "samples_choices", default=None,
              help="Ensemble sizes S (default 4,8,16,32); auto among them: the anytime ensemble (export --samples "
                   "auto; its latency is the mean over the search data's first --runs inputs).")
@click.option("--modes", default=None, help="Export modes (default baked,noise,shared,analytic).")
@click.option("--weights", "weight_choices", default=None,
              help="Weight formats (default: those the device runs: fp32,int8,int4; fp32,int8 on a Jetson); ir adds "
                   "the trial's lowered codes (noise/shared/analytic: packed codes decoded in the graph; baked: fp32 "
                   "members).")
@click.option("--hoist", "hoist_choices", default=None, help="Hoisting choices (default off,auto).")
@click.option("--seed", default=0, show_default=True, help="Seeds the sampler and every trial: same seed, same trials.")
@click.option("--population", default=DEFAULT_POPULATION, show_default=True,
              help="NSGA-II population; also how many trials are asked, then run in parallel, at a time.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: a process pool here; ray: Ray tasks (a local instance, or --ray-address).")
@click.option("--workers", default=1, show_default=True,
              help="Processes (local) or CPUs of the local Ray instance; ignored with --ray-address.")
@click.option("--ray-address", default=None, metavar="HOST:PORT",
              help="A running Ray cluster (checked within 5 s); profiles run where the device's custom resource is.")
@click.option("--study", "study_path", type=OutputPath("json"), default=None,
              help="Study file (Optuna journal); re-running the same command continues it. "
                   "Default: beside --json as NAME.study.jsonl, else edgebnn-search.study.jsonl.")
@click.option("--runs", default=20, show_default=True, help="Timed runs per trial profile (0: no profile).")
@click.option("--warmup", default=3, show_default=True, help="Untimed runs before timing.")
@click.option("--threads", default=1, show_default=True, help="onnxruntime threads per trial.")
@click.option("--baseline-samples", default=16, show_default=True, help="S of the float BNN the budget is relative to.")
@click.option("--json", "json_out", type=OutputPath("json"), help="Write the search report as JSON.")
@click.option("--plot", type=OutputPath("png"), help="Pareto plot (PNG).")
@click.option("--export-best", type=OutputPath("onnx"), help="Write the best trial's ONNX ensemble here.")
def search(model: str, data: str, ood_data: str | None, device: str, trials: int, budget: str | None,
           confidence: float, objectives: str, schemes: str | None, bits_choices: str | None, sigma_choices: str | None,
           samples_choices: str | None,
           modes: str | None, weight_choices: str | None, hoist_choices: str | None, seed: int, population: int,
           executor: str, workers: int, ray_address: str | None, study_path: str | None, runs: int, warmup: int,
           threads: int, baseline_samples: int, json_out: str | None, plot: str | None,
           export_best: str | None) -> None:
    """Search scheme × bits × σ bits × S × mode × weight format × hoisting for the smallest calibrated artifact.

    Each trial lowers MODEL (a float .ebnn: an already lowered one is refused), exports, evaluates on --data and
    profiles on --device; Optuna's seeded NSGA-II proposes the trials. Prints every trial, the Pareto front and
    the best artifact within --budget (see docs/search.md). A deep ensemble or SWAG .ebnn is searched over what
    varies for it: its registered schemes, and the S and modes that export it exactly (an ensemble: S = M, baked).
    """
    from edgebnn.budget import BudgetNotMetError
    from edgebnn.search import (
        SCHEMA,
        SearchSettings,
        SearchSpace,
        make_executor,
        plot_front,
        print_search,
        run_search,
    )
    from edgebnn.search import export_best as write_best
    from edgebnn.search.report import describe_best
    from edgebnn.search.run import device_formats

    axes: dict[str, Any] = {}
    for axis, text, option in (("schemes", schemes, "--schemes"), ("bits", bits_choices, "--bits"),
                               ("modes", modes, "--modes"), ("weights", weight_choices, "--weights"),
                               ("hoist", hoist_choices, "--hoist")):
        values = _choices(text, option)
        if values is not None:
            axes[axis] = values
    if "weights" not in axes:  # the formats the device runs (a Jetson's TensorRT takes no int4)
        axes["weights"] = device_formats(device)
    for axis, text, option in (("sigma_bits", sigma_choices, "--sigma-bits"),
                               ("samples", samples_choices, "--samples")):
        values = _choices(text, option)
        if values is not None:
            auto = axis == "samples"  # --samples 4,8,auto: auto is the anytime ensemble
            if not all(v.isdigit() or (auto and v == "auto") for v in values):
                raise InvalidOptionError(f"{option} {text}: give comma-separated non-negative integers"
                                         + (" or auto" if auto else ""))
            axes[axis] = tuple(v if v == "auto" else int(v) for v in values)
    for path in (json_out, plot, export_best, study_path):
        if path:
            _check_output_dir(path)
    if study_path is None:
        study_path = str(Path(json_out).with_suffix(".study.jsonl")) if json_out else "edgebnn-search.study.jsonl"
    settings = SearchSettings(model=model, data=data, ood_data=ood_data, device=device, trials=trials,
                              objectives=tuple(objectives.split(",")), budget=budget, space=SearchSpace(**axes),
                              seed=seed, population=population, baseline_samples=baseline_samples, runs=runs,
                              warmup=warmup, threads=threads, confidence=confidence)
    runner = make_executor(executor, workers=workers, ray_address=ray_address, device=device)
    try:
        with _status(f"searching ({runner.describe()})") as status:
            report = run_search(settings, study_path, runner,
                                progress=lambda done, total, _r: status(f"{done}/{total} trials"))
    except KeyboardInterrupt:
        err_console.print(f"[bold red]interrupted[/]: the trials finished so far are kept in the study "
                          f"{escape(study_path)}; re-run the same command (with --study {escape(study_path)}) to "
                          "resume the search from them", highlight=False, soft_wrap=True)
        sys.exit(130)
    print_search(console, report)
    print_search_certification(console, report.get("certification"))
    console.print(f"study: {study_path} (re-run the same command to continue it)", highlight=False)
    write_json(json_out, report, SCHEMA)
    if plot:
        plot_front(report, plot)
        console.print(f"wrote {plot}")
    if report["best"] is None:
        raise BudgetNotMetError(f"{report['best_reason']}; nothing exported", report.get("closest") or {})
    if export_best:
        write_best(report, export_best)
        console.print(f"wrote {export_best} ({escape(describe_best(report['best']))})", highlight=False)
