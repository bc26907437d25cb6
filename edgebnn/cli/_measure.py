"""``edgebnn eval``, ``profile``, ``compare`` and ``demo``: measuring artifacts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from edgebnn import schemas
from edgebnn.api import evaluate_artifact, profile_artifact
from edgebnn.cli._common import (
    DATA,
    DATA_HELP,
    SPLIT_HELP,
    _check_output_dir,
    _progress_bar,
    _status,
    console,
    main,
    write_json,
)
from edgebnn.cli._paths import InputPath, OutputPath
from edgebnn.devices import BASELINE_RUNNERS
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import MODES
from edgebnn.tables import (
    eval_columns,
    ood_labels,
    print_eval,
    print_profile,
    print_table,
)

if TYPE_CHECKING:
    pass


_ONNX_GOT_IR = ("an .ebnn IR, not an export: profile exports the .ebnn it is given itself (drop --onnx), or give "
                "--onnx the .onnx that edgebnn export wrote")
_ONNX_GOT_ENGINE = "a TensorRT engine: profile it with --engine on --device rtx or jetson"
_ENGINE_GOT_IR = "an .ebnn IR, not an engine: build one with edgebnn export IR --target tensorrt -o model.engine"


def _engine_got_onnx(path: str) -> str:
    engine = path[: -len(".onnx")] if path.endswith(".engine.onnx") else "model.engine"
    return (f"the ONNX an engine is compiled from, not an engine: give --engine {engine} (what edgebnn export "
            f"--target tensorrt wrote beside it), or profile this ONNX with --onnx {path}")


# -- eval -------------------------------------------------------------------------------------------------


@main.command(name="eval")
@click.argument("artifact", type=InputPath())
@click.option("--data", default=None, metavar="digits|FILE|DIR", type=DATA,
              help=DATA_HELP + " Without it: digits, and eval says so (a model of other inputs: give --data).")
@click.option("--split", type=click.Choice(["train", "val", "test"]), default=None, help=SPLIT_HELP)
@click.option("--ood-data", default=None, metavar="FILE|DIR", type=DATA,
              help="Out-of-distribution inputs (.npz with x, or a folder of shards; labels ignored): adds AUROC/AUPR "
                   "of mutual information and entropy and FPR at 95% TPR.")
@click.option("--samples", "-S", default=None, metavar="N|auto",
              help="S for an .ebnn (default 16; a deep ensemble: its M members), or auto: its anytime predictive "
                   "(edgebnn export --samples auto's rule); an .onnx has S built in (another --samples is refused). "
                   "An anytime ensemble reports the samples each input used (mean, p50, p90; OOD too).")
@click.option("--seed", default=0, show_default=True, help="Sampling seed for an .ebnn (and a noise-mode .onnx).")
@click.option("--json", "json_out", type=OutputPath("json"), help="Write the metrics as JSON.")
@click.option("--plot", type=OutputPath("png"),
              help="Write a PNG: reliability diagram and mutual-information histogram (in vs OOD); segmentation: "
                   "also an image, its mask, the predicted mask and the MI map.")
def eval_cmd(artifact: str, data: str, split: str | None, ood_data: str | None, samples: str | None, seed: int,
             json_out: str | None, plot: str | None) -> None:
    """Accuracy, NLL, ECE (15 bins) and Brier of an .ebnn (reference runtime) or exported .onnx; for a
    regression model NLL, RMSE, MAE, interval coverage and the variance split, for a segmentation model pixel
    accuracy, mean IoU and per-pixel NLL/ECE (labels: float targets, or [N, H, W] integer masks).

    With --ood-data, also how well the model's uncertainty tells those inputs from --data.
    """
    from edgebnn.data import DIGITS
    from edgebnn.stopping import parse_samples

    for path in (json_out, plot):
        if path:
            _check_output_dir(path)
    try:
        with _progress_bar(f"evaluating {Path(artifact).name}") as progress:
            report = evaluate_artifact(artifact, data=data or DIGITS, split=split, samples=parse_samples(samples),
                                       seed=seed, ood_data=ood_data, plot=plot, progress=progress)
    except InvalidOptionError as e:
        if data is not None or f", {DIGITS} has " not in str(e):
            raise
        raise InvalidOptionError(f"{e}: no --data was given, so eval tried the built-in digits set; give --data "
                                 "FILE (an .npz with x and y, or a folder of shards) of this model's inputs") from e
    print_eval(console, [report])
    warning = worse_than_chance(report.get("ood"))
    if warning:
        console.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if data is None:
        split_name = split or "test"
        console.print(f"data: the built-in digits {split_name} split (no --data given; --data FILE evaluates yours)",
                      highlight=False, soft_wrap=True)
    _print_samples_used(report)
    if report.get("input_range") is None:
        console.print(f"note: {artifact} records no input range (lowered without --eval or --calibrate data), so "
                      "inputs of another scale (0..255 pixels for a model trained on 0..1) are not caught; lower "
                      "with --eval DATA to record it", highlight=False, soft_wrap=True)
    if plot:
        console.print(f"wrote {plot}")
    write_json(json_out, report, schemas.EVAL)


def worse_than_chance(ood: dict[str, Any] | None) -> str | None:
    """The warning for an MI-AUROC below 0.5 (the members disagree less on the OOD inputs than on --data), else
    None."""
    auroc = (ood or {}).get("auroc_mutual_info")
    if ood is None or auroc is None or auroc >= 0.5:
        return None
    short, name = ood_labels(ood)[1], (ood.get("scores") or {}).get("epistemic", "mutual information")
    return (f"{short}-AUROC {auroc:.3f} is below 0.5, worse than chance: the ensemble's members disagree less on the "
            f"OOD inputs ({ood['data']}) than on the in-distribution ones, so {name} would flag the wrong "
            "ones; check that both sets are preprocessed alike, or that these inputs are out of distribution")


def _print_samples_used(report: dict[str, Any]) -> None:
    """An anytime ensemble's samples per input, in-distribution and OOD (eval)."""
    used = report.get("samples_used")
    if used is None:
        return

    def line(u: dict[str, Any]) -> str:
        return f"mean {u['mean']:.2f}, p50 {u['p50']:g}, p90 {u['p90']:g} (of {report['samples']})"

    ood = report.get("ood", {})
    text = f"samples used: {line(used)}"
    if "samples_used" in ood:
        text += f"; OOD ({ood['data']}): {line(ood['samples_used'])}, {ood['samples_ratio']:.2f}x in-distribution"
    console.print(text, highlight=False, soft_wrap=True)


# -- profile ----------------------------------------------------------------------------------------------


@main.command()
@click.argument("artifact", type=InputPath())
@click.option("--device", default="cpu", show_default=True, help="Device profile: cpu, rtx, jetson, jetson-orin-*.")
@click.option("--samples", "-S", default="16", show_default=True, metavar="N|auto",
              help="Ensemble size S, or auto: the anytime ensemble (edgebnn export --samples auto), timed per input on "
                   "--data (and --ood-data) against the fixed export at its largest count, det-S and the float BNN.")
@click.option("--data", default=None, metavar="digits|FILE|DIR", type=DATA,
              help="Anytime ensembles (--samples auto, or an anytime --onnx): the in-distribution inputs timed.")
@click.option("--ood-data", default=None, metavar="FILE|DIR", type=DATA,
              help="Anytime ensembles: unfamiliar inputs timed too.")
@click.option("--inputs", default=100, show_default=True, help="Anytime ensembles: how many inputs of each set.")
@click.option("--mode", type=click.Choice(["auto", *MODES]), default="auto",
              show_default=True,
              help="Export mode of the ensemble profiled (when exporting on the fly). auto: baked on rtx/jetson "
                   "(TensorRT ignores RNG seeds, DLA has no random ops); on the cpu the fastest mode in "
                   "--bench-results, else what edgebnn export writes by default (noise with the IR's codes).")
@click.option("--onnx", "onnx_path", type=InputPath(wrong={".ebnn": _ONNX_GOT_IR, ".engine": _ONNX_GOT_ENGINE}),
              help="Profile this exported ensemble instead of exporting ARTIFACT on the fly.")
@click.option("--engine", type=InputPath(wrong={".onnx": _engine_got_onnx, ".ebnn": _ENGINE_GOT_IR}),
              help="rtx/jetson: profile this TensorRT engine (its .manifest.json beside it) instead of building one. "
                   "Running an engine needs an NVIDIA GPU, the engine's TensorRT (rtx: tensorrt_rtx) and a CUDA "
                   "build of PyTorch; building one for rtx needs none of them (edgebnn export --target tensorrt).")
@click.option("--baseline-runner", type=click.Choice(BASELINE_RUNNERS), default="auto",
              show_default=True, help="Runtime of the float baselines. auto: onnxruntime on the cpu; on rtx/jetson "
                                      "float_deterministic as a TensorRT engine and float_bnn in torch CUDA.")
@click.option("--bench-results", type=InputPath(),
              help="Mode benchmark JSON (bench/ensemble_latency.py --json) that --mode auto reads on the cpu: the "
                   "fastest mode measured there; without it, auto is what edgebnn export writes by default (see "
                   "--mode).")
@click.option("--batch", default=1, show_default=True,
              help="Inputs per timed call (every graph; an engine is built for it): latency is per call, inf/s is "
                   "batch / mean latency. Anytime ensembles are timed per input (batch 1).")
@click.option("--runs", type=int, default=None,
              help="Timed runs per graph [200]; an anytime ensemble: rounds of every graph over its inputs [3].")
@click.option("--warmup", default=20, show_default=True, help="Untimed runs before timing.")
@click.option("--threads", default=2, show_default=True, help="onnxruntime/torch CPU threads.")
@click.option("--power-meter", default=None, help="nvml, tegrastats, ina3221, jtop, rapl or none (default: auto).")
@click.option("--remote", metavar="USER@HOST",
              help="Run the profile on this machine over ssh (scp the files, run edgebnn there, fetch the JSON).")
@click.option("--remote-edgebnn", default="edgebnn", show_default=True, metavar="CMD",
              help="The edgebnn command on the --remote machine, e.g. ~/venv/bin/edgebnn.")
@click.option("--json", "json_out", type=OutputPath("json"), help="Write the profile as JSON.")
@click.option("--plot", type=OutputPath("png"), help="Bar plot of latency (and energy) as PNG.")
def profile(artifact: str, device: str, samples: str, data: str | None, ood_data: str | None, inputs: int, mode: str,
            onnx_path: str | None, engine: str | None, baseline_runner: str, bench_results: str | None, batch: int,
            runs: int | None, warmup: int, threads: int, power_meter: str | None, remote: str | None,
            remote_edgebnn: str, json_out: str | None, plot: str | None) -> None:
    """Measure the exported ensemble and both float baselines (deterministic and S-pass BNN) in one run.

    An anytime ensemble (--samples auto) is timed per input (--runs rounds over --inputs inputs of --data)."""
    from edgebnn.stopping import parse_samples

    wanted = parse_samples(samples)
    with _status("profiling") as status:
        report = profile_artifact(
            artifact, device=device, samples=wanted if wanted is not None else 16, mode=mode, onnx_path=onnx_path,
            engine=engine, baseline_runner=baseline_runner, bench_results=bench_results, remote=remote,
            remote_edgebnn=remote_edgebnn, batch=batch, runs=runs,
            warmup=warmup, threads=threads, power_meter=power_meter,
            progress=status, data=data, ood_data=ood_data, inputs=inputs,
        )
    if "per_input" in report:
        _print_anytime_profile(report)
        write_json(json_out, report, report["schema"])
        return
    print_profile(console, report)
    console.print("runners: " + "; ".join(f"{name} on {r.get('runner')} ({r.get('provider')})" for name, r in
                                         [("ensemble", report), *report["baselines"].items()]), highlight=False)
    if report.get("mode_reason"):
        console.print(f"mode {report['mode']}: {report['mode_reason']}", highlight=False)
    write_json(json_out, report, report["schema"])
    if plot:
        from edgebnn.targets.profiler import plot_profile

        plot_profile(report, plot)
        console.print(f"wrote {plot}")


def _print_anytime_profile(report: dict[str, Any]) -> None:
    """Per-input latency of an anytime ensemble and what it is compared with, one table per input set."""
    s = report["samples"]
    for tag, part in report["per_input"].items():
        table = Table(title=f"{'in-distribution' if tag == 'in' else 'OOD'} inputs ({part['n']}, batch 1, "
                            f"{report['rounds']} rounds): latency per input, ms", title_justify="left")
        for col in ("graph", "p50", "p90", "mean", "mean / anytime"):
            table.add_column(col, justify="left" if col == "graph" else "right")
        names = {"ensemble": f"anytime ({report['mode']}, {part['samples_used']['mean']:.2f} samples on average)",
                 "fixed": f"fixed S={s} ({report['fixed_mode']})", f"det_{s}": f"det-{s} (float net, {s} copies)",
                 "float_deterministic": "float net, one pass", "float_bnn": f"float BNN ({s} sampled passes)"}
        mean = part["latency_ms"]["ensemble"]["mean"]
        for key, label in names.items():
            ms = part["latency_ms"][key]
            table.add_row(label, f"{ms['p50']:.3f}", f"{ms['p90']:.3f}", f"{ms['mean']:.3f}",
                          f"{ms['mean'] / mean:.2f}x")
        print_table(console, table)
    r = report["per_input"]["in"]["ratios"]
    console.print(f"anytime mean latency (in-distribution): {r['vs_fixed']:.2f}x the fixed S={s} export, "
                  f"{r[f'vs_det_{s}']:.2f}x det-{s}; {r['speedup_vs_float_bnn']:.1f}x faster than the float BNN "
                  "(means over the same inputs; engine latency is not measured here)", highlight=False, soft_wrap=True)


# -- compare ----------------------------------------------------------------------------------------------


@main.command()
@click.argument("a", type=InputPath())
@click.argument("b", type=InputPath())
@click.option("--data", default="digits", show_default=True, metavar="digits|FILE|DIR", type=DATA, help=DATA_HELP)
@click.option("--split", type=click.Choice(["train", "val", "test"]), default=None, help=SPLIT_HELP)
@click.option("--ir", "ir_path", type=InputPath(),
              help="The .ebnn both artifacts came from (needed when A and B are both exports).")
@click.option("--samples", "-S", default=16, show_default=True, help="S for an .ebnn side (reference runtime).")
@click.option("--calls", default=1, show_default=True,
              help="Average this many calls of a noise/shared export (each draws afresh; an .ebnn side draws S x "
                   "calls members): more draws, a smaller detectable difference (about 1/sqrt(calls)); time grows "
                   "with it. A baked export's S members are one draw whatever the calls.")
@click.option("--tolerance", type=float, default=None,
              help="The RMS difference (over examples and classes) of the mean probabilities (regression: the "
                   "predictive means) that 'same' allows [0.01]: 'same' needs the observed difference and the "
                   "smallest one the test detects (80% power) within it, else 'cannot tell'.")
@click.option("--null-runs", default=99, show_default=True, help="Simulated null pairs for the p-value.")
@click.option("--alpha", default=0.01, show_default=True, help="Call the distributions different when p <= alpha.")
@click.option("--seed", default=0, show_default=True,
              help="Sampling seed: A's side uses it, B's seed + 1 (an .ebnn side moves off a baked export's own "
                   "seed), the null simulation seeds from seed + 1000.")
@click.option("--json", "json_out", type=OutputPath("json"), help="Write the comparison as JSON.")
def compare(a: str, b: str, data: str, split: str | None, ir_path: str | None, samples: int, calls: int,
            tolerance: float | None, null_runs: int, alpha: float, seed: int, json_out: str | None) -> None:
    """Do artifacts A and B give the same predictive distribution (within Monte Carlo error)?

    Each side is an .ebnn (run with the reference runtime) or an exported .onnx (any mode). The test
    simulates its own null distribution from the IR, so it holds for correlated Monte Carlo errors, and states the
    smallest difference it could detect: at S = 16 a real difference can hide in the Monte Carlo error.
    Exit status 0 when they agree (within --tolerance), 1 when they differ, 3 when the test cannot tell.
    """
    from edgebnn.compare import TOLERANCE, compare_artifacts

    with _progress_bar("comparing: simulated null pairs") as progress:
        report = compare_artifacts(a, b, data, split=split, ir=ir_path, samples=samples, calls=calls,
                                   tolerance=TOLERANCE if tolerance is None else tolerance, null_runs=null_runs,
                                   alpha=alpha, seed=seed, progress=progress)
    where = f"{report['data']}/{report['split']}" if report["split"] else report["data"]
    table = Table(title=f"{where}: {Path(a).name} vs {Path(b).name}", title_justify="left")
    keys = eval_columns(report)
    for col in ("artifact", "S", "draws", *keys):
        table.add_column(col, justify="left" if col == "artifact" else "right")
    for side in (report["a"], report["b"]):
        table.add_row(Path(side["artifact"]).name, str(side["samples"] or "analytic"), str(side["draws"] or "-"),
                      *(f"{side[k]:.4f}" for k in keys))
    print_table(console, table)
    console.print(compare_verdict(report), highlight=False, soft_wrap=True)
    write_json(json_out, report, schemas.COMPARE)
    if report["verdict"] != "same":
        sys.exit(1 if report["verdict"] == "different" else 3)


def compare_verdict(report: dict[str, Any]) -> str:
    """The verdict line of ``edgebnn compare``: what the test found and the smallest difference it could see."""
    what = "predictive means" if report.get("task") == "regression" else "mean probabilities"
    test = (f"T = {report['statistic']:.3f} (null mean {report['null_mean']:.3f}), p = {report['p_value']:.3f}, "
            f"alpha = {report['alpha']}")
    seen = (f"RMS difference of the {what} {report['observed_diff']:.4f}; the test detects "
            f"{report['detectable_diff']:.4f} with {report['power']:.0%} power")
    if report["verdict"] == "different":
        return f"DIFFERENT predictive distributions: {test}; {seen}"
    if report["verdict"] == "same":
        return f"same predictive distribution (within {report['tolerance']:g}): {test}; {seen}"
    if report["detectable_diff"] <= report["tolerance"]:
        why, more = f"the observed difference exceeds the tolerance {report['tolerance']:g}", ""
    else:
        why = f"the test cannot see a difference as small as the tolerance {report['tolerance']:g}"
        fixed = [Path(s["artifact"]).name for s in (report["a"], report["b"]) if s["samples"] and not s["redraws"]]
        more = (f"; sample more: --calls {report['calls_needed']} reaches it at the 1/sqrt(draws) rate (fewer may do)"
                if report["calls_needed"] else
                f"; more calls cannot get there: a baked export's S members are one draw ({', '.join(fixed)}): "
                "export it with a larger --samples" if fixed else "")
    return f"cannot tell (no significant difference, but {why}): {test}; {seen}{more}"


# -- demo -------------------------------------------------------------------------------------------------


@main.command()
@click.option("--out", "out_dir", default="demo-out", show_default=True, type=click.Path(file_okay=False),
              help="Directory for the weights, IR, ONNX and JSON reports.")
@click.option("--samples", "-S", default=16, show_default=True, help="Ensemble size S.")
@click.option("--seed", default=0, show_default=True,
              help="Seeds the digits split, the training, the lowering, the exported members and noise, and the "
                   "evaluation.")
@click.option("--runs", default=200, show_default=True, help="Timed runs per graph when profiling.")
def demo(out_dir: str, samples: int, seed: int, runs: int) -> None:
    """Train a Bayesian CNN on sklearn digits, then lower, export, evaluate and profile it.

    Writes into OUT: digits_cnn.safetensors, digits_cnn.ebnn, digits_cnn_S<S>.onnx (fp32 baked), the fixed-point
    lowering digits_cnn_fixed.ebnn, its int8 baked export digits_cnn_fixed_S<S>_int8.onnx (int8 + DequantizeLinear:
    --form qdq) and its codes in a noise graph digits_cnn_fixed_S<S>_noise.onnx, and the JSON reports lower.json,
    eval_reference.json, eval_onnx.json, eval_fixed_int8.json, eval_fixed_noise.json, profile.json and demo.json
    (plus profile.png). Every file records the training inputs' range, which eval and Session check inputs against.
    """
    from edgebnn.demo import run_demo

    run_demo(Path(out_dir), samples=samples, seed=seed, runs=runs, console=console)
