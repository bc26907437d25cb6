"""The binary store (EBP): one sign bit per weight and the flip-probability code, decoded to exactly
``BinaryWeight.mean()`` = a·s·(1 - 2f) and ``stddev()`` = 2a·sqrt(f(1 - f))."""

from __future__ import annotations

import numpy as np
from store_helpers import assert_decodes_exactly, decode_graph, float_bytes
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn.exporters.stores import own_store
from edgebnn.ir.encodings import BinaryWeight, SigmaCode
from edgebnn.passes import lower


def test_signs_and_flip_codes_decode_exactly():
    model = lower(synthetic_cnn(), "binary", seed=0).model
    binary = [w.encoding for w in model.encoded_weights() if isinstance(w.encoding, BinaryWeight)]
    assert binary  # the binary pass binarizes the layer weights (biases stay fixed point)
    for enc in binary:
        _, got = decode_graph(enc, own_store("BinaryWeight"))
        assert_decodes_exactly(enc, got)


def test_one_flip_level_broadcasts():
    rng = np.random.default_rng(0)
    enc = BinaryWeight(rng.random((5, 7)) < 0.5, 0.25, SigmaCode.fit(np.full(35, 0.1), 0, rng))
    assert enc.flip.bits == 0  # no per-weight codes: one level, expanded in the graph
    _, got = decode_graph(enc, own_store("BinaryWeight"))
    assert_decodes_exactly(enc, got)


def test_the_file_shrinks_to_about_a_bit_per_weight_and_its_flip_code():
    model = lower(synthetic_linear(n_in=256, classes=32), "binary", seed=0).model
    enc = model.encoded_weight("fc.weight").encoding
    proto, got = decode_graph(enc, own_store("BinaryWeight"))
    assert_decodes_exactly(enc, got)
    assert proto.ByteSize() < float_bytes(enc) / 4
