"""ONNX ensemble graphs: the IR rewritten into standard ONNX that computes the S-sample predictive.

``baked`` mode. S posterior samples are drawn at export (seeded; the reference runtime's streams) and
stored as constants; there are no random ops in the graph. The sample axis is folded into the batch,
batch-major (row b·S + s), so every deterministic op (ReLU, pooling, BatchNorm, Flatten) runs once on
B·S rows, and each sampled layer becomes ONE batched op instead of S unrolled copies:

    input [B, ...] -> Unsqueeze(1) -> Expand [B, S, ...] -> Reshape [B·S, ...]
    Conv  (group g):  [B·S, C, H, W] -> Reshape [B, S·C, H, W] -> Conv(W_s stacked [S·O, C/g, k, k],
                       group S·g) -> [B, S·O, H', W'] -> Reshape [B·S, O, H', W']      (no transposes)
    Gemm:             [B·S, in] -> Reshape [B, S, 1, in] -> MatMul W_s [S, in, out] -> + b_s [S, 1, out]
                       -> Reshape [B·S, out]
    head:             logits [B·S, K] -> Reshape [B, S, K] -> p_s = Softmax; probs = mean_s p_s;
                       entropy = -Σ probs·log probs; mutual_info = entropy - mean_s(-Σ p_s·LogSoftmax)

Float baselines built from the same IR (for ``profile``): ``float_deterministic`` (posterior mean, one
pass) and ``float_bnn`` (w = mu + sigma·RandomNormal drawn inside the graph on every run, the
bayesian-torch way; S runs make one predictive).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

from edgebnn._io import atomic_write_bytes
from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.ir import BNNModel
from edgebnn.runtime.reference import check_samples, sample_weights

MODES = ("baked",)
OUTPUTS = ("probs", "entropy", "mutual_info")
_P = "ens/"  # prefix of every value the rewrite adds


def export_onnx(model: BNNModel, samples: int, *, mode: str = "baked", seed: int = 0) -> onnx.ModelProto:
    """The S-sample predictive ensemble as a standard ONNX model (outputs ``probs``, ``entropy``,
    ``mutual_info``)."""
    check_samples(samples)
    if mode not in MODES:
        raise InvalidOptionError(f"--mode {mode}: this edgebnn exports {', '.join(MODES)}")
    encoded = model.encoded_weights()
    drawn = sample_weights(model, samples, seed)
    base = model.float_model()
    shapes = _static_shapes(base)
    layer_of = {w.name: w for w in encoded}

    graph = base.graph
    in_name = model.manifest.input_name
    logits_name = graph.output[0].name
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = [t for t in graph.initializer if t.name not in layer_of]
    tiled = _P + "input"
    shapes[tiled] = shapes[in_name]
    nodes += _fold_samples(in_name, tiled, samples, model.manifest.input_shape[1:], inits)

    for node in graph.node:
        node = _renamed_input(node, in_name, tiled)
        sampled_inputs = [i for i in node.input if i in layer_of]
        if not sampled_inputs:
            nodes.append(node)
            continue
        w = layer_of[sampled_inputs[0]]
        if node.op_type == "Conv" and node.input[1] in layer_of:
            nodes += _conv(node, drawn, shapes, samples, inits, layer_of)
        elif node.op_type == "Gemm" and node.input[1] in layer_of:
            nodes += _gemm(node, drawn, samples, inits, layer_of)
        else:
            raise UnsupportedLayerError(
                f"{model.where}: layer {w.layer!r}: a sampled weight feeds {node.op_type} "
                f"({node.name or node.output[0]}); baked export handles Conv and Gemm weights"
            )
    num_classes = model.manifest.num_classes
    nodes += _predictive_head(logits_name, samples, num_classes, inits)
    outputs = [
        helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", num_classes]),
        helper.make_tensor_value_info("entropy", TensorProto.FLOAT, ["batch"]),
        helper.make_tensor_value_info("mutual_info", TensorProto.FLOAT, ["batch"]),
    ]
    new_graph = helper.make_graph(nodes, f"edgebnn_{mode}_S{samples}", list(graph.input), outputs, inits)
    out = helper.make_model(new_graph, opset_imports=list(base.opset_import), producer_name="edgebnn")
    out.ir_version = base.ir_version
    _set_metadata(out, model, mode=mode, samples=samples, seed=seed)
    onnx.checker.check_model(out)
    return out


def float_deterministic(model: BNNModel) -> onnx.ModelProto:
    """Posterior-mean fp32 network with a Softmax head (output ``probs``): one pass."""
    proto = model.float_model()
    _softmax_output(proto)
    _set_metadata(proto, model, mode="float_deterministic", samples=1, seed=None)
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
    draws: list[onnx.NodeProto] = []
    for w in encoded:
        mu, sigma = f"{_P}{w.name}.mu", f"{_P}{w.name}.sigma"
        graph.initializer.append(numpy_helper.from_array(w.encoding.mean().astype(np.float32), mu))
        graph.initializer.append(numpy_helper.from_array(w.encoding.stddev().astype(np.float32), sigma))
        eps, scaled = f"{_P}{w.name}.eps", f"{_P}{w.name}.noise"
        draws += [
            helper.make_node("RandomNormal", [], [eps], shape=list(w.encoding.shape), dtype=TensorProto.FLOAT),
            helper.make_node("Mul", [sigma, eps], [scaled]),
            helper.make_node("Add", [mu, scaled], [w.name]),
        ]
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(draws + rest)
    _softmax_output(proto)
    _set_metadata(proto, model, mode="float_bnn", samples=1, seed=None)
    return proto


def save_onnx(proto: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Write deterministically and atomically."""
    return atomic_write_bytes(path, proto.SerializeToString(deterministic=True))


# -- rewrite pieces -------------------------------------------------------------------------------------


def _const(inits: list[onnx.TensorProto], name: str, value: np.ndarray) -> str:
    inits.append(numpy_helper.from_array(value, name))
    return name


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _fold_samples(src: str, dst: str, samples: int, dims: list[int], inits: list[onnx.TensorProto]) -> list:
    """input [B, *dims] -> [B·S, *dims], batch-major."""
    axes = _const(inits, _P + "axes1", np.array([1], np.int64))
    expand = _const(inits, _P + "expand_shape", np.array([1, samples] + [1] * len(dims), np.int64))
    flat = _const(inits, _P + "fold_shape", np.array([-1, *dims], np.int64))
    return [
        helper.make_node("Unsqueeze", [src, axes], [_P + "input_1"]),
        helper.make_node("Expand", [_P + "input_1", expand], [_P + "input_s"]),
        helper.make_node("Reshape", [_P + "input_s", flat], [dst]),
    ]


def _renamed_input(node: onnx.NodeProto, old: str, new: str) -> onnx.NodeProto:
    if old not in node.input:
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for i, name in enumerate(copy.input):
        if name == old:
            copy.input[i] = new
    return copy


def _bias_samples(
    node: onnx.NodeProto, drawn: dict[str, np.ndarray], samples: int, out_dim: int, layer_of: dict, base: dict
) -> np.ndarray | None:
    """Bias as [S, out]: drawn if Bayesian, the deterministic bias repeated otherwise, None if absent."""
    if len(node.input) < 3 or not node.input[2]:
        return None
    name = node.input[2]
    if name in layer_of:
        return drawn[name]
    if name not in base:
        raise UnsupportedLayerError(f"{node.name}: bias {name!r} is not a constant")
    return np.broadcast_to(base[name].reshape(1, out_dim), (samples, out_dim))


def _conv(node, drawn, shapes, samples, inits, layer_of) -> list[onnx.NodeProto]:
    w = layer_of[node.input[1]]
    x_name, y_name = node.input[0], node.output[0]
    xs, ys = shapes.get(x_name), shapes.get(y_name)
    if xs is None or ys is None or len(xs) != 4:
        raise UnsupportedLayerError(f"layer {w.layer!r}: Conv needs static 2-D feature shapes (got {xs} -> {ys})")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    group = int(attrs.pop("group", 1))
    wsamp = drawn[w.name]  # [S, O, C/g, kh, kw]
    out_ch = wsamp.shape[1]
    base = {t.name: numpy_helper.to_array(t) for t in inits}
    bias = _bias_samples(node, drawn, samples, out_ch, layer_of, base)
    p = f"{_P}{w.name}/"
    inputs = [p + "x", _const(inits, p + "W", wsamp.reshape(samples * out_ch, *wsamp.shape[2:]))]
    if bias is not None:
        inputs.append(_const(inits, p + "b", np.ascontiguousarray(bias, np.float32).reshape(-1)))
    _, c, h, wd = xs
    _, _, h2, w2 = ys
    return [
        helper.make_node("Reshape", [x_name, _const(inits, p + "in_shape", _i64(-1, samples * c, h, wd))], [p + "x"]),
        helper.make_node("Conv", inputs, [p + "y"], group=group * samples, **attrs),
        helper.make_node("Reshape", [p + "y", _const(inits, p + "out_shape", _i64(-1, out_ch, h2, w2))], [y_name]),
    ]


def _gemm(node, drawn, samples, inits, layer_of) -> list[onnx.NodeProto]:
    w = layer_of[node.input[1]]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        raise UnsupportedLayerError(f"layer {w.layer!r}: Gemm with transA/alpha/beta is not supported")
    wsamp = drawn[w.name]
    if attrs.get("transB", 0):
        wsamp = wsamp.transpose(0, 2, 1)  # [S, out, in] -> [S, in, out]
    n_in, n_out = wsamp.shape[1], wsamp.shape[2]
    base = {t.name: numpy_helper.to_array(t) for t in inits}
    bias = _bias_samples(node, drawn, samples, n_out, layer_of, base)
    p = f"{_P}{w.name}/"
    in_shape = _const(inits, p + "in_shape", _i64(-1, samples, 1, n_in))
    nodes = [
        helper.make_node("Reshape", [node.input[0], in_shape], [p + "x"]),
        helper.make_node("MatMul", [p + "x", _const(inits, p + "W", np.ascontiguousarray(wsamp, np.float32))],
                         [p + "xw"]),
    ]
    last = p + "xw"
    if bias is not None:
        b = _const(inits, p + "b", np.ascontiguousarray(bias, np.float32).reshape(samples, 1, n_out))
        nodes.append(helper.make_node("Add", [last, b], [p + "y"]))
        last = p + "y"
    out_shape = _const(inits, p + "out_shape", np.array([-1, n_out], np.int64))
    nodes.append(helper.make_node("Reshape", [last, out_shape], [node.output[0]]))
    return nodes


def _predictive_head(logits: str, samples: int, classes: int, inits: list[onnx.TensorProto]) -> list:
    p = _P + "head/"
    shape = _const(inits, p + "shape", np.array([-1, samples, classes], np.int64))
    ax1 = _const(inits, p + "axis1", np.array([1], np.int64))
    axk = _const(inits, p + "axis_last", np.array([-1], np.int64))
    eps = _const(inits, p + "eps", np.array(1e-12, np.float32))
    zero = _const(inits, p + "zero", np.array(0.0, np.float32))
    return [
        helper.make_node("Reshape", [logits, shape], [p + "logits3"]),
        helper.make_node("Softmax", [p + "logits3"], [p + "p_s"], axis=-1),
        helper.make_node("LogSoftmax", [p + "logits3"], [p + "logp_s"], axis=-1),
        helper.make_node("ReduceMean", [p + "p_s", ax1], ["probs"], keepdims=0),
        helper.make_node("Max", ["probs", eps], [p + "probs_eps"]),
        helper.make_node("Log", [p + "probs_eps"], [p + "logprobs"]),
        helper.make_node("Mul", ["probs", p + "logprobs"], [p + "plogp"]),
        helper.make_node("ReduceSum", [p + "plogp", axk], [p + "neg_entropy"], keepdims=0),
        helper.make_node("Neg", [p + "neg_entropy"], ["entropy"]),
        helper.make_node("Mul", [p + "p_s", p + "logp_s"], [p + "plogp_s"]),
        helper.make_node("ReduceSum", [p + "plogp_s", axk], [p + "neg_entropy_s"], keepdims=0),
        helper.make_node("ReduceMean", [p + "neg_entropy_s", ax1], [p + "neg_expected_entropy"], keepdims=0),
        helper.make_node("Sub", [p + "neg_entropy", p + "neg_expected_entropy"], [p + "neg_mi"]),  # -H + E[H_s]
        helper.make_node("Neg", [p + "neg_mi"], [p + "mi_raw"]),
        helper.make_node("Max", [p + "mi_raw", zero], ["mutual_info"]),  # MI >= 0; clamps round-off
    ]


def _softmax_output(proto: onnx.ModelProto) -> None:
    graph = proto.graph
    logits = graph.output[0]
    graph.node.append(helper.make_node("Softmax", [logits.name], ["probs"], axis=-1))
    dims = [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim]
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, dims or None))


def _static_shapes(proto: onnx.ModelProto) -> dict[str, list[int]]:
    """Shapes of every value with the batch set to 1 (non-batch dims must be static)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    dims = probe.graph.input[0].type.tensor_type.shape.dim
    dims[0].Clear()
    dims[0].dim_value = 1
    inferred = shape_inference.infer_shapes(probe, data_prop=True)
    out: dict[str, list[int]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        shape = vi.type.tensor_type.shape
        if all(d.HasField("dim_value") for d in shape.dim):
            out[vi.name] = [d.dim_value for d in shape.dim]
    return out


def _set_metadata(proto: onnx.ModelProto, model: BNNModel, *, mode: str, samples: int, seed: int | None) -> None:
    import json

    from edgebnn import __version__

    del proto.metadata_props[:]
    meta = {
        "edgebnn_version": __version__,
        "mode": mode,
        "samples": samples,
        "seed": seed,
        "scheme": model.manifest.scheme,
        "source_library": model.manifest.source_library,
        "input_shape": model.manifest.input_shape,
        "num_classes": model.manifest.num_classes,
        "outputs": list(OUTPUTS) if mode == "baked" else ["probs"],
    }
    entry = proto.metadata_props.add()
    entry.key, entry.value = "edgebnn.export", json.dumps(meta, sort_keys=True)
