"""In-graph draws: how an encoded weight's S samples ``W_s`` [S, *shape] are computed from standard noise.

The noise an encoding consumes per draw is its :meth:`~edgebnn.ir.encodings.base.Encoding.noise_needs` (graph
inputs ``noise/<weight><suffix>``, or random ops in the graph, created by the caller); a draw turns them into the
samples exactly as the encoding's ``sample`` does in numpy. Each family gives its own
(:attr:`edgebnn.families.Family.draws`: a codebook's, a dropout mask's, SWAG's, Kronecker and dense Laplace's, in
their modules in :mod:`edgebnn.families`); a ``GAUSSIAN`` encoding without one draws with the default::

    W_s = mu + sigma ⊙ ε_s,   ε: [S, *shape]      (mu, sigma decoded once from the encoding's store, :mod:`.stores`)
"""

from __future__ import annotations

from collections.abc import Callable

from edgebnn.exporters._graph import Builder
from edgebnn.exporters.stores.registry import decode
from edgebnn.family import family_of
from edgebnn.ir.encodings import Encoding

# (builder, encoding, name prefix, tag of the emitted names, {noise suffix: graph input}, samples) -> W_s
DrawEmitter = Callable[[Builder, Encoding, str, str, dict[str, str], int], str]


def draw_emitter(enc: Encoding) -> DrawEmitter | None:
    """How ``enc`` is drawn in a graph (its family's draw; ``GAUSSIAN``: :func:`gaussian_draw`), or None when it
    cannot be (it has no standard-noise form)."""
    if enc.noise_needs() is None:
        return None
    family = family_of(enc.op_type)
    draw = family.draws.get(enc.op_type) if family is not None else None
    return draw if draw is not None else gaussian_draw if enc.GAUSSIAN else None


def gaussian_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """W_s = mu + sigma ⊙ ε_s; named ``<tag>mu``, ``<tag>sigma``, ... and ``W_s`` (``b_s`` for a bias)."""
    mu, sigma = decode(b, enc, "mean", p + tag + "mu"), decode(b, enc, "stddev", p + tag + "sigma")
    return b.add("Add", [mu, b.add("Mul", [sigma, eps[""]], p + tag + "scaled")], p + (tag + "s" if tag else "W_s"))
