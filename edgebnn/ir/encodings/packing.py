"""Bit packing of integer codes into ``uint8`` byte streams, vectorised with numpy.

Layout (little-endian bit stream, LSB first): value ``j`` occupies bits ``[j·b, (j+1)·b)`` of the stream,
so with ``b = 4`` byte ``k`` holds values ``2k`` (low nibble) and ``2k+1`` (high nibble) — the ONNX
``INT4`` layout — and with ``b = 2`` byte ``k`` holds values ``4k .. 4k+3`` from the low bits up. A stream
of ``n`` values at ``b`` bits takes ``ceil(n·b / 8)`` bytes; the padding bits of the last byte are 0.

Widths 1..8 pack eight values at a time into one little-endian 64-bit word and keep its first ``b`` bytes.
Widths 9..16 store the low byte of every value (an 8-bit stream) followed by the high ``b - 8`` bits (a
second stream), which takes ``n + ceil(n·(b-8)/8) = ceil(n·b/8)`` bytes as well.

Signed values use two's complement within ``b`` bits (:func:`pack_int` / :func:`unpack_int`).
"""

from __future__ import annotations

import numpy as np

MAX_BITS = 16
_CHUNK = 1 << 20  # values per chunk (a multiple of 8): bounds the 64-bit temporaries to 8 MiB


def packed_nbytes(n: int, bits: int) -> int:
    """Bytes of ``n`` values packed at ``bits`` bits each."""
    return (int(n) * int(bits) + 7) // 8


def bits_for(count: int) -> int:
    """Bits needed to tell ``count`` codes apart: ``ceil(log2 count)`` (0 for a single code)."""
    if count < 1:
        raise ValueError(f"need at least one code, got {count}")
    return int(count - 1).bit_length()


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bit width {bits} outside 1..{MAX_BITS}")


def _pack_narrow(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned values < 2**bits, bits in 1..8."""
    n = values.size
    out = np.zeros(packed_nbytes(n, bits), np.uint8)
    shifts = (np.arange(8, dtype=np.uint64) * np.uint64(bits))[None, :]
    for start in range(0, n, _CHUNK):
        chunk = values[start : start + _CHUNK]
        m = chunk.size
        groups = -(-m // 8)
        padded = np.zeros(groups * 8, np.uint64)
        padded[:m] = chunk
        words = np.bitwise_or.reduce(padded.reshape(groups, 8) << shifts, axis=1)
        stream = words.astype("<u8").view(np.uint8).reshape(groups, 8)[:, :bits].reshape(-1)
        first = start * bits // 8
        take = packed_nbytes(m, bits)
        out[first : first + take] = stream[:take]
    return out


def _unpack_narrow(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`_pack_narrow`; returns ``uint8`` values."""
    out = np.empty(n, np.uint8)
    shifts = (np.arange(8, dtype=np.uint64) * np.uint64(bits))[None, :]
    mask = np.uint64((1 << bits) - 1)
    for start in range(0, n, _CHUNK):
        m = min(_CHUNK, n - start)
        groups = -(-m // 8)
        first = start * bits // 8
        raw = packed[first : first + packed_nbytes(m, bits)]
        words8 = np.zeros((groups, 8), np.uint8)
        flat = np.zeros(groups * bits, np.uint8)
        flat[: raw.size] = raw
        words8[:, :bits] = flat.reshape(groups, bits)
        words = words8.view("<u8")
        vals = (words >> shifts) & mask
        out[start : start + m] = vals.reshape(-1)[:m]
    return out


def pack_uint(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack non-negative integers ``< 2**bits`` into a ``uint8`` stream of ``ceil(n·bits/8)`` bytes.

    Args:
        values: Integer array of any shape (flattened in C order).
        bits: Bit width, 1..16.

    Returns:
        The packed bytes.

    Raises:
        ValueError: ``bits`` is out of range or a value does not fit.
    """
    _check_bits(bits)
    flat = np.asarray(values).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= (1 << bits)):
        raise ValueError(f"values outside 0..{(1 << bits) - 1} cannot be packed at {bits} bits")
    if bits <= 8:
        return _pack_narrow(flat, bits)
    wide = flat.astype(np.uint16, copy=False)
    low = (wide & 0xFF).astype(np.uint8)
    high = (wide >> 8).astype(np.uint8)
    return np.concatenate([low, _pack_narrow(high, bits - 8)])


def unpack_uint(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Unpack ``n`` values of ``bits`` bits; ``uint8`` for widths <= 8, ``uint16`` above.

    Raises:
        ValueError: ``bits`` is out of range or ``packed`` is not exactly ``ceil(n·bits/8)`` bytes.
    """
    _check_bits(bits)
    packed = np.asarray(packed)
    if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != packed_nbytes(n, bits):
        raise ValueError(
            f"{n} values at {bits} bits need {packed_nbytes(n, bits)} packed uint8 bytes, got "
            f"{packed.size} {packed.dtype}"
        )
    if bits <= 8:
        return _unpack_narrow(packed, bits, n)
    low = packed[:n].astype(np.uint16)
    high = _unpack_narrow(packed[n:], bits - 8, n).astype(np.uint16)
    return low | (high << 8)


def pack_int(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack signed integers in ``[-(2**(bits-1)), 2**(bits-1) - 1]`` as two's complement.

    Raises:
        ValueError: ``bits`` is out of range (2..16 for signed values) or a value does not fit.
    """
    if not 2 <= bits <= MAX_BITS:
        raise ValueError(f"signed bit width {bits} outside 2..{MAX_BITS}")
    flat = np.asarray(values).reshape(-1)
    if flat.dtype.kind != "i" or 8 * flat.dtype.itemsize < bits:
        flat = flat.astype(np.int32)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if flat.size and (flat.min() < lo or flat.max() > hi):
        raise ValueError(f"values outside {lo}..{hi} cannot be packed at {bits} bits")
    # the low ``bits`` bits of two's complement are the same at every width: mask in the input's own width
    unsigned = flat.view(flat.dtype.str.replace("i", "u"))
    return pack_uint(unsigned & unsigned.dtype.type((1 << bits) - 1), bits)


def unpack_int(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_int`; returns ``int16`` values."""
    if not 2 <= bits <= MAX_BITS:
        raise ValueError(f"signed bit width {bits} outside 2..{MAX_BITS}")
    raw = unpack_uint(packed, bits, n).astype(np.int32)
    raw -= (raw >> (bits - 1)) << bits
    return raw.astype(np.int16)
