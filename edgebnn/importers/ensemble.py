"""Import a deep ensemble: M trained torch models of one architecture, as one IR of member-set weights.

Accepted: a list or tuple of ``nn.Module``, an ``nn.ModuleList``, or a wrapper module whose parameters all lie in
one ``nn.ModuleList`` attribute of M >= 2 models of one class and whose forward is the members' mean softmax (or
its log), checked on a probe input. The members' own forwards define the logits; the ensemble's predictive is
``(1/M) Σ_k softmax(f_k(x))``.

Member 0 gives the network's structure (exported once, as :mod:`._torch` does); every tensor that differs
between members becomes a :class:`~edgebnn.ir.encodings.MemberSetWeight` [M, *shape]: Linear/Conv weights and
biases, and BatchNorm, whose eval-mode ``y = γ_k (x − m_k)/s_k + β_k`` (``s_k = sqrt(v_k + eps)``) is kept as
normalisation by member 0's statistics followed by a per-member affine:

    γ'_k = γ_k · s_0 / s_k,    β'_k = β_k + γ_k (m_0 − m_k) / s_k          (member 0: γ'_0 = γ_0, β'_0 = β_0)

Tensors equal in every member (a shared frozen part) stay single. A differing tensor that is none of these (a
LayerNorm, an embedding, a parameter used in ``forward``) is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.importers._torch import PlainLayers, _torch, find_bayesian_layers, import_model
from edgebnn.importers.base import LayerPosterior, describe, to_numpy
from edgebnn.importers.mc_dropout import deterministic_posteriors
from edgebnn.ir import BNNModel
from edgebnn.ir.encodings import Encoding, MemberSetWeight

LIBRARY = "torch-ensemble"
_BN_STATS = ("running_mean", "running_var", "num_batches_tracked")


def as_ensemble(obj: Any, input_shape: Sequence[int], where: str, *, wrappers: bool = True) -> list[Any] | None:
    """The members when ``obj`` is a deep ensemble (see the module docstring), else None. ``wrappers``: also
    look for a wrapper module (its members must be whole models, each with submodules, that run on the input).

    Raises:
        InvalidOptionError: A list or tuple holding something other than torch modules, or fewer than two.
    """
    torch = _torch()
    nn = torch.nn
    if isinstance(obj, (list, tuple, nn.ModuleList)):
        members = list(obj)
        bad = next((i for i, m in enumerate(members) if not isinstance(m, nn.Module)), None)
        if bad is not None:
            raise InvalidOptionError(
                f"{where}: member {bad} is a {type(members[bad]).__name__}, not a torch.nn.Module; a deep ensemble "
                "is a list of trained models of one architecture"
            )
        if len(members) < 2:
            raise InvalidOptionError(f"{where}: a deep ensemble needs at least 2 members, got {len(members)}")
        return members
    if not wrappers or not isinstance(obj, nn.Module):
        return None
    lists = [(name, c) for name, c in obj.named_children() if isinstance(c, nn.ModuleList)]
    if len(lists) != 1 or len(lists[0][1]) < 2:
        return None
    attr, held = lists[0]
    members = list(held)
    inside = {id(t) for t in held.parameters()} | {id(t) for t in held.buffers()}
    outside = [t for t in (*obj.parameters(), *obj.buffers()) if id(t) not in inside]
    if (outside or len({type(m) for m in members}) != 1 or not any(True for _ in members[0].children())
            or find_bayesian_layers(members[0])[0]):
        return None
    return members if _check_wrapper(obj, members, attr, input_shape, where) else None


def _check_wrapper(obj: Any, members: list[Any], attr: str, input_shape: Sequence[int], where: str) -> bool:
    """Whether ``obj`` wraps ``members`` as an ensemble: False when the members do not each map the input to
    [batch, classes] logits like the wrapper's output (so not models: a layer list); refused when they do but the
    wrapper's forward is not their mean softmax (or its log) on a probe input."""
    torch = _torch()
    x = torch.randn((2, *[int(d) for d in input_shape[1:]]), generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            outs = [m.eval()(x) for m in members]
            if not all(hasattr(o, "shape") and o.ndim == 2 and o.shape == outs[0].shape for o in outs):
                return False
            mean = torch.stack([o.softmax(-1) for o in outs]).mean(0)
            got = obj.eval()(x)
    except Exception:  # the members do not run on the input alone: not an ensemble of models
        return False
    if isinstance(got, (tuple, list)) and got:
        got = got[0]
    if not hasattr(got, "shape") or tuple(got.shape) != tuple(mean.shape):
        return False  # not [batch, classes] like the members: not an ensemble of them
    if not (torch.allclose(got, mean, atol=1e-5) or torch.allclose(got, mean.log(), atol=1e-4)):
        raise UnsupportedLayerError(
            f"{where}: {type(obj).__name__} holds {len(members)} members in {attr!r} but its forward is not their "
            "mean softmax (or its log); pass the members themselves as a list"
        )
    return True


def import_ensemble(members: Sequence[Any], input_shape: Sequence[int], *, output_index: int = 0,
                    where: str = "<ensemble>") -> BNNModel:
    """Import M trained models of one architecture as a deep ensemble (member-set weights).

    Raises:
        UnsupportedLayerError: Members of different classes or parameter shapes, Bayesian members, or a tensor that
            differs between members outside Linear/Conv/BatchNorm layers (named).
    """
    torch = _torch()
    members = [m.eval() for m in members]
    first = members[0]
    states = [{k: v.detach().cpu() for k, v in m.state_dict().items()} for m in members]
    for k, (m, state) in enumerate(zip(members, states, strict=True)):
        if type(m) is not type(first):
            raise UnsupportedLayerError(f"{where}: member {k} is a {type(m).__name__}, member 0 a "
                                        f"{type(first).__name__}; a deep ensemble's members share one architecture")
        _check_same_tensors(states[0], state, k, where)
    if find_bayesian_layers(first)[0]:
        raise UnsupportedLayerError(f"{where}: the members have Bayesian layers; edgebnn imports deep ensembles of "
                                    "plain (deterministic) models")
    layers = plain_layers(first)
    if not layers:
        raise UnsupportedLayerError(f"{where}: the members have no Linear, Conv or BatchNorm layer")
    values = [_layer_values(m, layers) for m in members]
    covered = {f"{p}.{role}" for p, post in layers.items()
               for role in (("weight", "bias") + (_BN_STATS if post.kind == "batchnorm" else ()))}
    for key in states[0]:
        if key not in covered and any(not torch.equal(states[0][key], s[key]) for s in states[1:]):
            raise UnsupportedLayerError(
                f"{where}: {key!r} differs between members but is not a Linear/Conv/BatchNorm parameter that edgebnn "
                "draws per member"
            )
    encodings: dict[str, Encoding] = {}
    for name in values[0]:
        stack = np.stack([v[name] for v in values])
        if not all(np.array_equal(stack[0], s) for s in stack[1:]):
            encodings[name] = MemberSetWeight(stack)
    return import_model(first, tuple(input_shape), output_index=output_index, where=where,
                        layers=PlainLayers(layers, encodings, LIBRARY))


def _check_same_tensors(ref: dict[str, Any], state: dict[str, Any], k: int, where: str) -> None:
    missing = [key for key in ref if key not in state] + [key for key in state if key not in ref]
    if missing:
        raise UnsupportedLayerError(f"{where}: member {k} and member 0 differ in architecture: {missing[0]!r} is in "
                                    "only one of them")
    for key, t in ref.items():
        if tuple(state[key].shape) != tuple(t.shape):
            raise UnsupportedLayerError(
                f"{where}: member {k} and member 0 differ in architecture: {key!r} is {tuple(state[key].shape)} "
                f"in member {k}, {tuple(t.shape)} in member 0"
            )


def plain_layers(model: Any) -> dict[str, LayerPosterior]:
    """Member 0's Linear/Conv (σ = 0) and eval-mode BatchNorm layers, in module order."""
    from torch import nn

    plain = deterministic_posteriors(model, {})
    out: dict[str, LayerPosterior] = {}
    for path, m in model.named_modules():
        if path in plain:
            out[path] = plain[path]
        elif type(m) in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d):
            if not m.track_running_stats or m.running_mean is None:
                raise UnsupportedLayerError(f"{describe(m, path)}: track_running_stats=False normalises by the "
                                            "batch at prediction; edgebnn needs running statistics")
            gamma = to_numpy(m.weight) if m.weight is not None else np.ones(m.num_features, np.float32)
            beta = to_numpy(m.bias) if m.bias is not None else np.zeros(m.num_features, np.float32)
            out[path] = LayerPosterior(path, "batchnorm", gamma, np.zeros_like(gamma), beta, None,
                                       running_mean=to_numpy(m.running_mean), running_var=to_numpy(m.running_var),
                                       eps=float(m.eps))
    return out


def _layer_values(model: Any, layers: dict[str, LayerPosterior]) -> dict[str, np.ndarray]:
    """One member's ``{weight name: value}`` for ``layers``; BatchNorm as the affine after member 0's
    normalisation (module docstring)."""
    out: dict[str, np.ndarray] = {}
    for path, post in layers.items():
        m = model.get_submodule(path)
        if post.kind != "batchnorm":
            out[f"{path}.weight"] = to_numpy(m.weight)
            bias = to_numpy(m.bias) if m.bias is not None else np.zeros(post.out_channels, np.float32)
            out[f"{path}.bias"] = bias
            continue
        n = post.weight_mu.shape[0]
        gamma = to_numpy(m.weight).astype(np.float64) if m.weight is not None else np.ones(n)
        beta = to_numpy(m.bias).astype(np.float64) if m.bias is not None else np.zeros(n)
        s_k = np.sqrt(to_numpy(m.running_var).astype(np.float64) + float(m.eps))
        s_0 = np.sqrt(post.running_var.astype(np.float64) + post.eps)  # type: ignore[union-attr]
        m_0, m_k = post.running_mean.astype(np.float64), to_numpy(m.running_mean).astype(np.float64)  # type: ignore[union-attr]
        out[f"{path}.weight"] = (gamma * s_0 / s_k).astype(np.float32)
        out[f"{path}.bias"] = (beta + gamma * (m_0 - m_k) / s_k).astype(np.float32)
    return out
