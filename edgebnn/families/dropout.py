"""MC dropout (Gal & Ghahramani 2016): ``DropoutMask``, a Bernoulli keep-mask on an activation, kept on at
prediction; a plain torch model's ``nn.Dropout*`` layers imported with ``--mc-dropout``
(:mod:`edgebnn.importers.mc_dropout`), its plain weights σ = 0 Gaussians.

Draw (in the graph, exactly ``DropoutMask.sample``)::

    M_s = [u_s >= p] / (1 - p),   u: uniform [S, *mask shape]

No store: nothing is stored but ``p`` (and ``--weights int8|int4`` keep the mask's moments fp32). Analytic: exact
(each unit's mask is its own draw; the layer rule propagates its moments (1, p/(1-p))).
"""

from __future__ import annotations

import onnx

from edgebnn.exporters._graph import Builder
from edgebnn.family import EXACT, Family, register_family
from edgebnn.ir.encodings import DropoutMask, Encoding


def dropout_draw(b: Builder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """The keep-mask from uniform noise, exactly as ``DropoutMask.sample``: [u >= p] · 1/(1-p)."""
    assert isinstance(enc, DropoutMask)
    keep = b.add("GreaterOrEqual", [eps[""], b.f32(p + tag + "p", enc.p)], p + tag + "keep")
    kept = b.add("Cast", [keep], p + tag + "keep_f", to=onnx.TensorProto.FLOAT)
    return b.add("Mul", [kept, b.f32(p + tag + "scale", float(enc.keep_scale()))], p + (tag + "s" if tag else "W_s"))


FAMILY = register_family(Family(
    "dropout", (DropoutMask,), "MC dropout: a Bernoulli keep-mask per unit (or channel), scaled by 1/(1-p)",
    draws={"DropoutMask": dropout_draw}, requantize=False, analytic=EXACT,
))
