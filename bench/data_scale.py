"""Peak memory of ``edgebnn eval`` on a shard folder larger than one wants in memory (default 2 GiB).

Writes a folder of ``.npy`` shards into a temp dir (``x_000.npy``: float32 inputs ``(n, 3072)``, a flattened
3x32x32 image; ``y_000.npy``: int64 labels; written a chunk at a time so the writer stays small), then evaluates a
Bayesian MLP (3072 -> 256 -> 10, Gaussian weights) on it in a fresh ``python`` process, through the same
loader as ``edgebnn eval --data DIR``, and reports that process's peak resident set
(``getrusage(RUSAGE_SELF).ru_maxrss``) against the same right after its imports and model load (the
baseline). The loader memory-maps one shard only while it copies a batch out, so the peak should stay
near baseline + a few batches, whatever the folder's size.

Run from the repository root (needs the folder's size free in the temp dir; about a minute per GiB on
2 cores)::

    .venv/bin/python bench/data_scale.py [--gib 2] [--shard-mib 256] [--samples 4] [--json out.json]

Prints one JSON line on stdout and a summary on stderr. Measured on this project's 2-core machine (shared with
other jobs; edgebnn 0.1.0, numpy 2.4, onnxruntime 1.32, S = 4), ``--gib 2``: 2048 MiB of inputs (174,762 rows in 9
shards) evaluated in 74 s with a peak RSS of 167 MiB, 0 MiB over the 167 MiB after imports and model load
(the model load's own high-water mark covers the streaming working set); ``--gib 0.25``: 167 MiB as well.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FEATURES = 3 * 32 * 32
CLASSES = 10
CHUNK_ROWS = 4096  # rows written at a time

CHILD = r"""
import json, resource, sys, time
import numpy as np
from edgebnn import ir
import edgebnn

def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

model = ir.load(sys.argv[1])
baseline = rss_mib()
start = time.perf_counter()
report = edgebnn.evaluate(model, data=sys.argv[2], samples=int(sys.argv[3]))
print(json.dumps({"baseline_mib": baseline, "peak_mib": rss_mib(), "eval_s": time.perf_counter() - start,
                  "n": report["n"], "accuracy": report["accuracy"]}))
"""


def write_model(path: Path, seed: int) -> None:
    from edgebnn import ir
    from edgebnn.ir import gaussian_mlp

    rng = np.random.default_rng(seed)
    layers = []
    for fan_in, fan_out in ((FEATURES, 256), (256, CLASSES)):
        mu = (rng.standard_normal((fan_out, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
        layers.append((mu, np.full_like(mu, 0.05 / np.sqrt(fan_in)), None, None))
    ir.save(gaussian_mlp(layers), path)


def write_shards(folder: Path, total_bytes: int, shard_bytes: int, seed: int) -> int:
    """Write ``x_NNN.npy``/``y_NNN.npy`` pairs of flat float32 rows until ``total_bytes``; returns the rows."""
    from numpy.lib.format import write_array_header_1_0

    row_bytes = FEATURES * 4
    rows_per_shard = max(1, shard_bytes // row_bytes)
    total_rows = max(1, total_bytes // row_bytes)
    rng = np.random.default_rng(seed)
    done, i = 0, 0
    while done < total_rows:
        n = min(rows_per_shard, total_rows - done)
        with (folder / f"x_{i:03d}.npy").open("wb") as f:
            write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (n, FEATURES)})
            for lo in range(0, n, CHUNK_ROWS):
                f.write(rng.random((min(CHUNK_ROWS, n - lo), FEATURES), dtype=np.float32).tobytes())
        np.save(folder / f"y_{i:03d}.npy", rng.integers(0, CLASSES, n))
        done += n
        i += 1
    return total_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="size of the inputs to write and evaluate")
    parser.add_argument("--shard-mib", type=int, default=256)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgebnn-data-scale-") as tmp:
        root = Path(tmp)
        model = root / "mlp.ebnn"
        write_model(model, args.seed)
        shards = root / "shards"
        shards.mkdir()
        start = time.perf_counter()
        rows = write_shards(shards, int(args.gib * (1 << 30)), args.shard_mib << 20, args.seed)
        write_s = time.perf_counter() - start
        data_bytes = sum(p.stat().st_size for p in shards.glob("x_*.npy"))
        shard_count = len(list(shards.glob("x_*.npy")))
        child = subprocess.run([sys.executable, "-c", CHILD, str(model), str(shards), str(args.samples)],
                               capture_output=True, text=True, check=True)
        result = json.loads(child.stdout.strip().splitlines()[-1])
    result.update({"data_mib": data_bytes / (1 << 20), "rows": rows, "shards": shard_count, "write_s": write_s,
                   "samples": args.samples, "growth_mib": result["peak_mib"] - result["baseline_mib"]})
    print(f"evaluated {result['data_mib']:.0f} MiB of inputs ({rows} rows, {result['shards']} shards) in "
          f"{result['eval_s']:.1f} s: peak RSS {result['peak_mib']:.0f} MiB, {result['growth_mib']:.0f} MiB over "
          f"the {result['baseline_mib']:.0f} MiB after imports and model load", file=sys.stderr)
    line = json.dumps(result)
    print(line)
    if args.json:
        args.json.write_text(line + "\n")


if __name__ == "__main__":
    main()
