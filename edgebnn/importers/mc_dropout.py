"""MC dropout (Gal & Ghahramani 2016): a plain torch model's ``nn.Dropout``/``Dropout1d/2d/3d`` kept on at
prediction, imported as :class:`~edgebnn.ir.encodings.DropoutMask` encodings on the activation path.

Each dropout module becomes ``x * <path>.dropout_mask`` in the exported network: an all-ones buffer of the
mask's shape (``nn.Dropout``: one example's feature shape; ``DropoutNd``: ``[C, 1, ...]``), which the importer
then replaces by the mask's encoding node. Dropout that is not such a module (``F.dropout`` in a custom
module's ``forward``) cannot be kept on and is refused, naming the module.

The model's plain ``nn.Linear``/``Conv1d/2d/3d`` become Gaussian weights with σ = 0
(:func:`deterministic_posteriors`), so lowering schemes encode them as any other weight; they contribute no
randomness, and the exporters run a σ ≡ 0 weight once with its mean (``rewrite.quiet_weights``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from edgebnn.errors import UnsupportedLayerError
from edgebnn.importers.base import LayerPosterior, conv_geometry, describe, to_numpy
from edgebnn.ir.encodings import MASK_SUFFIX, DropoutMask, Encoding

_CHANNEL_RANK = {"Dropout1d": 3, "Dropout2d": 4, "Dropout3d": 5}  # input rank with the batch
_DROPOUT_FUNCS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "feature_dropout", "alpha_dropout",
                  "feature_alpha_dropout"}


def dropout_modules(model: Any) -> dict[str, Any]:
    """``{path: module}`` of the model's ``nn.Dropout``/``Dropout1d/2d/3d`` with p > 0 (exact classes)."""
    from torch import nn

    kinds = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
    return {path: m for path, m in model.named_modules() if type(m) in kinds and m.p > 0}


def deterministic_posteriors(model: Any, posteriors: dict[str, LayerPosterior]) -> dict[str, LayerPosterior]:
    """``posteriors`` with the model's plain ``nn.Linear``/``Conv1d/2d/3d`` (exact classes, zero padding, not
    inside a Bayesian layer) added as σ = 0 weights, in module order; biases stay deterministic."""
    from torch import nn

    convs = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
    out: dict[str, LayerPosterior] = {}
    for path, m in model.named_modules():
        if path in posteriors:
            out[path] = posteriors[path]
        elif any(path.startswith(p + ".") for p in posteriors):
            continue
        elif type(m) is nn.Linear or (type(m) in convs and m.padding_mode == "zeros"):
            mu = to_numpy(m.weight)
            bias = (to_numpy(m.bias), None) if m.bias is not None else (None, None)
            if type(m) is nn.Linear:
                out[path] = LayerPosterior(path, "linear", mu, np.zeros_like(mu), *bias)
            else:
                geometry = conv_geometry(m, path, tuple(int(k) for k in mu.shape[2:]))
                out[path] = LayerPosterior(path, "conv", mu, np.zeros_like(mu), *bias, **geometry)
    return out


@contextmanager
def watch(model: Any, dropouts: dict[str, Any], where: str) -> Iterator[dict[str, tuple[int, ...]]]:
    """Around one forward pass: yields ``{path: mask shape}`` (filled by the pass) and refuses, after it,
    dropout called by any module other than the dropout modules."""
    import torch
    from torch.overrides import TorchFunctionMode

    stack: list[str] = []
    shapes: dict[str, tuple[int, ...]] = {}
    offenders: list[str] = []
    modules = dict(model.named_modules())

    class _Watch(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = getattr(func, "__name__", "").rstrip("_")
            if name in _DROPOUT_FUNCS and stack and stack[-1] not in dropouts:
                offenders.append(stack[-1])
            return func(*args, **(kwargs or {}))

    def pre(path: str) -> Any:
        return lambda _m, _i: stack.append(path)

    def post(path: str) -> Any:
        def hook(m: Any, inputs: Any, _out: Any) -> None:
            stack.pop()
            if path in dropouts:
                shapes[path] = _mask_shape(m, path, tuple(inputs[0].shape))
        return hook

    hooks = [h for path, m in modules.items()
             for h in (m.register_forward_pre_hook(pre(path)), m.register_forward_hook(post(path)))]
    try:
        with _Watch(), torch.no_grad():
            yield shapes
    finally:
        for h in hooks:
            h.remove()
    if offenders:
        path = offenders[0]
        raise UnsupportedLayerError(
            f"{where}: {describe(modules[path], path or '<root>')} calls dropout itself; --mc-dropout keeps only "
            "nn.Dropout/Dropout1d/2d/3d submodules on at prediction: replace the call with such a submodule"
        )


def _mask_shape(m: Any, path: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    name = type(m).__name__
    if name == "Dropout":
        return shape[1:]
    if len(shape) != _CHANNEL_RANK[name]:
        raise UnsupportedLayerError(f"{describe(m, path)}: takes a {len(shape)}-D input; {name} drops channels of "
                                    f"{_CHANNEL_RANK[name]}-D [N, C, ...] inputs: use nn.Dropout for this one")
    return (shape[1], *[1] * (len(shape) - 2))


def mask_layer(shape: tuple[int, ...]) -> Any:
    """The module standing for a dropout in the exported network: ``x * dropout_mask`` (ones)."""
    import torch
    from torch import nn

    class _Mask(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer(MASK_SUFFIX.lstrip("."), torch.ones(shape))

        def forward(self, x: Any) -> Any:
            return x * getattr(self, MASK_SUFFIX.lstrip("."))

    return _Mask()


def mask_encodings(dropouts: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Encoding]:
    """``{path: its dropout mask}`` for every dropout module the forward pass reached."""
    return {path: DropoutMask(shapes[path], float(m.p)) for path, m in dropouts.items() if path in shapes}


def between_masks(paths: list[str], shape: tuple[int, ...], p: float) -> dict[str, Encoding]:
    """``{path: its dropout mask}`` for the dropout a multi-layer recurrent module applies between its layers."""
    return {path: DropoutMask(shape, p) for path in paths}
