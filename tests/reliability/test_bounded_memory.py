"""Bounded resources, measured with tracemalloc (numpy's buffers and Python bytes are traced).

- A hostile declared size (a tensor, a weight ``shape``, a protobuf length) is refused before anything is
  allocated for it.
- Large tensors are processed per layer: verifying, loading, lowering and exporting a model with 4 equal
  layers needs no more working memory than with 1 of them, beyond the bytes of the result itself (its
  serialized size: an exporter may hold its whole output once). The criterion is relative,
  (peak(4 layers) - peak(1 layer)) - (output(4) - output(1)), so it does not depend on what one layer needs.

``bench/memory.py`` measures the same on a 25M-weight posterior, in absolute terms.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from test_corpus import CASES, Ctx

from edgebnn import ir
from edgebnn.errors import InvalidArtifactError
from edgebnn.exporters.ensemble import export_onnx
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


def test_load_holds_the_file_and_one_layer(tmp_path):
    path = ir.save(mlp(4), tmp_path / "m.ebnn")
    size = path.stat().st_size
    peak = traced_peak(lambda: ir.load(path))
    assert peak < size + 1.5 * LAYER_BYTES, peak / LAYER_BYTES  # the file's bytes while parsing, then one layer


# float and prune keep each posterior as it is: their result is the whole model, and lower() reports its size
# through protobuf's ByteSize (one model-sized buffer), so they are held to what load and verify promise only.
COMPRESSING = [s for s in SCHEMES if s not in ("float", "prune")]


@pytest.mark.parametrize("scheme", COMPRESSING)
def test_lowering_holds_one_layer_at_a_time(scheme):
    assert extra_per_layer(lambda m: lower(m, scheme)) < 0.25


def test_baked_export_holds_one_layer_at_a_time():
    samples = 4

    assert extra_per_layer(lambda m: export_onnx(m, samples), lambda proto: proto.ByteSize()) < 0.25
