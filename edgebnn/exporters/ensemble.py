"""ONNX ensemble graphs: the IR rewritten into standard ONNX that computes the S-sample predictive.

Every mode returns a graph with the IR's input and outputs ``probs`` [B, K], ``entropy`` [B] and
``mutual_info`` [B]. The sample axis is folded into the batch, batch-major (row b·S + s): deterministic
ops (ReLU, pooling, BatchNorm, Flatten, residual Adds) run once on B·S rows and each sampled layer is ONE
batched op, never S unrolled copies.

``baked`` — S posterior samples drawn at export (seeded; the reference runtime's streams) and stored as
constants; no random ops, so it runs on TensorRT and DLA::

    Conv (group g):  [B·S, C, H, W] -> Reshape [B, S·C, H, W] -> Conv(W_s stacked [S·O, C/g, k, k],
                      group S·g) -> [B, S·O, H', W'] -> Reshape [B·S, O, H', W']       (no transposes)
    Gemm:            [B·S, in] -> Reshape [B, S, 1, in] -> MatMul W_s [S, in, out] -> + b_s [S, 1, out]
                      -> Reshape [B·S, out]

``noise`` (:mod:`.noise`) takes standard-normal noise as graph inputs that the host fills;
``analytic`` (:mod:`.analytic`) propagates means and variances in one pass.

Float baselines built from the same IR (for ``profile``): ``float_deterministic`` (posterior mean, one
pass) and ``float_bnn`` (w = mu + sigma·RandomNormal drawn inside the graph on every run, the
bayesian-torch way; S runs make one predictive).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgebnn._io import atomic_write_bytes
from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.exporters._graph import Builder, P, attrs_of, renamed_input, set_metadata, static_shapes
from edgebnn.ir import DOMAIN, BNNModel, EncodedWeight
from edgebnn.runtime.reference import check_samples

MODES = ("baked", "noise", "shared", "analytic")
# A layer rewrite: (builder, node, weight, static shapes) -> nodes added to the builder.
LayerRewrite = Callable[[Builder, onnx.NodeProto, EncodedWeight, dict[str, list[int]]], None]


WEIGHT_FORMATS = ("fp32", "int8", "int4")


def export_onnx(model: BNNModel, samples: int, *, mode: str = "baked", seed: int = 0,
                noise: str = "auto", weights: str = "fp32", hoist: str | float = "off") -> onnx.ModelProto:
    """The S-sample predictive ensemble of ``model`` as a standard ONNX model.

    Args:
        model: the IR.
        samples: ensemble size S (the analytic mode uses it for its logit quadrature).
        mode: ``baked``, ``noise`` or ``analytic``.
        seed: seed of the baked samples.
        noise: for ``mode="noise"``: ``auto``, ``local`` (noise on pre-activations) or ``weight`` (per weight).
        weights: ``fp32``, ``int8`` (baked mode: each member's weights as int8 + DequantizeLinear) or ``int4``
            (Gemm weights block-wise int4 where TensorRT allows it — even output dim —, the rest int8; the graph
            moves to opset 21, which TensorRT 10.3 on Jetson does not parse: for RTX / newer TensorRT).
        hoist: ``off`` (default: every layer samples), ``auto`` (layers whose σ is below their quantization
            step run once, before the sample axis), or a σ threshold. Off by default because it trades
            epistemic signal for speed: on the digits CNN lowered with ``fixed``, ``auto`` hoisted 3 of 4 layers
            and cut the mean mutual information from 0.040 to 0.015.
    """
    check_samples(samples)
    if weights not in WEIGHT_FORMATS:
        raise InvalidOptionError(f"--weights {weights}: choose one of {', '.join(WEIGHT_FORMATS)}")
    if weights != "fp32" and mode != "baked":
        raise InvalidOptionError(f"--weights {weights}: quantized weights are exported in baked mode only")
    if mode == "baked":
        _check_baked_size(model, samples, weights)
        out = _baked(model, samples, seed, weights, hoist)
    elif mode in ("noise", "shared"):
        from edgebnn.exporters.noise import export_noise

        out = export_noise(model, samples, variant="shared" if mode == "shared" else noise, hoist=hoist)
    elif mode == "analytic":
        from edgebnn.exporters.analytic import export_analytic

        out = export_analytic(model, samples)
    else:
        raise InvalidOptionError(f"--mode {mode}: choose one of {', '.join(MODES)}")
    onnx.checker.check_model(out)
    return out


MAX_GRAPH_BYTES = 2**31 - 2**26  # protobuf refuses messages of 2 GiB; keep room for the graph around them
_BYTES_PER_WEIGHT = {"fp32": 4.0, "int8": 1.0, "int4": 0.5}


def _check_baked_size(model: BNNModel, samples: int, weights: str) -> None:
    """Refuse, before drawing anything, a baked graph too large for one ONNX file."""
    n = sum(math.prod(next(a.ints for a in node.attribute if a.name == "shape"))
            for node in model.proto.graph.node if node.domain == DOMAIN)
    need = samples * n * _BYTES_PER_WEIGHT[weights]
    if need > MAX_GRAPH_BYTES:
        most = int(MAX_GRAPH_BYTES // (n * _BYTES_PER_WEIGHT[weights]))
        raise InvalidOptionError(
            f"--samples {samples}: {samples} baked members of {n:,} weights need {need / 2**30:.1f} GiB of "
            f"{weights} constants, over ONNX's 2 GiB file limit; use at most -S {most}, --weights int8, or "
            "--mode noise (noise drawn at run time)"
        )


def quiet_weights(model: BNNModel, hoist: str | float) -> set[str]:
    """Encoded weights whose posterior noise is below the hoisting threshold.

    ``hoist="auto"``: max σ at most the encoding's quantization step (float storage: σ = 0 only);
    a number: max σ at most that value; ``"off"``: none.
    """
    if hoist == "off":
        return set()
    if hoist != "auto" and (not isinstance(hoist, (int, float)) or hoist < 0):
        raise InvalidOptionError(f"--hoist {hoist}: use auto, off or a non-negative sigma")
    out = set()
    for w in model.iter_encoded_weights():  # one layer decoded at a time
        limit = w.encoding.step() if hoist == "auto" else float(hoist)
        if float(w.encoding.stddev().max(initial=0.0)) <= limit:
            out.add(w.name)
    names = set(model.encoded_weight_names())
    for node in model.proto.graph.node:  # a layer samples as a whole: a quiet weight with a noisy bias samples
        own = [x for x in node.input if x in names]
        if any(x not in out for x in own):
            out.difference_update(own)
    return out


def rewrite_sampled_layers(model: BNNModel, samples: int, rewrite: LayerRewrite, b: Builder,
                           hoist: str | float = "off") -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """Copy deterministic nodes, let ``rewrite`` emit each sampled Conv/Gemm, add the predictive head.

    Hoisting: layers whose weights are quiet (:func:`quiet_weights`) run once with their mean, and every
    node before the first sampled layer runs on the B input rows; the sample axis starts there. Values
    computed before that point and used after it are folded to B·S rows then; ``Shape`` nodes read the
    folded input so batch arithmetic sees B·S.

    Returns the float skeleton (for its graph input, opsets and output) and ``{"sampled", "hoisted"}`` layer
    names for the export report.
    """
    encoded = set(model.encoded_weight_names())  # decoded one layer at a time, when its node is reached
    layer_of = {n.output[0]: next((a.s.decode() for a in n.attribute if a.name == "layer"), n.output[0])
                for n in model.proto.graph.node if n.output and n.output[0] in encoded}
    quiet = quiet_weights(model, hoist)
    base = model.weights_as_inputs()  # the skeleton with shapes only: no posterior is copied
    shapes = static_shapes(base)
    in_name = model.manifest.input_name
    del base.graph.input[1:]  # the weights were inputs only for shape inference
    b.adopt(base.graph.initializer)
    for name in quiet:  # hoisted layers run once with their mean
        b.f32(name, model.encoded_weight(name).encoding.mean())
    nodes = list(base.graph.node)
    sampled_at = {i for i, n in enumerate(nodes) if any(x in encoded and x not in quiet for x in n.input)}
    start = _fold_point(nodes, in_name, sampled_at)

    folded: dict[str, str] = {}

    def fold(value: str) -> str:
        """``value`` [B, ...] as [B·S, ...] (once per value)."""
        if value not in folded:
            dims = shapes.get(value)
            if dims is None:
                raise UnsupportedLayerError(f"{model.where}: hoisting needs a static shape for {value!r}; "
                                            "export with --hoist off")
            prefix = P if value == in_name else f"{P}fold/{value}/"
            folded[value] = b.fold_samples(value, prefix + "input" if value == in_name else prefix + "out",
                                           samples, dims[1:], prefix)
            shapes[folded[value]] = dims
        return folded[value]

    pre_data = {in_name}  # data values computed on B rows, before the sample axis starts
    shape_vals: set[str] = set()  # values computed from Shape(...): batch arithmetic
    for i, node in enumerate(nodes):
        uses_shape = any(x in shape_vals for x in node.input)
        uses_data = any(x in pre_data for x in node.input)
        if node.op_type == "Shape" and uses_data:
            node = renamed_input(node, node.input[0], fold(node.input[0]))  # batch arithmetic sees B·S
            shape_vals.update(node.output)
        elif uses_shape and not uses_data:
            shape_vals.update(node.output)
        elif i < start and uses_data:
            pre_data.update(node.output)
        elif i >= start:
            for x in set(node.input) & pre_data:
                node = renamed_input(node, x, fold(x))
        if i not in sampled_at:
            b.nodes.append(node)
            continue
        hit = [x for x in node.input if x in encoded and x not in quiet]
        if node.op_type not in ("Conv", "Gemm") or node.input[1] not in hit:
            raise UnsupportedLayerError(
                f"{model.where}: layer {layer_of[hit[0]]!r}: a sampled weight feeds {node.op_type} "
                f"({node.name or node.output[0]}); ensembles handle Conv and Gemm weights"
            )
        rewrite(b, node, model.encoded_weight(node.input[1]), shapes)
    logits = base.graph.output[0].name
    if logits in pre_data:
        logits = fold(logits)  # every layer was hoisted: S identical members
    b.predictive_head(logits, samples, model.manifest.num_classes)
    sampled = {layer_of[n] for n in encoded if n not in quiet}
    return base, {"sampled": sorted(sampled), "hoisted": sorted({layer_of[n] for n in quiet} - sampled)}


def _fold_point(nodes: list[onnx.NodeProto], in_name: str, sampled_at: set[int]) -> int:
    """Index of the first node that must see B·S rows: a sampled layer, or a data op that uses the batch size
    (e.g. the Reshape of a flatten computed from ``Shape``): hoisted nodes run on B rows before it."""
    data, shape_vals = {in_name}, set()
    for i, node in enumerate(nodes):
        uses_data = any(x in data for x in node.input)
        uses_shape = any(x in shape_vals for x in node.input)
        if i in sampled_at or (uses_data and uses_shape and node.op_type != "Shape"):
            return i
        if (node.op_type == "Shape" and uses_data) or (uses_shape and not uses_data):
            shape_vals.update(node.output)
        elif uses_data:
            data.update(node.output)
    return len(nodes)


def gemm_attrs(node: onnx.NodeProto, w: EncodedWeight) -> dict:
    attrs = attrs_of(node)
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        raise UnsupportedLayerError(f"layer {w.layer!r}: Gemm with transA/alpha/beta is not supported")
    return attrs


def conv_shapes(node: onnx.NodeProto, w: EncodedWeight, shapes: dict[str, list[int]]) -> tuple[list[int], list[int]]:
    xs, ys = shapes.get(node.input[0]), shapes.get(node.output[0])
    if xs is None or ys is None or len(xs) != 4:
        raise UnsupportedLayerError(f"layer {w.layer!r}: Conv needs static 2-D feature shapes (got {xs} -> {ys})")
    return xs, ys


def bias_name(node: onnx.NodeProto) -> str | None:
    return node.input[2] if len(node.input) > 2 and node.input[2] else None


def _baked(model: BNNModel, samples: int, seed: int, weights: str = "fp32", hoist: str | float = "off",
           ) -> onnx.ModelProto:
    index = {name: i for i, name in enumerate(model.encoded_weight_names())}
    b = Builder()

    def draw(w: EncodedWeight) -> np.ndarray:
        """[S, *shape] members of one weight: the reference runtime's stream ``[seed, i]``."""
        return w.encoding.sample(np.random.default_rng([seed, index[w.name]]), samples)

    def bias_samples(node: onnx.NodeProto, out_dim: int) -> np.ndarray | None:
        """Bias as [S, out]: drawn if Bayesian, the deterministic bias repeated otherwise."""
        name = bias_name(node)
        if name is None:
            return None
        if name in index:
            return draw(model.encoded_weight(name))
        fixed = next((t for t in b.inits if t.name == name), None)
        if fixed is None:
            raise UnsupportedLayerError(f"{node.name}: bias {name!r} is not a constant")
        return np.broadcast_to(numpy_helper.to_array(fixed).reshape(1, out_dim), (samples, out_dim))

    def rewrite(b: Builder, node: onnx.NodeProto, w: EncodedWeight, shapes: dict[str, list[int]]) -> None:
        p = f"{P}{w.name}/"
        wsamp = draw(w)  # w is already decoded
        if node.op_type == "Conv":
            (_, c, h, wd), (_, _, h2, w2) = conv_shapes(node, w, shapes)
            attrs = attrs_of(node)
            group = int(attrs.pop("group", 1))
            out_ch = wsamp.shape[1]
            inputs = [b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, samples * c, h, wd)], p + "x"),
                      b.weight(p + "W", wsamp.reshape(samples * out_ch, *wsamp.shape[2:]),
                               "int8" if weights == "int4" else weights)]  # int4 is for GEMMs only
            bias = bias_samples(node, out_ch)
            if bias is not None:
                inputs.append(b.f32(p + "b", bias.reshape(-1)))
            y = b.add("Conv", inputs, p + "y", group=group * samples, **attrs)
            b.add("Reshape", [y, b.i64(p + "out_shape", -1, out_ch, h2, w2)], node.output[0])
            return
        attrs = gemm_attrs(node, w)
        if attrs.get("transB", 0):
            wsamp = wsamp.transpose(0, 2, 1)  # [S, out, in] -> [S, in, out]
        n_in, n_out = wsamp.shape[1], wsamp.shape[2]
        x = b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, samples, 1, n_in)], p + "x")
        fmt = "int8" if weights == "int4" and n_out % 2 else weights  # TensorRT int4: even last dimension
        y = b.add("MatMul", [x, b.weight(p + "W", wsamp, fmt)], p + "xw")
        bias = bias_samples(node, n_out)
        if bias is not None:
            y = b.add("Add", [y, b.f32(p + "b", bias.reshape(samples, 1, n_out))], p + "y")
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, n_out)], node.output[0])

    base, layers = rewrite_sampled_layers(model, samples, rewrite, b, hoist)
    out = b.model(base, list(base.graph.input), f"edgebnn_baked_S{samples}", model.manifest.num_classes)
    set_metadata(out, model, mode="baked", samples=samples, seed=seed, weights=weights, layers=layers)
    return out


def float_deterministic(model: BNNModel) -> onnx.ModelProto:
    """Posterior-mean fp32 network with a Softmax head (output ``probs``): one pass."""
    proto = model.float_model()
    _softmax_output(proto)
    set_metadata(proto, model, mode="float_deterministic", samples=1, seed=None)
    return proto


def float_bnn(model: BNNModel) -> onnx.ModelProto:
    """fp32 Gaussian network drawing every weight with RandomNormal inside the graph (output ``probs``).

    One run is one posterior sample, as bayesian-torch does it; the profiler runs it S times.
    """
    encoded = model.encoded_weights()
    proto = model.float_model()
    graph = proto.graph
    names = {w.name for w in encoded}
    kept = [t for t in graph.initializer if t.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    b = Builder()
    for w in encoded:
        mu = b.f32(f"{P}{w.name}.mu", w.encoding.mean())
        sigma = b.f32(f"{P}{w.name}.sigma", w.encoding.stddev())
        eps = b.add("RandomNormal", [], f"{P}{w.name}.eps", shape=list(w.encoding.shape), dtype=TensorProto.FLOAT)
        b.add("Add", [mu, b.add("Mul", [sigma, eps], f"{P}{w.name}.noise")], w.name)
    graph.initializer.extend(b.inits)
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(b.nodes + rest)
    _softmax_output(proto)
    set_metadata(proto, model, mode="float_bnn", samples=1, seed=None)
    return proto


def save_onnx(proto: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Write deterministically and atomically."""
    return atomic_write_bytes(path, proto.SerializeToString(deterministic=True))


def _softmax_output(proto: onnx.ModelProto) -> None:
    graph = proto.graph
    logits = graph.output[0]
    graph.node.append(helper.make_node("Softmax", [logits.name], ["probs"], axis=-1))
    dims = [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim]
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, dims or None))
