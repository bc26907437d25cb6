"""Recurrent graphs in the exporters: sequence-major values in the sample fold, and what analytic mode refuses.

What the importer gives (:mod:`edgebnn.importers.recurrent`): ``nn.LSTM``/``nn.GRU`` as ONNX ``LSTM``/``GRU``
nodes with deterministic weights and no initial state (the op's default, zeros of its input's batch, so any
B·S works); bayesian-torch's LSTMs unrolled over time into ``Gemm`` nodes, each reading its own copy
(``name@t``) of ``ih``/``hh``, which every mode samples as it samples any Gemm layer.

**The fold on another axis.** ``torch.onnx.export`` makes a batch-first sequence sequence-major for the
``LSTM`` op (``Transpose [B, T, F] -> [T, B, F]``; its output ``Y`` is ``[T, dirs, B, H]``). A value computed
before the sample axis starts and folded afterwards (:func:`edgebnn.exporters.rewrite.rewrite_sampled_layers`)
must be folded on its batch axis, which need not be axis 0::

    x [.., B, ..] (batch on axis a) -> Unsqueeze(a + 1) -> Expand (S on axis a + 1) -> Reshape [.., B·S, ..]

(row b·S + s on axis a: the layout of every other folded value). :func:`batch_axes` finds axis a by inferring
the shapes at batch 1 and at batch 2: the one axis that is 1 and then 2.

**Analytic mode** propagates means and variances through feed-forward ops; through an LSTM/GRU cell (products
of sigmoids and tanh of correlated Gaussians, fed back over time) it has no closed form, so it refuses a
recurrent graph in one line (:func:`refuse_recurrent`).
"""

from __future__ import annotations

import onnx
from onnx import shape_inference

from edgebnn.errors import UnsupportedLayerError
from edgebnn.exporters._graph import Builder, static_shapes
from edgebnn.ir import BNNModel

RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})
MOVES_BATCH = RECURRENT_OPS | {"Transpose"}  # ops after which a value's batch axis may not be axis 0
USE_SEPARATOR = "@"  # an unrolled layer's per-step copy of a weight: rnn.ih.weight@3 (edgebnn.importers.recurrent)


def batch_axes(proto: onnx.ModelProto) -> dict[str, int]:
    """``{value: its batch axis}`` for every value whose shapes at batch 1 and 2 differ in one axis, 1 -> 2."""
    one = static_shapes(proto)
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    dim = probe.graph.input[0].type.tensor_type.shape.dim[0]
    dim.Clear()
    dim.dim_value = 2
    inferred = shape_inference.infer_shapes(probe, data_prop=True)
    out: dict[str, int] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if vi.name not in one or len(dims) != len(one[vi.name]) or not all(d.HasField("dim_value") for d in dims):
            continue
        two = [d.dim_value for d in dims]
        differ = [k for k, (a, b) in enumerate(zip(one[vi.name], two, strict=True)) if a != b]
        if len(differ) == 1 and (one[vi.name][differ[0]], two[differ[0]]) == (1, 2):
            out[vi.name] = differ[0]
    return out


def fold_on_axis(b: Builder, src: str, dst: str, samples: int, dims: list[int], axis: int, prefix: str) -> str:
    """``src`` with the batch on ``axis`` (``dims``: its shape at batch 1) as B·S rows on that axis, row b·S + s."""
    x = b.add("Unsqueeze", [src, b.i64(prefix + "axes", axis + 1)], prefix + "input_1")
    expand = [1] * (len(dims) + 1)
    expand[axis + 1] = samples
    x = b.add("Expand", [x, b.i64(prefix + "expand_shape", *expand)], prefix + "input_s")
    flat = list(dims)
    flat[axis] = -1
    return b.add("Reshape", [x, b.i64(prefix + "fold_shape", *flat)], dst)


def refuse_recurrent(model: BNNModel, mode: str) -> None:
    """Raise for a graph with a recurrent op or an unrolled recurrent layer (a weight drawn per step)."""
    node = next((n for n in model.proto.graph.node if n.op_type in RECURRENT_OPS), None)
    if node is not None:
        raise UnsupportedLayerError(f"{model.where}: {node.op_type} node {node.name or node.output[0]!r}: {mode} mode "
                                    "does not propagate moments through recurrent layers; use --mode baked or noise")
    for name in model.encoded_weight_names():
        if USE_SEPARATOR in name:
            layer = name.split(USE_SEPARATOR)[0].rsplit(".", 1)[0]
            raise UnsupportedLayerError(f"{model.where}: layer {layer!r} is recurrent (its weights are drawn at "
                                        f"every step); {mode} mode does not propagate moments through recurrent "
                                        "layers; use --mode baked or noise")
