"""Correlated draws across weights: posterior families whose layers are not independent.

Most encodings draw each weight tensor on its own: weight ``i`` (graph order) from the stream
``numpy.random.default_rng([seed, i])``. Two families couple the layers of one posterior sample:

- a deep ensemble (:mod:`edgebnn.ir.encodings.members`): sample s takes member k(s) in
  EVERY layer (member k of layer 1 with member k of layer 2);
- SWAG (:mod:`edgebnn.ir.encodings.lowrank`): one z₂ ~ N(0, I_K) per sample is shared
  by every parameter (Maddox et al. 2019), so the low-rank term correlates the layers.

An encoding states its coupling with ``joint_group()``, a :class:`JointGroup`; every weight returning an equal
group reads the same shared draw per sample, :meth:`JointGroup.draw`:

    kind "members", size M:  k(s) = s mod M                 (deterministic: S = M runs each member once)
    kind "normal",  size K:  z₂(s) ~ N(0, I_K), from default_rng([seed, JOINT_STREAM, K])

and turns it into its draw with ``sample_joint(shared, rng, n)`` (``rng``: the weight's own stream, for its
independent part, e.g. SWAG's diagonal z₁). :func:`draw_weight` is the one entry point: the ``baked`` exporter
and the reference runtime both call it, so the same seed gives the same members in both.
``Encoding.sample`` stays the weight's marginal draw (an independent z₂ for SWAG).
"""

from __future__ import annotations

import numpy as np

from edgebnn.ir.encodings.base import JOINT_KINDS, JOINT_STREAM, Encoding, JointGroup

__all__ = ["JOINT_KINDS", "JOINT_STREAM", "JointGroup", "draw_weight"]


def draw_weight(enc: Encoding, seed: int, index: int, n: int) -> np.ndarray:
    """``n`` draws of encoded weight ``index`` (graph order) for ``seed``, jointly with its group if it has
    one; float32 ``(n, *enc.shape)``."""
    rng = np.random.default_rng([seed, index])
    group = enc.joint_group()
    if group is None:
        return enc.sample(rng, n)
    return enc.sample_joint(group.draw(seed, n), rng, n)
