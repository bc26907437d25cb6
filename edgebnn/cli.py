"""The ``edgebnn`` command line.

Errors a user can cause print one line naming the file, layer or option and exit with status 2;
``edgebnn --debug ...`` shows the traceback instead. Every ``--json`` report carries ``schema`` and
``edgebnn_version``.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgebnn import schemas
from edgebnn._version import __version__
from edgebnn.api import evaluate_artifact, load_ir, lower_model, profile_artifact
from edgebnn.calib.int8 import METHODS
from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.exporters import MODES, NOISE_VARIANTS, WEIGHT_FORMATS
from edgebnn.search.objectives import DEFAULT_OBJECTIVES
from edgebnn.search.run import DEFAULT_POPULATION
from edgebnn.tables import (
    fmt_bytes,
    print_closest,
    print_eval,
    print_inspect,
    print_lower_eval,
    print_lower_report,
    print_profile,
)
from edgebnn.tables import write_json as write_report
from edgebnn.targets.base import BASELINE_RUNNERS

if TYPE_CHECKING:
    from edgebnn.passes import LowerConfig

console = Console()
err_console = Console(stderr=True)


class _Group(click.Group):
    """Turns EdgeBNNError into one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EdgeBNNError as e:
            if ctx.obj and ctx.obj.get("debug"):
                traceback.print_exc()
            # The message may hold user text (paths, names): never interpret it as rich markup or emoji.
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True, emoji=False)
            sys.exit(2)
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]: no artifact was written or changed")
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="edgebnn")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """edgebnn: compile a trained Bayesian neural network into an on-device predictive ensemble.

    \b
    Typical flow:
      edgebnn demo --out demo-out                      # everything below, on sklearn digits
      edgebnn lower --model edgebnn.models:digits_cnn --weights w.safetensors \\
                    --input-shape 1,1,8,8 -o model.ebnn     # import a trained BNN into the IR
      edgebnn inspect model.ebnn                       # layers, encodings, sizes
      edgebnn export model.ebnn --target onnx --samples 16 -o model.onnx
      edgebnn eval model.onnx --data digits            # accuracy, NLL, ECE, Brier
      edgebnn eval model.onnx --data test.npz --ood-data ood.npz   # your data; OOD detection
      edgebnn profile model.ebnn --device cpu --samples 16   # vs float baselines
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


# -- helpers ----------------------------------------------------------------------------------------------


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(","))
    except ValueError as e:
        raise InvalidOptionError(f"--input-shape {text}: expected comma-separated ints like 1,1,8,8") from e
    if len(shape) < 2 or any(d <= 0 for d in shape):
        raise InvalidOptionError(f"--input-shape {text}: expected batch,dims... of positive ints like 1,1,8,8")
    return shape


def _parse_hoist(text: str) -> str | float:
    if text in ("auto", "off"):
        return text
    try:
        value = float(text)
    except ValueError as e:
        raise InvalidOptionError(f"--hoist {text}: use auto, off or a non-negative sigma") from e
    if not value >= 0:
        raise InvalidOptionError(f"--hoist {text}: use auto, off or a non-negative sigma")
    return value


DATA_HELP = ("'digits' (the built-in set; --split picks the part), an .npz with x (N, ...) float32 inputs and y (N,) "
             "integer labels, or a folder of .npy/.npz shards (x_000.npy + y_000.npy, or .npz with x and y), "
             "streamed in batches. Inputs must be preprocessed as the model expects.")
SPLIT_HELP = "digits split (default: test); for --data digits only."


@contextlib.contextmanager
def _progress_bar(description: str) -> Iterator[Callable[[int, int], None]]:
    """A transient rich progress bar on stderr; yields ``update(done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err_console, transient=True, disable=not err_console.is_terminal) as bar:
        task = bar.add_task(escape(description), total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def write_json(path: str | Path | None, report: dict[str, Any], schema: str) -> None:
    """Write ``report`` with ``schema`` and ``edgebnn_version`` atomically (no-op without a path)."""
    write_report(console, path, report, schema)


def _check_output_dir(path: str) -> None:
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise InvalidOptionError(f"-o {path}: directory {parent} does not exist")


# -- lower ------------------------------------------------------------------------------------------------


@main.command()
@click.option("--model", "model_spec", required=True, metavar="PKG.MOD:FACTORY",
              help="Factory that builds the (untrained) torch model, e.g. edgebnn.models:digits_cnn.")
@click.option("--weights", type=click.Path(dir_okay=False), required=True,
              help="Trained weights: .safetensors, or .pt/.pth state_dict (loaded with weights_only=True).")
@click.option("--input-shape", required=True, metavar="B,C,H,W", help="Input shape with batch, e.g. 1,1,8,8.")
@click.option("--scheme", default=None,
              help="Lowering scheme: float (default), mcq, fixed, codebook, ternary, binary, prune, or prune+SCHEME.")
@click.option("--bits", default=None, help="Bits per layer: 'auto' (default: from posterior variance) or N.")
@click.option("--seed", type=int, default=None, help="Seed for every random choice of the lowering (default 0).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="Lowering config: a JSON file (or a lower --report), or an .ebnn whose manifest stores one "
                   "(replays its lowering exactly). --scheme/--bits/--seed and --set apply on top.")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="Change one config key (repeatable): scheme, bits, seed, options.NAME, overrides; VALUE is "
                   "JSON or a plain string, e.g. --set options.noise_fraction=0.5 "
                   "--set 'overrides=[{\"pattern\": \"fc*\", \"bits\": 8}]'.")
@click.option("--output-index", default=0, show_default=True,
              help="Which output to use when forward returns a tuple such as (logits, kl).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the .ebnn IR.")
@click.option("--report", type=click.Path(dir_okay=False), help="Write the per-layer lowering report as JSON.")
@click.option("--eval", "eval_data", default=None, metavar="digits|FILE|DIR",
              help="Also compare the lowered model with the float BNN (accuracy/NLL/ECE, S=16) on this data: "
                   "'digits' (validation split), a labelled .npz or a folder of shards (see eval --help).")
@click.option("--ood-data", default=None, metavar="FILE|DIR",
              help="With --eval: out-of-distribution inputs (x only); adds the mutual-information AUROC.")
@click.option("--budget", "budget_text", default=None, metavar="METRIC=CHANGE,...",
              help="Uncertainty budget, e.g. nll=+0.02,ece=+0.01,auroc=-0.01 (metrics: nll, ece, brier, accuracy, "
                   "auroc): choose per layer the fewest bits (and scheme) that keep it on the --eval data, from the "
                   "posterior-variance rule down. Exit 2, nothing written, when no configuration keeps it.")
@click.option("--verbose", "-v", is_flag=True, help="One table row per layer, however many layers.")
@click.option("--mc-dropout", is_flag=True,
              help="MC dropout: keep the model's nn.Dropout/Dropout1d/2d/3d on at prediction as the posterior "
                   "(a plain torch model with dropout needs no Bayesian layer).")
def lower(model_spec: str, weights: str, input_shape: str, scheme: str | None, bits: str | None, seed: int | None,
          config_file: str | None, assignments: tuple[str, ...], output_index: int, output: str,
          report: str | None, eval_data: str | None, ood_data: str | None, budget_text: str | None,
          verbose: bool, mc_dropout: bool) -> None:
    """Import a trained PyTorch BNN and lower it into an .ebnn IR file.

    Understands edgebnn, bayesian-torch (reparameterization and flipout, dnn_to_bnn or hand-written),
    torchbnn and blitz layers; plain Linear/Conv2d/BatchNorm layers are carried through unchanged.
    """
    from edgebnn import ir
    from edgebnn.budget import Budget, BudgetNotMetError

    shape = _parse_shape(input_shape)
    budget = None if budget_text is None else Budget.parse(budget_text)
    if ood_data is not None and eval_data is None:
        raise InvalidOptionError("--ood-data: is measured with --eval DATA; add it")
    config = _lower_config(config_file, scheme, bits, seed, assignments)
    _check_output_dir(output)
    what = (f"budget {budget}: configurations measured" if budget else
            f"lowering ({config.scheme})" + (": rows evaluated" if eval_data else ""))
    try:
        with _progress_bar(what) as progress:
            model, lower_report = lower_model(model_spec, weights, shape, scheme=config, output_index=output_index,
                                              evaluate=eval_data, ood_data=ood_data, budget=budget,
                                              progress=progress, mc_dropout=mc_dropout)
    except BudgetNotMetError as e:
        print_closest(console, e.closest)
        raise
    ir.save(model, output)
    print_lower_report(console, lower_report, output, model=f"{model_spec} ({weights})",
                       manifest=json.loads(model.manifest.to_json()), verbose=verbose)
    if "eval" in lower_report:
        print_lower_eval(console, lower_report["eval"], lower_report.get("budget"), lowered=Path(output).name)
    write_json(report, lower_report, schemas.LOWER)


def _lower_config(config_file: str | None, scheme: str | None, bits: str | None, seed: int | None,
                  assignments: tuple[str, ...]) -> LowerConfig:
    """The config file (or the defaults), then --scheme/--bits/--seed, then each --set."""
    import dataclasses

    from edgebnn.api import lower_config_of
    from edgebnn.passes.config import LowerConfig, merge_sets

    config = lower_config_of(config_file) if config_file else LowerConfig()
    flags: dict[str, Any] = {k: v for k, v in (("scheme", scheme), ("bits", bits), ("seed", seed)) if v is not None}
    return merge_sets(dataclasses.replace(config, **flags), assignments)


# -- inspect ----------------------------------------------------------------------------------------------


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the raw description as JSON instead of tables.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Draw per-layer μ–σ scatter and bits chart to a PNG.")
@click.option("--verbose", "-v", is_flag=True, help="One table row per weight, however many weights.")
def inspect(file: str, as_json: bool, plot: str | None, verbose: bool) -> None:
    """Show an .ebnn file's manifest and layers (or an exported .onnx ensemble's metadata)."""
    if Path(file).suffix == ".onnx":
        info = _describe_onnx(file)
    else:
        model = load_ir(file)
        info = _describe_ir(model)
        if plot:
            from edgebnn.plots import plot_layers

            plot_layers(model, plot)
            console.print(f"wrote {plot}")
    if as_json:
        click.echo(json.dumps({"schema": schemas.INSPECT, "edgebnn_version": __version__, **info}, indent=2))
        return
    print_inspect(console, info, verbose=verbose)


def _describe_ir(model: Any) -> dict[str, Any]:
    import numpy as np

    layers = []
    for w in model.encoded_weights():
        enc = w.encoding
        layers.append({
            "name": w.name, "layer": w.layer, "encoding": enc.op_type, "shape": list(enc.shape),
            "n_weights": enc.size, "bytes": enc.nbytes,
            "mean_abs_mu": float(np.abs(enc.mean()).mean()), "mean_sigma": float(enc.stddev().mean()),
        })
    ops: dict[str, int] = {}
    for n in model.proto.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {
        "file": model.where,
        "manifest": json.loads(model.manifest.to_json()),
        "total_bytes": model.nbytes(),
        "ops": ops,
        "layers": layers,
    }


def _describe_onnx(path: str) -> dict[str, Any]:
    from edgebnn.runtime.session import read_export

    proto, meta, _ = read_export(path)
    ops: dict[str, int] = {}
    for n in proto.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {"file": path, "export": meta.to_dict(), "bytes": Path(path).stat().st_size,
            "opset": [(o.domain or "ai.onnx", o.version) for o in proto.opset_import], "ops": ops}


# -- export -----------------------------------------------------------------------------------------------


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--target", type=click.Choice(["onnx", "tensorrt"]), default="onnx", show_default=True)
@click.option("--samples", "-S", default=16, show_default=True, help="Ensemble size S.")
@click.option("--mode", type=click.Choice(MODES), default="baked",
              show_default=True,
              help="baked: S samples drawn now and stored as constants (TensorRT/DLA-safe); noise: the graph "
                   "takes standard-normal noise inputs that edgebnn.runtime.Session fills; shared: codebook "
                   "models draw K numbers per layer per sample; analytic: one pass propagating means and "
                   "variances.")
@click.option("--noise", "noise_variant", type=click.Choice([v for v in NOISE_VARIANTS if v not in MODES]),
              default="auto",
              show_default=True, help="noise mode: noise per weight (weight), per pre-activation (local), "
                                      "weight for Conv + local for Gemm (auto; exact and small), or local for Gemm "
                                      "+ baked members for Conv (mixed; exact, fastest on onnxruntime CPU).")
@click.option("--weights", "weight_format", type=click.Choice(WEIGHT_FORMATS), default="fp32",
              show_default=True,
              help="baked mode: store each member's weights as fp32, int8 + DequantizeLinear (symmetric, per "
                   "output channel: TensorRT's explicit-quantization rules), or int4 for Gemm weights (block-wise, "
                   "weight-only, opset 21: RTX/newer TensorRT; Conv stays int8).")
@click.option("--hoist", default="off", show_default=True,
              help="Run layers whose posterior noise is below a threshold once, before the sample axis starts: "
                   "off, auto (σ below the layer's quantization step), or a σ value. Faster, but hoisted layers "
                   "no longer contribute to the mutual information.")
@click.option("--form", type=click.Choice(["auto", "qdq", "folded", "integer"]), default="auto", show_default=True,
              help="How int8/int4 weights are written: qdq (int8/int4 + DequantizeLinear: storage, TensorRT), "
                   "folded (the same values as fp32 constants: fastest on onnxruntime CPU), integer (MatMulInteger "
                   "on per-call quantized activations), or auto: by target and device (onnx: folded; tensorrt: "
                   "qdq). The export report says which and why.")
@click.option("--seed", default=0, show_default=True, help="Seed of the baked samples.")
@click.option("--device", default=None,
              help="Target onnx: cpu|arm64 (default cpu; picks the weight form). TensorRT device profile: "
                   "jetson-orin-nano|jetson-orin-nx|jetson-agx-orin|rtx (default rtx).")
@click.option("--dry-run", is_flag=True, help="TensorRT: write the TensorRT-ready ONNX and the trtexec command only.")
@click.option("--workspace-mib", default=1024, show_default=True, help="TensorRT builder workspace limit.")
@click.option("--dla-core", type=int, default=None, help="TensorRT on Jetson: run on this DLA core (GPU fallback on).")
@click.option("--timing-cache", type=click.Path(dir_okay=False), default=None, help="TensorRT timing cache file.")
@click.option("--max-batch", default=1, show_default=True, help="TensorRT: largest batch the engine accepts.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Output .onnx (target onnx) or engine path (target tensorrt).")
def export(file: str, target: str, samples: int, mode: str, noise_variant: str, weight_format: str, hoist: str,
           form: str, seed: int, device: str | None, dry_run: bool, workspace_mib: int, dla_core: int | None,
           timing_cache: str | None, max_batch: int, output: str) -> None:
    """Export an .ebnn IR as an ONNX model (or TensorRT engine) computing the S-sample predictive.

    The graph has one input and three outputs: probs (mean over S), entropy, mutual_info.
    """
    from edgebnn.exporters.ensemble import export_onnx, save_onnx
    from edgebnn.exporters.metadata import read_metadata

    model = load_ir(file)
    _check_output_dir(output)
    with console.status(f"exporting {mode} ensemble, S={samples}"):
        proto = export_onnx(model, samples, mode=mode, seed=seed, noise=noise_variant, weights=weight_format,
                            hoist=_parse_hoist(hoist), form=form,
                            device=device or ("cpu" if target == "onnx" else "rtx"))
    meta = read_metadata(proto, output)
    layers = meta.layers
    if layers:
        console.print(f"samples: {', '.join(layers['sampled']) or 'none'}; "
                      f"hoisted (run once): {', '.join(layers['hoisted']) or 'none'}", highlight=False)
    if weight_format != "fp32" and meta.form:
        console.print(f"weight form: {meta.form} ({meta.form_reason})", highlight=False)
    if target == "onnx":
        save_onnx(proto, output)
        console.print(f"wrote {output} ({fmt_bytes(Path(output).stat().st_size)}, {mode}, S={samples})")
        return
    from edgebnn.exporters.tensorrt import build_engine

    onnx_path = Path(output).with_suffix(".onnx")
    if onnx_path == Path(output):
        raise InvalidOptionError(f"-o {output}: give the engine path (e.g. model.engine), not an .onnx path")
    save_onnx(proto, onnx_path)
    console.print(f"wrote {onnx_path} (TensorRT-ready ONNX)")
    manifest = build_engine(onnx_path, Path(output), device or "rtx", workspace_mib=workspace_mib,
                            dla_core=dla_core, timing_cache=Path(timing_cache) if timing_cache else None,
                            dry_run=dry_run, max_batch=max_batch)
    what = "dry run: engine not built" if dry_run else f"wrote {output} (TensorRT {manifest['tensorrt_version']})"
    console.print(f"{what}; trtexec equivalent:\n  {shlex.join(manifest['trtexec'])}", highlight=False)


# -- eval -------------------------------------------------------------------------------------------------


@main.command(name="eval")
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--data", default="digits", show_default=True, metavar="digits|FILE|DIR", help=DATA_HELP)
@click.option("--split", type=click.Choice(["train", "val", "test"]), default=None, help=SPLIT_HELP)
@click.option("--ood-data", default=None, metavar="FILE|DIR",
              help="Out-of-distribution inputs (.npz with x, or a folder of shards; labels ignored): adds AUROC/AUPR "
                   "of mutual information and entropy and FPR at 95% TPR.")
@click.option("--samples", "-S", default=16, show_default=True, help="S for an .ebnn (an .onnx has S baked in).")
@click.option("--seed", default=0, show_default=True, help="Sampling seed for an .ebnn (and a noise-mode .onnx).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write the metrics as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a PNG: reliability diagram and mutual-information histogram (in vs OOD).")
def eval_cmd(artifact: str, data: str, split: str | None, ood_data: str | None, samples: int, seed: int,
             json_out: str | None, plot: str | None) -> None:
    """Accuracy, NLL, ECE (15 bins) and Brier of an .ebnn (reference runtime) or exported .onnx.

    With --ood-data, also how well the model's uncertainty tells those inputs from --data.
    """
    for path in (json_out, plot):
        if path:
            _check_output_dir(path)
    with _progress_bar(f"evaluating {Path(artifact).name}") as progress:
        report = evaluate_artifact(artifact, data=data, split=split, samples=samples, seed=seed, ood_data=ood_data,
                                   plot=plot, progress=progress)
    print_eval(console, [report])
    if plot:
        console.print(f"wrote {plot}")
    write_json(json_out, report, schemas.EVAL)


# -- profile ----------------------------------------------------------------------------------------------


@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--device", default="cpu", show_default=True, help="Device profile: cpu, rtx, jetson, jetson-orin-*.")
@click.option("--samples", "-S", default=16, show_default=True, help="Ensemble size S.")
@click.option("--mode", type=click.Choice(["auto", *MODES]), default="auto",
              show_default=True,
              help="Export mode of the ensemble profiled (when exporting on the fly). auto: baked on rtx/jetson "
                   "(TensorRT ignores RNG seeds, DLA has no random ops); on the cpu the fastest mode in "
                   "--bench-results, else baked.")
@click.option("--onnx", "onnx_path", type=click.Path(dir_okay=False),
              help="Profile this exported ensemble instead of exporting ARTIFACT on the fly.")
@click.option("--engine", type=click.Path(dir_okay=False),
              help="rtx/jetson: profile this TensorRT engine (its .manifest.json beside it) instead of building one.")
@click.option("--baseline-runner", type=click.Choice(BASELINE_RUNNERS), default="auto",
              show_default=True, help="Runtime of the float baselines. auto: onnxruntime on the cpu; on rtx/jetson "
                                      "float_deterministic as a TensorRT engine and float_bnn in torch CUDA.")
@click.option("--bench-results", type=click.Path(dir_okay=False),
              help="Mode benchmark JSON (bench/ensemble_latency.py --json) that --mode auto reads on the cpu; "
                   "without it, auto means baked.")
@click.option("--batch", default=1, show_default=True)
@click.option("--runs", default=200, show_default=True, help="Timed runs per graph.")
@click.option("--warmup", default=20, show_default=True, help="Untimed runs before timing.")
@click.option("--threads", default=2, show_default=True, help="onnxruntime/torch CPU threads.")
@click.option("--power-meter", default=None, help="nvml, tegrastats, ina3221, jtop, rapl or none (default: auto).")
@click.option("--remote", metavar="USER@HOST",
              help="Run the profile on this machine over ssh (scp the files, run edgebnn there, fetch the JSON).")
@click.option("--remote-edgebnn", default="edgebnn", show_default=True, metavar="CMD",
              help="The edgebnn command on the --remote machine, e.g. ~/venv/bin/edgebnn.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write the profile as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Bar plot of latency (and energy) as PNG.")
def profile(artifact: str, device: str, samples: int, mode: str, onnx_path: str | None, engine: str | None,
            baseline_runner: str, bench_results: str | None, batch: int, runs: int, warmup: int, threads: int,
            power_meter: str | None, remote: str | None, remote_edgebnn: str, json_out: str | None,
            plot: str | None) -> None:
    """Measure the exported ensemble and both float baselines (deterministic and S-pass BNN) in one run."""
    with console.status("profiling") as status:
        report = profile_artifact(
            artifact, device=device, samples=samples, mode=mode, onnx_path=onnx_path, engine=engine,
            baseline_runner=baseline_runner, bench_results=bench_results, remote=remote,
            remote_edgebnn=remote_edgebnn, batch=batch, runs=runs, warmup=warmup, threads=threads,
            power_meter=power_meter, progress=lambda name: status.update(f"profiling {name}"),
        )
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


# -- compare ----------------------------------------------------------------------------------------------


@main.command()
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--data", default="digits", show_default=True, metavar="digits|FILE|DIR", help=DATA_HELP)
@click.option("--split", type=click.Choice(["train", "val", "test"]), default=None, help=SPLIT_HELP)
@click.option("--ir", "ir_path", type=click.Path(dir_okay=False),
              help="The .ebnn both artifacts came from (needed when A and B are both exports).")
@click.option("--samples", "-S", default=16, show_default=True, help="S for an .ebnn side (reference runtime).")
@click.option("--null-runs", default=99, show_default=True, help="Simulated null pairs for the p-value.")
@click.option("--alpha", default=0.01, show_default=True, help="Call the distributions different when p <= alpha.")
@click.option("--seed", default=0, show_default=True,
              help="Sampling seed: A's side uses it, B's seed + 1, the null simulation seeds from seed + 1000.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write the comparison as JSON.")
def compare(a: str, b: str, data: str, split: str | None, ir_path: str | None, samples: int, null_runs: int,
            alpha: float, seed: int, json_out: str | None) -> None:
    """Do artifacts A and B give the same predictive distribution (within Monte Carlo error)?

    Each side is an .ebnn (run with the reference runtime) or an exported .onnx (any mode). The test
    simulates its own null distribution from the IR, so it holds for correlated Monte Carlo errors.
    Exit status 0 when they agree, 1 when they differ.
    """
    from edgebnn.compare import compare_artifacts

    with console.status(f"comparing ({null_runs} simulated null pairs)"):
        report = compare_artifacts(a, b, data, split=split, ir=ir_path, samples=samples, null_runs=null_runs,
                                   alpha=alpha, seed=seed)
    where = f"{report['data']}/{report['split']}" if report["split"] else report["data"]
    table = Table(title=f"{where}: {Path(a).name} vs {Path(b).name}", title_justify="left")
    for col in ("artifact", "S", "accuracy", "nll", "ece", "brier"):
        table.add_column(col, justify="left" if col == "artifact" else "right")
    for side in (report["a"], report["b"]):
        table.add_row(Path(side["artifact"]).name, str(side["samples"] or "analytic"),
                      *(f"{side[k]:.4f}" for k in ("accuracy", "nll", "ece", "brier")))
    console.print(table)
    verdict = "same predictive distribution" if report["same_distribution"] else "DIFFERENT predictive distributions"
    console.print(f"{verdict}: T = {report['statistic']:.3f} (null mean {report['null_mean']:.3f}, "
                  f"99th pct {report['null_p99']:.3f}), p = {report['p_value']:.3f}, alpha = {alpha}")
    write_json(json_out, report, schemas.COMPARE)
    if not report["same_distribution"]:
        sys.exit(1)


# -- demo -------------------------------------------------------------------------------------------------


@main.command()
@click.option("--out", "out_dir", default="demo-out", show_default=True, type=click.Path(file_okay=False),
              help="Directory for the weights, IR, ONNX and JSON reports.")
@click.option("--samples", "-S", default=16, show_default=True, help="Ensemble size S.")
@click.option("--seed", default=0, show_default=True)
@click.option("--runs", default=200, show_default=True, help="Timed runs per graph when profiling.")
def demo(out_dir: str, samples: int, seed: int, runs: int) -> None:
    """Train a Bayesian CNN on sklearn digits, then lower, export, evaluate and profile it.

    Writes into OUT: digits_cnn.safetensors, digits_cnn.ebnn, digits_cnn_S<S>.onnx, the fixed-point
    lowering digits_cnn_fixed.ebnn and its int8 export digits_cnn_fixed_S<S>_int8.onnx, and the JSON
    reports lower.json, eval_reference.json, eval_onnx.json, eval_fixed_int8.json, profile.json and
    demo.json (plus profile.png).
    """
    from edgebnn.demo import run_demo

    run_demo(Path(out_dir), samples=samples, seed=seed, runs=runs, console=console)


# -- calibrate --------------------------------------------------------------------------------------------


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--data", default="digits", show_default=True, metavar="digits|FILE|DIR",
              help="Calibration inputs: 'digits' (split --calib-split), an .npz with x (labels not needed), or a "
                   "folder of .npy/.npz shards (a .npy may also hold a single input), float, preprocessed as the "
                   "model expects.")
@click.option("--method", type=click.Choice(METHODS), default="entropy",
              show_default=True, help="Activation range: observed min-max, the 99.999th percentile of |x|, or the "
                                      "KL-divergence (entropy) search of TensorRT's calibrator.")
@click.option("--calib-split", type=click.Choice(["train", "val", "test"]), default="val", show_default=True,
              help="digits split to calibrate on.")
@click.option("--eval-split", type=click.Choice(["train", "val", "test"]), default="test", show_default=True,
              help="digits split for accuracy/NLL/ECE/Brier before and after (never the calibration split).")
@click.option("--batch", default=32, show_default=True, help="Calibration batch size.")
@click.option("--max-samples", type=int, default=None, help="Calibrate on at most this many inputs.")
@click.option("--device", default="jetson", show_default=True,
              help="TensorRT device profile the compatibility check targets (jetson: TensorRT 10.3, rtx: 11).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="INT8 Q/DQ ONNX to write.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write the calibration report as JSON.")
def calibrate(model: str, data: str, method: str, calib_split: str, eval_split: str, batch: int,
              max_samples: int | None, device: str, output: str, json_out: str | None) -> None:
    """INT8-calibrate an exported baked ensemble (symmetric Q/DQ for TensorRT; the predictive head stays float).

    Writes an ONNX that edgebnn eval, edgebnn.runtime.Session and export --target tensorrt take like any
    export, and reports accuracy, NLL, ECE and Brier before and after INT8 on a held-out split.
    """
    from edgebnn.calib.int8 import Int8Config, calibrate_ensemble
    from edgebnn.exporters.trt_compat import Finding, format_findings

    _check_output_dir(output)
    config = Int8Config(method=method, batch=batch, max_samples=max_samples)
    with _progress_bar(f"calibrating {Path(model).name} ({method})") as progress:
        report = calibrate_ensemble(model, output, data=data, config=config, calib_split=calib_split,
                                    eval_split=eval_split, device=device, progress=progress)
    cal = report["calibration"]
    console.print(f"wrote {output} ({fmt_bytes(report['bytes']['after'])}, was {fmt_bytes(report['bytes']['before'])}; "
                  f"{method} on {cal['samples_used']} inputs)", highlight=False)
    ev = report["evaluation"]
    if ev is None:
        console.print(f"not evaluated: {report['evaluation_reason']}", highlight=False)
    else:
        table = Table(title=f"{ev['data']}/{ev['split']} (n={ev['n']})", title_justify="left")
        for col in ("", "accuracy", "nll", "ece", "brier"):
            table.add_column(col, justify="left" if not col else "right")
        for name in ("before", "after", "delta"):
            fmt = "{:+.4f}" if name == "delta" else "{:.4f}"
            table.add_row("fp32" if name == "before" else "int8" if name == "after" else "Δ",
                          *(fmt.format(ev[name][k]) for k in ("accuracy", "nll", "ece", "brier")))
        console.print(table)
        agree = ev["agreement"]
        console.print(f"top-1 agreement {agree['top1']:.4f}; mean |Δ entropy| {agree['mean_abs_entropy']:.4g}, "
                      f"mean |Δ mutual info| {agree['mean_abs_mutual_info']:.4g}", highlight=False)
    trt = report["tensorrt_compat"]
    console.print(f"{format_findings([Finding(**f) for f in trt['findings']])} "
                  f"(TensorRT {trt['tensorrt']}, {trt['device']})", highlight=False, markup=False)
    write_json(json_out, report, schemas.CALIBRATE)


# -- search -----------------------------------------------------------------------------------------------


def _choices(text: str | None, option: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(p.strip() for p in text.split(","))
    if not all(items):
        raise InvalidOptionError(f"{option} {text!r}: give comma-separated values")
    return items


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--data", required=True, metavar="digits|FILE|DIR",
              help="Labelled search data ('digits': its val split; an .npz with x and y; a folder of shards). "
                   "Keep a test set apart: the search chooses on this data.")
@click.option("--ood-data", default=None, metavar="FILE|DIR", help="Out-of-distribution inputs: adds auroc.")
@click.option("--device", default="cpu", show_default=True,
              help="Device profile each trial is profiled on: cpu, rtx, jetson, jetson-orin-*.")
@click.option("--trials", default=24, show_default=True, help="Trials the study holds when the search ends.")
@click.option("--budget", default=None, metavar="METRIC=DELTA,...",
              help="Allowed loss vs the float BNN on the same data, e.g. nll=+0.05,ece=+0.01 (accuracy=-0.01). "
                   "No trial within: exit 2 naming the closest.")
@click.option("--objectives", default=",".join(DEFAULT_OBJECTIVES), show_default=True,
              help="Minimized/maximized together (NSGA-II): bytes, artifact_bytes, latency, energy, accuracy, nll, "
                   "ece, brier, auroc. latency/energy are timings: with them, later generations depend on them.")
@click.option("--schemes", default=None, help="Schemes to explore (default mcq,fixed,codebook,ternary,binary,"
                                              "prune+fixed).")
@click.option("--bits", "bits_choices", default=None, help="Bit widths to explore (default auto,3,4,6).")
@click.option("--sigma-bits", "sigma_choices", default=None,
              help="Bits of the σ codes to explore (default 2,1,0; 0: one σ per layer).")
@click.option("--samples", "samples_choices", default=None, help="Ensemble sizes S (default 4,8,16,32).")
@click.option("--modes", default=None, help="Export modes (default baked,noise,shared,analytic).")
@click.option("--weights", "weight_choices", default=None, help="Baked member weight formats (default fp32,int8,int4).")
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
@click.option("--study", "study_path", type=click.Path(dir_okay=False), default=None,
              help="Study file (Optuna journal); re-running the same command continues it. "
                   "Default: beside --json as NAME.study.jsonl, else edgebnn-search.study.jsonl.")
@click.option("--runs", default=20, show_default=True, help="Timed runs per trial profile (0: no profile).")
@click.option("--warmup", default=3, show_default=True, help="Untimed runs before timing.")
@click.option("--threads", default=1, show_default=True, help="onnxruntime threads per trial.")
@click.option("--baseline-samples", default=16, show_default=True, help="S of the float BNN the budget is relative to.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write the search report as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Pareto plot (PNG).")
@click.option("--export-best", type=click.Path(dir_okay=False), help="Write the best trial's ONNX ensemble here.")
def search(model: str, data: str, ood_data: str | None, device: str, trials: int, budget: str | None,
           objectives: str, schemes: str | None, bits_choices: str | None, sigma_choices: str | None,
           samples_choices: str | None,
           modes: str | None, weight_choices: str | None, hoist_choices: str | None, seed: int, population: int,
           executor: str, workers: int, ray_address: str | None, study_path: str | None, runs: int, warmup: int,
           threads: int, baseline_samples: int, json_out: str | None, plot: str | None,
           export_best: str | None) -> None:
    """Search scheme × bits × σ bits × S × mode × weight format × hoisting for the smallest calibrated artifact.

    Each trial lowers MODEL (a float .ebnn), exports, evaluates on --data and profiles on --device; Optuna's
    seeded NSGA-II proposes the trials. Prints every trial, the Pareto front and the best artifact within
    --budget (see docs/search.md).
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

    axes: dict[str, Any] = {}
    for axis, text, option in (("schemes", schemes, "--schemes"), ("bits", bits_choices, "--bits"),
                               ("modes", modes, "--modes"), ("weights", weight_choices, "--weights"),
                               ("hoist", hoist_choices, "--hoist")):
        values = _choices(text, option)
        if values is not None:
            axes[axis] = values
    for axis, text, option in (("sigma_bits", sigma_choices, "--sigma-bits"),
                               ("samples", samples_choices, "--samples")):
        values = _choices(text, option)
        if values is not None:
            if not all(v.isdigit() for v in values):
                raise InvalidOptionError(f"{option} {text}: give comma-separated non-negative integers")
            axes[axis] = tuple(int(v) for v in values)
    for path in (json_out, plot, export_best, study_path):
        if path:
            _check_output_dir(path)
    if study_path is None:
        study_path = str(Path(json_out).with_suffix(".study.jsonl")) if json_out else "edgebnn-search.study.jsonl"
    settings = SearchSettings(model=model, data=data, ood_data=ood_data, device=device, trials=trials,
                              objectives=tuple(objectives.split(",")), budget=budget, space=SearchSpace(**axes),
                              seed=seed, population=population, baseline_samples=baseline_samples, runs=runs,
                              warmup=warmup, threads=threads)
    runner = make_executor(executor, workers=workers, ray_address=ray_address, device=device)
    with console.status(f"searching ({runner.describe()})") as status:
        report = run_search(settings, study_path, runner,
                            progress=lambda done, total, _r: status.update(f"searching: {done}/{total} trials"))
    print_search(console, report)
    console.print(f"study: {study_path} (re-run the same command to continue it)", highlight=False)
    write_json(json_out, report, SCHEMA)
    if plot:
        plot_front(report, plot)
        console.print(f"wrote {plot}")
    if report["best"] is None:
        raise BudgetNotMetError(f"{report['best_reason']}; nothing exported", report.get("closest") or {})
    if export_best:
        write_best(report, export_best)
        console.print(f"wrote {export_best} (trial {report['best']['number']})")
