"""``--weights int8`` / ``int4`` for any posterior: μ per-channel integers, σ a log-domain code, decoded in the graph
to what the store's numpy decode says, within the quantization step of each."""

from __future__ import annotations

import numpy as np
import pytest
from store_helpers import decode_graph, float_bytes
from synthetic import synthetic_linear

from edgebnn.exporters import quantize
from edgebnn.exporters.stores import store_for
from edgebnn.exporters.stores.float_ import FLOAT
from edgebnn.exporters.stores.gaussian import RequantStore, sigma_at


@pytest.mark.parametrize("bits", [8, 4])
def test_requantized_moments_decode_to_their_codes(bits):
    enc = synthetic_linear(n_in=256, classes=32).encoded_weight("fc.weight").encoding
    store = store_for(enc, f"int{bits}")
    assert isinstance(store, RequantStore) and store.bits == bits
    proto, got = decode_graph(enc, store)
    # exactly the numpy decode of the stored codes: Cast(q) · scale per channel, levels[codes]
    np.testing.assert_array_equal(got["mean"], store.decoded_mean(enc))
    np.testing.assert_array_equal(got["stddev"], sigma_at(enc.stddev(), bits).decode().reshape(enc.shape))
    np.testing.assert_array_equal(got["variance"], got["stddev"] * got["stddev"])
    # and within the quantization step of the encoding: half a step per μ (the per-channel max / (2^(b-1) - 1))
    _, scale = quantize.rows(enc.mean(), bits)
    assert np.all(np.abs(got["mean"] - enc.mean()) <= scale[:, None] / 2 * (1 + 1e-6))
    # σ keeps each log-Lloyd bin's RMS: the mean variance of the layer within a few percent (8 bits: finer)
    assert abs(got["variance"].mean() / enc.moments()[1].mean() - 1) < (0.01 if bits == 8 else 0.05)
    assert proto.ByteSize() < float_bytes(enc) * (0.3 if bits == 8 else 0.2)


def test_fp32_is_the_float_store_and_ir_falls_back_to_it_for_gaussians():
    enc = synthetic_linear().encoded_weight("fc.weight").encoding
    assert store_for(enc, "fp32") is FLOAT and store_for(enc, "ir") is FLOAT  # a float posterior has no codes
    _, got = decode_graph(enc, FLOAT)
    np.testing.assert_array_equal(got["mean"], enc.mean())
    np.testing.assert_array_equal(got["variance"], enc.moments()[1])


def test_a_runtime_without_the_decode_gets_the_float_store():
    from edgebnn.passes import lower

    enc = lower(synthetic_linear(), "fixed", seed=0).model.encoded_weight("fc.weight").encoding
    assert store_for(enc, "ir", ("some-runtime",)) is FLOAT
    assert store_for(enc, "ir", ("onnxruntime",)) is not FLOAT
    # TensorRT-RTX parses and builds every store's decode (tests/integration/test_tensorrt_rtx.py)
    assert store_for(enc, "ir", ("tensorrt",)) is not FLOAT
