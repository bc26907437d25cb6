"""Import SWAG (Maddox et al. 2019): a plain torch model plus its SWAG statistics, as low-rank Gaussian weights.

``stats`` holds, per model parameter ``{name}`` (``model.named_parameters()``), as the SWAG reference code
(wjmaddox/swa_gaussian, buffers ``{name}_mean``, ``{name}_sq_mean``, ``{name}_cov_mat_sqrt``) and
torch-uncertainty (``{name}_covariance_sqrt``) write them:

    {name}_mean              θ̄, the parameter's shape
    {name}_sq_mean           mean of θ², the parameter's shape
    {name}_covariance_sqrt   D [K, numel] (or ``{name}_cov_mat_sqrt``), optional: all parameters or none

Keys may carry one common prefix (the reference's ``base.``, torch-uncertainty's ``model.swag_stats.``): it is
found from the first parameter. Each parameter becomes a
:class:`~edgebnn.ir.encodings.LowRankGaussianWeight` (the reference's draw, z₂ shared by the network), or with
no ``covariance_sqrt`` (SWAG-diagonal) a ``GaussianWeight`` of σ·sqrt(scale). The model's BatchNorm running
statistics are used as they are (the reference re-estimates them per sample with ``bn_update``; an export
cannot). Every parameter must be a Linear/Conv/BatchNorm weight or bias and have statistics; a statistic
that matches no parameter, a missing one, or a shape that does not fit is refused, naming the parameter.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgebnn.errors import InvalidOptionError, InvalidWeightsError, UnsupportedLayerError
from edgebnn.importers._torch import PlainLayers, _torch, find_bayesian_layers, import_model
from edgebnn.importers.checkpoint import read_state_dict
from edgebnn.importers.ensemble import plain_layers
from edgebnn.ir import BNNModel, GaussianWeight
from edgebnn.ir.encodings import Encoding, LowRankGaussianWeight

LIBRARY = "swag"
COV_SUFFIXES = ("_covariance_sqrt", "_cov_mat_sqrt")
_SUFFIXES = ("_sq_mean", *COV_SUFFIXES, "_mean")  # _sq_mean before _mean: the longer suffix first


def import_swag(model: Any, stats: Mapping[str, Any] | str | os.PathLike[str], input_shape: Sequence[int], *,
                scale: float = 0.5, var_clamp: float = 1e-30, output_index: int = 0,
                where: str = "<model>") -> BNNModel:
    """Import ``model`` with its SWAG ``stats`` (a mapping of tensors/arrays, or a ``.safetensors``/``.pt`` file).

    Raises:
        InvalidWeightsError: Statistics missing for a parameter, matching no parameter, or of the wrong shape.
        InvalidOptionError: ``scale`` or ``var_clamp`` not a finite positive number.
        UnsupportedLayerError: A parameter outside Linear/Conv/BatchNorm layers, or Bayesian layers in ``model``.
    """
    torch = _torch()
    for option, value in (("scale", scale), ("var_clamp", var_clamp)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InvalidOptionError(f"--swag-{option.replace('_', '-')} {value!r}: must be a finite number > 0")
    source = str(stats) if isinstance(stats, (str, os.PathLike)) else "SWAG stats"
    table = read_state_dict(os.fspath(stats)) if isinstance(stats, (str, os.PathLike)) else dict(stats)
    arrays = {str(k): _array(v, f"{source}: {k}") for k, v in table.items()}
    if not isinstance(model, torch.nn.Module):
        raise InvalidOptionError(f"{where}: from_swag takes the torch.nn.Module SWAG was run on, got "
                                 f"{type(model).__name__}")
    model = model.eval()
    if find_bayesian_layers(model)[0]:
        raise UnsupportedLayerError(f"{where}: the model has Bayesian layers; SWAG's model is a plain network")
    params = {name: tuple(p.shape) for name, p in model.named_parameters()}
    if not params:
        raise UnsupportedLayerError(f"{where}: the model has no parameters")
    prefix = _prefix(arrays, next(iter(params)), source)
    layers = plain_layers(model)
    owner = {f"{p}.{role}": p for p in layers for role in ("weight", "bias")}
    for key in arrays:
        base = _base_name(key, prefix)
        if base is not None and base not in params:
            raise InvalidWeightsError(f"{source}: {key!r} matches no parameter of {type(model).__name__}")
    ranks: set[int] = set()
    encodings: dict[str, Encoding] = {}
    means: dict[str, np.ndarray] = {}
    for name, shape in params.items():
        if name not in owner:
            raise UnsupportedLayerError(f"{where}: parameter {name!r} is not a Linear/Conv/BatchNorm weight or bias; "
                                        "edgebnn samples SWAG on those layers only")
        mean = _stat(arrays, prefix + name + "_mean", shape, source, name)
        sq_mean = _stat(arrays, prefix + name + "_sq_mean", shape, source, name)
        var = np.maximum(sq_mean.astype(np.float64) - np.square(mean.astype(np.float64)), var_clamp)
        sigma = np.sqrt(var).astype(np.float32)
        cov_key = next((prefix + name + s for s in COV_SUFFIXES if prefix + name + s in arrays), None)
        means[name] = mean
        if cov_key is None:
            ranks.add(0)
            encodings[name] = GaussianWeight(mean, sigma * np.float32(math.sqrt(scale)))
            continue
        dev = arrays[cov_key]
        n = math.prod(shape)
        if dev.ndim != 2 or dev.shape[1] != n or dev.shape[0] < 2:
            raise InvalidWeightsError(f"{source}: {cov_key!r} is {tuple(dev.shape)}; parameter {name!r} needs "
                                      f"[K, {n}] with K >= 2 deviations")
        ranks.add(int(dev.shape[0]))
        encodings[name] = LowRankGaussianWeight(mean, sigma, dev, scale)
    if len(ranks) > 1:
        raise InvalidWeightsError(f"{source}: parameters have different numbers of deviations "
                                  f"({', '.join(map(str, sorted(ranks)))}; 0: none); SWAG keeps K for all")
    posts = {}
    for path, post in layers.items():
        bias = means.get(f"{path}.bias", post.bias_mu)
        posts[path] = dataclasses.replace(post, weight_mu=means[f"{path}.weight"], bias_mu=bias,
                                          bias_sigma=None)
    return import_model(model, tuple(input_shape), output_index=output_index, where=where,
                        layers=PlainLayers(posts, encodings, LIBRARY))


def _array(value: Any, what: str) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().float().numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiu":
        raise InvalidWeightsError(f"{what}: not a numeric tensor ({arr.dtype})")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.all(np.isfinite(arr)):
        raise InvalidWeightsError(f"{what}: has NaN or inf values")
    return arr


def _prefix(arrays: Mapping[str, np.ndarray], first: str, source: str) -> str:
    """The common key prefix: the one before the first parameter's ``_mean``."""
    want = first + "_mean"
    hits = sorted((k[: -len(want)] for k in arrays if k.endswith(want)), key=len)
    if not hits:
        raise InvalidWeightsError(f"{source}: no {want!r} for parameter {first!r} (SWAG stats hold "
                                  "{name}_mean, {name}_sq_mean and optionally {name}_covariance_sqrt per parameter)")
    return hits[0]


def _base_name(key: str, prefix: str) -> str | None:
    """The parameter a SWAG statistic key names (None: not a statistic under ``prefix``)."""
    if not key.startswith(prefix):
        return None
    for suffix in _SUFFIXES:
        if key.endswith(suffix):
            return key[len(prefix): -len(suffix)]
    return None


def _stat(arrays: Mapping[str, np.ndarray], key: str, shape: tuple[int, ...], source: str, name: str) -> np.ndarray:
    if key not in arrays:
        raise InvalidWeightsError(f"{source}: no {key!r} for parameter {name!r}")
    arr = arrays[key]
    if arr.size != math.prod(shape):
        raise InvalidWeightsError(f"{source}: {key!r} is {tuple(arr.shape)}; parameter {name!r} is {shape}")
    return arr.reshape(shape)
