"""What an importer adapter returns for one Bayesian layer, and the adapter protocol.

An adapter recognises the Bayesian layers of one library (edgebnn, bayesian-torch, torchbnn, blitz) and
reads their variational posterior into a :class:`LayerPosterior`: weight and bias means and standard
deviations as float32 numpy arrays in torch's layout, plus the convolution geometry or batch-norm
statistics. The helpers below (:func:`loaded`, :func:`describe`, :func:`conv_posterior`) are shared by
the adapters. The generic machinery in
``edgebnn.importers._torch`` swaps each layer for a deterministic twin holding the means, exports the
skeleton to ONNX and attaches the posteriors as encoding nodes (mean-field Gaussians, or the encodings an adapter
gives: a plug-in family's).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

import numpy as np

from edgebnn.errors import InvalidWeightsError, UnsupportedLayerError
from edgebnn.ir.encodings import Encoding

if TYPE_CHECKING:
    import torch


Kind = Literal["linear", "conv", "conv_transpose", "batchnorm"]
_WEIGHT_RANKS: dict[str, tuple[int, ...]] = {
    "linear": (2,), "conv": (3, 4, 5), "conv_transpose": (3, 4, 5), "batchnorm": (1,)
}


@dataclass(frozen=True)
class LayerPosterior:
    """Mean-field Gaussian posterior of one Linear, Conv{1,2,3}d, ConvTranspose{1,2,3}d or BatchNorm layer.

    Weights are in torch's layout: Linear ``[out, in]``, Conv ``[out, in/groups, *kernel]``, ConvTranspose
    ``[in, out/groups, *kernel]``, BatchNorm ``[channels]`` (the affine scale; ``bias`` is the shift, and
    ``running_mean``/``running_var``/``eps`` normalise as in eval mode). Conv geometry tuples have one
    entry per spatial axis; empty ones are filled with torch's defaults.

    A layer whose posterior is not mean-field Gaussian (a plug-in family's) gives its weight's (and bias's)
    encoding as ``weight_encoding`` / ``bias_encoding``: the IR stores those (of the same shapes), and ``weight_mu`` /
    ``bias_mu`` are their means (the posterior-mean network the skeleton is exported from); ``weight_sigma`` /
    ``bias_sigma`` their marginal ``stddev()`` (checked for shape; give ``bias_sigma`` for a bias encoding).
    """

    path: str
    kind: Kind
    weight_mu: np.ndarray
    weight_sigma: np.ndarray
    bias_mu: np.ndarray | None = None
    bias_sigma: np.ndarray | None = None  # None with a bias_mu: a deterministic bias
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    groups: int = 1
    output_padding: tuple[int, ...] = ()
    running_mean: np.ndarray | None = None
    running_var: np.ndarray | None = None
    eps: float = 1e-5
    weight_encoding: Encoding | None = None
    bias_encoding: Encoding | None = None

    @property
    def rank(self) -> int:
        """Spatial axes of a (transposed) convolution; 0 for Linear and BatchNorm."""
        return self.weight_mu.ndim - 2 if self.kind in ("conv", "conv_transpose") else 0

    @property
    def out_channels(self) -> int:
        """Output features or channels: what the bias is added to."""
        if self.kind == "conv_transpose":
            return int(self.weight_mu.shape[1]) * self.groups
        return int(self.weight_mu.shape[0])

    def __post_init__(self) -> None:
        where = f"layer {self.path!r}"
        for name in ("weight_mu", "weight_sigma", "bias_mu", "bias_sigma", "running_mean", "running_var"):
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
        if self.weight_mu.ndim not in _WEIGHT_RANKS[self.kind]:
            want = " or ".join(map(str, _WEIGHT_RANKS[self.kind]))
            raise InvalidWeightsError(
                f"{where}: {self.kind} weight must be {want}-D, got shape {self.weight_mu.shape}"
            )
        rank = self.rank
        for name, default in (("stride", 1), ("padding", 0), ("dilation", 1), ("output_padding", 0)):
            value = getattr(self, name) or (default,) * rank
            if len(value) != rank:
                raise InvalidWeightsError(f"{where}: {name}={value} does not have {rank} entries")
            object.__setattr__(self, name, tuple(int(v) for v in value))
        if self.bias_mu is not None and self.bias_mu.shape != (self.out_channels,):
            raise InvalidWeightsError(
                f"{where}: bias shape {self.bias_mu.shape} does not match {self.out_channels} outputs"
            )
        if self.bias_sigma is not None:
            if self.bias_mu is None or self.bias_sigma.shape != self.bias_mu.shape:
                raise InvalidWeightsError(f"{where}: bias sigma has no matching bias mu")
            if np.any(self.bias_sigma < 0):
                raise InvalidWeightsError(f"{where}: bias sigma has negative values")
        if self.kind == "batchnorm":
            stats = (self.running_mean, self.running_var)
            if any(s is None or s.shape != self.weight_mu.shape for s in stats) or self.bias_mu is None:
                raise InvalidWeightsError(f"{where}: batch norm needs a shift and running statistics per channel")
            if np.any(self.running_var < 0) or not self.eps > 0:  # type: ignore[operator]
                raise InvalidWeightsError(f"{where}: batch norm running_var or eps is negative")


class LayerAdapter(Protocol):
    """Recognises one library's Bayesian layers and reads their posterior."""

    library: str

    def matches(self, module: torch.nn.Module) -> bool: ...

    def extract(self, module: torch.nn.Module, path: str) -> LayerPosterior: ...


def softplus(x: np.ndarray) -> np.ndarray:
    """Numerically stable log1p(exp(x)), the rho -> sigma map of edgebnn, bayesian-torch and blitz.

    A NaN or infinite rho (a corrupt checkpoint) gives a NaN or infinite sigma quietly: the importer refuses it
    in one line naming the layer, which a numpy warning printed before it would spoil.
    """
    with np.errstate(all="ignore"):
        x = np.asarray(x, dtype=np.float64)
        return (np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))).astype(np.float32)


def to_numpy(t: Any) -> np.ndarray:
    """A float32 numpy copy of a parameter or buffer."""
    return t.detach().cpu().float().numpy().copy()


def ntuple(v: object, n: int, what: str, path: str) -> tuple[int, ...]:
    """Normalise a conv geometry argument (an int or an n-tuple of ints) to an n-tuple, or refuse it."""
    if isinstance(v, int) and not isinstance(v, bool):
        return (v,) * n
    if isinstance(v, (tuple, list)) and len(v) == n and all(isinstance(i, int) for i in v):
        return tuple(int(i) for i in v)
    raise UnsupportedLayerError(f"layer {path!r}: {what}={v!r} is not supported (use ints or {n}-tuples)")


def loaded(name: str) -> ModuleType | None:
    """Module ``name`` if its top-level package has been imported, else None.

    No instance of a library's layers can exist before the library is imported, so an adapter never
    imports a library the model has not already imported, and edgebnn works without it.
    """
    if sys.modules.get(name.partition(".")[0]) is None:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # an unrelated package of the same name
        return None


def describe(module: object, path: str) -> str:
    """The prefix of every message about one layer: ``layer 'features.0' (Conv2dFlipout)``."""
    return f"layer {path!r} ({type(module).__name__})"


class ConvGeometry(TypedDict):
    """The conv geometry fields of a :class:`LayerPosterior`."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int


def conv_geometry(module: Any, path: str, kernel: tuple[int, ...]) -> ConvGeometry:
    """Stride, padding, dilation and groups of a layer that calls ``F.convNd`` with its own attributes.

    String padding is converted where torch's meaning is a symmetric pad: ``'valid'`` always,
    ``'same'`` when stride is 1 and each dilated kernel extent is even; otherwise the layer is refused.
    """
    n = len(kernel)
    stride = ntuple(module.stride, n, "stride", path)
    dilation = ntuple(module.dilation, n, "dilation", path)
    padding = module.padding
    if isinstance(padding, str):
        extents = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
        if padding == "valid":
            padding = (0,) * n
        elif padding == "same" and stride == (1,) * n and all(e % 2 == 0 for e in extents):
            padding = tuple(e // 2 for e in extents)
        else:
            raise UnsupportedLayerError(
                f"{describe(module, path)}: padding={padding!r} with kernel {kernel}, stride {stride} and "
                f"dilation {dilation} is not a symmetric pad; give padding as ints"
            )
    groups = module.groups
    if not isinstance(groups, int) or groups < 1:
        raise UnsupportedLayerError(f"{describe(module, path)}: groups={groups!r} is not a positive int")
    return ConvGeometry(stride=stride, padding=ntuple(padding, n, "padding", path), dilation=dilation, groups=groups)


def conv_posterior(
    module: Any,
    path: str,
    weight: tuple[np.ndarray, np.ndarray],
    bias: tuple[np.ndarray, np.ndarray] | tuple[None, None],
    transposed: bool = False,
) -> LayerPosterior:
    """The posterior of a (transposed) convolution whose module carries torch's geometry attributes."""
    mu, sigma = weight
    if transposed and isinstance(module.padding, str):  # torch itself refuses it for transposed convs
        raise UnsupportedLayerError(f"{describe(module, path)}: padding={module.padding!r}; give ints")
    geometry = conv_geometry(module, path, tuple(int(k) for k in mu.shape[2:]))
    if not transposed:
        return LayerPosterior(path, "conv", mu, sigma, bias[0], bias[1], **geometry)
    n = mu.ndim - 2
    output_padding = ntuple(getattr(module, "output_padding", 0), n, "output_padding", path)
    return LayerPosterior(
        path, "conv_transpose", mu, sigma, bias[0], bias[1], output_padding=output_padding, **geometry
    )
