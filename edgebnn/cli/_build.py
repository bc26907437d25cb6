"""``edgebnn lower``, ``inspect``, ``export`` and ``calibrate``: making and inspecting artifacts."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from edgebnn import schemas
from edgebnn._version import __version__
from edgebnn.api import MINIMIZE, load_ir, lower_model
from edgebnn.calib import METHODS
from edgebnn.cli._budget import confidence_option, print_budget_bounds
from edgebnn.cli._common import (
    DATA,
    _check_output_dir,
    _parse_hoist,
    _parse_shape,
    _progress_bar,
    console,
    main,
    write_json,
)
from edgebnn.cli._fastest import print_fastest
from edgebnn.cli._paths import InputPath, OutputPath
from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.exporters import (
    AUTO,
    MODE_CHOICES,
    MODES,
    NOISE_VARIANTS,
    RNG_CHOICES,
    STORE_CHOICES,
    VARIANCE_CHOICES,
)
from edgebnn.tables import (
    fmt_bytes,
    print_closest,
    print_deployed,
    print_inspect,
    print_lower_eval,
    print_lower_report,
    times_smaller,
)

if TYPE_CHECKING:
    from edgebnn.exporters.tensorrt import BuildOptions
    from edgebnn.passes import LowerConfig


def _engine_companions(path: str, params: Mapping[str, Any]) -> list[str]:
    """What a TensorRT build writes beside the engine (:mod:`edgebnn.exporters.tensorrt`), named after it."""
    if params.get("target") != "tensorrt":
        return []
    return [f"{path}.onnx", f"{path}.manifest.json", f"{path}.trtexec.txt"]


def _engine_hint(path: str, params: Mapping[str, Any]) -> str:
    if params.get("target") != "tensorrt":
        return ""
    return f" (the ONNX it compiles is written beside it as {Path(path).with_suffix('.engine')}.onnx)"


# -- lower ------------------------------------------------------------------------------------------------


@main.command()
@click.option("--model", "model_spec", required=True, metavar="PKG.MOD:FACTORY",
              help="Factory that builds the (untrained) torch model, e.g. edgebnn.models:digits_cnn "
                   "(modules in the working directory are found, as with python -m).")
@click.option("--weights", type=InputPath(), required=True,
              help="Trained weights: .safetensors, or .pt/.pth state_dict (loaded with weights_only=True).")
@click.option("--input-shape", required=True, metavar="B,C,H,W", help="Input shape with batch, e.g. 1,1,8,8.")
@click.option("--scheme", default=None,
              help="Lowering scheme: float (default), mcq, fixed, codebook, ternary, binary, prune, or prune+SCHEME.")
@click.option("--bits", default=None, help="Bits per layer: 'auto' (default: from posterior variance) or N.")
@click.option("--seed", type=int, default=None, help="Seed for every random choice of the lowering (default 0).")
@click.option("--config", "config_file", type=InputPath(),
              help="Lowering config: a JSON file (or a lower --report), or an .ebnn whose manifest stores one "
                   "(replays its lowering exactly). --scheme/--bits/--seed and --set apply on top.")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="Change one config key (repeatable): scheme, bits, seed, options.NAME, overrides; VALUE is "
                   "JSON or a plain string, e.g. --set options.noise_fraction=0.5 "
                   "--set 'overrides=[{\"pattern\": \"fc*\", \"bits\": 8}]'.")
@click.option("--output-index", default=0, show_default=True,
              help="Which output to use when forward returns a tuple such as (logits, kl).")
@click.option("-o", "--output", required=True, type=OutputPath("ebnn", hint=" (then edgebnn export it to .onnx)"),
              help="Where to write the .ebnn IR (edgebnn export turns it into an .onnx or an engine).")
@click.option("--report", type=OutputPath("json"), help="Write the per-layer lowering report as JSON.")
@click.option("--eval", "eval_data", default=None, metavar="digits|FILE|DIR", type=DATA,
              help="Also compare the lowered model with the float BNN (accuracy/NLL/ECE, S=16) on this data: "
                   "'digits' (validation split), a labelled .npz or a folder of shards (see eval --help).")
@click.option("--ood-data", default=None, metavar="FILE|DIR", type=DATA,
              help="With --eval: out-of-distribution inputs (x only); adds the mutual-information AUROC.")
@click.option("--budget", "budget_text", default=None, metavar="METRIC=CHANGE,...",
              help="Uncertainty budget, e.g. nll=+0.02,ece=+0.01,auroc=-0.01 (metrics: nll, ece, brier, accuracy, "
                   "auroc; regression: rmse, mae, calibration_error; segmentation: mean_iou, pixel_accuracy; a plug-in "
                   "task's own, e.g. exact_match): "
                   "the smallest deployed lowering that keeps it on new data with --confidence, certified on the "
                   "--eval rows (one-sided bounds per metric; docs/uncertainty_budget.md). Exit 2, nothing written, "
                   "when none is certified; a budget finer than the rows resolve says how many rows it needs.")
@confidence_option
@click.option("--minimize", type=click.Choice(MINIMIZE), default="size", show_default=True,
              help="With --budget: what the certified lowering minimizes. size: the deployed file. latency: the "
                   "export's latency on the cpu (onnxruntime, batch 1), choosing which layers sample (a deterministic "
                   "prefix runs once), the mode and S; needs --ood-data (the MI-AUROC sees what trading stochastic "
                   "layers costs). The report prints the `edgebnn export` command of the chosen export.")
@click.option("--calibrate", "calibrate_data", default=None, metavar="digits|FILE|DIR", type=DATA,
              help="--scheme fixed: round each layer's means so that the layer's OUTPUT stays closest to the "
                   "float posterior mean's on these inputs (GPTQ error compensation; 'digits': the train split, "
                   "a .npz or a folder of shards, labels not needed) instead of rounding each weight to nearest. "
                   "Worth most at 3-4 bits.")
@click.option("--calibrate-inputs", default=256, show_default=True, type=int,
              help="With --calibrate: how many inputs (the first ones) to measure the layer inputs on.")
@click.option("--verbose", "-v", is_flag=True, help="One table row per layer, however many layers.")
@click.option("--mc-dropout", is_flag=True,
              help="MC dropout: keep the model's nn.Dropout/Dropout1d/2d/3d on at prediction as the posterior "
                   "(a plain torch model with dropout needs no Bayesian layer).")
@click.option("--swag", "swag_stats", default=None, type=InputPath(), metavar="STATS",
              help="SWAG: per-parameter {name}_mean, {name}_sq_mean and {name}_covariance_sqrt [K, numel] "
                   "(.safetensors or .pt, as the SWAG reference code and torch-uncertainty store them); the model's "
                   "parameters become SWAG's low-rank + diagonal Gaussian (export with --mode baked).")
@click.option("--swag-scale", default=0.5, show_default=True, type=float,
              help="SWAG's scale: w = mean + sqrt(scale)·(σ⊙z1 + Dᵀz2/sqrt(K-1)).")
@click.option("--laplace", "laplace_state", default=None, type=InputPath(), metavar="STATE",
              help="Laplace: torch.save(la.state_dict(), STATE) of a fitted laplace-torch classification posterior of "
                   "this network (Diag/Kron on all weights, Diag/Kron/Full on the last layer; loaded with "
                   "weights_only=True): its saved class is rebuilt on the model and imported exactly.")
@click.option("--task", default=None, metavar="TASK",
              help="What the output is: classification, regression, segmentation (dense), or a plug-in's task. "
                   "Default: [B, K>=3] logits are classification, [B, C, H, W] / [B, C, L] segmentation; a 1- or "
                   "2-wide output must say (regression: means, or means and log-variances).")
@click.option("--noise-var", type=float, default=None,
              help="--task regression with a mean-only head: the observation noise variance (aleatoric).")
@click.option("--regression-head", type=click.Choice(["mean", "mean_logvar"]), default=None,
              help="--task regression: mean ([B, D]) or mean_logvar ([B, 2D] or a (mean, log-variance) tuple); "
                   "default mean_logvar for a tuple or an even width without --noise-var, else mean.")
def lower(model_spec: str, weights: str, input_shape: str, scheme: str | None, bits: str | None, seed: int | None,
          config_file: str | None, assignments: tuple[str, ...], output_index: int, output: str,
          report: str | None, eval_data: str | None, ood_data: str | None, budget_text: str | None,
          confidence: float, minimize: str, calibrate_data: str | None, calibrate_inputs: int, verbose: bool,
          mc_dropout: bool,
          swag_stats: str | None, swag_scale: float, laplace_state: str | None,
          task: str | None,
          noise_var: float | None, regression_head: str | None) -> None:
    """Import a trained PyTorch BNN and lower it into an .ebnn IR file.

    Understands edgebnn, bayesian-torch (reparameterization and flipout, dnn_to_bnn or hand-written),
    torchbnn and blitz layers; plain Linear/Conv2d/BatchNorm layers are carried through unchanged. A factory
    returning a list of models is a deep ensemble (--weights: one file, member k's keys prefixed "k."); --swag
    imports SWAG statistics for the model, --laplace a laplace-torch posterior's saved state.
    """
    from edgebnn import ir
    from edgebnn.budget import Budget, BudgetNotMetError

    shape = _parse_shape(input_shape)
    budget = None if budget_text is None else Budget(Budget.parse(budget_text).limits, confidence)
    if ood_data is not None and eval_data is None:
        raise InvalidOptionError("--ood-data: is measured with --eval DATA; add it")
    config = _lower_config(config_file, scheme, bits, seed, assignments)
    _check_output_dir(output)
    what = (f"budget {budget}: configurations measured" if budget else
            f"lowering ({config.scheme}): weights, then rows evaluated" if eval_data else
            f"lowering ({config.scheme}): weights")
    if calibrate_data:
        what = f"calibration inputs, then {what}"
    try:
        with _progress_bar(what) as progress:
            model, lower_report = lower_model(model_spec, weights, shape, scheme=config, output_index=output_index,
                                              evaluate=eval_data, ood_data=ood_data, budget=budget,
                                              progress=progress, mc_dropout=mc_dropout, swag=swag_stats,
                                              swag_scale=swag_scale, laplace=laplace_state, task=task,
                                              noise_var=noise_var, regression_head=regression_head,
                                              calibrate=calibrate_data, calibrate_inputs=calibrate_inputs,
                                              minimize=minimize)
    except BudgetNotMetError as e:
        if e.closest.get("config") is not None:  # none for a budget finer than the rows resolve: the line says all
            print_closest(console, e.closest)
        raise
    if config_file and Path(config_file).suffix == ".ebnn" and model.manifest.input_range is None:
        model.manifest.input_range = load_ir(config_file).manifest.input_range  # the replay keeps what eval checks
    ir.save(model, output)
    print_lower_report(console, lower_report, output, model=f"{model_spec} ({weights})",
                       manifest=json.loads(model.manifest.to_json()), verbose=verbose)
    if model.manifest.input_range is None:
        console.print("input range: not recorded (no --eval or --calibrate data), so eval and Session cannot refuse "
                      "inputs of another scale; lower with --eval DATA to record it", highlight=False, soft_wrap=True)
    if "eval" in lower_report:
        print_lower_eval(console, lower_report["eval"], lower_report.get("budget"), lowered=Path(output).name,
                         path=output)
    for note in lower_report.get("quality_notes", []):
        console.print(f"[bold yellow]warning:[/] {escape(note)}", highlight=False, soft_wrap=True)
    if "budget" in lower_report:
        print_budget_bounds(console, lower_report["budget"])
    if "fastest" in lower_report:
        print_fastest(console, lower_report["fastest"], output)
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
@click.argument("file", type=InputPath())
@click.option("--json", "as_json", is_flag=True, help="Print the raw description as JSON instead of tables.")
@click.option("--plot", type=OutputPath("png"), help="Draw per-layer μ–σ scatter and bits chart to a PNG.")
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
    from edgebnn.exporters.sizes import deployed_bytes
    from edgebnn.runtime.session import read_export

    proto, meta, _ = read_export(path)
    ops: dict[str, int] = {}
    for n in proto.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {"file": path, "export": meta.to_dict(), "bytes": Path(path).stat().st_size,
            "opset": [(o.domain or "ai.onnx", o.version) for o in proto.opset_import], "ops": ops,
            "deployed": deployed_bytes(path).to_dict()}


# -- export -----------------------------------------------------------------------------------------------


@main.command()
@click.argument("file", type=InputPath())
@click.option("--target", type=click.Choice(["onnx", "tensorrt"]), default="onnx", show_default=True,
              help="onnx: the ensemble as one .onnx (for onnxruntime or any ONNX runtime). tensorrt: that ONNX "
                   "built into a TensorRT engine for --device (rtx here with tensorrt-rtx; jetson on the Jetson, "
                   "or --dry-run for the ONNX, manifest and trtexec command), beside its manifest.")
@click.option("--samples", "-S", default=None, metavar="N|auto",
              help="Ensemble size S (default 16; a deep ensemble's M members: M), or auto: an anytime ensemble that "
                   "draws samples in chunks and stops each input when more would not change its answer (every class "
                   "probability within --epsilon of its --max-samples value and the same class, with probability "
                   ">= 1 - --delta for Gaussian members; docs/anytime.md); outputs add samples, the members each "
                   "input used.")
@click.option("--min-samples", type=int, default=None, help="--samples auto: the fewest samples an input draws [4].")
@click.option("--max-samples", type=int, default=None,
              help="--samples auto: the most, whose predictive the rule keeps to [16; a deep ensemble: M].")
@click.option("--chunk", type=int, default=None, help="--samples auto: samples drawn at a time [4].")
@click.option("--epsilon", type=float, default=None,
              help="--samples auto: tolerance on every class probability [0.1]; 0 switches the rule off.")
@click.option("--delta", type=float, default=None, help="--samples auto: error probability of the rule [0.1].")
@click.option("--mode", type=click.Choice(MODE_CHOICES), default=AUTO,
              show_default=True,
              help="auto: the device's default, which keeps the lowered compression (cpu, arm64: noise with the IR's "
                   "codes, noise drawn in the graph: one self-contained file; a deep ensemble: baked; TensorRT "
                   "devices: baked). baked: S samples drawn now and stored as constants (TensorRT/DLA-safe); noise: "
                   "μ and σ stored (as the IR's codes), standard-normal noise drawn per call (in the graph, or "
                   "as inputs edgebnn.runtime.Session fills: --rng); shared: codebook models draw K numbers per "
                   "layer per sample; analytic: one pass propagating means and variances.")
@click.option("--noise", "noise_variant", type=click.Choice([v for v in NOISE_VARIANTS if v not in MODES]),
              default="auto",
              show_default=True, help="noise mode: noise per weight (weight), per pre-activation (local), "
                                      "weight for Conv + local for Gemm (auto; exact and small; with --rng graph "
                                      "Flipout on large Conv weights), one draw per call shared by the samples "
                                      "with per-sample signs + local for Gemm (flipout), or local for Gemm + baked "
                                      "members for Conv (mixed; a family's own draw stays in the graph).")
@click.option("--weights", "weight_format", type=click.Choice(STORE_CHOICES), default="ir",
              show_default=True,
              help="How every weight tensor the graph stores is written, in every mode. ir: the IR's own codes "
                   "where its encoding has them (a lowering's packed μ and σ codes; a lowered deep ensemble's "
                   "members), decoded in the graph once per call, fp32 where it has none (baked members of a "
                   "Gaussian are draws off any grid). fp32: every tensor fp32. int8, int4: every tensor coded at "
                   "export (members and means: int8 + DequantizeLinear per output channel, int4 per output channel "
                   "on onnxruntime devices, block-wise on Gemm weights for TensorRT, opset 21; μ and σ: per-channel "
                   "integers and a log-domain σ code).")
@click.option("--rng", type=click.Choice(RNG_CHOICES), default="auto", show_default=True,
              help="noise/shared mode: graph draws the noise inside the graph (seeded RandomNormal(Like): one graph "
                   "input, any onnxruntime); host takes it as graph inputs that edgebnn.runtime.Session fills "
                   "(reproducible); auto: graph unless the device is TensorRT.")
@click.option("--hoist", default="off", show_default=True,
              help="Run layers whose posterior noise is below a threshold once, before the sample axis starts: "
                   "off, auto (σ below the layer's quantization step), or a σ value. Faster, but hoisted layers "
                   "no longer contribute to the mutual information.")
@click.option("--form", type=click.Choice(["auto", "qdq", "folded", "integer"]), default="auto", show_default=True,
              help="How int8/int4 weights are written: qdq (int8/int4 + DequantizeLinear: storage, TensorRT), "
                   "folded (the same values as fp32 constants), integer (int8: MatMulInteger, int4: MatMulNBits, "
                   "on activations quantized per call), or auto: by target and device (onnx: integer for dense "
                   "layers over 8 MiB of members, folded elsewhere; tensorrt: qdq). The export report says which "
                   "and why.")
@click.option("--variance", type=click.Choice(VARIANCE_CHOICES), default="exact", show_default=True,
              help="analytic mode: how each k×k Conv's variance is computed. exact: the layer's own convolution on "
                   "[m², v]; separable: a per-channel k×k filter and a 1×1 mix (about 2/9 of the cost for 3×3; "
                   "bt ResNet-18 at 224: 1.2-1.8x one float pass at batch 1, 2.0x at 8, instead of 2.6-3.9x), "
                   "exact on variances constant over a window; the export records the fit's error "
                   "(docs/uncertainty.md).")
@click.option("--seed", default=0, show_default=True, help="Seed of the baked samples.")
@click.option("--device", default=None,
              help="Target onnx: cpu|arm64 (default cpu; picks the weight form). TensorRT device profile: "
                   "jetson-orin-nano|jetson-orin-nx|jetson-agx-orin|rtx (default rtx).")
@click.option("--dry-run", is_flag=True,
              help="TensorRT: write the ONNX, the build manifest and the trtexec command only (Jetson: build there; "
                   "rtx builds here with TensorRT for RTX, pip install 'edgebnn[tensorrt]').")
@click.option("--workspace-mib", default=1024, show_default=True, help="TensorRT builder workspace limit.")
@click.option("--dla-core", type=int, default=None, help="TensorRT on Jetson: run on this DLA core (GPU fallback on).")
@click.option("--timing-cache", type=click.Path(dir_okay=False), default=None, help="TensorRT timing cache file.")
@click.option("--max-batch", default=1, show_default=True, help="TensorRT: largest batch the engine accepts.")
@click.option("--min-batch", default=1, show_default=True, help="TensorRT: smallest batch the engine accepts.")
@click.option("--opt-batch", type=int, default=None, help="TensorRT: the batch the engine is tuned for [max-batch].")
@click.option("--compute-capability", multiple=True, metavar="X.Y",
              help="rtx: a GPU generation the engine runs on (8.0, 8.6, 8.9, 12.0; 7.5 = Turing, no FP32 GEMM); "
                   "repeat for several. Default: TensorRT for RTX's portable set (Ampere and later).")
@click.option("-o", "--output", required=True,
              type=OutputPath(lambda p: "engine" if p.get("target") == "tensorrt" else "onnx",
                              companions=_engine_companions, hint=_engine_hint),
              help="Output .onnx (target onnx) or engine path (target tensorrt: model.engine; the ONNX it compiles "
                   "is written beside it as model.engine.onnx, with model.engine.manifest.json and "
                   "model.engine.trtexec.txt).")
@click.option("--json", "json_out", type=OutputPath("json"),
              help="Write the export report as JSON: the export metadata and the deployed bytes (key deployed).")
def export(file: str, target: str, samples: str | None, min_samples: int | None, max_samples: int | None,
           chunk: int | None, epsilon: float | None, delta: float | None, mode: str, noise_variant: str,
           weight_format: str, rng: str, hoist: str, form: str, variance: str, seed: int, device: str | None,
           dry_run: bool,
           workspace_mib: int,
           dla_core: int | None, timing_cache: str | None, max_batch: int, min_batch: int, opt_batch: int | None,
           compute_capability: tuple[str, ...], output: str, json_out: str | None) -> None:
    """Export an .ebnn IR as an ONNX model (or TensorRT engine) computing the S-sample predictive.

    The graph's first input is the data; its outputs are the task's: probs (mean over S), entropy and mutual_info for
    classification (per pixel for segmentation), mean, variance, aleatoric and epistemic for regression, a plug-in
    task's own. --samples auto adds an output samples (the members each input used); --rng host (TensorRT's
    default for noise/shared) adds inputs noise/<weight> of standard noise that edgebnn.runtime.Session fills (the
    export metadata lists them). The metadata records the export configuration that reproduces the file. With
    --target tensorrt, FILE may also be an ONNX export (e.g. what edgebnn calibrate wrote): the engine is built from
    it as it is.
    """
    from edgebnn.api import export_result
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.metadata import read_metadata
    from edgebnn.exporters.tensorrt import BuildOptions
    from edgebnn.stopping import parse_samples

    build = BuildOptions(workspace_mib=workspace_mib, dla_core=dla_core,
                         timing_cache=Path(timing_cache) if timing_cache else None, dry_run=dry_run,
                         max_batch=max_batch, min_batch=min_batch, opt_batch=opt_batch,
                         compute_capability=compute_capability)
    if target == "tensorrt" and dry_run:
        from edgebnn.exporters.tensorrt import check_dry_run_path

        check_dry_run_path(output, device or "rtx")  # before any work: a real engine's companions stay its own
    if Path(file).suffix.lower() == ".onnx":
        if target != "tensorrt":
            raise InvalidOptionError(
                f"{file}: already an ONNX export; export takes the .ebnn IR (edgebnn lower ... -o model.ebnn). To "
                f"build a TensorRT engine from this export: edgebnn export {file} --target tensorrt -o model.engine")
        _engine_from_onnx(file, output, device=device or "rtx", json_out=json_out, build=build)
        return
    model = load_ir(file)
    wanted = parse_samples(samples)
    rule = _anytime_rule(model, wanted, min_samples=min_samples, max_samples=max_samples, chunk=chunk,
                         epsilon=epsilon, delta=delta)
    where = device or ("cpu" if target == "onnx" else "rtx")
    _check_output_dir(output)
    resolved = ExportConfig(wanted, rule=rule, mode=mode, noise=noise_variant, weights=weight_format, rng=rng,
                            hoist=_parse_hoist(hoist), form=form, seed=seed, device=where,
                            variance=variance).resolve(model)
    size = resolved.samples
    try:
        with _progress_bar(f"exporting the ensemble, S={'auto' if rule else size}: layers") as progress:
            result = export_result(model, resolved, progress=progress)
    except UnsupportedLayerError as e:  # a layer's message names the layer; the file too, where it does not
        if file in str(e):
            raise
        raise UnsupportedLayerError(f"{file}: {e}") from e
    proto, choice = result.proto, result.choice
    if rule is not None:
        from edgebnn.stopping import describe

        console.print(f"anytime: {describe(rule, model.manifest.num_classes)}", highlight=False, soft_wrap=True)
    mode = choice.mode
    if choice.reason:
        console.print(f"mode: {mode} ({choice.reason})", highlight=False)
    meta = read_metadata(proto, output)
    for note in meta.approximations or ():  # what analytic's moments drop, as the family states it
        console.print(f"approximates: {note}", highlight=False, soft_wrap=True)
    layers = meta.layers
    if layers:
        console.print(f"samples: {', '.join(layers['sampled']) or 'none'}; "
                      f"hoisted (run once): {', '.join(layers['hoisted']) or 'none'}", highlight=False)
    folded = weight_format in ("int8", "int4") and meta.form in ("folded", "integer")
    if folded:
        but = ", dense layers over 8 MiB excepted" if meta.form == "integer" else ""
        console.print(f"--weights {weight_format}: folded back to fp32 constants on {where} (faster there{but}: "
                      f"docs/speed.md), so the file holds fp32 weights; --form qdq stores {weight_format}",
                      highlight=False, soft_wrap=True)
    elif weight_format not in ("fp32", "ir") and meta.form:
        console.print(f"weight form: {meta.form} ({meta.form_reason})", highlight=False)
    if meta.stores:
        stores = ", ".join(f"{k} ({v})" for k, v in meta.stores.items())
        console.print(f"moments stored as: {stores}, decoded in the graph", highlight=False)
    if mode in ("noise", "shared"):
        host = (f"{len(meta.noise_inputs)} graph inputs the host fills (edgebnn.runtime.Session)"
                if meta.noise_inputs else "none per call (every sampled layer baked)")
        console.print("noise: " + ("drawn in the graph (one input)" if meta.rng == "graph" else host), highlight=False)
    if target == "onnx":
        from edgebnn.exporters.ensemble import save_onnx

        with _progress_bar(f"writing {output}", unit="bytes") as progress:
            save_onnx(proto, output, progress=progress)
        console.print(f"wrote {output} ({fmt_bytes(Path(output).stat().st_size)}, {mode}, "
                      f"S={f'auto {rule.min_samples}..{size}' if rule else size})")
        deployed = _print_deployed(output, meta.to_dict(), json_out)
        if rule is None:  # its suggestions are fixed-S exports
            _say_if_larger(model, deployed, file=file, output=output, samples=size, device=where, seed=seed)
        return
    engine_device = device or "rtx"
    deployed, engine_bytes = _build_engine(proto, output, device=engine_device, build=build,
                                           export_meta=meta.to_dict(), json_out=json_out)
    if rule is None and engine_bytes is not None:
        _say_if_larger(model, deployed, file=file, output=output, samples=size, device=engine_device, seed=seed,
                       target="tensorrt", shown=engine_bytes)


def _engine_from_onnx(file: str, output: str, *, device: str, json_out: str | None, build: BuildOptions) -> None:
    """``export model.onnx --target tensorrt``: an engine built from an ONNX export as it is (a calibrated one)."""
    from edgebnn.runtime.session import read_export

    proto, meta, _ = read_export(file)
    _check_output_dir(output)
    precision = f", {meta.precision} ({meta.calibration['method']} calibration)" if meta.calibration else ""
    console.print(f"engine of {file}: {meta.mode}, S={meta.samples}{precision}, as exported", highlight=False)
    _build_engine(proto, output, device=device, build=build, export_meta=meta.to_dict(), json_out=json_out)


def _build_engine(proto: Any, output: str, *, device: str, build: BuildOptions, export_meta: dict[str, Any],
                  json_out: str | None) -> tuple[dict[str, Any], int | None]:
    """Build (or dry-run) the engine and print what was written; returns the ONNX's deployed bytes and the engine's
    (None on a dry run)."""
    from edgebnn.exporters.tensorrt import compile_engine, engine_onnx_path
    from edgebnn.exporters.tensorrt import manifest_path as manifest_name

    onnx_path = engine_onnx_path(output)
    with _progress_bar(f"building the TensorRT engine for {device}"):
        manifest = compile_engine(proto, output, device, build)
    console.print(f"wrote {onnx_path} (the ONNX TensorRT compiled) and {manifest_name(output)}", highlight=False)
    for warning in manifest["builder_warnings"]:
        console.print(f"TensorRT warning: {warning}", highlight=False, markup=False)
    if build.dry_run:
        console.print(f"dry run: engine not built; trtexec equivalent:\n  {shlex.join(manifest['trtexec'])}",
                      highlight=False, markup=False)
    else:
        console.print(f"wrote {output} ({fmt_bytes(manifest['engine_bytes'])}; {manifest['builder']} "
                      f"{manifest['tensorrt_version']}, built in {manifest['build_seconds']:.2f} s, "
                      f"batch {build.min_batch}..{build.max_batch})", highlight=False, markup=False)
    deployed = _print_deployed(str(onnx_path), export_meta, json_out, engine=manifest)
    return deployed, manifest["engine_bytes"]


def _anytime_rule(model: Any, samples: int | str | None, **given: Any) -> Any:
    """The stopping rule of ``--samples auto`` from its options (None for a fixed S; the options refused then)."""
    named = {k: v for k, v in given.items() if v is not None}
    if samples != "auto":
        if named:
            flags = ", ".join("--" + k.replace("_", "-") for k in named)
            raise InvalidOptionError(f"{flags}: only with --samples auto (an anytime ensemble)")
        return None
    from edgebnn.exporters.config import rule_for

    return rule_for(model, **named)


def _print_deployed(path: str, export_meta: dict[str, Any], json_out: str | None,
                    engine: dict[str, Any] | None = None) -> dict[str, Any]:
    """The written ONNX's deployed bytes as a table, and ``--json``: the export metadata and ``deployed``; on a
    TensorRT target the engine (what the device loads: key ``engine``, its build manifest) beside the ONNX."""
    from edgebnn.exporters.sizes import deployed_bytes

    deployed = deployed_bytes(path).to_dict()
    print_deployed(console, deployed, title="ONNX" if engine is not None else "deployed")
    if engine is not None and engine["engine_bytes"] is not None:
        n = int(engine["engine_bytes"])
        console.print(f"engine (what the device loads): {fmt_bytes(n)} ({n:,} bytes): "
                      f"{times_smaller(deployed.get('float_bnn_bytes'), n, 'fp32 BNN')}; "
                      f"{n / deployed['file_bytes']:.1f}x the ONNX", highlight=False, markup=False)
    report = {"file": path, "export": export_meta, "deployed": deployed}
    if engine is not None:
        report["engine"] = engine
    write_json(json_out, report, schemas.EXPORT)
    return deployed


def _say_if_larger(model: Any, deployed: dict[str, Any], *, file: str, output: str, samples: int, device: str,
                   seed: int, target: str = "onnx", shown: int | None = None) -> None:
    """One line when the file (``shown``: a TensorRT engine's bytes instead) is larger than the fp32 BNN, naming the
    command of the smallest export the device runs (tried in memory as ONNX:
    :func:`edgebnn.exporters.export.smallest_export`), for ``target``."""
    from edgebnn.exporters.export import smallest_export

    size, ref = int(deployed["file_bytes"]), deployed.get("float_bnn_bytes")
    what = "" if shown is None else "the engine is "
    shown = size if shown is None else int(shown)
    if not ref or shown <= ref:
        return
    with _progress_bar("trying smaller exports: layers") as progress:
        best = smallest_export(model, samples, device, seed=seed, progress=progress)
    head = f"{what}larger than the fp32 BNN ({fmt_bytes(shown)} vs {fmt_bytes(ref)})"
    if best is None or best[1] >= size:
        console.print(f"{head}: no export {device} runs is smaller; {_lower_hint(model)}", highlight=False,
                      markup=False, soft_wrap=True)
        return
    command = export_command(file, output, samples=samples, device=device, flags=best[0], target=target)
    still = "" if best[1] <= ref else f"; still larger: {_lower_hint(model)}"
    onnx = "" if target == "onnx" else " as ONNX"
    console.print(f"{head}; the smallest for {device}: {command} ({fmt_bytes(best[1])}{onnx}{still})", highlight=False,
                  markup=False, soft_wrap=True)


def _lower_hint(model: Any) -> str:
    """What would make the IR itself smaller, true for its families: lowering it with ``fixed`` where every layer
    takes it, fewer bits where it is lowered already, else which layers no scheme lowers."""
    from edgebnn.ir import DOMAIN
    from edgebnn.passes.base import lowers

    kinds = sorted({n.op_type for n in model.proto.graph.node if n.domain == DOMAIN})
    if model.manifest.scheme != "float":
        return (f"the IR is lowered already ({model.manifest.scheme}); fewer bits make it smaller (edgebnn lower ... "
                "--bits 4, or --budget)")
    kept = [k for k in kinds if not lowers(k, "fixed")]
    if kept:
        return f"its {', '.join(kept)} layers have no fixed lowering (edgebnn plugins lists each family's lowerings)"
    return "lower the IR first (edgebnn lower --scheme fixed)"


def export_command(file: str, output: str, *, samples: int, device: str, flags: list[str],
                   target: str = "onnx") -> str:
    """An ``edgebnn export`` command line the CLI accepts (what the tool suggests)."""
    return shlex.join(["edgebnn", "export", file, "--target", target, "--device", device, "--samples", str(samples),
                       *flags, "-o", output])


# -- calibrate --------------------------------------------------------------------------------------------


@main.command()
@click.argument("model", type=InputPath(wrong={".engine": "a TensorRT engine: calibrate the .ebnn or an ONNX export "
                                                        "and build the engine from the result"}))
@click.option("--data", default="digits", show_default=True, metavar="digits|FILE|DIR", type=DATA,
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
@click.option("--batch", default=32, show_default=True,
              help="Calibration batch size: the largest size from half of it up that divides the inputs evenly "
                   "(equal batches: 360 inputs run as 12 of 30); if none does, the last partial batch is left out, "
                   "and the command says how many inputs it used.")
@click.option("--samples", "-S", type=int, default=None,
              help="MODEL.ebnn: S of the baked ensemble exported first (default 16; a deep ensemble: its M). An "
                   ".onnx has its S built in.")
@click.option("--seed", default=0, show_default=True, help="MODEL.ebnn: seed of the baked members.")
@click.option("--max-samples", type=int, default=None, help="Calibrate on at most this many inputs.")
@click.option("--device", default="jetson", show_default=True,
              help="TensorRT device profile the compatibility check targets (jetson: TensorRT 10.3, rtx: 11).")
@click.option("-o", "--output", required=True, type=OutputPath("onnx"), help="INT8 Q/DQ ONNX to write.")
@click.option("--json", "json_out", type=OutputPath("json"), help="Write the calibration report as JSON.")
def calibrate(model: str, data: str, method: str, calib_split: str, eval_split: str, batch: int,
              samples: int | None, seed: int, max_samples: int | None, device: str, output: str,
              json_out: str | None) -> None:
    """INT8-calibrate a baked ensemble (symmetric Q/DQ for TensorRT; the predictive head stays float).

    MODEL is the .ebnn (its baked fp32 ensemble is exported first: --samples, --seed) or an export written with
    --mode baked (fp32 members). The CPU's default export (noise: weights drawn in the graph on every call) has no
    stored weights to quantize: give its .ebnn instead. Writes an INT8 Q/DQ ONNX that edgebnn eval and
    edgebnn.runtime.Session run like any export, and from which a TensorRT engine is built with
    edgebnn export OUT.onnx --target tensorrt -o OUT.engine; reports accuracy, NLL, ECE and Brier before and after
    INT8 on a held-out split.
    """
    from edgebnn.calib.int8 import Int8Config, calibrate_ensemble
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.trt_compat import Finding, format_findings

    _check_output_dir(output)
    config = Int8Config(method=method, batch=batch, max_samples=max_samples)
    with _progress_bar(f"calibrating {Path(model).name} ({method})") as progress:
        report = calibrate_ensemble(model, output, data=data, config=config, calib_split=calib_split,
                                    eval_split=eval_split, device=device, progress=progress,
                                    export=ExportConfig(samples, mode="baked", weights="fp32", seed=seed))
    from edgebnn.calib.readers import divisor_near

    cal, exported = report["calibration"], report["exported"]
    if exported:
        console.print(f"exported {model} baked, S={exported['samples']}, fp32 members (seed {exported['seed']}), "
                      "then calibrated it", highlight=False)
    used, of, size = cal["samples_used"], cal["inputs"], cal["batch_used"]
    left = ""
    if used < of:
        near = divisor_near(of, batch)
        left = (f"; the last {of - used} left out: batches must be equal"
                + (f", --batch {near} uses all" if near else ""))
    console.print(f"wrote {output} ({fmt_bytes(report['bytes']['after'])}, was {fmt_bytes(report['bytes']['before'])}; "
                  f"{method} on {used} of {of} inputs, {used // size} batches of {size}{left})", highlight=False)
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
