"""Error-compensating rounding of fixed-point means from calibration inputs (GPTQ; Frantar et al., ICLR 2023).

Nearest rounding makes each weight's error as small as it can be on its own; what the network feels is the
error of a layer's *output*. For a layer y = W x (a Conv as a matrix on its input patches), rows w of W and
inputs x drawn from calibration data, the output error of a rounded row q is

    E ||(w - q) x||² = (w - q)ᵀ H (w - q),    H = E[x xᵀ]   (the inputs' second moment, cols x cols)

and with correlated inputs a weight's rounding error can be cancelled by moving the weights not yet rounded.
GPTQ rounds the columns one at a time (largest diag H first, its "act order"), each to the nearest point of
the layer's grid, and spreads the error over the remaining columns through the Cholesky factor U of H⁻¹
(H⁻¹ = Uᵀ U, U upper triangular; the Optimal Brain Surgeon update):

    e = (w_i - q_i) / U_ii,     w_j ← w_j - e U_ij   for the columns j after i

H is damped by 1% of its mean diagonal (the paper's choice; it keeps H⁻¹ finite when inputs are collinear or a
unit is never active). With a diagonal H the update moves nothing and the codes are nearest rounding exactly.
Pruned weights (μ = σ = 0, e.g. after ``prune``) stay 0: their column's error, what earlier updates moved onto
them, is spread like any other (SparseGPT's mask), so the sparsity and ``shrink`` see the same zeros.

For a BNN the weights rounded are the posterior means, and x are the inputs each layer sees in the
posterior-mean network (:meth:`BNNModel.float_model`) on the calibration data, so the mean path the
``analytic`` and sampled predictives share keeps its outputs; σ is coded as before. What it cost is reported
per layer as the relative output error tr(E H Eᵀ) / tr(W H Wᵀ), E = W - W̄, with the compensated codes
(``output_error``) and with nearest rounding (``output_error_nearest``).

:func:`layer_grams` measures H for every Bayesian weight that a 1-group Conv (any rank), a Gemm or a MatMul
reads directly; ``fixed`` takes them as ``grams`` (data, like ``gradients``: not stored in the lowering config).
Other weights (grouped convolutions, weights reshaped before use) keep nearest rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import BNNModel, attrs_of

DAMPING = 0.01
"""H += DAMPING · mean(diag H) · I before inverting (GPTQ's default)."""


@dataclass(frozen=True)
class InputGram:
    """The second moment H = E[x xᵀ] of a weight's inputs, and how the weight's axes map onto it.

    Attributes:
        h: ``[cols, cols]`` float64: the input patch (Conv: channel-major, then the kernel offsets, the order of
            ``W.reshape(out, -1)``) or input feature vector (Gemm, MatMul).
        transposed: The weight stores inputs on axis 0 (MatMul, Gemm with ``transB=0``): its rows are ``W.T``.
        count: Input vectors averaged (patches for a Conv).
        inputs: Model inputs they came from.
    """

    h: np.ndarray
    transposed: bool = False
    count: int = 0
    inputs: int = 0

    def columns(self, shape: tuple[int, ...]) -> int:
        """Input columns of a weight of ``shape`` (the side of ``h`` it needs)."""
        return shape[0] if self.transposed else math.prod(shape[1:])

    def rows(self, w: np.ndarray) -> np.ndarray:
        """``w`` as ``[rows, cols]`` float64: one row per output unit."""
        w2 = w.T if self.transposed else w.reshape(w.shape[0], -1)
        return np.array(w2, dtype=np.float64)

    def unrows(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The inverse of :meth:`rows`."""
        return (rows.T if self.transposed else rows).reshape(shape)


def output_error(w: np.ndarray, w_bar: np.ndarray, h: np.ndarray) -> float:
    """tr(E H Eᵀ) / tr(W H Wᵀ) with E = W - W̄ (``[rows, cols]``): the output error relative to the output."""
    e = w - w_bar
    ref = float(np.einsum("ij,jk,ik->", w, h, w))
    return float(np.einsum("ij,jk,ik->", e, h, e)) / ref if ref > 0 else 0.0


def compensated_codes(w: np.ndarray, h: np.ndarray, step: float, limit: int,
                      zero: np.ndarray | None = None) -> np.ndarray:
    """Integer codes ``q`` (``|q| <= limit``) of ``w ≈ step · q`` that keep ``(w - step q) H (w - step q)ᵀ`` small.

    Args:
        w: ``[rows, cols]`` weights (float64; not modified).
        h: ``[cols, cols]`` symmetric positive semi-definite input second moment.
        step: The grid step Δ (> 0).
        limit: Largest code magnitude.
        zero: ``[rows, cols]`` bool: weights that must stay exactly 0 (pruned ones); the others compensate for
            what the updates had moved onto them, as SparseGPT does for a mask.

    Returns:
        ``[rows, cols]`` int16 codes.
    """
    if h.shape != (w.shape[1], w.shape[1]):
        raise InvalidOptionError(f"grams: a {h.shape} matrix for a weight of {w.shape[1]} input columns")
    order = np.argsort(-np.diag(h), kind="stable")
    keep = None if zero is None or not zero.any() else ~zero[:, order]
    w = w[:, order].copy()
    h = h[np.ix_(order, order)].copy()
    diag = np.diag(h).copy()
    dead = ~(diag > 0)
    h[dead, dead] = 1.0  # a never-active input: its weight rounds to nearest and moves nothing
    h[np.diag_indices_from(h)] += DAMPING * float(np.mean(np.diag(h)))
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    q = np.empty(w.shape, np.int16)
    for i in range(w.shape[1]):
        col = np.clip(np.rint(w[:, i] / step), -limit, limit)
        if keep is not None:
            col *= keep[:, i]
        q[:, i] = col
        err = (w[:, i] - col * step) / u[i, i]
        w[:, i + 1:] -= np.outer(err, u[i, i + 1:])
    out = np.empty_like(q)
    out[:, order] = q
    return out


# -- measuring H on calibration data ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Reader:
    """How to turn a node's data input into the rows whose second moment is the weight's H."""

    weight: str
    data: str
    transposed: bool
    conv: dict[str, list[int]] | None  # kernel_shape, strides, pads, dilations of a Conv


def _readers(graph: onnx.GraphProto, shapes: Mapping[str, tuple[int, ...]]) -> list[_Reader]:
    """One reader per weight (``shapes``' keys) read directly as a 1-group Conv's, a Gemm's or a MatMul's weight."""
    names = set(shapes)
    found: dict[str, _Reader] = {}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            if name in names:
                uses[name] = uses.get(name, 0) + 1
        if len(node.input) < 2 or node.input[1] not in names:
            continue
        a, w = attrs_of(node), node.input[1]
        if node.op_type == "Conv" and a.get("group", 1) == 1 and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET"):
            kernel = list(shapes[w][2:])
            nd = len(kernel)
            found[w] = _Reader(w, node.input[0], False, {
                "kernel_shape": kernel, "strides": list(a.get("strides", [1] * nd)),  # type: ignore[call-overload]
                "pads": list(a.get("pads", [0] * 2 * nd)),  # type: ignore[call-overload]
                "dilations": list(a.get("dilations", [1] * nd))})  # type: ignore[call-overload]
        elif node.op_type == "Gemm" and not a.get("transA", 0):
            found[w] = _Reader(w, node.input[0], not a.get("transB", 0), None)
        elif node.op_type == "MatMul" and len(shapes[w]) == 2:
            found[w] = _Reader(w, node.input[0], True, None)
    return [r for w, r in found.items() if uses.get(w) == 1]  # a weight read twice has no single input


def _patches(x: np.ndarray, conv: Mapping[str, list[int]]) -> np.ndarray:
    """``[C·prod(kernel), N·positions]``: every input patch a Conv reads as a column, rows channel-major like
    ``W.reshape(out, -1)``'s columns (one strided slice of the padded input per kernel offset)."""
    kernel, strides, pads, dil = conv["kernel_shape"], conv["strides"], conv["pads"], conv["dilations"]
    nd = len(kernel)
    x = np.pad(x, [(0, 0), (0, 0), *((pads[i], pads[i + nd]) for i in range(nd))])
    x = np.ascontiguousarray(np.moveaxis(x, 1, 0))  # [C, N, *spatial]
    out = [(x.shape[2 + i] - (kernel[i] - 1) * dil[i] - 1) // strides[i] + 1 for i in range(nd)]
    cols = np.empty((x.shape[0], math.prod(kernel), x.shape[1], *out), np.float32)
    for k, offset in enumerate(np.ndindex(*kernel)):
        cols[:, k] = x[(slice(None), slice(None), *(slice(o * d, o * d + (n - 1) * s + 1, s)
                                                     for o, d, n, s in zip(offset, dil, out, strides, strict=True)))]
    return cols.reshape(x.shape[0] * math.prod(kernel), -1)


def layer_grams(model: BNNModel, batches: Iterable[np.ndarray], *,
                progress: Callable[[int], None] | None = None) -> dict[str, InputGram]:
    """H = E[x xᵀ] of the inputs of every Bayesian weight a Conv (1 group), Gemm or MatMul reads directly, in the
    posterior-mean network run by onnxruntime on ``batches`` of model inputs.

    Args:
        model: The IR (float or lowered: its mean network is run).
        batches: Arrays shaped like the model's input (any batch size).
        progress: Called with the number of inputs done after each batch.

    Returns:
        ``{weight name: InputGram}``; weights read any other way are absent (they keep nearest rounding).

    Raises:
        InvalidOptionError: No inputs, or inputs the model does not take (names the shape).
    """
    import onnxruntime as ort

    proto = model.float_model()
    shapes = {w.name: tuple(w.encoding.shape) for w in model.encoded_weights()}
    readers = _readers(proto.graph, shapes)
    outputs = list(dict.fromkeys(r.data for r in readers))
    have = {o.name for o in proto.graph.output}
    for name in outputs:
        if name not in have:
            proto.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0].name
    sums: dict[str, np.ndarray] = {}
    counts = {r.weight: 0 for r in readers}
    done = 0
    for x in batches:
        x = np.ascontiguousarray(x, dtype=np.float32)
        try:
            acts = dict(zip(outputs, session.run(outputs, {feed: x}), strict=True))
        except Exception as e:  # onnxruntime raises its own types for a wrong shape
            raise InvalidOptionError(f"calibration inputs {x.shape}: the model does not take them ({e})") from e
        batch: dict[str, tuple[np.ndarray, int]] = {}  # weights reading one input the same way share its H
        for r in readers:
            key = repr((r.data, r.conv))
            if key not in batch:
                a = acts[r.data]
                cols = _patches(a, r.conv) if r.conv is not None else a.reshape(-1, a.shape[-1]).T
                batch[key] = (cols @ cols.T).astype(np.float64), cols.shape[1]  # float32 BLAS per batch
            g, n = batch[key]
            sums[r.weight] = sums[r.weight] + g if r.weight in sums else g
            counts[r.weight] += n
        done += len(x)
        if progress is not None:
            progress(done)
    if done == 0:
        raise InvalidOptionError("calibration data: no inputs")
    return {r.weight: InputGram(sums[r.weight] / counts[r.weight], r.transposed, counts[r.weight], done)
            for r in readers}
