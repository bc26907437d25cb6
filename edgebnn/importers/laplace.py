"""Import a fitted laplace-torch posterior (``Laplace(...)`` after ``fit``) into the IR, exactly per structure.

laplace-torch (Daxberger et al. 2021) keeps the MAP network and a Gaussian posterior N(θ_MAP, P⁻¹) over the
parameters that require grad (all weights) or over the last ``nn.Linear`` (``*LLLaplace``), with
``P = H / (σ² T) + P₀`` (``T``: temperature, ``P₀``: the prior precision as fitted). Each structure becomes an
encoding with its own exact draw (the IR never holds a mean-field stand-in for a correlated posterior):

- ``DiagLaplace`` / ``DiagLLLaplace``: ``GaussianWeight(θ_MAP, la.posterior_scale)``: mean-field is exact.
- ``KronLaplace`` / ``KronLLLaplace``: per parameter, the block of ``la.posterior_precision`` (a
  ``KronDecomposed``: eigenvectors, eigenvalues already times ``1/(σ² T)``, the prior ``δ`` per parameter,
  damping): a weight's two factors give a ``KronGaussianWeight`` with ``D = (λ_o λ_iᵀ + δ)^{-1/2}``
  (damped: ``((λ_o + √δ)(λ_i + √δ)ᵀ)^{-1/2}``); a bias (one dense factor, laplace-torch keeps weight and bias
  apart) a ``DenseGaussianWeight`` with ``L = Q diag((λ + δ)^{-1/2})``.
- ``FullLLLaplace``: ``la.posterior_scale`` over ``[vec W, b]`` (weight and bias correlated). The last layer is
  imported as ``x -> Linear([x, 1], [W | b])`` (its bias folded in as a weight column, a ``Concat`` with a
  constant 1 feature) so that one ``DenseGaussianWeight`` holds the joint covariance.

Anything else (regression, ``FullLaplace`` / low-rank on all weights, functional Laplace, an unfitted object,
parameters of a layer other than Linear/Conv) is refused in one line.

From a file (``edgebnn lower --laplace STATE``, :func:`load_laplace`): what ``torch.save(la.state_dict(), STATE)``
writes (laplace-torch 0.3: ``mean``, ``H``, the prior, ``n_data``, ``likelihood``, ``cls_name``, and for a last-layer
posterior ``data``, the first batch, that finds the last layer) holds tensors, lists, numbers and strings only, so
it loads with ``torch.load(weights_only=True)``. Its ``cls_name`` names the structure; that class of the installed
laplace-torch is built on the MAP network (``--model``/``--weights``) and ``la.load_state_dict`` fills it, so the
posterior is exactly the saved one. The state does not record a ``KronLaplace``'s ``damping``; it needs not:
laplace-torch 0.3's ``posterior_precision`` (the sum of a ``KronDecomposed`` and the prior) drops the flag, so
its own samples and GLM variance ignore damping, and edgebnn, which reads ``posterior_precision``, does the same
(tests/integration/test_family_cli.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgebnn.errors import InvalidWeightsError, UnsupportedLayerError
from edgebnn.importers.base import LayerPosterior, conv_posterior, loaded, to_numpy
from edgebnn.ir import BNNModel
from edgebnn.ir.encodings import DenseGaussianWeight, Encoding, KronGaussianWeight

LIBRARY = "laplace-torch"
SUPPORTED = "DiagLaplace, KronLaplace, DiagLLLaplace, KronLLLaplace or FullLLLaplace"


def is_laplace(obj: object) -> bool:
    """Whether ``obj`` is a laplace-torch posterior (without importing laplace-torch if the caller has not)."""
    base = loaded("laplace.baselaplace")
    return base is not None and isinstance(obj, base.BaseLaplace)


_FILE_KEYS = ("mean", "H", "prior_precision", "n_data", "likelihood", "cls_name")
_IMPORTED = frozenset({"DiagLaplace", "KronLaplace", "DiagLLLaplace", "KronLLLaplace", "FullLLLaplace"})


def load_laplace(model: Any, state_path: str, input_shape: tuple[int, ...], *, where: str) -> Any:
    """The fitted laplace-torch posterior saved as ``torch.save(la.state_dict(), state_path)``, rebuilt on
    ``model`` (the MAP network, weights loaded) as the class its ``cls_name`` names (module docstring).

    Raises:
        InvalidWeightsError: Not such a file, a key missing, or a state that does not fit ``model``.
        UnsupportedLayerError: A structure edgebnn does not import, or a likelihood other than classification.
        MissingDependencyError: laplace-torch is not installed.
    """
    import contextlib
    import io
    import warnings

    from edgebnn.errors import MissingDependencyError
    from edgebnn.importers._torch import _torch
    from edgebnn.importers.checkpoint import read_torch_file

    torch = _torch()
    state = read_torch_file(state_path)
    if not isinstance(state, dict) or not all(k in state for k in _FILE_KEYS):
        missing = [k for k in _FILE_KEYS if not isinstance(state, dict) or k not in state]
        raise InvalidWeightsError(f"{state_path}: not a laplace-torch state_dict (no {', '.join(missing)}); save it "
                                  "with torch.save(la.state_dict(), PATH) after la.fit(...)")
    kind = str(state["cls_name"])
    if kind not in _IMPORTED:
        raise UnsupportedLayerError(f"{state_path}: a {kind}: edgebnn imports {SUPPORTED}")
    if str(state["likelihood"]) not in ("classification", "Likelihood.CLASSIFICATION"):
        raise UnsupportedLayerError(f"{state_path}: a {kind} with likelihood {str(state['likelihood'])!r}; edgebnn "
                                    "imports classification posteriors")
    try:
        import laplace
    except ImportError as e:
        raise MissingDependencyError(f"--laplace {state_path}: needs laplace-torch (pip install laplace-torch)") from e
    cls = next(c for c in _subclasses(laplace.baselaplace.BaseLaplace) if c.__name__ == kind)
    last_layer = issubclass(cls, laplace.lllaplace.LLLaplace)
    options: dict[str, Any] = {"last_layer_name": state.get("_last_layer_name")} if last_layer else {}
    if last_layer and state.get("data") is None and options["last_layer_name"] is None:
        state = {**state, "data": (torch.zeros(input_shape),)}  # a probe input finds the last layer
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")  # a differing temperature etc. is loaded from the state anyway
            la = cls(model, "classification", **options)
            la.load_state_dict(state)
            la.posterior_precision  # noqa: B018  (the precision of H and the prior: shapes checked here)
    except Exception as e:  # laplace-torch's ValueError, or torch's shape errors: the state does not fit the model
        text = str(e).strip().splitlines()
        raise InvalidWeightsError(f"{state_path}: does not fit {where}: {text[0][:200] if text else type(e).__name__}"
                                  ) from e
    n = int(la.n_params)
    h = state["H"]
    want = {"Diag": (n,), "Full": (n, n)}.get(kind.removesuffix("Laplace").removesuffix("LL"))
    shape = tuple(getattr(h, "shape", ()))
    if int(la.mean.numel()) != n or (want is not None and shape != want):
        h_shape = "" if want is None else f" and H {shape}"
        raise InvalidWeightsError(f"{state_path}: does not fit {where}: mean has {int(la.mean.numel())} entries"
                                  f"{h_shape}; the {kind} of this model has {n} parameters")
    return la


def _subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls``, however deep."""
    out: list[type] = []
    stack = [cls]
    while stack:
        subs: list[type] = stack.pop().__subclasses__()
        for sub in subs:
            out.append(sub)
            stack.append(sub)
    return out


@dataclass
class _Param:
    """One parameter tensor in the posterior: its module, role and slice of the parameter vector."""

    path: str
    role: str
    module: Any
    start: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def import_laplace(la: Any, input_shape: tuple[int, ...], *, where: str) -> BNNModel:
    """The IR of a fitted laplace-torch posterior (see the module docstring for each structure).

    Raises:
        UnsupportedLayerError: an unfitted object, a structure or likelihood edgebnn does not import, or
            posterior parameters on a layer other than Linear/Conv{1,2,3}d.
    """
    from edgebnn.importers._torch import PlainLayers, import_model

    base = loaded("laplace.baselaplace")
    last = loaded("laplace.lllaplace")
    assert base is not None and last is not None  # is_laplace
    kind = type(la).__name__
    structure = ("diag" if isinstance(la, base.DiagLaplace) else "kron" if isinstance(la, base.KronLaplace)
                 else "full" if isinstance(la, base.FullLaplace) else None)
    last_layer = isinstance(la, last.LLLaplace)
    if structure is None or not isinstance(la, base.ParametricLaplace) or (structure == "full" and not last_layer):
        raise UnsupportedLayerError(f"{where}: {kind} is not imported; edgebnn imports {SUPPORTED}")
    if int(getattr(la, "n_data", 0) or 0) == 0 or la.mean is None or (last_layer and la.model.last_layer is None):
        raise UnsupportedLayerError(f"{where}: {kind} is not fitted: call la.fit(train_loader) before importing it")
    if str(la.likelihood) not in ("classification", "Likelihood.CLASSIFICATION"):
        raise UnsupportedLayerError(
            f"{where}: {kind} has likelihood {str(la.likelihood)!r}; edgebnn imports classification posteriors"
        )
    net = la.model.model if last_layer else la.model
    params = _params(la, net, last_layer, where)
    mean = to_numpy(la.mean).astype(np.float64)
    if mean.shape != (params[-1].start + params[-1].size,):
        raise InvalidWeightsError(f"{where}: {kind}.mean has {mean.size} entries, its parameters {params[-1].start}")
    if structure == "full":
        net, posteriors, encodings = _full_last_layer(la, net, params, mean, where)
    else:
        encodings = _kron_encodings(la, params, mean, where) if structure == "kron" else {}
        sigma = to_numpy(la.posterior_scale).astype(np.float64) if structure == "diag" else None
        posteriors = _posteriors(params, mean, sigma, encodings)
    return import_model(net, input_shape, where=where, layers=PlainLayers(posteriors, encodings, LIBRARY))


def _params(la: Any, net: Any, last_layer: bool, where: str) -> list[_Param]:
    """The posterior's parameters in laplace-torch's vector order, each with its module and role."""
    from torch import nn

    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    ids = {id(p) for p in (la.model.last_layer.parameters() if last_layer else la.params)}
    out: list[_Param] = []
    start = 0
    for name, p in net.named_parameters():
        if id(p) not in ids:
            continue
        path, _, role = name.rpartition(".")
        module = net.get_submodule(path)
        if type(module) not in kinds or role not in ("weight", "bias") or (
                not isinstance(module, nn.Linear) and module.padding_mode != "zeros"):
            raise UnsupportedLayerError(
                f"{where}: layer {path!r} ({type(module).__name__}): laplace-torch's posterior covers its parameter "
                f"{role!r}; edgebnn imports Laplace posteriors of Linear and Conv1d/2d/3d layers (freeze the others "
                "with requires_grad_(False) before fitting)"
            )
        out.append(_Param(path, role, module, start, tuple(int(d) for d in p.shape)))
        start += p.numel()
    if not out:
        raise UnsupportedLayerError(f"{where}: {type(la).__name__} covers no parameters")
    return out


def _posteriors(params: list[_Param], mean: np.ndarray, sigma: np.ndarray | None,
                encodings: dict[str, Encoding]) -> dict[str, LayerPosterior]:
    """A ``LayerPosterior`` per layer: μ from the posterior mean, σ the marginal one (diag: ``posterior_scale``;
    kron: the encoding's), and what the posterior leaves out of a layer (a frozen bias) deterministic."""
    from torch import nn

    layers: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    modules: dict[str, Any] = {}
    for p in params:
        mu = mean[p.start:p.start + p.size].reshape(p.shape).astype(np.float32)
        name = f"{p.path}.{p.role}"
        sd = encodings[name].stddev() if name in encodings else \
            sigma[p.start:p.start + p.size].reshape(p.shape).astype(np.float32)  # type: ignore[index]
        layers.setdefault(p.path, {})[p.role] = (mu, sd)
        modules[p.path] = p.module
    out = {}
    for path, roles in layers.items():
        module = modules[path]
        w = roles.get("weight") or (to_numpy(module.weight), np.zeros(tuple(module.weight.shape), np.float32))
        b: tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, None] | tuple[None, None] = roles.get("bias") or (
            (to_numpy(module.bias), None) if module.bias is not None else (None, None))
        if isinstance(module, nn.Linear):
            out[path] = LayerPosterior(path, "linear", w[0], w[1], b[0], b[1])
        else:
            out[path] = conv_posterior(module, path, w, b)  # type: ignore[arg-type]
    return out


def _kron_encodings(la: Any, params: list[_Param], mean: np.ndarray, where: str) -> dict[str, Encoding]:
    """One encoding per parameter from its block of ``la.posterior_precision`` (a ``KronDecomposed``)."""
    prec = la.posterior_precision
    if len(prec.eigenvalues) != len(params):
        raise InvalidWeightsError(
            f"{where}: {type(la).__name__} has {len(prec.eigenvalues)} Kronecker blocks for {len(params)} parameters"
        )
    deltas = to_numpy(prec.deltas).astype(np.float64).reshape(-1)
    deltas = np.broadcast_to(deltas, (len(params),)) if deltas.size == 1 else deltas
    out: dict[str, Encoding] = {}
    for p, vecs, vals, delta in zip(params, prec.eigenvectors, prec.eigenvalues, deltas, strict=True):
        name = f"{p.path}.{p.role}"
        mu = mean[p.start:p.start + p.size].reshape(p.shape)
        qs = [to_numpy(q).astype(np.float64) for q in vecs]
        ls = [to_numpy(v).astype(np.float64) for v in vals]
        if len(ls) == 2:
            if prec.damping:
                eig = np.outer(ls[0] + np.sqrt(delta), ls[1] + np.sqrt(delta))
            else:
                eig = np.outer(ls[0], ls[1]) + delta
            _check_positive(eig, name, where)
            if eig.shape != (p.shape[0], p.size // p.shape[0]):
                raise InvalidWeightsError(f"{where}: {name}: Kronecker factors {eig.shape} do not match {p.shape}")
            out[name] = KronGaussianWeight(mu, qs[0], qs[1], eig ** -0.5)
        else:
            eig = ls[0] + delta
            _check_positive(eig, name, where)
            out[name] = DenseGaussianWeight(mu, qs[0] * eig[None, :] ** -0.5)
    return out


def _check_positive(eig: np.ndarray, name: str, where: str) -> None:
    if not np.all(np.isfinite(eig)) or np.any(eig <= 0):
        raise InvalidWeightsError(f"{where}: {name}: the posterior precision is not positive definite "
                                  "(a zero prior precision?)")


def _full_last_layer(la: Any, net: Any, params: list[_Param], mean: np.ndarray,
                     where: str) -> tuple[Any, dict[str, LayerPosterior], dict[str, Encoding]]:
    """The network with its last Linear ``x -> W x + b`` as ``[x, 1] -> [W | b]``, and the joint posterior of
    ``[W | b]`` as one ``DenseGaussianWeight`` (rows of ``la.posterior_scale`` permuted to the augmented layout)."""
    import copy

    import torch
    from torch import nn

    scale = to_numpy(la.posterior_scale).astype(np.float64)
    path = params[0].path
    module = params[0].module
    if not isinstance(module, nn.Linear) or [p.role for p in params] not in (["weight"], ["weight", "bias"]):
        raise UnsupportedLayerError(f"{where}: FullLLLaplace on layer {path!r} ({type(module).__name__}): edgebnn "
                                    "imports a full-covariance last layer that is an nn.Linear")
    out_f, in_f = params[0].shape
    if len(params) == 1:  # no bias: the posterior is over vec(W) as it is
        enc: Encoding = DenseGaussianWeight(mean.reshape(out_f, in_f), scale)
        post = LayerPosterior(path, "linear", enc.mean(), enc.stddev())
        return net, {path: post}, {f"{path}.weight": enc}
    # row-major [out, in + 1]: (o, i < in) is W[o, i] at o·in + i, (o, in) is b[o] at out·in + o
    rows = np.arange(out_f)[:, None] * in_f + np.arange(in_f)[None, :]
    perm = np.concatenate([rows, out_f * in_f + np.arange(out_f)[:, None]], axis=1).reshape(-1)
    enc = DenseGaussianWeight(mean[perm].reshape(out_f, in_f + 1), scale[perm])

    class _BiasAsWeight(nn.Module):
        """``Linear(in, out)`` as ``Linear(in + 1, out, bias=False)`` on ``[x, 1]``."""

        def __init__(self) -> None:
            super().__init__()
            self.aug = nn.Linear(in_f + 1, out_f)

        def forward(self, x: Any) -> Any:
            return self.aug(torch.cat([x, x[..., :1] * 0 + 1], dim=-1))

    net = copy.deepcopy(net)
    parent_path, _, child = path.rpartition(".")
    setattr(net.get_submodule(parent_path) if parent_path else net, child, _BiasAsWeight())
    aug = f"{path}.aug"
    post = LayerPosterior(aug, "linear", enc.mean(), enc.stddev(), np.zeros(out_f, np.float32), None)
    return net, {aug: post}, {f"{aug}.weight": enc}
