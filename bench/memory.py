"""Peak memory of lowering and exporting a 25M-weight synthetic posterior, one fresh process per stage.

The posterior (25,503,744 Bayesian weights; μ and σ in fp32 make 204 MB, "the posterior's fp32 bytes")
is built directly as IR with onnx.helper and ``edgebnn.ir.make_encoding_node``, a few big layers::

    input [B, 16, 8, 8] -> Conv 128x16x3x3 -> Relu -> MaxPool 2 -> Conv 256x128x3x3 -> Relu -> Flatten
      -> Gemm 4096x4096 (+ Gaussian bias) -> Relu -> Gemm 2048x4096 -> Relu -> Gemm 10x2048 -> logits

μ ~ Student-t(4)·sqrt(1/(2·fan_in)), σ = 0.25·sqrt(1/(2·fan_in))·exp(0.5 z) (as bench/compression.py).

Stages, each in a fresh ``python`` process so that one stage's high-water mark cannot hide another's:

    build          generate the posterior and ``ir.save`` it
    load           ``ir.load`` it (parse + verify, every encoding decoded and checked)
    lower/SCHEME   load, ``edgebnn.passes.lower(model, SCHEME, consume=True)``, ``ir.save`` the result
    export/SCHEME  load the lowered IR, ``export_model(model, ExportConfig(S, mode=MODE))``, ``save_onnx``
                   (``--mode``, default baked; ``bench/scale.py`` runs it on the zoo's models)

Each stage reports its peak resident set (Linux ``VmHWM``, else ``getrusage(RUSAGE_SELF).ru_maxrss``), the
same right after its imports (the interpreter, numpy, onnx, onnxruntime: the baseline), the difference
("peak - baseline", the memory the stage itself needed) and that difference as a multiple of the posterior's
fp32 bytes.

Run from the repository root (takes a few minutes; the machine must have ~3 GB free)::

    .venv/bin/python bench/memory.py [--schemes float,mcq,...] [--samples 4] [--seed 0] [--json out.json]

It prints one JSON line on stdout and a table on stderr.

Measured on the CI machine (2 shared cores, 23 GB, no GPU; edgebnn 0.1.0, numpy 2.4, onnx 1.23,
onnxruntime 1.31, protobuf 7.36 (upb), Python 3.11; S = 4, seed 0). Baseline after imports: 83 MiB. "x
posterior" is peak - baseline over the posterior's 204 MB of fp32 μ and σ; "before" is commit 0fb6a9a (each
pass copied its input, ``ir.load`` held the file's bytes while parsing, ``ir.save`` and the lowering report's
``ebnn_bytes`` serialized the whole model at once), "after" is this version, both run the same hour. Seconds
and weights/s are of the whole stage (load + lower + save, 25.5M weights), the mean of two before/after runs
interleaved stage by stage on the loaded machine (load average 2.5-3.5 on its 2 cores; single runs vary by up
to 2x)::

    stage   scheme     before x   after: peak-baseline  x posterior   seconds before/after  weights/s  artifact
    build                3.12              390 MiB         2.01                                       204.0 MB
    load                 2.00              340 MiB         1.75          0.9 / 1.0                   (.ebnn)
    lower   float        4.13              347 MiB         1.78          3.5 / 3.1           8.2M     204.0 MB
    lower   mcq          4.39              579 MiB         2.98          5.5 / 3.0           8.4M      38.2 MB
    lower   fixed        4.13              570 MiB         2.93          3.0 / 3.1           8.1M      29.8 MB
    lower   codebook     5.09              686 MiB         3.53         20.0 / 18.5          1.4M      26.7 MB
    lower   ternary      4.75              607 MiB         3.12          4.3 / 3.1           8.2M      12.8 MB
    lower   binary       4.34              626 MiB         3.22          3.8 / 4.7           5.5M       9.6 MB
    lower   prune        5.16              658 MiB         3.38          3.6 / 3.8           6.8M     204.0 MB
    export  float        7.18             1397 MiB         7.18                                       408.1 MB .onnx
    export  mcq          6.32             1234 MiB         6.34                                       408.1 MB
    export  fixed        6.46             1223 MiB         6.29                                       408.1 MB
    export  codebook     6.26             1218 MiB         6.26                                       408.1 MB
    export  ternary      6.19             1204 MiB         6.19                                       408.1 MB
    export  binary       6.28             1222 MiB         6.28                                       408.1 MB
    export  prune        7.18             1396 MiB         7.17                                       408.1 MB

So lowering a 25M-weight posterior now peaks at 1.8x (float) to 3.5x (codebook) its fp32 bytes, from 4.1x to
5.2x, at the same speed (within the noise); every scheme but codebook (its mixture fit) lowers more than 5M
weights/s. Where it went: ``lower(..., consume=True)`` rewrites the loaded model in place (each pass copied
its input: 1.0x; passes after the first of a composition no longer copy either), ``ir.save`` and
``ebnn_bytes`` serialize one initializer at a time (protobuf's whole-model ``SerializeToString``/``ByteSize``
took 2.0x while it grew its buffer), ``ir.load`` parses the file a field at a time (the file's bytes were
1.0x), and the schemes drop weight-sized temporaries early (``pack_int`` masked int16 codes as two int32
copies; codebook held three component-index arrays at once). What remains: the model itself (1.1x: protobuf's
copy of μ and σ), the largest layer decoded (0.66x here: fc1 is 4096 x 4096) while its encoding is built, and,
for a dense result (prune), the replaced tensors, which protobuf's arena keeps until the model is freed (up to
1.0x). The baked S = 4 export is 6.2-7.2x (that graph alone is 2x: S·n·4 bytes of constants, and the loaded
input IR another 1-2x); not changed here. ``tests/reliability/test_bounded_memory.py`` holds loading,
verifying, lowering and the baked export to one layer at a time, and a consuming lower and ``ir.save`` to no
model copy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from edgebnn._io import atomic_write_json

SCHEMES = ("float", "mcq", "fixed", "codebook", "ternary", "binary", "prune")
LAYERS = (  # name, kind, weight shape, Gaussian bias
    ("conv1", "Conv", (128, 16, 3, 3), False),
    ("conv2", "Conv", (256, 128, 3, 3), False),
    ("fc1", "Gemm", (4096, 4096), True),
    ("fc2", "Gemm", (2048, 4096), False),
    ("fc3", "Gemm", (10, 2048), False),
)
INPUT_SHAPE = [1, 16, 8, 8]
CLASSES = 10


def n_weights() -> int:
    import math

    return sum(math.prod(shape) + (shape[0] if gauss_bias else 0) for _, _, shape, gauss_bias in LAYERS)


def posterior_fp32_bytes() -> int:
    return 8 * n_weights()  # μ and σ, 4 bytes each


def build_posterior(seed: int) -> Any:
    """The synthetic posterior as a ``BNNModel``; each layer's arrays are freed once they are in the proto."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from edgebnn.ir import DOMAIN, BNNModel, GaussianWeight, Manifest, make_encoding_node

    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [], "memory_bench",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *INPUT_SHAPE[1:]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
    )
    enc_nodes, nodes = [], []
    x = "input"
    for i, (name, kind, shape, gauss_bias) in enumerate(LAYERS):
        fan_in = int(np.prod(shape[1:]))
        scale = np.sqrt(1 / (2 * fan_in))
        mu = (rng.standard_t(4, shape) * scale).astype(np.float32)
        sigma = (0.25 * scale * np.exp(0.5 * rng.standard_normal(shape))).astype(np.float32)
        enc_nodes.append(make_encoding_node(graph, f"{name}.weight", name, GaussianWeight(mu, sigma)))
        del mu, sigma
        bias = (0.01 * rng.standard_normal(shape[0])).astype(np.float32)
        if gauss_bias:
            enc_nodes.append(make_encoding_node(graph, f"{name}.bias", name,
                                                GaussianWeight(bias, np.full_like(bias, 0.005))))
        else:
            graph.initializer.append(onnx.numpy_helper.from_array(bias, f"{name}.bias"))
        last = i == len(LAYERS) - 1
        y = "logits" if last else f"{name}.out"
        if kind == "Conv":
            nodes.append(helper.make_node("Conv", [x, f"{name}.weight", f"{name}.bias"], [y], pads=[1, 1, 1, 1],
                                          kernel_shape=list(shape[2:])))
        else:
            nodes.append(helper.make_node("Gemm", [x, f"{name}.weight", f"{name}.bias"], [y], transB=1))
        if last:
            break
        nodes.append(helper.make_node("Relu", [y], [f"{name}.relu"]))
        x = f"{name}.relu"
        if name == "conv1":
            nodes.append(helper.make_node("MaxPool", [x], ["pool1"], kernel_shape=[2, 2], strides=[2, 2]))
            x = "pool1"
        if name == "conv2":
            nodes.append(helper.make_node("Flatten", [x], ["flat"], axis=1))
            x = "flat"
    graph.node.extend(enc_nodes + nodes)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    manifest = Manifest(source_library="synthetic", input_name="input", input_shape=INPUT_SHAPE, num_classes=CLASSES)
    return BNNModel(proto, manifest, "<25M-weight synthetic posterior>")


# -- one stage, in this process ---------------------------------------------------------------------------


def _rss_bytes() -> int:
    """Peak resident set of this process so far: Linux's VmHWM, else ``ru_maxrss`` (which, spawned from a larger
    process, can start at that process's size: exec keeps the high-water mark of the forked copy)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def run_stage(stage: str, scheme: str | None, workdir: Path, samples: int, seed: int,
              mode: str = "baked") -> dict[str, Any]:
    import numpy  # noqa: F401  (imports count towards the baseline, not the stage)
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401

    from edgebnn import ir
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.ensemble import save_onnx
    from edgebnn.exporters.export import export_model
    from edgebnn.passes import lower

    posterior = workdir / "posterior.ebnn"
    lowered = workdir / f"lowered-{scheme}.ebnn"
    baseline = _rss_bytes()
    started = time.perf_counter()
    out: Path | None = None
    if stage == "build":
        out = ir.save(build_posterior(seed), posterior)
    elif stage == "load":
        ir.load(posterior)
    elif stage == "lower":
        out = ir.save(lower(ir.load(posterior), scheme, seed=seed, consume=True).model, lowered)
    elif stage == "export":
        out = save_onnx(export_model(ir.load(lowered), ExportConfig(samples, mode=mode, seed=seed)).proto,
                        workdir / f"{scheme}-{mode}-S{samples}.onnx")
    else:
        raise ValueError(f"unknown stage {stage}")
    seconds = time.perf_counter() - started
    peak = _rss_bytes()
    return {"stage": stage, "scheme": scheme, "peak_rss": peak, "baseline_rss": baseline,
            "stage_bytes": peak - baseline, "seconds": round(seconds, 2),
            "mode": mode if stage == "export" else None, "artifact_bytes": _artifact_bytes(out)}


def _artifact_bytes(out: Path | None) -> int | None:
    """The bytes written: the file and, past the protobuf limit, its external data beside it."""
    if out is None:
        return None
    data = out.with_name(out.name + ".data")
    return out.stat().st_size + (data.stat().st_size if data.exists() else 0)


def child_main(args: argparse.Namespace) -> None:
    try:
        row = run_stage(args.stage, args.scheme, Path(args.dir), args.samples, args.seed, args.mode)
    except Exception as e:  # reported in the row (and the driver's exit status), so the table shows which stage
        row = {"stage": args.stage, "scheme": args.scheme, "error": f"{type(e).__name__}: {e}".splitlines()[0],
               "traceback": traceback.format_exc(limit=3)}
    print(json.dumps(row))


# -- the driver -------------------------------------------------------------------------------------------


def spawn(stage: str, scheme: str | None, workdir: Path, samples: int, seed: int,
          mode: str = "baked") -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--stage", stage, "--dir", str(workdir), "--samples", str(samples),
           "--seed", str(seed), "--mode", mode]
    if scheme:
        cmd += ["--scheme", scheme]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not lines:  # killed (out of memory?) or crashed before reporting
        return {"stage": stage, "scheme": scheme, "error": f"exit {r.returncode}: {r.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def main_bench(args: argparse.Namespace) -> dict[str, Any]:
    schemes = [s for s in args.schemes.split(",") if s]
    post = posterior_fp32_bytes()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgebnn-memory-") as tmp:
        workdir = Path(tmp)
        plan: list[tuple[str, str | None]] = [("build", None), ("load", None)]
        for scheme in schemes:
            plan += [("lower", scheme), ("export", scheme)]
        for stage, scheme in plan:
            if stage == "export" and any(r.get("error") and r["stage"] == "lower" and r["scheme"] == scheme
                                         for r in rows):
                rows.append({"stage": stage, "scheme": scheme, "error": "skipped: lowering failed"})
                continue
            row = spawn(stage, scheme, workdir, args.samples, args.seed, args.mode)
            if "stage_bytes" in row:
                row["x_posterior"] = round(row["stage_bytes"] / post, 2)
                row["peak_x_posterior"] = round(row["peak_rss"] / post, 2)
            rows.append(row)
            what = row.get("error") or f"{row['stage_bytes'] / 2**20:.0f} MiB over baseline"
            print(f"{stage}{'/' + scheme if scheme else ''}: {what}", file=sys.stderr, flush=True)
    import numpy
    import onnx
    import onnxruntime

    from edgebnn import __version__

    return {
        "bench": "edgebnn.memory/1", "edgebnn_version": __version__, "numpy": numpy.__version__,
        "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(), "n_weights": n_weights(), "posterior_fp32_bytes": post,
        "largest_layer_fp32_bytes": 8 * 4096 * 4096, "samples": args.samples, "seed": args.seed, "stages": rows,
    }


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    post = result["posterior_fp32_bytes"]
    table = Table(title=f"peak memory per stage: {result['n_weights']:,} weights, posterior fp32 "
                        f"{post / 1e6:.0f} MB, S={result['samples']} (fresh process per stage)",
                  title_justify="left")
    for col in ("stage", "scheme", "peak RSS MiB", "baseline MiB", "peak-baseline MiB", "x posterior", "s",
                "artifact MB", "error"):
        table.add_column(col, justify="left" if col in ("stage", "scheme", "error") else "right")
    for r in result["stages"]:
        if "stage_bytes" in r:
            table.add_row(r["stage"], r["scheme"] or "", f"{r['peak_rss'] / 2**20:.0f}",
                          f"{r['baseline_rss'] / 2**20:.0f}", f"{r['stage_bytes'] / 2**20:.0f}",
                          f"{r['x_posterior']:.2f}", f"{r['seconds']:.1f}",
                          f"{r['artifact_bytes'] / 1e6:.1f}" if r.get("artifact_bytes") else "", "")
        else:
            table.add_row(r["stage"], r["scheme"] or "", "", "", "", "", "", "", r["error"][:60])
    Console(stderr=True, width=150).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", default="baked", help="the export stage's mode (baked, noise, analytic)")
    parser.add_argument("--json", help="also write the JSON result here")
    parser.add_argument("--stage", help=argparse.SUPPRESS)  # internal: run one stage in this process
    parser.add_argument("--scheme", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        child_main(args)
        return
    result = main_bench(args)
    print(json.dumps(result, separators=(",", ":")))
    if args.json:
        atomic_write_json(args.json, result)
    print_table(result)
    failed = [f"{r['stage']}/{r['scheme']}" for r in result["stages"] if r.get("error")]
    if failed:
        sys.exit(f"stages failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
