"""Correlated Laplace posteriors (laplace-torch): a Kronecker-factored layer (``KronGaussianWeight``) or a dense
Gaussian block (``DenseGaussianWeight``), lowered with ``fixed`` to ``KronFixedWeight`` / ``DenseFixedWeight``.
Imported from a fitted laplace-torch object by :mod:`edgebnn.importers.laplace` (a diagonal Laplace is the
mean-field Gaussian family).

Draws (in the graph, exactly the encodings' ``sample``)::

    Kronecker:  W_s = M + Q_out (Z_s ⊙ D) Q_inᵀ,  Z: [S, out, rest]       (two MatMuls over the sample axis)
    dense:      W_s = M + reshape(L z_s),  z: [S, r]                      (one MatMul)

Analytic: refused anywhere but the last layer (per-weight moments drop the correlation); as the last layer (a
last-layer posterior: ``*LLLaplace``) the logits are exactly Gaussian, and the GLM / probit predictive reads the
exact logit variance per family (:mod:`edgebnn.exporters.glm`), u = Q_iᵀ φ::

    Kronecker:  var_k = Σ_p Q_o[k, p]² Σ_q D[p, q]² u_q²          dense:  var_k = Σ_r (Σ_i L[k·n + i, r] φ_i)²

``fixed`` puts the mean on ``fixed``'s grid by the whitened rule (:func:`edgebnn.passes.fixed.whitened_mean`;
``L⁻¹ e = (Q_oᵀ E Q_i) / D`` for Kronecker, the least-squares solution of ``L z = e`` for dense), codes the
eigenvectors and the dense factor as int8 row codes (one scale per eigenvector / column; the eigenvectors' code moved
dNLL by 3e-5) and D as a log code of ``KRON_SCALE_BITS`` (6: at 4 it cost dNLL +0.008, at 6 +0.002, at 8 +0.000
for 600 more bytes on a 10 × 32 layer). Its stores decode them in the graph; ``--weights int8|int4`` codes the same
parts at export (D at ``max(bits, KRON_SCALE_BITS)``: at 4 it cost dNLL +0.008).

Kept fp32, and why: the GLM predictive reads Q_i, D² and Q_o² computed in float64 and rounded once; squaring decoded
codes in the graph rounds in float32, so that decode would not be exact (the GLM graph is the same bytes lowered or
not).
"""

from __future__ import annotations

import numpy as np

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.factors import FactorStore, factor, mean, row_code
from edgebnn.exporters.stores.gaussian import sigma_at, sigma_code
from edgebnn.family import Analytic, Family, register_family
from edgebnn.ir import EncodedWeight
from edgebnn.ir.encodings import (
    DenseFixedWeight,
    DenseGaussianWeight,
    Encoding,
    KronFixedWeight,
    KronGaussianWeight,
    RowCode,
    SigmaCode,
)
from edgebnn.passes.base import LayerOutcome, LayerPass, Lowering, kept
from edgebnn.passes.fixed import whitened_mean

KRON_SCALE_BITS = 6


def kron_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """W_s = M + Q_out (Z_s ⊙ D) Q_inᵀ: two MatMuls broadcast over the sample axis of the noise Z [S, out, rest]."""
    assert isinstance(enc, KronGaussianWeight)
    p += tag
    scaled = b.add("Mul", [eps[""], factor(b, enc, "scale", p + "kron_scale", enc.scale)], p + "kron_zd")
    left = b.add("MatMul", [factor(b, enc, "q_out", p + "q_out", enc.q_out), scaled], p + "kron_left")
    q_in_t = factor(b, enc, "q_in_t", p + "q_in_t", np.ascontiguousarray(enc.q_in.T))
    full = b.add("MatMul", [left, q_in_t], p + "kron_dw")
    dw = b.add("Reshape", [full, b.i64(p + "kron_shape", samples, *enc.shape)], p + "kron_dw_w")
    return b.add("Add", [mean(b, enc, p + "mu"), dw], p + ("s" if tag else "W_s"))


def dense_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """W_s = M + reshape(L z_s): one MatMul of the noise z [S, r] with Lᵀ [r, numel]."""
    assert isinstance(enc, DenseGaussianWeight)
    p += tag
    flat = b.add("MatMul", [eps[""], factor(b, enc, "scale_t", p + "scale_t", np.ascontiguousarray(enc.scale.T))],
                 p + "dense_dw")
    dw = b.add("Reshape", [flat, b.i64(p + "dense_shape", samples, *enc.shape)], p + "dense_dw_w")
    return b.add("Add", [mean(b, enc, p + "mu"), dw], p + ("s" if tag else "W_s"))


class KronFixedStore(FactorStore):
    """``q_out`` (Q_o), ``q_in_t`` (Q_iᵀ), ``scale`` (D, [out, rest]) decoded from the lowering's codes."""

    op_type = "KronFixedWeight"

    def factor(self, b: Builder, enc: Encoding, field: str, name: str) -> str:
        assert isinstance(enc, KronFixedWeight)
        if field == "q_out":
            return row_code(b, enc.q_out_code, name, transpose=True)
        if field == "q_in_t":
            return row_code(b, enc.q_in_code, name)
        assert field == "scale", field
        return sigma_code(b, enc.scale_code, enc.matrix_shape, name)

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, KronFixedWeight)
        return int(enc.packed.nbytes + 1 + 4 + enc.q_out_code.nbytes + enc.q_in_code.nbytes + enc.scale_code.nbytes)


class DenseFixedStore(FactorStore):
    """``scale_t`` (Lᵀ, [r, numel]) decoded from the lowering's codes."""

    op_type = "DenseFixedWeight"

    def factor(self, b: Builder, enc: Encoding, field: str, name: str) -> str:
        assert isinstance(enc, DenseFixedWeight) and field == "scale_t", field
        return row_code(b, enc.scale_code, name)

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, DenseFixedWeight)
        return int(enc.packed.nbytes + 1 + 4 + enc.scale_code.nbytes)


def requant_factor(b: Builder, enc: Encoding, field: str, name: str, bits: int) -> str:
    """``--weights int8|int4``: the eigenvectors and a dense factor int8 row codes, D a log code of at least
    ``KRON_SCALE_BITS`` bits (the lowering's codes, fitted now)."""
    if isinstance(enc, KronGaussianWeight):
        if field == "q_out":
            return row_code(b, RowCode.fit(enc.q_out.T), name, transpose=True)
        if field == "q_in_t":
            return row_code(b, RowCode.fit(enc.q_in.T), name)
        return sigma_code(b, sigma_at(enc.scale, max(bits, KRON_SCALE_BITS)), enc.matrix_shape, name)
    assert isinstance(enc, DenseGaussianWeight) and field == "scale_t", field
    return row_code(b, RowCode.fit(enc.scale.T), name)


def fixed_kron(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    """The mean on a grid by the whitened rule, the eigenvectors int8 per eigenvector, D a log code. Whitening:
    ``L⁻¹ e = (Q_oᵀ E Q_i) / D`` (E the error as [out, rest])."""
    enc = weight.encoding
    assert isinstance(enc, KronGaussianWeight)
    q_out, q_in, d = (a.astype(np.float64) for a in (enc.q_out, enc.q_in, enc.scale))

    def whiten(e: np.ndarray) -> np.ndarray:
        rotated = q_out.T @ e.reshape(enc.matrix_shape) @ q_in
        return np.divide(rotated, d, out=np.where(np.abs(rotated) > 0, np.inf, 0.0), where=d > 0)

    q, step, bits, outcome = whitened_mean(pass_, enc, whiten, rng)
    out = KronFixedWeight(q, step, bits, RowCode.fit(enc.q_out.T), RowCode.fit(enc.q_in.T),
                          SigmaCode.fit(enc.scale, KRON_SCALE_BITS, rng))
    return LayerOutcome(out, outcome.note, outcome.extra)


def fixed_dense(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    """The mean on a grid by the whitened rule (``L⁻¹ e`` the least-squares solution of ``L z = e``), the factor L
    int8 per column."""
    enc = weight.encoding
    assert isinstance(enc, DenseGaussianWeight)
    factor_l = enc.scale.astype(np.float64)

    def whiten(e: np.ndarray) -> np.ndarray:
        return np.asarray(np.linalg.lstsq(factor_l, e.reshape(-1), rcond=None)[0])

    q, step, bits, outcome = whitened_mean(pass_, enc, whiten, rng)
    out = DenseFixedWeight(q, step, bits, RowCode.fit(enc.scale.T))
    return LayerOutcome(out, outcome.note, outcome.extra)


def kron_variance(b: Builder, enc: Encoding, phi: str, p: str) -> str:
    """var_k = Σ_p Q_o[k, p]² Σ_q D[p, q]² (Q_iᵀ φ)_q²."""
    assert isinstance(enc, KronGaussianWeight)
    u = b.add("MatMul", [phi, b.f32(p + "q_in", enc.q_in)], p + "u")
    u2 = b.add("Mul", [u, u], p + "u2")
    d2 = np.square(enc.scale.astype(np.float64)).T.astype(np.float32)
    rot = b.add("MatMul", [u2, b.f32(p + "d2_t", np.ascontiguousarray(d2))], p + "var_eig")
    q2 = np.square(enc.q_out.astype(np.float64)).T.astype(np.float32)
    return b.add("MatMul", [rot, b.f32(p + "q_out2_t", np.ascontiguousarray(q2))], p + "var")


def dense_variance(b: Builder, enc: Encoding, phi: str, p: str) -> str:
    """var_k = Σ_r (Σ_i L[k·n + i, r] φ_i)²."""
    assert isinstance(enc, DenseGaussianWeight)
    k, n = enc.shape
    r = enc.scale.shape[1]
    lmat = enc.scale.reshape(k, n, r).transpose(1, 0, 2).reshape(n, k * r)  # [n, K·r]
    t = b.add("MatMul", [phi, b.f32(p + "scale_t", np.ascontiguousarray(lmat))], p + "t")
    t3 = b.add("Reshape", [t, b.i64(p + "t_shape", -1, k, r)], p + "t3")
    return b.add("ReduceSum", [b.add("Mul", [t3, t3], p + "t2"), b.i64(p + "axis_r", -1)], p + "var", keepdims=0)


_LAST_LAYER_ONLY = "is exact for it only as the last layer (the GLM predictive); use --mode baked or noise"
KRON_ANALYTIC = Analytic("refused", _LAST_LAYER_ONLY, last_layer=kron_variance)
DENSE_ANALYTIC = Analytic("refused", _LAST_LAYER_ONLY, last_layer=dense_variance)

FAMILY = register_family(Family(
    "laplace", (KronGaussianWeight, KronFixedWeight, DenseGaussianWeight, DenseFixedWeight),
    "Laplace: Kronecker-factored or dense Gaussian per layer (laplace-torch)",
    draws={"KronGaussianWeight": kron_draw, "KronFixedWeight": kron_draw,
           "DenseGaussianWeight": dense_draw, "DenseFixedWeight": dense_draw},
    stores={"KronFixedWeight": KronFixedStore(), "DenseFixedWeight": DenseFixedStore()},
    lowerings={"KronGaussianWeight": {"float": kept(), "fixed": Lowering(fixed_kron, {"bits"})},
               "KronFixedWeight": {"float": kept(), "fixed": kept("already fixed point: kept")},
               "DenseGaussianWeight": {"float": kept(), "fixed": Lowering(fixed_dense, {"bits"})},
               "DenseFixedWeight": {"float": kept(), "fixed": kept("already fixed point: kept")}},
    analytic=lambda enc: KRON_ANALYTIC if isinstance(enc, KronGaussianWeight) else DENSE_ANALYTIC,
    factors=requant_factor, label="Laplace posterior",
))
