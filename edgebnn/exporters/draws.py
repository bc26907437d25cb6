"""In-graph weight draws: ``W_s`` [S, *shape] from standard-noise graph inputs, one emitter per encoding.

The noise an encoding consumes per draw is its :meth:`~edgebnn.ir.encodings.base.Encoding.noise_needs` (graph
inputs ``noise/<weight><suffix>``, created by the caller); an emitter turns them into the draw, exactly as the
encoding's ``sample`` does in numpy:

``GAUSSIAN`` encodings (the default emitter)::

    W_s = mu + sigma ⊙ ε_s,   ε: [S, *shape]      (mu, sigma decoded once from the encoding's store, :mod:`.stores`)

``CodebookWeight`` with ``sampling="independent"`` (each weight reads its entry, then draws on its own)::

    mean = m[index], std = s[index] (outliers and blended weights overwritten);  W_s = mean + std ⊙ ε_s

``CodebookWeight`` with ``sampling="shared"`` (2DGBNN stochastic weight sharing)::

    c = m + s ⊙ ε [S, K];  W_s = c[:, index];  blended weight i: entry j with u_i ≥ cum_{j-1} (uniform u);
    outlier o: μ_o + σ_o ε_o

``DropoutMask`` (MC dropout)::

    M_s = [u_s >= p] / (1 - p),   u: uniform [S, *mask shape]

``LowRankGaussianWeight`` (SWAG; z₂ one input [S, K] shared by every layer; and its lowered ``LowRankFixedWeight``)::

    W_s = mean + (sqrt(scale) σ) ⊙ ε_s + reshape(z₂_s @ (sqrt(scale / (K − 1)) D))

``KronGaussianWeight`` / ``DenseGaussianWeight`` (Kronecker-factored / full-covariance Laplace; and their lowered
``KronFixedWeight`` / ``DenseFixedWeight``)::

    W_s = M + Q_out (Z_s ⊙ D) Q_inᵀ,  Z: [S, out, rest];     W_s = M + reshape(L z_s),  z: [S, r]

The families' mean and covariance factors come from their store (:func:`.stores.families.factor`: the lowered
encodings' codes decoded in the graph, fp32 constants otherwise).
Adding an encoding that draws differently is one emitter registered in :data:`DRAWS` by op type.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores import decode
from edgebnn.exporters.stores.base import unpack_codes
from edgebnn.exporters.stores.families import factor
from edgebnn.exporters.stores.families import mean as family_mean
from edgebnn.ir.encodings import (
    CodebookWeight,
    DenseGaussianWeight,
    DropoutMask,
    Encoding,
    KronGaussianWeight,
    LowRankGaussianWeight,
)
from edgebnn.ir.encodings.lowrank import Z2_SUFFIX

# (builder, encoding, name prefix, tag of the emitted names, {noise suffix: graph input}, samples) -> W_s
DrawEmitter = Callable[[Builder, Encoding, str, str, dict[str, str], int], str]
DRAWS: dict[str, DrawEmitter] = {}


def register_draw(op_type: str) -> Callable[[DrawEmitter], DrawEmitter]:
    """Decorator: draw encodings of ``op_type`` in the graph with the decorated emitter."""
    def register(fn: DrawEmitter) -> DrawEmitter:
        DRAWS[op_type] = fn
        return fn
    return register


def draw_emitter(enc: Encoding) -> DrawEmitter | None:
    """How ``enc`` is drawn in a graph, or None when it cannot be (it has no standard-noise form)."""
    if enc.noise_needs() is None:
        return None
    return DRAWS.get(enc.op_type, gaussian_draw if enc.GAUSSIAN else None)


def gaussian_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """W_s = mu + sigma ⊙ ε_s; named ``<tag>mu``, ``<tag>sigma``, ... and ``W_s`` (``b_s`` for a bias)."""
    mu, sigma = decode(b, enc, "mean", p + tag + "mu"), decode(b, enc, "stddev", p + tag + "sigma")
    return b.add("Add", [mu, b.add("Mul", [sigma, eps[""]], p + tag + "scaled")], p + (tag + "s" if tag else "W_s"))


@register_draw("CodebookWeight")
def codebook_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """A codebook's draw in the graph, per its ``sampling``: independent per weight, or one value per entry per
    sample shared by its weights (2DGBNN)."""
    assert isinstance(enc, CodebookWeight)
    p += tag
    if b.store_choice == "ir" and enc.bits:  # the IR's packed B-bit indices, unpacked in the graph (int32)
        idx = unpack_codes(b, enc.packed, enc.bits, enc.size, p + "idx")
        b.stored[p + "idx"] = enc.op_type
    else:
        idx = b.add("Cast", [b.const(p + "indices", enc.indices.astype(np.uint8 if enc.k <= 256 else np.uint16))],
                    p + "idx", to=onnx.TensorProto.INT64)
    if enc.sampling == "independent":
        return _independent_draw(b, enc, p, idx, eps[""])
    c = b.add("Add", [b.f32(p + "cb_mean", enc.codebook[:, 0]),
                      b.add("Mul", [b.f32(p + "cb_std", enc.codebook[:, 1]), eps[""]], p + "cb_scaled")], p + "c")
    flat = b.add("Gather", [c, idx], p + "w_inliers", axis=1)  # [S, n]
    if enc.blend_index.size:
        j = enc.blend_components.shape[1]
        cum = np.cumsum(enc.blend_weights(), axis=1)[:, :-1]  # pick = #{cum_j <= u}, as CodebookWeight.sample
        ge = b.add("GreaterOrEqual", [b.add("Unsqueeze", [eps[".blend"], b.i64(p + "ax2", 2)], p + "u3"),
                                      b.f32(p + "cum", cum[None])], p + "ge")
        pick = b.add("ReduceSum", [b.add("Cast", [ge], p + "ge_i", to=onnx.TensorProto.INT64),
                                   b.i64(p + "ax2b", 2)], p + "pick", keepdims=1)  # [S, n_b, 1]
        comps = b.add("Expand", [b.const(p + "blend_comp", enc.blend_components.astype(np.int64)[None]),
                                 b.i64(p + "bshape", samples, enc.blend_index.size, j)], p + "comps")
        comp = b.add("Squeeze", [b.add("GatherElements", [comps, pick], p + "comp3", axis=2),
                                 b.i64(p + "ax2c", 2)], p + "comp")
        vals = b.add("GatherElements", [c, comp], p + "blend_vals", axis=1)
        flat = _scatter(b, flat, enc.blend_index, vals, samples, p + "blend")
    if enc.outlier_index.size:
        vals = b.add("Add", [b.f32(p + "o_mu", enc.outlier_mu),
                             b.add("Mul", [b.f32(p + "o_sigma", enc.outlier_sigma), eps[".outliers"]], p + "o_s")],
                     p + "o")
        flat = _scatter(b, flat, enc.outlier_index, vals, samples, p + "outliers")
    return b.add("Reshape", [flat, b.i64(p + "draw_shape", samples, *enc.shape)], p + "W_s")


def _independent_draw(b: Builder, enc: CodebookWeight, p: str, idx: str, eps: str) -> str:
    """W_s = mean + std ⊙ ε with mean and std gathered from the K entries (stored as indices, not per weight);
    outliers and blended weights keep their own moments (``CodebookWeight.moments``)."""
    mean_flat, var_flat = (a.reshape(-1) for a in enc.moments())
    own = np.union1d(enc.outlier_index, enc.blend_index).astype(np.int64)
    own_idx = b.const(p + "own_idx", own) if own.size else ""
    moments = []
    for name, column, values in (("mean", 0, mean_flat), ("std", 1, np.sqrt(var_flat))):
        flat = b.add("Gather", [b.f32(p + "cb_" + name, enc.codebook[:, column]), idx], p + name + "_inliers", axis=0)
        if own.size:
            flat = b.add("ScatterElements", [flat, own_idx, b.f32(p + "own_" + name, values[own])],
                         p + name + "_flat", axis=0)
        moments.append(b.add("Reshape", [flat, b.i64(p + name + "_shape", *enc.shape)], p + name))
    scaled = b.add("Mul", [moments[1], eps], p + "scaled")
    return b.add("Add", [moments[0], scaled], p + "W_s")


@register_draw("DropoutMask")
def dropout_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """The keep-mask from uniform noise, exactly as ``DropoutMask.sample``: [u >= p] · 1/(1-p)."""
    assert isinstance(enc, DropoutMask)
    keep = b.add("GreaterOrEqual", [eps[""], b.f32(p + tag + "p", enc.p)], p + tag + "keep")
    kept = b.add("Cast", [keep], p + tag + "keep_f", to=onnx.TensorProto.FLOAT)
    return b.add("Mul", [kept, b.f32(p + tag + "scale", float(enc.keep_scale()))], p + (tag + "s" if tag else "W_s"))


def _scatter(b: Builder, flat: str, index: np.ndarray, values: str, samples: int, p: str) -> str:
    """flat[:, index] = values, for [S, n] flat and [S, len(index)] values."""
    const = b.const(p + "_idx", index.astype(np.int64)[None])
    idx = b.add("Expand", [const, b.i64(p + "_ishape", samples, index.size)], p + "_idx_s")
    return b.add("ScatterElements", [flat, idx, values], p + "_w", axis=1)


@register_draw("LowRankGaussianWeight")
@register_draw("LowRankFixedWeight")
def lowrank_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """SWAG's draw exactly as ``LowRankGaussianWeight.sample_joint``, the low-rank term one MatMul of the shared
    z₂ [S, K] by the scaled deviations [K, n]; mean, σ and D from the encoding's store (:mod:`.stores.families`)."""
    assert isinstance(enc, LowRankGaussianWeight)
    p += tag
    root = np.float32(np.sqrt(enc.scale))
    c = b.f32(p + "dev_c", np.array(root / np.float32(np.sqrt(enc.rank - 1)), np.float32))
    dev = b.add("Mul", [factor(b, enc, "deviations", p + "dev_raw", enc.deviations), c], p + "dev")
    low = b.add("MatMul", [eps[Z2_SUFFIX], dev], p + "low_flat")
    low = b.add("Reshape", [low, b.i64(p + "low_shape", samples, *enc.shape)], p + "low")
    root_c = b.f32(p + "root", np.array(root, np.float32))
    sigma = b.add("Mul", [factor(b, enc, "sigma", p + "sigma_raw", enc.sigma), root_c], p + "sigma")
    diag = b.add("Mul", [sigma, eps[""]], p + "scaled")
    return b.add("Add", [b.add("Add", [family_mean(b, enc, p + "mu"), diag], p + "diag_s"), low],
                 p + ("s" if tag else "W_s"))


@register_draw("KronGaussianWeight")
@register_draw("KronFixedWeight")
def kron_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """W_s = M + Q_out (Z_s ⊙ D) Q_inᵀ, exactly as ``KronGaussianWeight.sample``: two MatMuls broadcast over the
    sample axis of the host noise Z [S, out, rest]; M, Q_out, D and Q_inᵀ from the encoding's store."""
    assert isinstance(enc, KronGaussianWeight)
    p += tag
    scaled = b.add("Mul", [eps[""], factor(b, enc, "scale", p + "kron_scale", enc.scale)], p + "kron_zd")
    left = b.add("MatMul", [factor(b, enc, "q_out", p + "q_out", enc.q_out), scaled], p + "kron_left")
    q_in_t = factor(b, enc, "q_in_t", p + "q_in_t", np.ascontiguousarray(enc.q_in.T))
    full = b.add("MatMul", [left, q_in_t], p + "kron_dw")
    dw = b.add("Reshape", [full, b.i64(p + "kron_shape", samples, *enc.shape)], p + "kron_dw_w")
    return b.add("Add", [family_mean(b, enc, p + "mu"), dw], p + ("s" if tag else "W_s"))


@register_draw("DenseGaussianWeight")
@register_draw("DenseFixedWeight")
def dense_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """W_s = M + reshape(L z_s), exactly as ``DenseGaussianWeight.sample``: one MatMul of the host noise z [S, r]
    with Lᵀ [r, numel]; M and Lᵀ from the encoding's store."""
    assert isinstance(enc, DenseGaussianWeight)
    p += tag
    flat = b.add("MatMul", [eps[""], factor(b, enc, "scale_t", p + "scale_t", np.ascontiguousarray(enc.scale.T))],
                 p + "dense_dw")
    dw = b.add("Reshape", [flat, b.i64(p + "dense_shape", samples, *enc.shape)], p + "dense_dw_w")
    return b.add("Add", [family_mean(b, enc, p + "mu"), dw], p + ("s" if tag else "W_s"))
