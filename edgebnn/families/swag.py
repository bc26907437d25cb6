"""SWAG (Maddox et al. 2019): a low-rank plus diagonal Gaussian over all parameters, one z₂ shared by every layer
(``LowRankGaussianWeight``; lowered with ``fixed``: ``LowRankFixedWeight``). Imported from a plain model and its
SWAG statistics by :mod:`edgebnn.importers.swag`.

Draw (in the graph, exactly ``LowRankGaussianWeight.sample_joint``; z₂ one input [S, K] shared by every layer)::

    W_s = mean + (sqrt(scale) σ) ⊙ ε_s + reshape(z₂_s @ (sqrt(scale / (K − 1)) D))

Exports: exact in ``baked`` (one z₂ per sample shared by every layer, as the reference code draws it) and in
``noise --noise weight``; ``analytic`` and the other noise variants run on per-weight moments, dropping the
low-rank correlation between layers: refused.

``fixed`` puts the mean on ``fixed``'s grid by the variance rule with the marginal σ (the low-rank part included),
codes σ as a log-domain SigmaCode of at least ``FAMILY_SIGMA_BITS`` bits and the deviations D as int8 row codes
(one scale per (iterate, output channel)). Its store decodes them in the graph
(:mod:`edgebnn.exporters.stores.factors`); ``--weights int8|int4`` codes the same parts at export (σ at that
width, D int8).
"""

from __future__ import annotations

import numpy as np

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.factors import FactorStore, factor, mean, reshape_to, row_code
from edgebnn.exporters.stores.gaussian import sigma_at, sigma_code
from edgebnn.family import Analytic, ExportRequest, Family, register_family
from edgebnn.ir import EncodedWeight
from edgebnn.ir.encodings import Encoding, LowRankFixedWeight, LowRankGaussianWeight, RowCode, SigmaCode
from edgebnn.ir.encodings.lowrank import Z2_SUFFIX
from edgebnn.passes.base import LayerOutcome, LayerPass, Lowering, kept
from edgebnn.passes.fixed import family_sigma_bits, fixed_mean


def lowrank_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """SWAG's draw exactly as ``sample_joint``, the low-rank term one MatMul of the shared z₂ [S, K] by the scaled
    deviations [K, n]; mean, σ and D from the encoding's store."""
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
    return b.add("Add", [b.add("Add", [mean(b, enc, p + "mu"), diag], p + "diag_s"), low],
                 p + ("s" if tag else "W_s"))


class LowRankFixedStore(FactorStore):
    """``sigma`` (σ, the weight's shape) and ``deviations`` (D, [K, n]) decoded from the lowering's codes."""

    op_type = "LowRankFixedWeight"

    def factor(self, b: Builder, enc: Encoding, field: str, name: str) -> str:
        assert isinstance(enc, LowRankFixedWeight)
        if field == "sigma":
            return sigma_code(b, enc.sigma_code, enc.shape, name)
        assert field == "deviations", field
        return reshape_to(b, row_code(b, enc.dev_code, name + "/d"), (enc.rank, enc.size), name)

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, LowRankFixedWeight)
        return int(enc.packed.nbytes + 1 + 4 + enc.sigma_code.nbytes + enc.dev_code.nbytes)


def requant_factor(b: Builder, enc: Encoding, field: str, name: str, bits: int) -> str:
    """``--weights int8|int4``: σ as a ``bits``-bit log code, D as int8 rows (the lowering's codes, fitted now)."""
    assert isinstance(enc, LowRankGaussianWeight)
    if field == "sigma":
        return sigma_code(b, sigma_at(enc.sigma, bits), enc.shape, name)
    rows = RowCode.fit(enc.deviations.reshape(enc.rank * enc.shape[0], -1))
    return reshape_to(b, row_code(b, rows, name + "/d"), (enc.rank, enc.size), name)


def fixed_lowrank(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
    """The mean on a grid, σ a log code, D an int8 code per (iterate, output channel)."""
    enc = weight.encoding
    assert isinstance(enc, LowRankGaussianWeight)
    fp, mean_outcome = fixed_mean(pass_, enc, rng)
    rows = enc.deviations.reshape(enc.rank * (enc.shape[0] if enc.shape else 1), -1)
    out = LowRankFixedWeight(fp.q, fp.scale, fp.bits, SigmaCode.fit(enc.sigma, family_sigma_bits(pass_), rng),
                             RowCode.fit(rows), enc.scale)
    return LayerOutcome(out, mean_outcome.note, mean_outcome.extra)


def exact_exports(req: ExportRequest) -> str | None:
    if req.mode == "analytic":
        return ("--mode analytic would treat the layers as independent, dropping SWAG's low-rank correlation; "
                "export SWAG with --mode baked or --mode noise --noise weight")
    if req.mode in ("noise", "shared") and req.noise != "weight":
        return (f"--noise {req.noise if req.mode == 'noise' else 'shared'} runs Gaussian layers on their marginal "
                "moments, dropping SWAG's low-rank correlation; use --noise weight (z₂ drawn in the graph, shared by "
                "every layer) or --mode baked")
    return None


FAMILY = register_family(Family(
    "swag", (LowRankGaussianWeight, LowRankFixedWeight), "SWAG: low-rank plus diagonal Gaussian, one z2 per sample",
    draws={"LowRankGaussianWeight": lowrank_draw, "LowRankFixedWeight": lowrank_draw},
    stores={"LowRankFixedWeight": LowRankFixedStore()},
    lowerings={"LowRankGaussianWeight": {"float": kept(), "fixed": Lowering(fixed_lowrank, {"bits"})},
               "LowRankFixedWeight": {"float": kept(), "fixed": kept("already fixed point: kept")}},
    analytic=Analytic("refused", "would treat the layers as independent, dropping SWAG's low-rank correlation; "
                                 "export SWAG with --mode baked or --mode noise --noise weight"),
    factors=requant_factor, exports=exact_exports, label="SWAG posterior",
))
