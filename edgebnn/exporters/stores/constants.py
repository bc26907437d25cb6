"""The constant store: weight tensors a graph holds as constants (``baked`` members, hoisted means, the integer
kernels' weights), in the export's format (:class:`~edgebnn.exporters._graph.ExportFormat`).

Every weight enters a graph through a store: the moments through the encodings' stores (:mod:`.registry`'s
``decode``), constants through :func:`constant`, :func:`per_channel` and the integer kernels here. A constant of
``dtype``:

- ``fp32``: the encoding's own codes where its store writes members (a lowered deep ensemble's members lie on its
  grid: :meth:`.base.Store.members`), else fp32;
- ``int8``: one scale per slice of axis 0 (a 1-D per-channel scale on a constant, zero point 0: TensorRT's explicit
  quantization rules), ``max|slice| / 127``: each weight moves by at most half a step. When ``grid`` says the values
  are ``q · step`` with ``q`` within 8 bits (an encoding's integer grid) every scale is ``step``: stored losslessly;
- ``int4``: block-wise (INT4_BLOCK inputs per scale, opset 21 DequantizeLinear: TensorRT's weight-only GEMMs) or,
  in the ``channels`` layout, one scale per output channel shared by the S members (:func:`per_channel`).

In the ``folded`` form (and the ``integer`` form, for weights no integer kernel takes) the same quantized values are
stored dequantized, as fp32 constants (``float32(q) · scale``, what DequantizeLinear computes): onnxruntime does not
constant-fold a DequantizeLinear on a constant, it runs it on every inference. The quantizer is
:mod:`edgebnn.exporters.quantize`.
"""

from __future__ import annotations

import numpy as np
import onnx

from edgebnn.exporters import quantize
from edgebnn.exporters._graph import CONTRIB, Builder
from edgebnn.exporters.forms import NBITS_ACCURACY_LEVEL
from edgebnn.exporters.stores.registry import store_for
from edgebnn.ir.encodings import Encoding, Grid


def constant(b: Builder, name: str, value: np.ndarray, dtype: str = "fp32", grid: Grid | None = None,
             source: Encoding | None = None) -> str:
    """The constant weight ``value`` as the value ``name`` in ``dtype`` and the builder's form (module docstring);
    ``source``: the encoding ``value`` was drawn from, whose store may write fp32 members on ``grid`` as codes."""
    if dtype == "fp32":
        if grid is not None and source is not None:
            store = store_for(source, b.fmt.weights, b.fmt.runtimes)
            coded = store.members(b, source, name, np.asarray(value, np.float32), grid) if store.writes_members \
                else None
            if coded is not None:
                return coded
        return b.f32(name, value)
    if dtype not in ("int8", "int4"):
        raise ValueError(dtype)
    value = np.asarray(value, np.float32)
    fmt = b.fmt
    if fmt.int4_layout == "channels" and fmt.form == "qdq" and dtype == "int8" and value.ndim > 1:
        dtype = "int4"  # the layer kinds' int8 for int4 is TensorRT's rule (int4 on GEMMs only)
    exact = grid is not None and grid.bits <= (8 if dtype == "int8" else 4)
    step = grid.step if exact and grid else None
    if fmt.int4_layout == "channels" and fmt.form == "qdq" and dtype == "int4":
        return per_channel(b, name, value, step, 4)
    if dtype == "int4":
        q4, scale4 = quantize.blocks(value, step)
        if fmt.form != "qdq":
            return b.f32(name, quantize.dequantize_blocks(q4, scale4))
        scale_name = b.f32(name + ".scale", scale4)  # before the codes: the initializers' order is the file's
        return b.add("DequantizeLinear", [b.int4(name + ".q", q4), scale_name], name, axis=q4.ndim - 2,
                     block_size=quantize.INT4_BLOCK)
    q, scale = quantize.rows(value, 8, step)
    if fmt.form != "qdq":
        return b.f32(name, q.astype(np.float32) * scale.reshape((-1,) + (1,) * (value.ndim - 1)))
    return b.add("DequantizeLinear", [b.const(name + ".q", q), b.const(name + ".scale", scale),
                                      b.const(name + ".zero", np.zeros(len(scale), np.int8))], name, axis=0)


def per_channel(b: Builder, name: str, value: np.ndarray, step: float | None, bits: int) -> str:
    """int4 / int8 with one scale per output channel shared by the S members (per-axis DequantizeLinear; the
    grouping: :func:`edgebnn.exporters.quantize.member_channels`)."""
    q, scale, axis = quantize.member_channels(value, b.fmt.samples, bits, step)
    codes = b.int4(name + ".q", q) if bits == 4 else b.const(name + ".q", q)
    out = name if q.shape == value.shape else name + ".dq"
    y = b.add("DequantizeLinear", [codes, b.const(name + ".scale", scale)], out, axis=axis)
    if out == name:
        return name
    return b.add("Reshape", [y, b.i64(name + ".shape", *value.shape)], name)


def grid_step(grid: Grid | None, bits: int = 8) -> float | None:
    """The step of an integer grid of at most ``bits`` bits (the weight is then stored exactly), else None."""
    return grid.step if grid is not None and grid.bits <= bits else None


def matmul_nbits(b: Builder, x: str, w: np.ndarray, grid: Grid | None, p: str, out: str) -> str:
    """MatMulNBits (onnxruntime contrib) on ``x`` [..., K] with the int4 blocks of ``w`` [K, N]: the ``qdq`` /
    ``folded`` forms' values (exact on a grid of at most 4 bits), the activation rounded to int8 per block inside
    the op (:data:`~edgebnn.exporters.forms.NBITS_ACCURACY_LEVEL`)."""
    packed, scales = quantize.nbits_weight(w, grid_step(grid, 4))
    return b.add("MatMulNBits", [x, b.const(p + "B4", packed), b.f32(p + "B4_scales", scales)], out, domain=CONTRIB,
                 K=int(w.shape[0]), N=int(w.shape[1]), bits=4, block_size=quantize.INT4_BLOCK,
                 accuracy_level=NBITS_ACCURACY_LEVEL)


def matmul_integer(b: Builder, x: str, q: np.ndarray, scale: np.ndarray, p: str, out: str) -> str:
    """MatMulInteger on the activation ``x``, quantized per call, and the int8 weight ``q`` ([in, out], from
    :func:`edgebnn.exporters.quantize.rows`), dequantized by one multiply: ``float(acc) · (s_x · scale)`` (``scale``
    broadcasts on the output).

    The weight is stored as uint8 ``q + 128`` with zero point 128 (u8 x u8), not as s8: onnxruntime's u8 x s8
    kernel on x86 CPUs without VNNI (AVX2 only) multiplies with ``vpmaddubsw``, whose int16 pair sums saturate
    (255 · 127 · 2 > 32767), which moved a digits CNN's probabilities by up to 0.15; its u8 x u8 kernel widens
    to int16 first and is exact everywhere (tests/unit/test_speed.py fails on an AVX2 machine with s8)."""
    xq, xs, xz = p + "xq", p + "x_scale", p + "x_zero"
    b.nodes.append(onnx.helper.make_node("DynamicQuantizeLinear", [x], [xq, xs, xz]))
    wq = (np.asarray(q, np.int16) + 128).astype(np.uint8)
    w_zero = b.const(p + "w_zero", np.array(128, np.uint8))
    acc = b.add("MatMulInteger", [xq, b.const(p + "Wq", np.ascontiguousarray(wq)), xz, w_zero], p + "acc")
    scales = b.add("Mul", [xs, b.f32(p + "w_scale", scale)], p + "scale")
    return b.add("Mul", [b.add("Cast", [acc], p + "acc_f", to=onnx.TensorProto.FLOAT), scales], out)
