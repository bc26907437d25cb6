"""Which export modes are exact for a posterior family whose layers are drawn jointly, and what S it needs.

Read from the encoding nodes' op types and attributes, nothing decoded:

- a deep ensemble (``MemberSetWeight``, ``MemberSetFixedWeight``: M members) is exact in ``baked`` with S = M
  (sample s is member s in every layer: :mod:`edgebnn.ir.encodings.members`); any other S would weigh members
  unequally, so it is refused; ``noise``/``shared`` have no noise to take (the members are constants: use
  ``baked``) and ``analytic`` would propagate the members' mean and variance, a Gaussian, not the ensemble:
  both refused;
- SWAG (``LowRankGaussianWeight``, lowered ``LowRankFixedWeight``) is exact in ``baked`` (one z₂ per sample shared by
  every layer, as the reference code draws it) and in ``noise --noise weight`` (z₂ a graph input [S, K] every
  layer reads); ``analytic`` and the other noise variants run on per-weight moments, dropping the low-rank
  correlation between layers: refused.
"""

from __future__ import annotations

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import DOMAIN, BNNModel

MEMBER_SETS = frozenset({"MemberSetWeight", "MemberSetFixedWeight"})
LOW_RANK = frozenset({"LowRankGaussianWeight", "LowRankFixedWeight"})


def ensemble_members(model: BNNModel) -> int | None:
    """M of a deep-ensemble IR (the ``members`` attribute of its member-set nodes), None for other IRs."""
    sizes = {a.i for n in model.proto.graph.node if n.domain == DOMAIN and n.op_type in MEMBER_SETS
             for a in n.attribute if a.name == "members"}
    return max(sizes) if sizes else None


def family_of(model: BNNModel) -> str | None:
    """``deep ensemble`` or ``SWAG posterior`` for an IR of such a family, None for the others."""
    kinds = {n.op_type for n in model.proto.graph.node if n.domain == DOMAIN}
    return "deep ensemble" if kinds & MEMBER_SETS else "SWAG posterior" if kinds & LOW_RANK else None


def default_samples(model: BNNModel, fallback: int) -> int:
    """The S an export of ``model`` takes when none is given: M for a deep ensemble, else ``fallback``."""
    return ensemble_members(model) or fallback


def check_family(model: BNNModel, mode: str, samples: int, noise: str = "auto") -> None:
    """Refuse, in one line, a mode or S that cannot be exact for the IR's posterior family."""
    kinds = {n.op_type for n in model.proto.graph.node if n.domain == DOMAIN}
    m = ensemble_members(model)
    if m is not None:
        if mode != "baked":
            why = ("would propagate the members' mean and variance (a Gaussian), not the ensemble"
                   if mode == "analytic" else "has no noise to draw (the members are constants)")
            raise InvalidOptionError(f"{model.where}: --mode {mode} {why}; export a deep ensemble with --mode baked")
        if samples != m:
            raise InvalidOptionError(
                f"{model.where}: --samples {samples}: a deep ensemble of {m} members exports exactly with "
                f"--samples {m} (each member once)"
            )
    if kinds & LOW_RANK and mode == "analytic":
        raise InvalidOptionError(f"{model.where}: --mode analytic would treat the layers as independent, dropping "
                                 "SWAG's low-rank correlation; export SWAG with --mode baked or --mode noise "
                                 "--noise weight")
    if kinds & LOW_RANK and mode in ("noise", "shared") and noise != "weight":
        raise InvalidOptionError(f"{model.where}: --noise {noise if mode == 'noise' else 'shared'} runs Gaussian "
                                 "layers on their marginal moments, dropping SWAG's low-rank correlation; use --noise "
                                 "weight (z₂ drawn in the graph, shared by every layer) or --mode baked")
