"""``edgebnn demo``: the whole chain on real data, from a fresh install, in a few minutes on 2 cores.

train a Bayesian CNN on sklearn digits -> save weights (safetensors) -> lower (import into the IR)
-> export the S-sample ONNX ensemble (fp32 baked; lowered: int8 baked, and its codes in a noise graph)
-> evaluate the reference runtime and the ONNX files on the test split
-> profile the ensemble against both float baselines with onnxruntime on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from edgebnn import schemas
from edgebnn.exporters import DEFAULT_SAMPLES
from edgebnn.tables import fmt_bytes, print_eval, print_lower_report, print_profile, write_json

MODEL_SPEC = "edgebnn.models:digits_cnn"
INPUT_SHAPE = (1, 1, 8, 8)


def run_demo(out: Path, *, samples: int = DEFAULT_SAMPLES, seed: int = 0, runs: int = 200,
             console: Console) -> dict[str, Any]:
    import torch
    from safetensors.torch import save as safetensors_bytes

    from edgebnn import ir
    from edgebnn._io import atomic_write
    from edgebnn.api import evaluate_artifact, lower_model, profile_artifact
    from edgebnn.data import digits
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.ensemble import save_onnx
    from edgebnn.exporters.export import export_model
    from edgebnn.exporters.metadata import read_metadata
    from edgebnn.models import digits_cnn
    from edgebnn.passes import lower
    from edgebnn.targets.profiler import plot_profile
    from edgebnn.train import train_bnn

    out.mkdir(parents=True, exist_ok=True)
    weights = out / "digits_cnn.safetensors"
    ebnn = out / "digits_cnn.ebnn"
    onnx_path = out / f"digits_cnn_S{samples}.onnx"
    fixed_ebnn = out / "digits_cnn_fixed.ebnn"
    small_onnx = out / f"digits_cnn_fixed_S{samples}_int8.onnx"
    compact_onnx = out / f"digits_cnn_fixed_S{samples}_noise.onnx"

    console.rule("1/5 train a Bayesian CNN on sklearn digits")
    torch.manual_seed(seed)
    model = digits_cnn()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # this small CNN trains fastest on one thread (10 s vs 14 s on two)
    try:
        result = train_bnn(model, digits(seed), seed=seed)
    finally:
        torch.set_num_threads(threads)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_write(weights, lambda f: f.write(safetensors_bytes(state)))
    console.print(f"trained in {result.wall_time_s:.1f} s; wrote {weights}")

    console.rule("2/5 lower: import into the IR")
    bnn, lower_report = lower_model(MODEL_SPEC, weights, INPUT_SHAPE, scheme="float", seed=seed)
    x_train = digits(seed).x_train  # the range eval and Session check inputs against, kept by every file below
    bnn.manifest.input_range = [float(x_train.min()), float(x_train.max())]
    ir.save(bnn, ebnn)
    print_lower_report(console, lower_report, str(ebnn))
    write_json(console, out / "lower.json", lower_report, schemas.LOWER)

    console.rule(f"3/5 export the S={samples} ensemble to ONNX (fp32 baked; fixed-point lowered: int8 baked, codes)")
    save_onnx(export_model(bnn, ExportConfig(samples, mode="baked", seed=seed)).proto, onnx_path)
    console.print(f"wrote {onnx_path} ({fmt_bytes(onnx_path.stat().st_size)})")
    fixed = lower(bnn, "fixed", seed=seed).model
    ir.save(fixed, fixed_ebnn)
    # int8 members stored as int8 + DequantizeLinear (--form qdq); edgebnn export's cpu default (--form auto) folds
    # them back to fp32 constants for speed, a file as large as the fp32 one
    small_proto = export_model(fixed, ExportConfig(samples, mode="baked", weights="int8", form="qdq", seed=seed)).proto
    save_onnx(small_proto, small_onnx)
    layers = read_metadata(small_proto, str(small_onnx)).layers or {"sampled": [], "hoisted": []}
    console.print(f"wrote {fixed_ebnn} ({fmt_bytes(fixed_ebnn.stat().st_size)}, bits per layer from the "
                  f"posterior variance) and {small_onnx} ({fmt_bytes(small_onnx.stat().st_size)}, int8 weights "
                  f"stored as int8 + DequantizeLinear: edgebnn export --mode baked --weights int8 --form qdq; "
                  f"sampled layers: {', '.join(layers['sampled']) or 'none'}; run once, σ below their step: "
                  f"{', '.join(layers['hoisted']) or 'none'})", highlight=False)
    # the compact artifact: the lowered codes stored as such, decoded once per call, the noise drawn in the graph
    save_onnx(export_model(fixed, ExportConfig(samples, mode="noise", rng="graph", seed=seed)).proto, compact_onnx)
    console.print(f"wrote {compact_onnx} ({fmt_bytes(compact_onnx.stat().st_size)}, noise mode: the fixed-point "
                  "codes as lowered, decoded in the graph; noise drawn in the graph, so it runs on the data alone)",
                  highlight=False)

    console.rule("4/5 evaluate on the digits test split")
    ref = evaluate_artifact(ebnn, samples=samples, seed=seed)
    exported = evaluate_artifact(onnx_path)
    small = evaluate_artifact(small_onnx)
    compact = evaluate_artifact(compact_onnx)
    print_eval(console, [ref, exported, small, compact])
    write_json(console, out / "eval_reference.json", ref, schemas.EVAL)
    write_json(console, out / "eval_onnx.json", exported, schemas.EVAL)
    write_json(console, out / "eval_fixed_int8.json", small, schemas.EVAL)
    write_json(console, out / "eval_fixed_noise.json", compact, schemas.EVAL)

    console.rule("5/5 profile on the CPU against float baselines")
    prof = profile_artifact(ebnn, device="cpu", samples=samples, onnx_path=str(onnx_path), runs=runs)
    print_profile(console, prof)
    write_json(console, out / "profile.json", prof, prof["schema"])
    plot_profile(prof, str(out / "profile.png"))

    summary = {
        "small_artifact_bytes": small_onnx.stat().st_size,
        "small_ebnn_bytes": fixed_ebnn.stat().st_size,
        "small_accuracy": small["accuracy"],
        "small_nll": small["nll"],
        "small_ece": small["ece"],
        "compact_artifact_bytes": compact_onnx.stat().st_size,
        "compact_accuracy": compact["accuracy"],
        "compact_nll": compact["nll"],
        "compact_ece": compact["ece"],
        "artifact_bytes": onnx_path.stat().st_size,
        "ebnn_bytes": ebnn.stat().st_size,
        "accuracy": exported["accuracy"],
        "nll": exported["nll"],
        "ece": exported["ece"],
        "latency_ms_p50": prof["latency_ms"]["p50"],
        "float_deterministic_ms_p50": prof["baselines"]["float_deterministic"]["latency_ms"]["p50"],
        "float_bnn_ms_p50": prof["baselines"]["float_bnn"]["latency_ms"]["p50"],
        "ratios": prof["ratios"],
        "energy_mj_per_inference": prof["energy_mj_per_inference"],
        "energy_reason": prof["energy_reason"],
    }
    _print_summary(console, summary, samples)
    write_json(console, out / "demo.json", summary, schemas.DEMO)
    return summary


def _print_summary(console: Console, s: dict[str, Any], samples: int) -> None:
    from rich.table import Table

    det, bnn, ens = s["float_deterministic_ms_p50"], s["float_bnn_ms_p50"], s["latency_ms_p50"]
    energy = s["energy_mj_per_inference"]
    table = Table(title=f"edgebnn demo · digits test split · S={samples}", title_justify="left")
    table.add_column("")
    for head in ("fp32 baked", "fixed int8 baked (--form qdq)", "fixed codes, noise"):
        table.add_column(head, justify="right")
    for label, key, fmt in [("ONNX file", "artifact_bytes", fmt_bytes), ("accuracy", "accuracy", "{:.4f}".format),
                            ("NLL", "nll", "{:.4f}".format), ("ECE (15 bins)", "ece", "{:.4f}".format)]:
        table.add_row(label, *(fmt(s[f"{prefix}{key}"]) for prefix in ("", "small_", "compact_")))
    table.add_row(".ebnn IR", fmt_bytes(s["ebnn_bytes"]), fmt_bytes(s["small_ebnn_bytes"]), "")
    console.print(table)
    timing = Table(title="fp32 baked ensemble · onnxruntime CPU", title_justify="left")
    timing.add_column("")
    timing.add_column("value", justify="right")
    ratios = s["ratios"]  # the profile's own figures (p50s of interleaved runs): one number per comparison
    for label, value in [
        ("latency p50, batch 1", f"{ens:.3f} ms"),
        ("vs float deterministic pass (p50)", f"{ratios['vs_float_deterministic']:.2f}x its {det:.3f} ms"),
        (f"vs float BNN, {samples} sampled passes (p50)",
         f"{ratios['speedup_vs_float_bnn']:.1f}x faster than {bnn:.3f} ms"),
        ("energy per inference", "n/a" if energy is None else f"{energy:.3f} mJ"),
    ]:
        timing.add_row(label, value)
    console.print(timing)
    if energy is None:
        console.print(f"energy n/a: {s['energy_reason']}", highlight=False)
