"""The codebook store (2DGBNN): packed entry indices + the K-entry table, outliers and blended weights scattered in,
decoded to exactly ``CodebookWeight.mean()`` / ``stddev()``."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper
from store_helpers import assert_decodes_exactly, decode_graph, float_bytes
from synthetic import synthetic_linear

from edgebnn.exporters.stores import own_store, store_for
from edgebnn.exporters.stores.base import PREFIX
from edgebnn.ir.encodings import CodebookWeight
from edgebnn.passes import lower


def _codebook(n: int, k: int, outliers: int, blended: int, seed: int = 0) -> CodebookWeight:
    rng = np.random.default_rng(seed)
    flat = rng.permutation(n)
    table = np.stack([rng.normal(size=k), rng.uniform(0.01, 0.2, k)], axis=1).astype(np.float32)
    return CodebookWeight(
        (n // 8, 8), rng.integers(0, k, n), table,
        np.sort(flat[:outliers]), rng.normal(size=outliers), rng.uniform(0.01, 0.3, outliers),
        np.sort(flat[outliers:outliers + blended]), rng.integers(0, k, (blended, 2)),
        rng.integers(1, 255, (blended, 2)), sampling="independent")


@pytest.mark.parametrize("k, outliers, blended", [(16, 5, 7), (1, 0, 0), (5, 0, 3), (200, 9, 0)])
def test_indices_and_table_decode_exactly(k, outliers, blended):
    enc = _codebook(64, k, outliers, blended)
    _, got = decode_graph(enc, store_for(enc))
    assert_decodes_exactly(enc, got)  # table gathers and the own moments scattered: the numpy values


def test_a_lowered_codebook_shrinks_the_file():
    """A 4-bit codebook of 8192 weights: 4 KB of indices against 3 x 32 KB of fp32 moments."""
    model = lower(synthetic_linear(n_in=256, classes=32), "codebook", seed=0).model
    enc = model.encoded_weight("fc.weight").encoding
    assert isinstance(enc, CodebookWeight)
    proto, got = decode_graph(enc, own_store("CodebookWeight"))
    assert_decodes_exactly(enc, got)
    assert proto.ByteSize() < float_bytes(enc) / 4
    assert own_store("CodebookWeight").nbytes(enc) <= enc.nbytes + 1


def test_indices_read_by_the_mean_and_the_spread_are_stored_once():
    """mean, stddev and variance all gather by the same 4-bit indices: the pooled stream holds them once
    (4096 · 4 bits = 2048 bytes, plus the one padding byte the unpack reads past the end), not three times."""
    enc = _codebook(4096, 16, outliers=3, blended=2)
    proto, got = decode_graph(enc, store_for(enc))
    assert_decodes_exactly(enc, got)  # every decode reads the one stream's values
    stream = next(t for t in proto.graph.initializer if t.name == f"{PREFIX}u4")
    assert numpy_helper.to_array(stream).nbytes == 4096 * 4 // 8 + 1
