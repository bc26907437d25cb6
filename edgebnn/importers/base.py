"""What an importer adapter returns for one Bayesian layer, and the adapter protocol.

An adapter recognises the Bayesian layers of one library (edgebnn, bayesian-torch, torchbnn, blitz) and
reads their variational posterior into a :class:`LayerPosterior`: weight and bias means and standard
deviations as float32 numpy arrays in torch's layout (Linear ``[out, in]``, Conv2d
``[out, in/groups, kh, kw]``), plus the convolution geometry. The generic machinery in
``edgebnn.importers._torch`` swaps each layer for a deterministic twin holding the means, exports the
skeleton to ONNX and attaches the posteriors as ``GaussianWeight`` nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from edgebnn.errors import InvalidWeightsError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LayerPosterior:
    """Mean-field Gaussian posterior of one Linear or Conv2d layer."""

    path: str
    kind: Literal["linear", "conv2d"]
    weight_mu: np.ndarray
    weight_sigma: np.ndarray
    bias_mu: np.ndarray | None = None
    bias_sigma: np.ndarray | None = None  # None with a bias_mu: a deterministic bias
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    def __post_init__(self) -> None:
        where = f"layer {self.path!r}"
        for name in ("weight_mu", "weight_sigma", "bias_mu", "bias_sigma"):
            arr = getattr(self, name)
            if arr is None:
                continue
            if not np.all(np.isfinite(arr)):
                raise InvalidWeightsError(f"{where}: {name} has NaN or inf values")
        if self.weight_mu.shape != self.weight_sigma.shape:
            raise InvalidWeightsError(
                f"{where}: weight mu {self.weight_mu.shape} and sigma {self.weight_sigma.shape} differ in shape"
            )
        if np.any(self.weight_sigma < 0):
            raise InvalidWeightsError(f"{where}: weight sigma has negative values")
        want_ndim = 2 if self.kind == "linear" else 4
        if self.weight_mu.ndim != want_ndim:
            raise InvalidWeightsError(
                f"{where}: {self.kind} weight must be {want_ndim}-D, got shape {self.weight_mu.shape}"
            )
        if self.bias_mu is not None and self.bias_mu.shape != (self.weight_mu.shape[0],):
            raise InvalidWeightsError(
                f"{where}: bias shape {self.bias_mu.shape} does not match {self.weight_mu.shape[0]} outputs"
            )
        if self.bias_sigma is not None:
            if self.bias_mu is None or self.bias_sigma.shape != self.bias_mu.shape:
                raise InvalidWeightsError(f"{where}: bias sigma has no matching bias mu")
            if np.any(self.bias_sigma < 0):
                raise InvalidWeightsError(f"{where}: bias sigma has negative values")


class LayerAdapter(Protocol):
    """Recognises one library's Bayesian layers and reads their posterior."""

    library: str

    def matches(self, module: torch.nn.Module) -> bool: ...

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior: ...


def softplus(x: np.ndarray) -> np.ndarray:
    """Numerically stable log1p(exp(x)), the rho -> sigma map of edgebnn, bayesian-torch and blitz."""
    x = np.asarray(x, dtype=np.float64)
    return (np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))).astype(np.float32)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A float32 numpy copy of a parameter or buffer."""
    return t.detach().cpu().float().numpy().copy()


def pair(v: int | tuple[int, ...] | list[int], what: str, path: str) -> tuple[int, int]:
    """Normalise a conv geometry argument (int or 2-tuple) to a 2-tuple, or refuse it naming the layer."""
    if isinstance(v, int):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return (int(v[0]), int(v[1]))
    from edgebnn.errors import UnsupportedLayerError

    raise UnsupportedLayerError(f"layer {path!r}: {what}={v!r} is not supported (use ints or 2-tuples)")
