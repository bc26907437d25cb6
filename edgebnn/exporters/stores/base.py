"""The store contract: how one encoding's stored codes become the fp32 tensors a layer reads, in the graph.

A store writes an encoding's codes into the :class:`~edgebnn.exporters._graph.Builder` as compact initializers
and emits the in-graph decode that yields the tensor a layer needs:

- :meth:`Store.mean` — the posterior mean ``E[w]`` (shape of the weight);
- :meth:`Store.stddev` / :meth:`Store.variance` — the posterior spread (``noise``: ``W_s = mu + σ ⊙ ε``;
  ``noise --noise local`` and ``analytic``: ``σ²``).

Every decode is a few elementwise / gather ops whose inputs are all initializers, so onnxruntime evaluates it
ONCE, at session creation (its constant folding; it folds every op here, but never a DequantizeLinear, which is
why the portable decode is ``Cast`` + ``Mul``, not DequantizeLinear): a compact graph runs the same kernels on
the same fp32 tensors as its fp32 twin. Runtimes that do not fold run the decode once per call, shared by all S
samples (the decoded tensor is one value used by every sample).

Decodes are exact: ``float32(q) · scale`` is what the encoding's numpy ``mean()`` computes, a ``Gather`` from a
float32 table returns the table's values.

Bit unpacking (:func:`unpack_codes`) reads :mod:`edgebnn.ir.encodings.packing`'s little-endian bit stream
(value ``j`` at bits ``[j·b, (j+1)·b)``) with int32 arithmetic only (``Range``, ``Div``, ``Mod``, ``Gather``:
ai.onnx opset 11, no opset-18 bitwise ops, so graphs keep their own opset)::

    j = Range(0, n);  k = (j·b) div 8;  r = (j·b) mod 8
    word = byte[k] + 256 · byte[k + 1];  code = (word div 2^r) mod 2^b      (signed: code - 2^b where ≥ 2^(b-1))

A store states its bytes (:meth:`Store.nbytes`, the initializers it writes), the ai.onnx opset its decode
needs (:attr:`Store.opset`) and the runtimes that run it (:attr:`Store.runtimes`).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import onnx
from onnx import numpy_helper

from edgebnn.exporters import ORT, TRT
from edgebnn.exporters._graph import Builder
from edgebnn.ir.encodings import Encoding, Grid

INT32 = onnx.TensorProto.INT32
FLOAT = onnx.TensorProto.FLOAT
INT64 = onnx.TensorProto.INT64


class Store(ABC):
    """How one encoding (by op type) is written into a graph and decoded there."""

    op_type: ClassVar[str]
    opset: ClassVar[int] = 11  # ai.onnx opset of the decode ops (Range: 11)
    # runtimes known to run the decode: TensorRT-RTX parses and builds every store's decode (real builds of each,
    # tests/integration/test_tensorrt_rtx.py); Jetson's TensorRT 10.3 is unverified (DeviceProfile.decodes)
    runtimes: ClassVar[tuple[str, ...]] = (ORT, TRT)

    @abstractmethod
    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        """Emit the codes and the decode of ``enc.mean()``; returns the value named ``name`` (fp32, enc.shape)."""

    @abstractmethod
    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        """Emit the decode of ``enc.stddev()`` (fp32, enc.shape) as the value ``name``."""

    def variance(self, b: Builder, enc: Encoding, name: str) -> str:
        """``σ²`` as the value ``name``: the decoded σ squared (float32, as ``moments()`` computes it)."""
        sd = self.stddev(b, enc, name + ".sd")
        return b.add("Mul", [sd, sd], name)

    @abstractmethod
    def nbytes(self, enc: Encoding) -> int:
        """Bytes of the initializers this store writes for ``enc`` (mean and spread; not the graph around them)."""

    # whether :meth:`members` writes baked members as codes (a family whose draws lie on its codes' grid)
    writes_members: ClassVar[bool] = False

    def members(self, b: Builder, enc: Encoding, name: str, value: np.ndarray, grid: Grid) -> str | None:
        """``baked``: the member tensor ``value`` (drawn members of ``enc`` in a layer's batched layout, on ``grid``)
        as the value ``name`` written from codes, or None to write it fp32 (the default)."""
        return None


def scalar(b: Builder, name: str, value: int) -> str:
    """An int32 scalar initializer (shape ``[]``: ``Range`` takes scalars only)."""
    if not b.has(name):  # not Builder.const: np.ascontiguousarray would make the scalar 1-D
        b.adopt([numpy_helper.from_array(np.array(value, np.int32), name)])
    return name


class CodePool:
    """The codes of every stored tensor of one graph, one stream per (bit width, signedness).

    Each tensor's codes (the IR's, unpacked exactly in numpy) join its width's stream; :func:`finish_stores`
    writes each stream once (re-packed without per-tensor padding: the same bits) with ONE unpack and one
    ``Split`` into the tensors' values. Signed codes (integer means) come out as float32 (one ``Cast`` per
    stream), unsigned ones (indices into a table) as int32. Fewer nodes than an unpack per tensor: on a small
    CNN the graph, not the codes, was most of a compact file. Codes taken twice (a codebook's indices, which its
    mean's and its spread's decodes both read) are stored once: the second take returns the first one's value.
    """

    def __init__(self) -> None:
        self.groups: dict[tuple[int, bool], list[tuple[str, np.ndarray]]] = {}
        self.seen: dict[tuple[int, bool, str], str] = {}

    def take(self, values: np.ndarray, bits: int, signed: bool, name: str) -> str:
        """Add ``values`` (``bits``-bit codes) to their stream; returns the value that holds them: ``name``, or the
        value of the same codes taken before."""
        flat = np.ascontiguousarray(values).reshape(-1)
        # a digest, not the codes: the pool must not hold a second copy of a large model's codes
        digest = hashlib.blake2b(flat.tobytes()).hexdigest()  # the bytes are freed once hashed
        key = (bits, signed, f"{flat.dtype.str}{flat.size}:{digest}")
        if key in self.seen:
            return self.seen[key]
        self.seen[key] = name
        self.groups.setdefault((bits, signed), []).append((name, flat))
        return name

    def finish(self, b: Builder) -> None:
        """Emit every stream's unpack at the front of the graph (its inputs are initializers only)."""
        from edgebnn.ir.encodings.packing import pack_int, pack_uint

        body, b.nodes = b.nodes, []
        for (bits, signed), items in sorted(self.groups.items()):
            p = f"{PREFIX}{'i' if signed else 'u'}{bits}"
            values = np.concatenate([v for _, v in items])
            if bits > 8 and TRT in (b.fmt.runtimes or ()):
                codes = _unpack_wide(b, values, bits, p, signed)
            elif bits == 8 and signed and TRT in (b.fmt.runtimes or ()):
                # TensorRT takes an int8 constant only into a DequantizeLinear (no Cast): scale 1 is the same values
                one = b.f32(PREFIX + "one", 1.0)
                codes = b.add("DequantizeLinear", [b.const(p, values.astype(np.int8)), one], p + "/c")
            elif bits >= 8:
                dtype = (np.int8 if bits == 8 else np.int16) if signed else (np.uint8 if bits == 8 else np.uint16)
                codes = b.add("Cast", [b.const(p, values.astype(dtype))], p + "/c", to=FLOAT if signed else INT32)
            else:
                packed = pack_int(values, bits) if signed else pack_uint(values, bits)
                codes = _unpack(b, packed, bits, values.size, p, signed)
            sizes = b.const(p + "/sizes", np.array([v.size for _, v in items], np.int64))
            b.nodes.append(onnx.helper.make_node("Split", [codes, sizes], [name for name, _ in items], axis=0))
        b.nodes.extend(body)
        self.groups.clear()
        self.seen.clear()


PREFIX = "ens/codes/"


def code_pool(b: Builder) -> CodePool:
    if b.code_pool is None:
        b.code_pool = CodePool()
    pool: CodePool = b.code_pool
    return pool


def finish_stores(b: Builder) -> None:
    """Write the pooled code streams (call once, after the last store, before ``Builder.model``)."""
    if b.code_pool is not None:
        b.code_pool.finish(b)


def unpack_codes(b: Builder, packed: np.ndarray, bits: int, n: int, name: str, signed: bool = False) -> str:
    """The ``n`` codes of ``bits`` bits in ``packed`` (the IR's bit stream) as the value ``name`` [n]: float32
    for signed codes (integer means), int32 for unsigned ones (table indices); pooled (:class:`CodePool`)."""
    from edgebnn.ir.encodings.packing import unpack_int, unpack_uint

    values = unpack_int(packed, bits, n) if signed else unpack_uint(packed, bits, n)
    return code_pool(b).take(values, bits, signed, name)


def _unpack(b: Builder, packed: np.ndarray, bits: int, n: int, p: str, signed: bool) -> str:
    """The arithmetic unpack of the module docstring: int32 codes (float32 when ``signed``)."""
    stream = np.concatenate([np.asarray(packed, np.uint8), np.zeros(1, np.uint8)])  # byte k + 1 always exists
    byte = b.add("Cast", [b.const(p, stream)], p + "/bytes", to=INT32)
    j = b.add("Range", [scalar(b, PREFIX + "0", 0), scalar(b, p + "/n", n), scalar(b, PREFIX + "1", 1)], p + "/j")
    bitpos = b.add("Mul", [j, scalar(b, p + "/b", bits)], p + "/bit")
    eight = scalar(b, PREFIX + "8", 8)
    k = b.add("Div", [bitpos, eight], p + "/k")
    lo = b.add("Gather", [byte, k], p + "/lo", axis=0)
    hi = b.add("Gather", [byte, b.add("Add", [k, PREFIX + "1"], p + "/k1")], p + "/hi", axis=0)
    word = b.add("Add", [lo, b.add("Mul", [hi, scalar(b, PREFIX + "256", 256)], p + "/hi8")], p + "/w")
    pow2 = PREFIX + "pow2"
    if not b.has(pow2):
        b.const(pow2, (1 << np.arange(8)).astype(np.int32))
    shift = b.add("Gather", [pow2, b.add("Mod", [bitpos, eight], p + "/r")], p + "/s", axis=0)
    code = b.add("Mod", [b.add("Div", [word, shift], p + "/d"), scalar(b, p + "/m", 1 << bits)], p + "/u")
    if signed:  # two's complement within ``bits``: code - 2^b where code ≥ 2^(b-1), as (code div 2^(b-1)) · 2^b
        high = b.add("Div", [code, scalar(b, p + "/h", 1 << (bits - 1))], p + "/neg")
        code = b.add("Sub", [code, b.add("Mul", [high, p + "/m"], p + "/wrap")], p + "/i")
    return b.add("Cast", [code], p + "/c", to=FLOAT if signed else INT32) if signed else code


def _unpack_wide(b: Builder, values: np.ndarray, bits: int, p: str, signed: bool) -> str:
    """9-16-bit codes for TensorRT, which imports no 16-bit integer initializer: the low bytes (uint8) plus 256 times
    the high ``bits - 8`` bits (a packed stream), as :func:`_unpack` writes its codes."""
    u = np.asarray(values, np.int64) % (1 << bits)  # two's complement within ``bits``
    low = b.add("Cast", [b.const(p + "/low", (u & 0xFF).astype(np.uint8))], p + "/lo8", to=INT32)
    from edgebnn.ir.encodings.packing import pack_uint

    high = _unpack(b, pack_uint(u >> 8, bits - 8), bits - 8, u.size, p + "/high", False)
    code = b.add("Add", [low, b.add("Mul", [high, scalar(b, PREFIX + "256", 256)], p + "/hi8")], p + "/u")
    if signed:
        wrap = scalar(b, p + "/m", 1 << bits)
        neg = b.add("Div", [code, scalar(b, p + "/h", 1 << (bits - 1))], p + "/neg")
        code = b.add("Sub", [code, b.add("Mul", [neg, wrap], p + "/wrap")], p + "/i")
        return b.add("Cast", [code], p + "/c", to=FLOAT)
    return code


def reshape_to(b: Builder, flat: str, shape: tuple[int, ...], name: str) -> str:
    """``flat`` [n] as the weight shape."""
    return b.add("Reshape", [flat, b.const(name + ".shape", np.array(shape, np.int64))], name)


def scaled(b: Builder, codes: str, scale: float, shape: tuple[int, ...], name: str) -> str:
    """``codes · scale`` (float32 codes, :func:`unpack_codes`) shaped ``shape``: exactly numpy's
    ``q.astype(float32) * float32(scale)``."""
    flat = b.add("Mul", [codes, b.f32(name + ".scale", np.array(scale, np.float32))], name + "/flat")
    return reshape_to(b, flat, shape, name)


def table_lookup(b: Builder, table: np.ndarray, codes: str | None, n: int, shape: tuple[int, ...], name: str) -> str:
    """``table[codes]`` shaped ``shape``; a one-entry table (no codes) broadcasts its value."""
    t = b.f32(name + ".table", np.asarray(table, np.float32))
    if codes is None:
        return b.add("Expand", [t, b.const(name + ".shape", np.array(shape, np.int64))], name)
    flat = b.add("Gather", [t, codes], name + "/flat", axis=0)
    return reshape_to(b, flat, shape, name)
