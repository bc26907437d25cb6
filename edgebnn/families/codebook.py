"""The codebook family (stochastic weight sharing, 2DGBNN): ``CodebookWeight``, every inlier weight an index into
K Gaussian components (m_k, s_k), outliers their own Gaussian, blended weights a mixture of entries.

Draw (in the graph, :func:`codebook_draw`), per the encoding's ``sampling``::

    independent:  mean = m[index], std = s[index] (outliers and blended weights overwritten);  W_s = mean + std ⊙ ε_s
    shared:       c = m + s ⊙ ε [S, K];  W_s = c[:, index];  blended weight i: entry j with u_i ≥ cum_{j-1}
                  (uniform u);  outlier o: μ_o + σ_o ε_o          (one draw per entry per sample, as 2DGBNN)

Store (``--weights ir``): the packed entry indices and the K-entry table, exactly ``mean()`` / ``stddev()``::

    mean = m[index],  σ = s[index]       Gather from the codebook's columns (float32 [K] each)
    outliers and blended weights         overwritten with their own moments (``ScatterElements`` of the
                                         ``CodebookWeight.mean()`` / ``stddev()`` values at their flat indices)

Bytes: the packed B-bit indices, the table, and per outlier or blended weight one index (uint16/uint32) and one
float32 for each of μ and σ.

Analytic: exact for ``sampling="independent"`` (each weight draws on its own); refused for ``shared``: the weights
of an entry share one draw, which per-weight moments cannot carry (its analytic graph would be the independent
codebook's predictive: on the digits CNN NLL 0.103 against the shared draws' 0.263, docs/uncertainty.md).
"""

from __future__ import annotations

import numpy as np
import onnx

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.base import INT64, TRT, Store, reshape_to, unpack_codes
from edgebnn.family import EXACT, Analytic, Family, register_family
from edgebnn.ir.encodings import CodebookWeight, Encoding
from edgebnn.ir.encodings.codebook import index_dtype


class CodebookStore(Store):
    op_type = "CodebookWeight"

    def _own(self, enc: CodebookWeight) -> np.ndarray:
        return np.union1d(enc.outlier_index, enc.blend_index).astype(np.int64)

    def _column(self, b: Builder, enc: Encoding, name: str, column: int, values: np.ndarray) -> str:
        assert isinstance(enc, CodebookWeight)
        table = b.f32(name + ".table", enc.codebook[:, column])
        if enc.bits:
            idx = unpack_codes(b, enc.packed, enc.bits, enc.size, name + "/idx")
            flat = b.add("Gather", [table, idx], name + "/inliers", axis=0)
        else:  # one entry
            flat = b.add("Expand", [table, b.const(name + ".n", np.array([enc.size], np.int64))], name + "/inliers")
        own = self._own(enc)
        if own.size:
            # TensorRT imports no uint16/uint32 weights: int32 there (4 bytes an outlier instead of 2)
            dtype = np.int32 if TRT in (b.fmt.runtimes or ()) else index_dtype(enc.size)
            at = b.add("Cast", [b.const(name + ".own_index", own.astype(dtype))], name + "/own", to=INT64)
            flat = b.add("ScatterElements", [flat, at, b.f32(name + ".own", values.reshape(-1)[own])],
                         name + "/flat", axis=0)
        return reshape_to(b, flat, enc.shape, name)

    def mean(self, b: Builder, enc: Encoding, name: str) -> str:
        return self._column(b, enc, name, 0, enc.mean())

    def stddev(self, b: Builder, enc: Encoding, name: str) -> str:
        return self._column(b, enc, name, 1, enc.stddev())

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, CodebookWeight)
        own = self._own(enc).size
        return int(enc.packed.nbytes + 1 + enc.codebook.nbytes + own * (np.dtype(index_dtype(enc.size)).itemsize + 8))


def codebook_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """A codebook's draw in the graph, per its ``sampling``: independent per weight, or one value per entry per
    sample shared by its weights (2DGBNN)."""
    assert isinstance(enc, CodebookWeight)
    p += tag
    if b.fmt.weights == "ir" and enc.bits:  # the IR's packed B-bit indices, unpacked in the graph (int32)
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


def _scatter(b: Builder, flat: str, index: np.ndarray, values: str, samples: int, p: str) -> str:
    """flat[:, index] = values, for [S, n] flat and [S, len(index)] values."""
    const = b.const(p + "_idx", index.astype(np.int64)[None])
    idx = b.add("Expand", [const, b.i64(p + "_ishape", samples, index.size)], p + "_idx_s")
    return b.add("ScatterElements", [flat, idx, values], p + "_w", axis=1)


SHARED_DRAWS = Analytic(
    "refused", "draws one value per codebook entry shared by its weights (sampling='shared'), which per-weight "
    "moments cannot carry: use --mode shared or baked (or lower with sampling='independent')")


def _analytic(enc: Encoding) -> Analytic:
    return SHARED_DRAWS if isinstance(enc, CodebookWeight) and enc.sampling == "shared" else EXACT


FAMILY = register_family(Family(
    "codebook", (CodebookWeight,), "stochastic weight sharing (2DGBNN): K Gaussian entries, packed indices",
    draws={"CodebookWeight": codebook_draw}, stores={"CodebookWeight": CodebookStore()}, analytic=_analytic,
))
