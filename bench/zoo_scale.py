"""bayesian-torch's ImageNet ResNets (``models/bayesian/resnet_*_large``) through import, lowering and export.

Too large for the test suite (resnet18: 11.7M Bayesian weights, resnet50: 25.6M), so measured here. For each
model and method (variational, flipout), freshly initialised (seed 0; the posterior is what the factory
gives, no pretrained weights; batch-norm statistics from two random batches), on a 3 x 224 x 224 input:

    import       ``import_model`` (torch.onnx export of the posterior-mean net + shape folding + IR)
    lower        ``lower(ir, SCHEME)`` for each scheme asked for
    export       ``export_model(ir, ExportConfig(S, mode=mode))`` for baked and noise, float scheme
    run          onnxruntime, one batch of B random images through the exported ensemble
    check        baked predictive vs the reference runtime's (same seed: the same members), max |diff|
    int8         the baked export with ``weights="int8"``: its serialized bytes against the 2 GiB protobuf limit

and the memory of each stage, as ``bench/memory.py`` measures it: the imported IR is saved as an ``.ebnn``,
then ``lower/SCHEME`` (load, ``lower(..., consume=True)``, save) and ``export/SCHEME`` (load the lowered IR,
baked export at S, save) each run in a fresh process (``memory.spawn``) that reports its peak RSS minus its
RSS after imports; ``import`` is measured in this process, as its peak RSS over the RSS before it (Linux:
``VmHWM`` reset through ``/proc/self/clear_refs``). Each is also given as a multiple of the posterior's fp32
bytes (8 bytes per Bayesian weight: μ and σ), and lowering's speed as Bayesian weights per second of the
whole ``lower/SCHEME`` process stage (load + lower + save).

Run from the repository root (a few minutes; ~8 GB free memory for resnet50 at S = 4)::

    .venv/bin/python bench/zoo_scale.py [--models resnet18,resnet50] [--schemes float,fixed] [--samples 4]
        [--batch 2] [--json out.json]

It prints one JSON line per (model, method) on stdout and a summary table on stderr.

Measured on the CI machine (2 shared cores under load from other jobs, no GPU; torch 2.13, onnx 1.23,
onnxruntime 1.32; S = 4, batch 2, seconds)::

    model                      weights  import  lower float/fixed  baked export/run  noise export/run  baked-ref
    variational_large:resnet18  11.7M     4.9      0.3 / 1.6          2.3 / 0.23        0.3 / 0.79      5.6e-08
    flipout_large:resnet18      11.7M    10.3      1.2 / 3.6          4.3 / 0.35        0.5 / 1.99      4.1e-08
    variational_large:resnet50  25.5M    22.2      1.9 / 9.3         12.8 / 1.25        1.7 / 2.73      7.1e-06
    flipout_large:resnet50      25.5M    33.3      2.7 / 11.2         6.2 / 0.78        0.8 / 1.47      1.0e-05

Stage memory and lowering speed of variational resnet50 (``--models resnet50 --methods variational --schemes
float,fixed,mcq``; 25,503,912 Bayesian weights, posterior 204 MB in fp32; the same machine, load average 4-5,
so seconds are loose)::

    stage          peak - RSS before/baseline   x posterior   seconds   weights/s
    import                1106 MiB                 5.68          31.1
    lower/float            243 MiB                 1.25           1.3      19.0M
    lower/fixed            321 MiB                 1.65           4.7       5.4M
    lower/mcq              331 MiB                 1.70           4.0       6.3M
    export/float          1834 MiB                 9.43           6.7       (baked S = 4, fp32: 409 MB .onnx)
    export/fixed          1685 MiB                 8.66           8.8
    export/mcq            1688 MiB                 8.67           7.2
    lower/codebook         325 MiB                 1.67          49.4       0.5M   (a later run, load ~1)

codebook's lowering is the slow one: its mixture fit (mini-batch EM, trying K = 2^b - 1 upwards until the
variance budget is met) costs about 0.9 s per layer whatever the layer's size, and ResNet-50 has 54 Bayesian
conv/linear layers; ``bench/memory.py``'s few large layers lower at 1.4M weights/s.

Lowering holds the model and its largest layer (a ResNet's layers are small: 1.3-1.7x, against 1.8-3.0x for
the few big layers of ``bench/memory.py``). The export's 8.7-9.4x is the exporter's (the S = 4 fp32 constants
alone are 2x). The baked export with ``weights="int8"`` at S = 4 serializes to 103 MB, far under protobuf's
2 GiB (int8 fits up to S = 81 of 25.5M weights, fp32 up to S = 20); a larger one is written with its constants in
an external data file beside the ``.onnx`` (``<file>.data``), which every reader in edgebnn loads.

Every model imports with static shapes and exports in baked and noise mode; the baked ensemble reproduces
the reference runtime's members (max |diff| of the predictive, float32 summation order). Analytic mode is not
timed here; ``export_model(ir, ExportConfig(4, mode="analytic"))`` of variational resnet18 took 7.0 s and gives a valid
predictive (these ResNets downsample with 1x1 convs: no Slice/Pad, unlike the CIFAR option-A shortcut).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import memory  # bench/memory.py: one stage in a fresh process
import numpy as np


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def peak_during(fn: Any) -> tuple[int, Any]:
    """(peak RSS while ``fn()`` runs minus the RSS before it, its result); freed heap is trimmed first, so memory
    that malloc kept from earlier work cannot hide what ``fn`` allocates."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status_bytes("VmRSS")
    result = fn()
    return _status_bytes("VmHWM") - before, result


def resnet_large(model_name: str, method: str) -> Any:
    """bayesian-torch's ``resnet_{method}_large.{model_name}``, freshly initialised (seed 0), in eval mode with
    batch-norm running statistics from two random 8 x 3 x 224 x 224 batches, as a trained model has real ones."""
    import importlib

    import torch

    lib = importlib.import_module(f"bayesian_torch.models.bayesian.resnet_{method}_large")
    torch.manual_seed(0)
    model = getattr(lib, model_name)()
    norms = [m for m in model.modules() if hasattr(m, "running_var")]
    for m in norms:
        m.momentum = None
        m.reset_running_stats()
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(8, 3, 224, 224))
    for m in norms:
        m.momentum = 0.1
    return model.eval()


def run(model_name: str, method: str, schemes: list[str], samples: int, batch: int) -> dict[str, Any]:


    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.importers import import_model
    from edgebnn.passes import lower
    from edgebnn.runtime import Session
    from edgebnn.runtime.reference import predict

    model = resnet_large(model_name, method)
    row: dict[str, Any] = {"model": f"{method}_large:{model_name}", "samples": samples, "batch": batch}
    t = time.perf_counter()
    import_bytes, ir = peak_during(lambda: import_model(model, (1, 3, 224, 224), where=row["model"]))
    row["import_s"] = round(time.perf_counter() - t, 2)
    row["bayesian_weights"] = n = int(sum(math.prod(w.encoding.shape) for w in ir.iter_encoded_weights()))
    posterior = 8 * n
    row["posterior_fp32_bytes"] = posterior
    row["memory"] = {"import": {"stage_bytes": import_bytes, "x_posterior": round(import_bytes / posterior, 2)}}
    with tempfile.TemporaryDirectory(prefix="edgebnn-zoo-scale-") as tmp:
        from edgebnn import ir as ir_io

        ir_io.save(ir, Path(tmp) / "posterior.ebnn")
        for scheme in schemes:
            for stage in ("lower", "export"):
                r = memory.spawn(stage, scheme, Path(tmp), samples, 0)
                if "stage_bytes" in r:
                    r["x_posterior"] = round(r["stage_bytes"] / posterior, 2)
                    r["weights_per_s"] = round(n / r["seconds"]) if r["seconds"] else None
                row["memory"][f"{stage}/{scheme}"] = r
    row["lower_s"] = {}
    for scheme in schemes:
        t = time.perf_counter()
        lower(ir, scheme, seed=0)
        row["lower_s"][scheme] = round(time.perf_counter() - t, 2)
    x = np.random.default_rng(1).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    for mode in ("baked", "noise"):
        t = time.perf_counter()
        proto = export_model(ir, ExportConfig(samples, mode=mode, seed=0, rng="host")).proto
        row[f"{mode}_export_s"] = round(time.perf_counter() - t, 2)
        session = Session(proto, seed=0)
        session.predict(x)  # warm-up
        t = time.perf_counter()
        probs = session.predict(x).probs
        row[f"{mode}_run_s"] = round(time.perf_counter() - t, 3)
        if mode == "baked":
            ref = predict(ir, x, samples, seed=0).probs
            row["baked_vs_reference_max_abs"] = float(np.abs(probs - ref).max())
        del proto, session
    int8 = export_model(ir, ExportConfig(samples, mode="baked", seed=0, weights="int8")).proto
    row["int8_baked_bytes"] = int8.ByteSize()
    row["int8_baked_under_2GiB"] = row["int8_baked_bytes"] < 2**31
    return row


def print_memory(row: dict[str, Any]) -> None:
    """The stage memory of one row, one line per stage, on stderr."""
    for stage, r in row["memory"].items():
        if "stage_bytes" not in r:
            print(f"  {stage:<16} {r.get('error', '?')}", file=sys.stderr)
            continue
        speed = f"  {r['weights_per_s'] / 1e6:5.1f}M weights/s" if r.get("weights_per_s") else ""
        secs = f"  {r['seconds']:5.1f}s" if "seconds" in r else ""
        print(f"  {stage:<16} {r['stage_bytes'] / 2**20:7.0f} MiB  {r['x_posterior']:5.2f}x posterior{secs}{speed}",
              file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--methods", default="variational,flipout")
    parser.add_argument("--schemes", default="float,fixed")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for model_name in args.models.split(","):
        for method in args.methods.split(","):
            row = run(model_name, method, args.schemes.split(","), args.samples, args.batch)
            rows.append(row)
            print(json.dumps(row), flush=True)
            print(
                f"{row['model']:<28} {row['bayesian_weights']:>10,} weights  import {row['import_s']:>6.1f}s  "
                f"baked export {row['baked_export_s']:>5.1f}s run {row['baked_run_s']:>6.3f}s  "
                f"noise run {row['noise_run_s']:>6.3f}s  baked-ref {row['baked_vs_reference_max_abs']:.1e}  "
                f"int8 baked {row['int8_baked_bytes'] / 1e6:.0f} MB",
                file=sys.stderr,
            )
            print_memory(row)
    if args.json:
        from edgebnn._io import atomic_write_json

        atomic_write_json(args.json, rows)


if __name__ == "__main__":
    main()
