"""A posterior family from outside edgebnn: Gaussian noise multiplying each output row of a weight.

    W[i, :] = M[i, :] · (1 + s_i ε_i),     ε_i ~ N(0, 1): one number per output row and draw

so E[W] = M and Var W[i, j] = M[i, j]² s_i², and the weights of one row are perfectly correlated (they share ε_i).
Everything edgebnn needs of it is in this module, registered once with :func:`edgebnn.families.register_family`:

- the torch layer :class:`RowNoiseLinear` (train it as any module) and its importer adapter, so ``edgebnn lower
  --model ...`` reads a trained model of these layers;
- two encodings: :class:`RowNoiseWeight` (M and s in fp32, what the importer writes) and :class:`RowNoiseFixedWeight`
  (M on an 8-bit grid, what ``--scheme fixed`` writes);
- the in-graph draw (``--mode noise``: ε drawn per row in the graph, or given by the host), the store of the fixed
  encoding (``--weights ir`` writes its int8 codes and decodes them in the graph) and the ``fixed`` lowering;
- analytic: refused. The rows' shared ε makes a pre-activation's variance s_i² (Σ_j M_ij x_j)², which per-weight
  moments (Σ_j M_ij² s_i² x_j²) cannot give: ``--mode analytic`` ends in one line instead of a wrong predictive.

It uses only ``edgebnn.families`` (the public plug-in interface), ``edgebnn.errors``, numpy and torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.families import (
    Analytic,
    Encoding,
    Family,
    GraphBuilder,
    Grid,
    LayerOutcome,
    LayerPosterior,
    Lowering,
    NoiseNeed,
    Store,
    check_finite,
    check_shape,
    decode,
    kept,
    register_family,
)

# -- the encodings: what an .ebnn stores for one weight, and how it samples -------------------------------------------


class RowNoiseWeight(Encoding):
    """W = M ⊙ (1 + s ε)[:, None]: fields ``mean`` [out, in] and ``s`` [out], float32."""

    op_type: ClassVar[str] = "RowNoiseWeight"
    FIELDS: ClassVar[tuple[str, ...]] = ("mean", "s")

    def __init__(self, mean: np.ndarray, s: np.ndarray) -> None:
        super().__init__(mean.shape)
        self.m = np.ascontiguousarray(mean, np.float32)
        self.s = np.ascontiguousarray(s, np.float32)

    @classmethod
    def from_fields(cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...],
                    where: str) -> Encoding:
        check_rows(fields, shape, "mean", where)
        return cls(fields["mean"], fields["s"])

    def fields(self) -> dict[str, np.ndarray]:
        return {"mean": self.m, "s": self.s}

    def mean(self) -> np.ndarray:
        return self.m

    def stddev(self) -> np.ndarray:
        """The marginal σ per weight, |M| s (reports and hoisting read it; the draw is not per weight)."""
        return (np.abs(self.m) * self.s[:, None]).astype(np.float32)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws [n, out, in] (``baked`` stores them; the reference runtime runs them)."""
        eps = rng.standard_normal((n, self.shape[0])).astype(np.float32)
        return (self.mean()[None] * (1 + self.s * eps)[:, :, None]).astype(np.float32)

    def noise_needs(self) -> tuple[NoiseNeed, ...]:
        """One standard normal per row and draw: the graph input (or random op) ``noise/<weight>.row`` [S, out]."""
        return (NoiseNeed(".row", (self.shape[0],)),)


class RowNoiseFixedWeight(RowNoiseWeight):
    """The same posterior with M on a symmetric 8-bit grid: ``q`` int8 [out, in], attribute ``step``; M = q · step."""

    op_type: ClassVar[str] = "RowNoiseFixedWeight"
    FIELDS: ClassVar[tuple[str, ...]] = ("q", "s")

    def __init__(self, q: np.ndarray, step: float, s: np.ndarray) -> None:
        self.q, self.quant_step = np.ascontiguousarray(q, np.int8), float(np.float32(step))
        super().__init__(self.q.astype(np.float32) * np.float32(self.quant_step), s)

    @classmethod
    def from_fields(cls, fields: Mapping[str, np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...],
                    where: str) -> Encoding:
        check_rows(fields, shape, "q", where)
        step = attrs.get("step")
        if not isinstance(step, float) or not np.isfinite(step) or step <= 0:
            raise InvalidArtifactError(f"{where}: attribute 'step' must be a finite number > 0, got {step!r}")
        return cls(fields["q"], step, fields["s"])

    def fields(self) -> dict[str, np.ndarray]:
        return {"q": self.q, "s": self.s}

    def attributes(self) -> dict[str, Any]:
        return {"step": self.quant_step}

    def step(self) -> float:
        return self.quant_step

    def mean_grid(self) -> Grid:
        return Grid(self.quant_step, 8)


def check_rows(fields: Mapping[str, np.ndarray], shape: tuple[int, ...], mean: str, where: str) -> None:
    """One-line errors (naming ``where``) for a file whose fields do not fit: a weight [out, in], s [out] >= 0."""
    if len(shape) != 2:
        raise InvalidArtifactError(f"{where}: a row-noise weight is [out, in], got shape {list(shape)}")
    check_shape(fields[mean], shape, mean, where)
    check_shape(fields["s"], (shape[0],), "s", where)
    for name in (mean, "s"):
        check_finite(fields[name], name, where)
    if (fields["s"] < 0).any():
        raise InvalidArtifactError(f"{where}: s must be >= 0")


# -- how the exporters write it into a graph --------------------------------------------------------------------------


def draw(b: GraphBuilder, enc: Encoding, p: str, tag: str, eps: dict[str, str], samples: int) -> str:
    """W_s [S, out, in] = M ⊙ (1 + s ⊙ ε_s)[:, :, None], from the noise ``eps[".row"]`` [S, out]; M as its store
    decodes it (the int8 codes for :class:`RowNoiseFixedWeight`)."""
    assert isinstance(enc, RowNoiseWeight)
    p += tag
    mean = decode(b, enc, "mean", p + "mean")
    factor = b.add("Add", [b.f32(p + "one", 1.0), b.add("Mul", [b.f32(p + "s", enc.s), eps[".row"]], p + "s_eps")],
                   p + "factor")
    factor = b.add("Unsqueeze", [factor, b.i64(p + "axis2", 2)], p + "factor3")
    return b.add("Mul", [mean, factor], p + (tag + "s" if tag else "W_s"))


class RowNoiseFixedStore(Store):
    """``--weights ir`` of :class:`RowNoiseFixedWeight`: the int8 codes and one step, M = DequantizeLinear(q, step)
    in the graph (onnxruntime and TensorRT both take an int8 constant into a DequantizeLinear)."""

    op_type: ClassVar[str] = "RowNoiseFixedWeight"

    def mean(self, b: GraphBuilder, enc: Encoding, name: str) -> str:
        assert isinstance(enc, RowNoiseFixedWeight)
        return b.add("DequantizeLinear", [b.const(name + ".q", enc.q), b.f32(name + ".step", enc.quant_step)], name)

    def stddev(self, b: GraphBuilder, enc: Encoding, name: str) -> str:
        return b.f32(name, enc.stddev())

    def nbytes(self, enc: Encoding) -> int:
        assert isinstance(enc, RowNoiseFixedWeight)
        return int(enc.q.nbytes + enc.s.nbytes + 4)


def lower_fixed(pass_: Any, weight: Any, rng: np.random.Generator) -> LayerOutcome:
    """``edgebnn lower --scheme fixed``: M on a symmetric grid of ``--bits`` bits (2..8; default 8), step = max|M| /
    (2^(bits-1) - 1), s kept in fp32. It honours ``--bits`` (declared with ``Lowering(..., {"bits"})`` below), not
    ``--calibrate``, which edgebnn then refuses in one line."""
    enc = weight.encoding
    assert isinstance(enc, RowNoiseWeight)
    bits = pass_.config.bits or 8
    if not 2 <= bits <= 8:
        raise InvalidOptionError(f"--bits {bits}: a row-noise mean is stored as int8 codes (2..8 bits)")
    limit = (1 << (bits - 1)) - 1
    top = float(np.abs(enc.m).max(initial=0.0))
    step = top / limit if top > 0 else 1.0
    q = np.clip(np.rint(enc.m / np.float32(step)), -limit, limit).astype(np.int8)
    return LayerOutcome(RowNoiseFixedWeight(q, step, enc.s), None, {"scale": float(np.float32(step)), "bits": bits})


# -- the torch layer and its importer ---------------------------------------------------------------------------------


class RowNoiseLinear(nn.Module):
    """A linear layer whose weight is drawn as ``W = M ⊙ (1 + s ε)`` per forward pass (one ε per output row); the
    bias is deterministic. ``s = exp(row_log_scale)``."""

    def __init__(self, in_features: int, out_features: int, init_scale: float = 0.1) -> None:
        super().__init__()
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features))
        self.row_log_scale = nn.Parameter(torch.full((out_features,), float(np.log(init_scale))))
        self.bias = nn.Parameter(torch.zeros(out_features))
        nn.init.kaiming_uniform_(self.weight_mu, a=5 ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = torch.randn(self.weight_mu.shape[0], device=x.device)
        weight = self.weight_mu * (1 + self.row_log_scale.exp() * eps)[:, None]
        return nn.functional.linear(x, weight, self.bias)

    def kl(self, prior_scale: float = 0.5) -> torch.Tensor:
        """KL(N(1, s²) || N(1, prior²)) of each row's multiplier, summed: the term a variational loss adds."""
        s2 = (2 * self.row_log_scale).exp()
        return 0.5 * (s2 / prior_scale**2 - 1 - torch.log(s2 / prior_scale**2)).sum()


class RowNoiseAdapter:
    """Tells edgebnn's importer what a :class:`RowNoiseLinear` is: its mean network and its weight's encoding."""

    library = "edgebnn-example-rownoise"

    def matches(self, module: nn.Module) -> bool:
        return isinstance(module, RowNoiseLinear)

    def extract(self, module: nn.Module, path: str) -> LayerPosterior:
        assert isinstance(module, RowNoiseLinear)
        enc = RowNoiseWeight(module.weight_mu.detach().cpu().numpy(), module.row_log_scale.detach().exp().cpu().numpy())
        return LayerPosterior(path, "linear", enc.mean(), enc.stddev(), module.bias.detach().cpu().numpy(),
                              weight_encoding=enc)


def row_noise_mlp(inputs: int = 64, hidden: int = 32, classes: int = 10) -> nn.Module:
    """A digits-sized MLP of row-noise layers (``edgebnn lower --model edgebnn_example.rownoise:row_noise_mlp``)."""
    return nn.Sequential(nn.Flatten(), RowNoiseLinear(inputs, hidden), nn.ReLU(), RowNoiseLinear(hidden, classes))


FAMILY = register_family(Family(
    "rownoise", (RowNoiseWeight, RowNoiseFixedWeight), "Gaussian noise multiplying each output row (example plug-in)",
    draws={"RowNoiseWeight": draw, "RowNoiseFixedWeight": draw},
    stores={"RowNoiseFixedWeight": RowNoiseFixedStore()},
    lowerings={"RowNoiseWeight": {"fixed": Lowering(lower_fixed, {"bits"})},
               "RowNoiseFixedWeight": {"fixed": kept("already on its 8-bit grid: kept")}},
    adapters=(RowNoiseAdapter(),),
    analytic=Analytic("refused", "would treat the weights of a row as independent, but they share one draw; export "
                                 "it with --mode baked or noise"),
))
