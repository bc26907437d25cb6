"""Recurrent layers on the torch side: bayesian-torch's Bayesian LSTMs, per-call draws, nn.LSTM/GRU dropout.

**bayesian-torch ``LSTMReparameterization`` / ``LSTMFlipout``** are a python loop over time around two Bayesian
linear layers, ``ih`` (input to the four gates, [4H, I]) and ``hh`` (hidden state to the gates, [4H, H]), gates
in torch's order i, f, g, o::

    for t: g = ih(x_t) + hh(h_{t-1});  c_t = σ(g_f) ⊙ c_{t-1} + σ(g_i) ⊙ tanh(g_g);  h_t = σ(g_o) ⊙ tanh(c_t)

The importer reads ``ih`` and ``hh`` as the linear layers they are (:func:`unrolled_bayesian_rnn`: the container
itself is not an adapter's layer) and ``torch.onnx.export`` unrolls the loop: T ``Gemm`` nodes read each weight.

**Per-call draws** (:func:`untie_per_call`). bayesian-torch, torchbnn, blitz and edgebnn's layers draw new
weights on every call of a layer (``eps.normal_()`` in ``forward``), so the LSTM above draws ``ih`` and ``hh``
afresh at every time step, and a layer called twice draws twice. The IR states that: a sampled weight read by
k nodes becomes k encoded weights, ``name``, ``name@1``, ... (layers ``path``, ``path@1``, ...), each drawn on its
own, in every export mode and in the reference runtime. (σ ≡ 0 weights stay shared: they draw nothing.)

**nn.LSTM / nn.GRU with ``dropout`` under ``--mc-dropout``** (Gal & Ghahramani 2016, "A theoretically grounded
application of dropout in RNNs" is the variant torch does not implement; torch's is this one): torch drops the
outputs of every layer but the last, elementwise on ``[B, T, D·H]``, when the module is in training mode. The
importer splits such a module into one single-layer module per layer (:func:`split_rnn`, same weights) with
an MC-dropout mask between consecutive layers (``<path>.drop<k>``, shape ``[T, D·H]`` on the batch-major
sequence), which the exporters sample as any dropout mask.
"""

from __future__ import annotations

from typing import Any

import onnx

from edgebnn.ir import make_encoding_node
from edgebnn.ir.encodings import Encoding

BAYESIAN_TORCH_RNNS = ("LSTMReparameterization", "LSTMFlipout")
USE_SEPARATOR = "@"  # rnn.ih.weight@3: the 4th node reading rnn.ih.weight draws it on its own


def unrolled_bayesian_rnn(module: Any) -> bool:
    """Whether ``module`` is a bayesian-torch LSTM whose ``ih``/``hh`` layers the importer reads directly."""
    from edgebnn.importers.base import loaded

    layers = loaded("bayesian_torch.layers")
    name = type(module).__name__
    return (layers is not None and name in BAYESIAN_TORCH_RNNS and type(module) is getattr(layers, name, None)
            and all(type(getattr(module, part, None)).__name__.startswith("Linear") for part in ("ih", "hh")))


def untie_per_call(graph: onnx.GraphProto, encoded: dict[str, tuple[str, Encoding]],
                   nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Give every further node that reads a sampled encoded weight its own copy (drawn independently).

    ``encoded`` maps weight names to ``(layer path, encoding)``; ``nodes`` (the graph's compute nodes, in order)
    are renamed in place. Returns the new encoding nodes (their fields are added to ``graph``'s initializers).
    """
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for x in dict.fromkeys(node.input):
            if x in encoded:
                users.setdefault(x, []).append(node)
    out = []
    for name, readers in users.items():
        path, enc = encoded[name]
        if len(readers) < 2 or (enc.GAUSSIAN and not float(enc.stddev().max(initial=0.0)) > 0):
            continue
        for use, node in enumerate(readers[1:], start=1):
            copy = f"{name}{USE_SEPARATOR}{use}"
            for i, x in enumerate(node.input):
                if x == name:
                    node.input[i] = copy
            out.append(make_encoding_node(graph, copy, f"{path}{USE_SEPARATOR}{use}", enc))
    return out


def rnn_dropouts(model: Any) -> dict[str, Any]:
    """``{path: module}`` of the model's ``nn.LSTM``/``nn.GRU``/``nn.RNN`` (exact classes) that drop between
    layers (``num_layers > 1``, ``dropout > 0``)."""
    from torch import nn

    return {path: m for path, m in model.named_modules()
            if type(m) in (nn.LSTM, nn.GRU, nn.RNN) and m.num_layers > 1 and m.dropout > 0}


def rnn_mask_shape(module: Any, output: Any) -> tuple[int, ...]:
    """The per-example shape of the dropout between two layers of ``module``: ``[T, D·H]``."""
    y = output[0] if isinstance(output, tuple) else output
    if y.ndim != 3:
        raise ValueError(f"unbatched {type(module).__name__} input")
    return (int(y.shape[1] if module.batch_first else y.shape[0]), int(y.shape[2]))


def split_rnn(module: Any, mask_shape: tuple[int, ...], mask_layer: Any) -> Any:
    """``module`` (a multi-layer nn.LSTM/GRU/RNN) as single-layer modules of the same weights with
    ``mask_layer(mask_shape)`` (``x * mask`` on the batch-major sequence) between consecutive layers."""
    import torch
    from torch import nn

    kind = type(module)
    dirs = 2 if module.bidirectional else 1
    extra = {"nonlinearity": module.nonlinearity} if kind is nn.RNN else {}
    if kind is nn.LSTM:
        extra["proj_size"] = module.proj_size
    out_width = (module.proj_size or module.hidden_size) * dirs if kind is nn.LSTM else module.hidden_size * dirs
    layers = []
    for k in range(module.num_layers):
        one = kind(module.input_size if k == 0 else out_width, module.hidden_size, num_layers=1, bias=module.bias,
                   batch_first=module.batch_first, bidirectional=module.bidirectional, **extra)
        with torch.no_grad():
            for name, _ in one.named_parameters():
                getattr(one, name).copy_(getattr(module, name.replace("_l0", f"_l{k}")))
        layers.append(one)
    batch_first = module.batch_first

    class _Split(nn.Module):
        """One layer at a time; ``drop<k>`` masks layer k's output (MC dropout). Returns what the module
        returns: the output and the final states of every layer stacked (``(h_n, c_n)`` for an LSTM)."""

        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(layers)
            for k in range(len(layers) - 1):
                self.add_module(f"drop{k}", mask_layer(mask_shape))

        def forward(self, x: Any, hx: Any = None) -> Any:
            if hx is not None:
                raise ValueError("--mc-dropout on a multi-layer RNN takes no initial state")
            states = []
            for k, layer in enumerate(self.layers):
                x, state = layer(x)
                states.append(state)
                if k < len(self.layers) - 1:
                    drop = getattr(self, f"drop{k}")
                    x = drop(x) if batch_first else drop(x.transpose(0, 1)).transpose(0, 1)
            if isinstance(states[0], tuple):
                return x, tuple(torch.cat(parts) for parts in zip(*states, strict=True))
            return x, torch.cat(states)

    return _Split()


def mask_paths(path: str, module: Any) -> list[str]:
    """The dropout paths :func:`split_rnn` gives ``module`` at ``path``."""
    return [f"{path}.drop{k}" for k in range(module.num_layers - 1)]

