"""Import a trained PyTorch BNN into the IR.

1. Find the Bayesian layers with the library adapters and read their posteriors.
2. Probe one forward pass to learn which layers return ``(out, kl)`` tuples (hand-written bayesian-torch
   models) and which model output is the prediction (a dict output is refused).
3. Swap each Bayesian layer for a deterministic twin holding the posterior mean (``F.linear``, ``F.convNd``,
   ``F.conv_transposeNd`` or ``F.batch_norm``, returning a tuple again where the original did) and export
   that network with ``torch.onnx.export`` (dynamo, ``optimize=False`` so BatchNorm is never folded into a
   Bayesian weight; batch axis dynamic).
4. Fold the shape arithmetic the export leaves (:mod:`edgebnn.importers._shapes`), keeping the batch
   dynamic, and require static non-batch shapes around every Bayesian layer.
5. Replace each mean-weight initializer by a ``GaussianWeight(mu, sigma)`` node with the same output name.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from edgebnn.errors import (
    EdgeBNNError,
    InvalidOptionError,
    InvalidWeightsError,
    MissingDependencyError,
    UnsupportedLayerError,
)
from edgebnn.importers._shapes import fold_shape_computations, static_feature_shapes
from edgebnn.importers.base import LayerAdapter, LayerPosterior
from edgebnn.importers.mc_dropout import (
    between_masks,
    deterministic_posteriors,
    dropout_modules,
    mask_encodings,
    mask_layer,
    watch,
)
from edgebnn.importers.recurrent import mask_paths, rnn_dropouts, rnn_mask_shape, split_rnn, untie_per_call
from edgebnn.ir import (
    DOMAIN,
    DOMAIN_VERSION,
    MAX_IR_VERSION,
    BNNModel,
    GaussianWeight,
    Manifest,
    make_encoding_node,
    verify,
)
from edgebnn.ir.encodings import MASK_SUFFIX, Encoding
from edgebnn.tasks import Task, option_task, task_of_output

OPSET = 18
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
# Parameter-name fragments that mark a layer as Bayesian even when no adapter knows its library.
_BAYESIAN_PARAM = re.compile(r"(^|_)(rho|log_sigma|sigma|logvar|log_alpha)($|_)|(^|_)mu($|_)")


@dataclass(frozen=True)
class PlainLayers:
    """A plain model's layers to import with given encodings: ``posteriors`` describe each layer (its means are
    what the exported skeleton holds), ``encodings`` maps weight names (``<path>.weight``, ``<path>.bias``) to
    their encoding (others: σ = 0 Gaussians, a bias without σ stays a constant), ``library`` names the source."""

    posteriors: Mapping[str, LayerPosterior]
    encodings: Mapping[str, Encoding]
    library: str


def _adapters() -> list[LayerAdapter]:
    """Every registered family's torch adapters (the built-in libraries', then plug-ins'), first match wins."""
    from edgebnn.family import adapters

    return adapters()


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise MissingDependencyError("importing a PyTorch model needs torch: pip install 'edgebnn[torch]'") from e
    return torch


def find_bayesian_layers(model: Any) -> tuple[dict[str, LayerPosterior], set[str]]:
    """Posteriors of every Bayesian layer by module path, and the libraries they came from.

    Raises UnsupportedLayerError for a layer that looks Bayesian but no adapter knows.
    """
    adapters = _adapters()
    found: dict[str, LayerPosterior] = {}
    libraries: set[str] = set()
    inside: list[str] = []
    for path, module in model.named_modules():
        if any(path.startswith(p + ".") for p in inside):
            continue  # parts of a layer already imported (e.g. blitz's weight_sampler)
        adapter = next((a for a in adapters if a.matches(module)), None)
        if adapter is not None:
            found[path] = adapter.extract(module, path)
            libraries.add(adapter.library)
            inside.append(path)
            continue
        own = [n for n, _ in module.named_parameters(recurse=False)]
        suspicious = [n for n in own if _BAYESIAN_PARAM.search(n)]
        if suspicious:
            known = sorted({a.library for a in adapters})
            raise UnsupportedLayerError(
                f"layer {path or '<root>'!r} ({type(module).__module__}.{type(module).__name__}) has "
                f"Bayesian-looking parameters {suspicious} but no importer knows it (importers: {', '.join(known)}); "
                "a plug-in adds one (docs/extending.md): install it, or load its module with --plugin MODULE"
            )
    return found, libraries


def mean_forward(post: LayerPosterior, x: Any, weight: Any = None, bias: Any = None, stats: Any = None) -> Any:
    """The layer ``post`` describes applied to the torch tensor ``x``.

    ``weight``, ``bias`` and (batch norm) ``stats = (running_mean, running_var)`` default to the posterior
    means and statistics in ``post``.
    """
    import torch
    import torch.nn.functional as F

    weight = torch_tensor(post.weight_mu) if weight is None else weight
    bias = torch_tensor(post.bias_mu) if bias is None else bias
    if post.kind == "linear":
        return F.linear(x, weight, bias)
    if post.kind == "batchnorm":
        # Normalise, then scale and shift as a batch norm of statistics (0, 1) and epsilon 0: in the exported
        # graph the sampled scale and shift then feed a node that is linear in them, which the exporters'
        # batch-norm layer kind samples (edgebnn.exporters.layers.BatchNormalization).
        mean, var = (torch_tensor(post.running_mean), torch_tensor(post.running_var)) if stats is None else stats
        zeros, ones = torch.zeros(len(post.weight_mu)), torch.ones(len(post.weight_mu))
        xhat = F.batch_norm(x, mean, var, ones, zeros, False, 0.0, post.eps)
        return F.batch_norm(xhat, zeros, ones, weight, bias, False, 0.0, 0.0)
    if post.kind == "conv":
        conv = getattr(F, f"conv{post.rank}d")
        return conv(x, weight, bias, post.stride, post.padding, post.dilation, post.groups)
    conv = getattr(F, f"conv_transpose{post.rank}d")
    return conv(x, weight, bias, post.stride, post.padding, post.output_padding, post.groups, post.dilation)


def torch_tensor(a: np.ndarray | None) -> Any:
    import torch

    return None if a is None else torch.from_numpy(np.ascontiguousarray(a))


def _mean_layer(post: LayerPosterior, returns_tuple: bool) -> Any:
    import torch
    from torch import nn

    class _Mean(nn.Module):
        """Deterministic twin of a Bayesian layer holding the posterior mean."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch_tensor(post.weight_mu), requires_grad=False)
            # A bias-less layer gets an explicit zero bias: without one, torch.onnx.export builds the zeros
            # from Shape(weight), which would make the sampled weight feed a Shape node.
            bias = post.bias_mu if post.bias_mu is not None else np.zeros(post.out_channels, np.float32)
            self.bias = nn.Parameter(torch_tensor(bias), requires_grad=False)
            if post.kind == "batchnorm":
                self.register_buffer("running_mean", torch_tensor(post.running_mean))
                self.register_buffer("running_var", torch_tensor(post.running_var))

        def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
            stats = (self.running_mean, self.running_var) if post.kind == "batchnorm" else None
            out = mean_forward(post, x, self.weight, self.bias, stats)
            return (out, torch.zeros((), dtype=out.dtype)) if returns_tuple else out

    return _Mean()


def _set_submodule(root: Any, path: str, new: Any) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, name, new)


def import_model(
    model: Any,
    input_shape: tuple[int, ...] | list[int],
    *,
    output_index: int = 0,
    where: str = "<model>",
    mc_dropout: bool = False,
    layers: PlainLayers | None = None,
    task: str | None = None,
    task_options: Mapping[str, Any] | None = None,
) -> BNNModel:
    """Import a trained PyTorch BNN.

    Args:
        model: the trained ``nn.Module`` (edgebnn, bayesian-torch, torchbnn or blitz layers, plus plain
            Linear/Conv2d/BatchNorm carried through as deterministic layers).
        input_shape: one example's shape with a leading batch dim, e.g. ``(1, 1, 8, 8)``.
        output_index: which element to use when ``forward`` returns a tuple such as ``(logits, kl)``.
        where: how errors name the model (e.g. the factory string).
        mc_dropout: keep the model's ``nn.Dropout``/``Dropout1d/2d/3d`` on at prediction (MC dropout): each
            becomes a dropout mask on its input (:mod:`edgebnn.families.dropout`), and its plain Linear/Conv weights
            ``GaussianWeight`` with σ = 0 (:mod:`.mc_dropout`).
        layers: a plain torch model's layers with their weights given as encodings (deep ensembles, SWAG:
            :class:`PlainLayers`) instead of Bayesian layers found by the adapters.
        task: a registered task (:data:`edgebnn.tasks.TASKS`: ``classification``, ``regression``,
            ``segmentation`` (``dense``), or a plug-in's); None infers it where that guesses nothing: [B, K >= 3] is
            classification, [B, C, *spatial] segmentation, and a 1- or 2-wide head is refused with a hint
            (:func:`edgebnn.tasks.task_of_output`).
        task_options: the task's ``from_torch`` options (:attr:`edgebnn.tasks.Task.import_options`: regression's
            ``noise_var`` and ``regression_head``, a plug-in task's own); None values are not given.

    Returns:
        The IR with one ``GaussianWeight`` per Bayesian weight (and bias) and one dropout mask per dropout
        layer with ``mc_dropout``.
    """
    torch = _torch()
    joins_pair = task is not None and option_task(task).joins_output_pair  # an unknown task: one line, before torch
    shape = tuple(int(d) for d in input_shape)
    if len(shape) < 2 or any(d <= 0 for d in shape):
        raise InvalidOptionError(f"--input-shape {','.join(map(str, shape))}: need batch,dims... of positive ints")
    model = model.eval()
    _check_finite_parameters(model, where)
    if layers is not None:  # a plain model whose weights are given (deep ensembles, SWAG)
        posteriors, libraries = dict(layers.posteriors), {layers.library}
    else:
        posteriors, libraries = find_bayesian_layers(model)
    dropouts = dropout_modules(model) if mc_dropout else {}
    rnns = rnn_dropouts(model) if mc_dropout else {}  # nn.LSTM/GRU dropping between their layers
    if mc_dropout:  # the plain layers' weights as σ = 0 Gaussians: lowering schemes encode them too
        posteriors = deterministic_posteriors(model, posteriors)
    if not posteriors and not mc_dropout:
        known = ", ".join(sorted({a.library for a in _adapters()}))
        raise UnsupportedLayerError(
            f"{where}: no Bayesian layers found (importers: {known}; --mc-dropout for a model with dropout; "
            "--plugin MODULE loads a plug-in's importer)"
        )

    returns_tuple: dict[str, bool] = {}
    hooks = [
        model.get_submodule(p).register_forward_hook(
            lambda _m, _i, out, p=p: returns_tuple.__setitem__(p, isinstance(out, tuple))
        )
        for p in posteriors
    ]
    rnn_shapes: dict[str, tuple[int, ...]] = {}
    hooks += [model.get_submodule(p).register_forward_hook(
        lambda m, _i, out, p=p: rnn_shapes.__setitem__(p, rnn_mask_shape(m, out))) for p in rnns]
    try:
        with watch(model, dropouts, where) if mc_dropout else torch.no_grad() as mask_shapes:
            example = torch.zeros((2, *shape[1:]))
            out = model(example)
    except UnsupportedLayerError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        takes = _first_layer_takes(model, shape)
        probe = ",".join(map(str, example.shape))  # the shape torch's message speaks of: batch 2, the rest typed
        raise InvalidOptionError(
            f"{where}: forward pass on --input-shape {','.join(map(str, shape))} failed (probed as a batch of shape "
            f"{probe}): {msg}" + (f"; {takes}" if takes else "")
        ) from e
    finally:
        for h in hooks:
            h.remove()
    if mc_dropout and not dropouts and not rnn_shapes:  # after the pass: dropout outside a module is named first
        raise UnsupportedLayerError(f"{where}: --mc-dropout: no nn.Dropout/Dropout1d/2d/3d with p > 0 (nor an "
                                    f"nn.LSTM/GRU/RNN with dropout > 0) in {type(model).__name__}")
    if isinstance(out, Mapping):
        keys = ", ".join(repr(k) for k in list(out)[:4])
        raise UnsupportedLayerError(
            f"{where}: forward of {type(model).__name__} returns a dict ({keys}); wrap the model so that forward "
            "returns the logits tensor (or a tuple with the logits at --output-index)"
        )
    pair = joins_pair and _mean_logvar_pair(out)
    if isinstance(out, (tuple, list)) and not pair:
        if not 0 <= output_index < len(out):
            raise InvalidOptionError(f"{where}: forward returns {len(out)} outputs; output index {output_index}")
        out = out[output_index]
    if pair:  # (mean, log-variance): one [B, 2D] output
        out = torch.cat([out[0], out[1]], 1)
    spec = _task_of(out, shape[0], task, task_options or {}, bool(pair), where)
    mean_model = copy.deepcopy(model)
    for path, post in posteriors.items():
        _set_submodule(mean_model, path, _mean_layer(post, returns_tuple.get(path, False)))
    masks = mask_encodings(dropouts, mask_shapes or {}) if mc_dropout else {}
    for path, mask in masks.items():
        _set_submodule(mean_model, path, mask_layer(mask.shape))
        libraries.add("torch-mc-dropout")
    for path, between in rnn_shapes.items():  # one module per layer, a mask between layers
        _set_submodule(mean_model, path, split_rnn(rnns[path], between, mask_layer))
        masks.update(between_masks(mask_paths(path, rnns[path]), between, float(rnns[path].dropout)))
        libraries.add("torch-mc-dropout")

    from torch import nn

    class _Select(nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.net = inner

        def forward(self, x: Any) -> Any:
            y = self.net(x)
            if pair:
                return torch.cat([y[0], y[1]], 1)
            return y[output_index] if isinstance(y, (tuple, list)) else y

    proto = fold_shape_computations(_export(torch, _Select(mean_model).eval(), example, where))
    _check_static_shapes(proto, {p: type(model.get_submodule(p)).__name__ for p in posteriors}, "net.", where)
    return _attach_posteriors(proto, posteriors, masks, "net.", Manifest(
        source_library="+".join(sorted(libraries)),
        input_name=INPUT_NAME,
        input_shape=[1, *shape[1:]],
        num_classes=int(out.shape[1]),
        task=spec.name,
        task_options=spec.options(),
    ), where, layers.encodings if layers is not None else {})


def _check_finite_parameters(model: Any, where: str) -> None:
    """Refuse a parameter with NaN or infinite values by its state_dict name (``fc1.rho_weight``), before an adapter
    turns it into an internal σ. Buffers are not checked: an attention mask holds -inf by design."""
    import torch

    for name, param in model.named_parameters():
        bad = int((~torch.isfinite(param.detach())).sum()) if param.is_floating_point() else 0
        if bad:
            raise InvalidWeightsError(f"{where}: parameter {name} has {bad} NaN or infinite value(s) of "
                                      f"{param.numel()}; the checkpoint is corrupt or training diverged")


def _first_layer_takes(model: Any, shape: tuple[int, ...]) -> str | None:
    """What the model's first weighted layer takes, as a hint for a wrong ``--input-shape`` ``shape``: a conv layer
    its channels and spatial rank (from its kernel's dimensions: bayesian-torch gives ``kernel_size`` as one int),
    with the shape to try built from the sizes the user typed where they fit; a linear layer its features; None when
    it has neither."""
    for name, m in model.named_modules():
        channels, kernel = getattr(m, "in_channels", None), getattr(m, "kernel_size", None)
        if isinstance(channels, int) and kernel is not None:
            rank = _spatial_rank(m, kernel)
            layer = f"its first layer {name} ({type(m).__name__}) takes {channels} channel(s) in {rank}-d"
            typed = (shape[2:] if len(shape) == rank + 2 else  # channels wrong: keep the sizes typed
                     shape[1:] if len(shape) == rank + 1 and shape[1] != channels else None)  # channels left out
            spatial = typed if typed is not None else ("D", "H", "W")[-rank:] if rank <= 3 else ("...",)
            want = ",".join(map(str, (1, channels, *spatial)))
            if want == ",".join(map(str, shape)):  # the shape fits this layer: a later one refused it
                return f"{layer}, as --input-shape {want} gives it: a later layer refused its size"
            return f"{layer}: --input-shape {want} (batch, channels, {rank} spatial dims)"
        features = getattr(m, "in_features", None)
        if isinstance(features, int):
            return (f"its first layer {name} ({type(m).__name__}) takes {features} features per example (after "
                    "any flatten in forward)")
    return None


def _spatial_rank(layer: Any, kernel: Any) -> int:
    """The spatial rank of a conv layer: its kernel tensor's dimensions less (out, in), else the ``kernel_size``
    tuple's length, else the ``Conv<N>d`` in its class name, else 1."""
    for param in layer.parameters(recurse=False):
        if param.ndim >= 3:
            return int(param.ndim) - 2
    if isinstance(kernel, (tuple, list)):
        return len(kernel)
    match = re.search(r"(\d)d", type(layer).__name__, re.IGNORECASE)
    return int(match.group(1)) if match else 1


def _mean_logvar_pair(out: Any) -> bool:
    """Whether ``forward`` returned (mean, log-variance): two tensors of one [B, D] shape first."""
    return (isinstance(out, (tuple, list)) and len(out) >= 2 and all(hasattr(o, "shape") for o in out[:2])
            and out[0].ndim == 2 and tuple(out[0].shape) == tuple(out[1].shape))


def _task_of(out: Any, batch: int, task: str | None, options: Mapping[str, Any], pair: bool, where: str) -> Task:
    """The task of the output ``out`` (of the batch-2 probe): stated, or inferred where nothing is guessed
    (:func:`edgebnn.tasks.task_of_output`)."""
    got = tuple(getattr(out, "shape", ()))
    if not hasattr(out, "shape") or out.ndim < 2:
        shown = "[" + ", ".join(str(d) for d in (batch, *got[1:])) + "]" if got else "no tensor"
        raise UnsupportedLayerError(f"{where}: the model output must be [batch, outputs] or [batch, classes, "
                                    f"*spatial], got {shown}")
    return task_of_output((batch, *(int(d) for d in got[1:])), task, where, pair=pair, **options)


def _export(torch: Any, module: Any, example: Any, where: str) -> onnx.ModelProto:
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    sink = io.StringIO()
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                (example,),
                dynamo=True,
                optimize=False,
                opset_version=OPSET,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_shapes=({0: batch},),
                verbose=False,
                report=False,
            )
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsupportedLayerError(f"{where}: torch.onnx.export of the posterior-mean network failed: {msg}") from e
    finally:
        for lg, lvl in zip(loggers, levels, strict=True):
            lg.setLevel(lvl)
    return program.model_proto


def _check_static_shapes(proto: onnx.ModelProto, classes: dict[str, str], prefix: str, where: str) -> None:
    """Every node a Bayesian weight feeds must see static shapes on a batch-1 probe: exporters lay samples out
    by them (the batch itself stays dynamic in the graph)."""
    shapes = static_feature_shapes(proto)
    layer_of = {f"{prefix}{path}.weight": path for path in classes}
    for node in proto.graph.node:
        path = next((layer_of[x] for x in node.input if x in layer_of), None)
        if path is None:
            continue
        for role, value in (("input", node.input[0]), ("output", node.output[0])):
            shape = shapes.get(value)
            if shape is None or any(d is None for d in shape):
                got = "unknown" if shape is None else "[" + ", ".join("?" if d is None else str(d)
                                                                     for d in shape) + "] at batch 1"
                raise UnsupportedLayerError(
                    f"{where}: layer {path!r} ({classes[path]}): its {node.op_type} {role} shape is {got} even "
                    "after folding shape computations; make every size but the batch follow from --input-shape "
                    "(no data-dependent sizes)"
                )


def _strip_prefix(graph: onnx.GraphProto, prefix: str) -> None:
    """Rename initializers ``net.conv1.weight`` -> ``conv1.weight`` (the wrapper's prefix) everywhere."""
    renames = {t.name: t.name[len(prefix):] for t in graph.initializer if t.name.startswith(prefix)}
    for t in graph.initializer:
        t.name = renames.get(t.name, t.name)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]


def _attach_posteriors(
    proto: onnx.ModelProto, posteriors: dict[str, LayerPosterior], masks: dict[str, Encoding], prefix: str,
    manifest: Manifest, where: str, encodings: Mapping[str, Encoding],
) -> BNNModel:
    graph = proto.graph
    # Drop exporter debris that would make files differ between machines (stack traces, doc strings).
    proto.doc_string = ""
    graph.doc_string = ""
    del proto.metadata_props[:]
    for node in graph.node:
        node.doc_string = ""
        del node.metadata_props[:]
    del graph.value_info[:]

    _strip_prefix(graph, prefix)
    inits = {t.name: t for t in graph.initializer}
    new_nodes = []
    encoded: dict[str, tuple[str, Any]] = {}
    for path, post in posteriors.items():
        given = dict(encodings)  # a family's own encodings of this layer (its adapter's, or a plain model's)
        given.update({f"{path}.{role}": enc for role, enc in (("weight", post.weight_encoding),
                                                               ("bias", post.bias_encoding)) if enc is not None})
        pairs = [("weight", post.weight_mu, post.weight_sigma)]
        if post.bias_mu is not None and (post.bias_sigma is not None or f"{path}.bias" in given):
            sigma_b = post.bias_sigma if post.bias_sigma is not None else np.zeros_like(post.bias_mu)
            pairs.append(("bias", post.bias_mu, sigma_b))
        for role, mu, sigma in pairs:
            name = f"{path}.{role}"
            if name not in inits:
                raise UnsupportedLayerError(
                    f"{where}: layer {path!r}: exported graph has no initializer {name!r} "
                    "(the exporter renamed or folded it)"
                )
            exported = onnx.numpy_helper.to_array(inits[name])
            if exported.shape != mu.shape or not np.array_equal(exported, mu):
                raise UnsupportedLayerError(
                    f"{where}: layer {path!r}: exported {role} differs from the posterior mean "
                    "(the exporter transformed it)"
                )
            graph.initializer.remove(inits[name])
            enc = given[name] if name in given else GaussianWeight(mu, sigma)
            if tuple(enc.shape) != tuple(mu.shape):
                raise UnsupportedLayerError(f"{where}: layer {path!r}: its {role} encoding {enc.op_type} has shape "
                                            f"{list(enc.shape)}, the layer's {role} {list(mu.shape)}")
            encoded[name] = (path, enc)
            new_nodes.append(make_encoding_node(graph, name, path, encoded[name][1]))
    for path, mask in masks.items():
        name = path + MASK_SUFFIX
        if name not in inits:
            raise UnsupportedLayerError(f"{where}: layer {path!r}: exported graph has no dropout mask {name!r}")
        graph.initializer.remove(inits[name])
        encoded[name] = (path, mask)
        new_nodes.append(make_encoding_node(graph, name, path, mask))
    nodes = list(graph.node)
    new_nodes += untie_per_call(graph, encoded, nodes)  # the libraries draw on every call of a layer
    del graph.node[:]
    graph.node.extend(new_nodes + nodes)
    proto.opset_import.append(onnx.helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
    proto.producer_name = "edgebnn"
    bnn = BNNModel(proto, manifest, where)
    try:
        verify(bnn)
    except EdgeBNNError as e:
        raise UnsupportedLayerError(f"{where}: imported graph failed verification: {e}") from e
    return bnn
