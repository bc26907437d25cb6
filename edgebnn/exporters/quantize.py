"""The exporters' one quantizer: symmetric integers times a scale, for every weight a graph stores as integers.

    q = clip(rint(v / s), -L, L),   L = 2^(bits-1) - 1,   v ≈ s · q        (each value moves by at most s / 2)
    s = max|group| / L (1 for an all-zero group), or ``step`` where the values are known to be q · step with
        |q| <= L (an encoding's integer grid: then v = s · q exactly)

Groups: one per slice of axis 0 (:func:`rows`: a weight's output channels, int8 Q/DQ, re-quantized means), one per
output channel shared by a member stack (:func:`member_channels`: the portable int4 layout), one per block of
``INT4_BLOCK`` values along the reduction axis (:func:`blocks`: TensorRT's weight-only int4, MatMulNBits).
Used by :mod:`.stores.constants` (baked members, hoisted means) and :mod:`.stores.gaussian` (``--weights int8|int4``
moments); the IR's own codes (a lowering's) come from :mod:`edgebnn.ir.encodings`, never from here.
"""

from __future__ import annotations

import numpy as np

INT4_BLOCK = 32


def rows(value: np.ndarray, bits: int = 8, step: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One scale per slice of axis 0: ``(q int8 shaped like value, scale float32 [len(value)])``."""
    top = (1 << (bits - 1)) - 1
    value = np.asarray(value, np.float32)
    amax = np.abs(value.reshape(len(value), -1)).max(axis=1)
    scale = (np.full(len(value), step) if step is not None else np.where(amax > 0, amax / top, 1.0)
             ).astype(np.float32)
    shape = (-1,) + (1,) * (value.ndim - 1)
    return np.clip(np.rint(value / scale.reshape(shape)), -top, top).astype(np.int8), scale


def member_channels(value: np.ndarray, samples: int, bits: int, step: float | None = None,
                    ) -> tuple[np.ndarray, np.ndarray, int]:
    """One scale per output channel shared by the S members: ``(q int8 [view], scale [channels], axis)``, ``q`` in
    the grouped view ``value`` is read in (reshape it back to ``value.shape``).

    Grouping (any grouping decodes exactly what was quantized; this one keeps the scales few): [S, in, out]
    (batched Gemm) per output, axis 2; [S·O, ...] (batched Conv, wide Gemm, member biases) viewed as [S, O, rest],
    per O; otherwise [O, rest], per row. Scale ``max|channel| / (2^(bits-1) - 1)``, or ``step`` on a grid that fits.
    """
    if value.ndim == 3:
        view, axis = value, 2
    elif samples > 1 and len(value) % samples == 0:
        view, axis = value.reshape(samples, len(value) // samples, -1), 1
    else:
        view, axis = value.reshape(len(value), -1), 0
    top = (1 << (bits - 1)) - 1
    moved = np.moveaxis(view, axis, 0).reshape(view.shape[axis], -1)
    amax = np.abs(moved).max(axis=1)
    scale = (np.full(len(amax), step) if step is not None else np.where(amax > 0, amax / top, 1.0)
             ).astype(np.float32)
    shape = [1] * view.ndim
    shape[axis] = -1
    q = np.clip(np.rint(view / scale.reshape(shape)), -top, top).astype(np.int8)
    return q, scale, axis


def blocks(value: np.ndarray, step: float | None = None, block: int = INT4_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Block-wise symmetric int4: one scale per ``block`` values along the second-to-last axis, the layout
    TensorRT's INT4 weight-only GEMMs take (even last dim); ``max|block| / 7``, or ``step`` for values on a known
    grid. Returns ``(q, scale)``: q int8 in [-7, 7] shaped like ``value``, scale [..., blocks, last]."""
    k = value.shape[-2]
    n_blocks = -(-k // block)
    pad = n_blocks * block - k
    padded = np.pad(value, [(0, 0)] * (value.ndim - 2) + [(0, pad), (0, 0)])
    shaped = padded.reshape(*value.shape[:-2], n_blocks, block, value.shape[-1])
    amax = np.abs(shaped).max(axis=-2)  # [..., blocks, out]
    scale = (np.full(amax.shape, step) if step is not None else np.where(amax > 0, amax / 7.0, 1.0)
             ).astype(np.float32)
    q = np.clip(np.rint(shaped / scale[..., None, :]), -7, 7).astype(np.int8)
    return q.reshape(padded.shape)[..., :k, :], scale


def dequantize_blocks(q: np.ndarray, scale: np.ndarray, block: int = INT4_BLOCK) -> np.ndarray:
    """``float32(q) · scale`` for :func:`blocks`' layout (what the int4 DequantizeLinear computes)."""
    per_row = np.repeat(scale, block, axis=-2)[..., : q.shape[-2], :]
    return q.astype(np.float32) * per_row


def nbits_weight(w: np.ndarray, step: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A dense weight ``w`` [K, N] (inputs x outputs) as MatMulNBits' inputs ``B`` and ``scales``.

    The values are :func:`blocks`' (the ``qdq`` / ``folded`` forms' blocks of ``INT4_BLOCK`` inputs per output,
    ``q`` in [-7, 7], ``step`` for an exact grid), stored as MatMulNBits takes them (onnxruntime's contrib-op schema,
    checked numerically in the tests): ``B`` [N, ceil(K / block), block / 2] uint8, two codes ``q + 8`` per byte,
    the lower K first in the low nibble (the default zero point is 8, so code 8 is 0: the last block is padded with
    it when ``block`` does not divide K); ``scales`` [N, blocks] float32."""
    q, scale = blocks(np.asarray(w, np.float32), step)  # q [K, N], scale [blocks, N]
    k, n = q.shape
    n_blocks = scale.shape[0]
    codes = np.full((n, n_blocks * INT4_BLOCK), 8, np.uint8)
    codes[:, :k] = (q.T + 8).astype(np.uint8)
    pairs = codes.reshape(n, n_blocks, INT4_BLOCK // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8), np.ascontiguousarray(scale.T)
