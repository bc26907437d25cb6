"""Which exports are exact for the posterior families of an IR, and what S they take: asked of each family
(:attr:`edgebnn.families.Family.exports`, :attr:`~edgebnn.families.Family.default_samples`), from the encoding
nodes' op types and attributes, nothing decoded. A deep ensemble is exact in ``baked`` with S = M only, SWAG in
``baked`` and ``noise --noise weight`` (each family's module says why).
"""

from __future__ import annotations

from typing import Any

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import DEFAULT_SAMPLES
from edgebnn.family import ExportRequest, Family, family_of
from edgebnn.ir import DOMAIN, BNNModel


def _families(model: BNNModel) -> list[tuple[Family, list[Any]]]:
    """The IR's families, in graph order, each with its encoding nodes."""
    out: dict[str, tuple[Family, list[Any]]] = {}
    for node in model.proto.graph.node:
        family = family_of(node.op_type) if node.domain == DOMAIN else None
        if family is not None:
            out.setdefault(family.name, (family, []))[1].append(node)
    return list(out.values())


def samples_fixed_by(model: BNNModel) -> tuple[str, int] | None:
    """How messages name the family that fixes the IR's S, and that S (a deep ensemble's M: each member once,
    in ``baked``, its only exact mode); None when any S is exact."""
    for family, nodes in _families(model):
        if family.default_samples is not None and (m := family.default_samples(nodes)) is not None:
            return family.noun, m
    return None


def ensemble_members(model: BNNModel) -> int | None:
    """The S the IR's family fixes (:func:`samples_fixed_by`), None when any S is exact."""
    fixed = samples_fixed_by(model)
    return None if fixed is None else fixed[1]


def family_of_model(model: BNNModel) -> str | None:
    """How messages name the IR's posterior when it is not mean-field ("deep ensemble", "SWAG posterior"): the
    first family with lowerings of its own; None for the others."""
    return next((family.noun for family, _ in _families(model) if family.lowerings), None)


def default_samples(model: BNNModel, fallback: int = DEFAULT_SAMPLES) -> int:
    """The S an export of ``model`` takes when none is given: M for a deep ensemble, else ``fallback``."""
    return ensemble_members(model) or fallback


def refusal(model: BNNModel, mode: str, samples: int, noise: str = "auto") -> str | None:
    """Why the export cannot be exact for the IR's families (one line), or None."""
    for family, nodes in _families(model):
        if family.exports is not None and (why := family.exports(ExportRequest(mode, samples, noise, nodes))):
            return f"{model.where}: {why}"
    return None


def check_family(model: BNNModel, mode: str, samples: int, noise: str = "auto") -> None:
    """Refuse, in one line, a mode, S or ``--noise`` variant that cannot be exact for the IR's posterior family."""
    why = refusal(model, mode, samples, noise)
    if why is not None:
        raise InvalidOptionError(why)
