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

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgebnn._io import atomic_write_bytes
from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.exporters._graph import Builder, P, attrs_of, renamed_input, set_metadata, static_shapes
from edgebnn.ir import BNNModel, EncodedWeight
from edgebnn.runtime.reference import check_samples, sample_weights

MODES = ("baked", "noise", "shared", "analytic")
# A layer rewrite: (builder, node, weight, static shapes) -> nodes added to the builder.
LayerRewrite = Callable[[Builder, onnx.NodeProto, EncodedWeight, dict[str, list[int]]], None]


WEIGHT_FORMATS = ("fp32", "int8")


def export_onnx(model: BNNModel, samples: int, *, mode: str = "baked", seed: int = 0,
                noise: str = "auto", weights: str = "fp32") -> onnx.ModelProto:
    """The S-sample predictive ensemble of ``model`` as a standard ONNX model.

    Args:
        model: the IR.
        samples: ensemble size S (the analytic mode uses it for its logit quadrature).
        mode: ``baked``, ``noise`` or ``analytic``.
        seed: seed of the baked samples.
        noise: for ``mode="noise"``: ``auto``, ``local`` (noise on pre-activations) or ``weight`` (per weight).
        weights: ``fp32`` or ``int8`` (baked mode: each member's weights as int8 + DequantizeLinear).
    """
    check_samples(samples)
    if weights not in WEIGHT_FORMATS:
        raise InvalidOptionError(f"--weights {weights}: choose one of {', '.join(WEIGHT_FORMATS)}")
    if weights != "fp32" and mode != "baked":
        raise InvalidOptionError(f"--weights {weights}: quantized weights are exported in baked mode only")
    if mode == "baked":
        out = _baked(model, samples, seed, weights)
    elif mode in ("noise", "shared"):
        from edgebnn.exporters.noise import export_noise

        out = export_noise(model, samples, variant="shared" if mode == "shared" else noise)
    elif mode == "analytic":
        from edgebnn.exporters.analytic import export_analytic

        out = export_analytic(model, samples)
    else:
        raise InvalidOptionError(f"--mode {mode}: choose one of {', '.join(MODES)}")
    onnx.checker.check_model(out)
    return out


def rewrite_sampled_layers(model: BNNModel, samples: int, rewrite: LayerRewrite, b: Builder) -> onnx.ModelProto:
    """Fold the input to B·S rows, copy deterministic nodes, let ``rewrite`` emit each sampled Conv/Gemm.

    Returns the float skeleton (for its graph input, opsets and output name).
    """
    encoded = {w.name: w for w in model.encoded_weights()}
    base = model.float_model()
    shapes = static_shapes(base)
    in_name = model.manifest.input_name
    b.adopt(t for t in base.graph.initializer if t.name not in encoded)
    tiled = b.fold_samples(in_name, P + "input", samples, model.manifest.input_shape[1:])
    shapes[tiled] = shapes[in_name]
    for node in base.graph.node:
        node = renamed_input(node, in_name, tiled)
        hit = [i for i in node.input if i in encoded]
        if not hit:
            b.nodes.append(node)
        elif node.op_type in ("Conv", "Gemm") and node.input[1] in encoded:
            rewrite(b, node, encoded[node.input[1]], shapes)
        else:
            w = encoded[hit[0]]
            raise UnsupportedLayerError(
                f"{model.where}: layer {w.layer!r}: a sampled weight feeds {node.op_type} "
                f"({node.name or node.output[0]}); ensembles handle Conv and Gemm weights"
            )
    b.predictive_head(base.graph.output[0].name, samples, model.manifest.num_classes)
    return base


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


def _baked(model: BNNModel, samples: int, seed: int, weights: str = "fp32") -> onnx.ModelProto:
    drawn = sample_weights(model, samples, seed)
    b = Builder()

    def bias_samples(node: onnx.NodeProto, out_dim: int) -> np.ndarray | None:
        """Bias as [S, out]: drawn if Bayesian, the deterministic bias repeated otherwise."""
        name = bias_name(node)
        if name is None:
            return None
        if name in drawn:
            return drawn[name]
        fixed = next((t for t in b.inits if t.name == name), None)
        if fixed is None:
            raise UnsupportedLayerError(f"{node.name}: bias {name!r} is not a constant")
        return np.broadcast_to(numpy_helper.to_array(fixed).reshape(1, out_dim), (samples, out_dim))

    def rewrite(b: Builder, node: onnx.NodeProto, w: EncodedWeight, shapes: dict[str, list[int]]) -> None:
        p = f"{P}{w.name}/"
        wsamp = drawn[w.name]
        if node.op_type == "Conv":
            (_, c, h, wd), (_, _, h2, w2) = conv_shapes(node, w, shapes)
            attrs = attrs_of(node)
            group = int(attrs.pop("group", 1))
            out_ch = wsamp.shape[1]
            inputs = [b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, samples * c, h, wd)], p + "x"),
                      b.weight(p + "W", wsamp.reshape(samples * out_ch, *wsamp.shape[2:]), weights)]
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
        y = b.add("MatMul", [x, b.weight(p + "W", wsamp, weights)], p + "xw")
        bias = bias_samples(node, n_out)
        if bias is not None:
            y = b.add("Add", [y, b.f32(p + "b", bias.reshape(samples, 1, n_out))], p + "y")
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, n_out)], node.output[0])

    base = rewrite_sampled_layers(model, samples, rewrite, b)
    out = b.model(base, list(base.graph.input), f"edgebnn_baked_S{samples}", model.manifest.num_classes)
    set_metadata(out, model, mode="baked", samples=samples, seed=seed, weights=weights)
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
