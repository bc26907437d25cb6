"""Bit packing and the shared σ code: exact round trips, the byte layout, sizes and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings import SigmaCode
from edgebnn.ir.encodings.packing import (
    bits_for,
    pack_int,
    pack_uint,
    packed_nbytes,
    unpack_int,
    unpack_uint,
)


@pytest.mark.parametrize("bits", range(1, 17))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000, (1 << 20) + 13])
def test_uint_round_trip_every_width(bits: int, n: int) -> None:
    values = np.random.default_rng(bits * 1000 + n).integers(0, 1 << bits, n)
    packed = pack_uint(values, bits)
    assert packed.dtype == np.uint8 and packed.size == packed_nbytes(n, bits) == (n * bits + 7) // 8
    np.testing.assert_array_equal(unpack_uint(packed, bits, n), values)


@pytest.mark.parametrize("bits", [2, 3, 4, 8, 11, 16])
def test_signed_round_trip_covers_the_whole_range(bits: int) -> None:
    values = np.arange(-(1 << (bits - 1)), 1 << (bits - 1))
    np.testing.assert_array_equal(unpack_int(pack_int(values, bits), bits, values.size), values)


def test_layout_is_lsb_first_int4_low_nibble_first_and_ternary_four_per_byte() -> None:
    np.testing.assert_array_equal(pack_uint(np.array([1, 2, 3, 4]), 4), [0x21, 0x43])
    np.testing.assert_array_equal(pack_int(np.array([1, -1, 0, 1]), 2), [0b01_00_11_01])
    np.testing.assert_array_equal(pack_uint(np.array([1, 0, 0, 0, 0, 0, 0, 1, 1]), 1), [0x81, 0x01])
    # 3-bit: value j sits at bits 3j..3j+2 of the little-endian stream
    np.testing.assert_array_equal(pack_uint(np.array([7, 0, 5]), 3), [0b0100_0111, 0b0000_0001])


def test_pack_refuses_values_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match=r"0\.\.15"):
        pack_uint(np.array([16]), 4)
    with pytest.raises(ValueError, match=r"-2\.\.1"):
        pack_int(np.array([2]), 2)
    with pytest.raises(ValueError, match=r"outside 1\.\.16"):
        pack_uint(np.array([1]), 17)
    with pytest.raises(ValueError, match="need 2 packed uint8 bytes"):
        unpack_uint(np.zeros(3, np.uint8), 4, 4)


def test_bits_for_counts() -> None:
    assert [bits_for(k) for k in (1, 2, 3, 4, 5, 16, 17, 256)] == [0, 1, 2, 2, 3, 4, 5, 8]


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 16), values=st.lists(st.integers(0, 65535), max_size=200))
def test_uint_round_trip_property(bits: int, values: list[int]) -> None:
    arr = np.array(values, np.int64) & ((1 << bits) - 1)
    np.testing.assert_array_equal(unpack_uint(pack_uint(arr, bits), bits, arr.size), arr)


# --- SigmaCode ---------------------------------------------------------------------------------------------


def test_sigma_code_levels_bytes_and_variance() -> None:
    rng = np.random.default_rng(0)
    sigma = np.exp(rng.normal(-4, 0.7, 10_000)).astype(np.float32)
    for bits in (0, 1, 2, 4):
        code = SigmaCode.fit(sigma, bits, rng)
        assert code.levels.size <= 1 << bits and code.bits == bits_for(code.levels.size)
        assert code.codes.nbytes == packed_nbytes(sigma.size, code.bits)
        decoded = code.decode()
        # each level is the rms of its bin, so the layer's mean variance is kept (float32 sums)
        want = np.mean(sigma.astype(np.float64) ** 2)
        assert np.mean(decoded.astype(np.float64) ** 2) == pytest.approx(want, rel=1e-5)
    # more levels, smaller relative error (log-domain Lloyd-Max)
    errors = [np.sqrt(np.mean((SigmaCode.fit(sigma, b, rng).decode() / sigma - 1) ** 2)) for b in (1, 2, 4)]
    assert errors[0] > errors[1] > errors[2]


def test_sigma_code_keeps_exact_zeros_and_all_zero_input() -> None:
    rng = np.random.default_rng(1)
    sigma = np.exp(rng.normal(-3, 0.5, 1000)).astype(np.float32)
    sigma[::3] = 0
    decoded = SigmaCode.fit(sigma, 2, rng).decode()
    np.testing.assert_array_equal(decoded == 0, sigma == 0)
    zero = SigmaCode.fit(np.zeros(50, np.float32), 4, rng)
    assert zero.levels.tolist() == [0.0] and zero.codes.size == 0 and not zero.decode().any()


def test_sigma_code_validation_names_the_problem() -> None:
    with pytest.raises(InvalidArtifactError, match="w: sigma levels must be finite"):
        SigmaCode.from_arrays(np.array([-1.0, 1.0], np.float32), np.zeros(1, np.uint8), 4, "sigma", "w")
    with pytest.raises(InvalidArtifactError, match="sigma codes must be 1 packed uint8 bytes"):
        SigmaCode.from_arrays(np.array([1.0, 2.0], np.float32), np.zeros(2, np.uint8), 4, "sigma", "w")
    with pytest.raises(InvalidArtifactError, match="point past its 3 levels"):
        SigmaCode.from_arrays(np.array([1.0, 2.0, 3.0], np.float32), np.array([0xFF], np.uint8), 4, "sigma", "w")


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.floats(0, 10, allow_nan=False, width=32), min_size=1, max_size=300),
    bits=st.integers(0, 8),
)
def test_sigma_code_round_trip_property(values: list[float], bits: int) -> None:
    sigma = np.array(values, np.float32)
    code = SigmaCode.fit(sigma, bits, np.random.default_rng(0))
    again = SigmaCode.from_arrays(code.levels, code.codes, sigma.size, "sigma", "w")
    np.testing.assert_array_equal(again.decode(), code.decode())
    decoded = code.decode()
    if bits:  # a reserved level keeps exact zeros exact
        np.testing.assert_array_equal(decoded == 0, sigma == 0)
    # every level is a power mean of its members, so it lies within their range
    assert sigma.min() * (1 - 1e-6) <= decoded.min() and decoded.max() <= sigma.max() * (1 + 1e-6)
