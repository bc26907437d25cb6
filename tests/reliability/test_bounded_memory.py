"""Bounded resources, measured with tracemalloc (numpy's buffers and Python bytes are traced).

- A hostile declared size (a tensor, a weight ``shape``, a protobuf length) is refused before anything is
  allocated for it.
- A consuming lower and ``ir.save`` hold no second copy of the model (measured as peak RSS in a fresh process:
  protobuf's memory is outside tracemalloc's view).
- Large tensors are processed per layer: verifying, loading, lowering and exporting a model with 4 equal
  layers needs no more working memory than with 1 of them, beyond the bytes of the result itself (its
  serialized size: an exporter may hold its whole output once). The criterion is relative,
  (peak(4 layers) - peak(1 layer)) - (output(4) - output(1)), so it does not depend on what one layer needs.

``bench/memory.py`` measures the same on a 25M-weight posterior, in absolute terms.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_corpus import CASES, Ctx

from edgebnn import ir
from edgebnn.errors import InvalidArtifactError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.ir import BNNModel, gaussian_mlp
from edgebnn.passes import SCHEMES, lower

WIDTH = 512
LAYER_BYTES = 8 * WIDTH * WIDTH  # one layer's posterior in fp32: μ and σ


def traced_peak(fn: Callable[[], object]) -> int:
    return traced(fn)[0]


def traced(fn: Callable[[], object]) -> tuple[int, object]:
    """(peak traced bytes while ``fn`` runs, its result)."""
    tracemalloc.start()
    try:
        result = fn()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


HOSTILE_SIZES = ["ebnn-declared-size-4TiB", "ebnn-declared-size-wraps-int64", "ebnn-declared-size-deterministic",
                 "ebnn-shape-attribute-1T-weights", "ebnn-shape-attribute-wraps-int64", "ebnn-length-prefix-1TiB"]


@pytest.mark.parametrize("case_id", HOSTILE_SIZES)
def test_hostile_declared_size_allocates_nothing(case_id, tmp_path, monkeypatch, request):
    bad = next(c for c in CASES if c.id == case_id).build(Ctx(tmp_path, monkeypatch, request))
    path = next(a for a in bad.argv if a.endswith(".ebnn"))

    def load():
        with pytest.raises(InvalidArtifactError):
            ir.load(path)

    assert traced_peak(load) < 4 << 20  # the files are a few KiB; they declare up to 2**64 elements


def mlp(layers: int, seed: int = 0) -> BNNModel:
    """``layers`` Gemm layers of WIDTH x WIDTH Gaussian weights (each LAYER_BYTES of posterior), no biases."""
    rng = np.random.default_rng(seed)
    posteriors = []
    for _ in range(layers):
        mu = rng.normal(0, 0.05, (WIDTH, WIDTH)).astype(np.float32)
        sigma = (0.02 * np.exp(0.5 * rng.standard_normal((WIDTH, WIDTH)))).astype(np.float32)
        posteriors.append((mu, sigma, None, None))
    return gaussian_mlp(posteriors)


def extra_per_layer(run: Callable[[BNNModel], object], size: Callable[[object], int] = lambda r: 0) -> float:
    """Working memory per extra layer beyond the output's own bytes, in layers' posterior bytes:
    ((peak(4 layers) - peak(1 layer)) - (size(output 4) - size(output 1))) / 3."""
    small, big = mlp(1), mlp(4)
    (p1, r1), (p4, r4) = traced(lambda: run(small)), traced(lambda: run(big))
    return ((p4 - p1) - (size(r4) - size(r1))) / 3 / LAYER_BYTES


def test_verify_holds_one_layer_at_a_time():
    assert extra_per_layer(ir.verify) < 0.1


def test_load_holds_one_layer_not_the_file(tmp_path):
    path = ir.save(mlp(4), tmp_path / "m.ebnn")
    assert path.stat().st_size > 4 * LAYER_BYTES
    peak = traced_peak(lambda: ir.load(path))
    # the file is parsed a tensor at a time (a tensor is half a layer), then verified a layer at a time
    assert peak < 1.5 * LAYER_BYTES, peak / LAYER_BYTES


# float and prune keep each posterior as it is: their result is the whole model, and lower() reports its size
# through protobuf's ByteSize (one model-sized buffer), so they are held to what load and verify promise only.
COMPRESSING = [s for s in SCHEMES if s not in ("float", "prune")]


@pytest.mark.parametrize("scheme", COMPRESSING)
def test_lowering_holds_one_layer_at_a_time(scheme):
    assert extra_per_layer(lambda m: lower(m, scheme)) < 0.25


def test_baked_export_holds_one_layer_at_a_time():
    samples = 4

    assert extra_per_layer(lambda m: export_model(m, ExportConfig(samples, mode="baked")).proto,
                           lambda proto: proto.ByteSize()) < 0.25


# -- protobuf's own memory, which tracemalloc does not see ---------------------------------------------------
# The model's tensors live in protobuf (upb) arenas, allocated outside Python's allocator: a copy of the whole
# model, or a whole serialized copy of it, is invisible to tracemalloc. These stages run in a fresh process that
# reads its peak resident set (Linux: VmHWM, reset through /proc/self/clear_refs, after glibc's malloc_trim has
# returned the freed heap) around each step.

RSS_SCRIPT = r"""
import ctypes, json, sys
import numpy as np
from edgebnn import ir
from edgebnn.ir import gaussian_mlp
from edgebnn.passes import lower

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

def peak_over_now(fn):
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back, so reused memory cannot hide an allocation
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    result = fn()
    return status("VmHWM") - before, result

width, layers, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
ir.save(gaussian_mlp([(rng.normal(0, 0.05, (width, width)).astype(np.float32),
                       (0.02 * np.exp(0.5 * rng.standard_normal((width, width)))).astype(np.float32), None, None)
                      for _ in range(layers)]), path)
out = {}
for scheme in ("float", "mcq"):
    for consume in (False, True):
        model = ir.load(path)
        out[f"{scheme}/consume={consume}"], lowered = peak_over_now(
            lambda: lower(model, scheme, consume=consume).model)  # noqa: B023
        del model
        if scheme == "float" and consume:
            out["save"], _ = peak_over_now(lambda: ir.save(lowered, path))  # noqa: B023
        del lowered
print(json.dumps(out))
"""

RSS_WIDTH, RSS_LAYERS = 1024, 8
RSS_MODEL_BYTES = RSS_LAYERS * 8 * RSS_WIDTH * RSS_WIDTH  # 64 MiB of μ and σ: the proto holds as much


def rss_peaks(tmp_path) -> dict[str, int]:
    """Peak RSS over the RSS before each step, in a fresh interpreter (see RSS_SCRIPT)."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak resident set")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(RSS_WIDTH), str(RSS_LAYERS), str(tmp_path / "m.ebnn")],
                       capture_output=True, text=True, check=False, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_consuming_lower_and_save_copy_no_model(tmp_path):
    peaks = {k: v / RSS_MODEL_BYTES for k, v in rss_peaks(tmp_path).items()}
    # the measurement sees a model copy: a lower that keeps its input holds the input and its result
    assert peaks["float/consume=False"] > 0.9, peaks
    # lowering in place holds a layer's arrays at a time (a layer is 1/8 of the model), never a model copy (1.0)
    assert peaks["float/consume=True"] < 0.5, peaks
    assert peaks["mcq/consume=False"] - peaks["mcq/consume=True"] > 0.7, peaks
    # saving writes one initializer at a time: no serialized copy of the whole model (1.0, 2.0 while protobuf
    # grows its buffer)
    assert peaks["save"] < 0.5, peaks
