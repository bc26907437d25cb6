"""Stores of the integer encodings (fixed point, MCQ counts, ternary): the IR's packed codes and σ code in the graph,
decoded there to exactly the encoding's mean and σ, in a fraction of the fp32 bytes."""

from __future__ import annotations

import pytest
from store_helpers import assert_decodes_exactly, decode_graph, float_bytes
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn.exporters.stores import own_store, store_for
from edgebnn.ir.encodings.fixedpoint import QuantizedWeight
from edgebnn.passes import lower


@pytest.mark.parametrize("scheme, options", [("fixed", {}), ("fixed", {"bits": 3}), ("mcq", {}), ("ternary", {}),
                                             ("prune+fixed", {})])
def test_integer_codes_decode_to_the_encodings_moments(scheme, options):
    model = lower(synthetic_cnn(), scheme, seed=0, **options).model
    widths = set()
    for w in model.encoded_weights():
        enc = w.encoding
        assert isinstance(enc, QuantizedWeight)
        store = store_for(enc)
        assert store is own_store(enc.op_type)
        _, got = decode_graph(enc, store)
        assert_decodes_exactly(enc, got)  # float32(q) · scale and levels[codes]: the same float32 operations
        widths.add(enc.bits)
    assert widths  # at least one width was unpacked in the graph


@pytest.mark.parametrize("scheme", ["fixed", "mcq", "ternary"])
def test_the_file_shrinks_to_the_codes(scheme):
    """On an 8192-weight layer the decode graph (about 2 KB of nodes) is small next to the fp32 moments it replaces
    (3 x 32 KB): the file holds at most a quarter of the float store's bytes (codes of at most 8 + 8 bits)."""
    model = lower(synthetic_linear(n_in=256, classes=32), scheme, seed=0).model
    enc = model.encoded_weight("fc.weight").encoding
    proto, got = decode_graph(enc, store_for(enc))
    assert_decodes_exactly(enc, got)
    assert proto.ByteSize() < float_bytes(enc) / 4


def test_store_bytes_are_the_irs_bytes():
    """What the store says it writes is the IR's own encoding (its packed streams, the table, one scale)."""
    model = lower(synthetic_cnn(), "fixed", seed=0).model
    for w in model.encoded_weights():
        assert own_store("FixedPointWeight").nbytes(w.encoding) <= w.encoding.nbytes + 8
