"""``noise`` mode: the graph takes standard-normal noise as inputs; the host fills them (cheap, seedable).

No random ops in the graph (TensorRT ignores their seeds, DLA cannot run them, and onnxruntime's
RandomNormal dominated a 16-sample LeNet's time, FACTS.md). Variants:

``local`` (local reparameterization, Kingma et al. 2015): a Gaussian layer's pre-activation given its input
is Gaussian, so each of the B·S rows draws it directly::

    mean = Conv(x, mu) + b_mu,   var = Conv(x², sigma²) + b_sigma²,   y = mean + sqrt(var) ⊙ ε_row
    ε: input ``noise/<weight>`` of shape [B·S, *layer output]          (weights stay shared: no grouped conv)

``weight``: one weight draw per sample, W_s = mu + sigma ⊙ ε_s, then the batched layer of ``baked``::

    ε: input ``noise/<weight>`` of shape [S, *weight shape] (and ``noise/<bias>`` [S, out])

``local`` is exact for Gemm (each output unit has its own weights) but only approximate for Conv: it draws
every spatial position independently, while a sampled kernel is shared across positions. ``auto`` (the
default) is exact everywhere and keeps noise small: ``weight`` for Conv (kernels are small), ``local`` for
Gemm (a row's outputs are fewer than the layer's weights).

Noise inputs are recorded in the export metadata (``noise_inputs``: name, shape with -1 for the B·S rows,
``per`` = ``row`` or ``sample``); :class:`edgebnn.runtime.Session` fills them.
"""

from __future__ import annotations

import numpy as np
import onnx

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters._graph import Builder, P, attrs_of, set_metadata
from edgebnn.ir import BNNModel, EncodedWeight

VARIANTS = ("auto", "local", "weight")
# Encodings whose samples are Gaussian given their stored mean and stddev (others sample discrete levels).
GAUSSIAN_ENCODINGS = frozenset({"GaussianWeight", "FixedPointWeight", "IntCountWeight"})
ROWS = "batch_x_samples"


def export_noise(model: BNNModel, samples: int, *, variant: str = "auto") -> onnx.ModelProto:
    from edgebnn.exporters.ensemble import bias_name, conv_shapes, gemm_attrs, rewrite_sampled_layers

    if variant not in VARIANTS:
        raise InvalidOptionError(f"--noise {variant}: choose {' or '.join(VARIANTS)}")
    encoded = {w.name: w for w in model.encoded_weights()}
    for w in encoded.values():
        if w.encoding.op_type not in GAUSSIAN_ENCODINGS:
            raise InvalidOptionError(
                f"{model.where}: layer {w.layer!r} is {w.encoding.op_type}, which samples discrete values; "
                "--mode noise draws Gaussian weights: use --mode baked (or shared for codebooks)"
            )
    records: list[dict] = []
    b = Builder()

    def bias_of(node: onnx.NodeProto) -> tuple[EncodedWeight | None, str | None]:
        """(the Bayesian bias, or None; the bias value name, or None)."""
        bias = bias_name(node)
        return (encoded.get(bias) if bias else None), bias

    def noise_input(name: str, dims: list[int], per: str) -> str:
        records.append({"name": name, "shape": [-1 if per == "row" else samples, *dims], "per": per})
        return b.input(name, [ROWS if per == "row" else samples, *dims])

    def local(b: Builder, node: onnx.NodeProto, w: EncodedWeight, shapes: dict[str, list[int]]) -> None:
        p = f"{P}{w.name}/"
        bias_w, bias = bias_of(node)
        mu = b.f32(p + "mu", w.encoding.mean())
        x = node.input[0]
        x2 = b.add("Mul", [x, x], p + "x2")
        var_w = b.f32(p + "sigma2", w.encoding.stddev() ** 2)
        mean_in, var_in = [x, mu], [x2, var_w]
        if bias_w is not None:
            mean_in.append(b.f32(p + "b_mu", bias_w.encoding.mean()))
            var_in.append(b.f32(p + "b_sigma2", bias_w.encoding.stddev() ** 2))
        elif bias:
            mean_in.append(bias)
        if node.op_type == "Conv":
            _, (_, o, h2, w2) = conv_shapes(node, w, shapes)
            attrs = attrs_of(node)
            mean = b.add("Conv", mean_in, p + "mean", **attrs)
            var = b.add("Conv", var_in, p + "var", **attrs)
            dims = [o, h2, w2]
        else:
            attrs = gemm_attrs(node, w)
            mean = b.add("Gemm", mean_in, p + "mean", **attrs)
            var = b.add("Gemm", var_in, p + "var", **attrs)
            dims = [int(w.encoding.shape[0] if attrs.get("transB", 0) else w.encoding.shape[1])]
        eps = noise_input(f"noise/{w.name}", dims, "row")
        std = b.add("Sqrt", [var], p + "std")
        b.add("Add", [mean, b.add("Mul", [std, eps], p + "scaled")], node.output[0])

    def weight(b: Builder, node: onnx.NodeProto, w: EncodedWeight, shapes: dict[str, list[int]]) -> None:
        p = f"{P}{w.name}/"
        bias_w, bias = bias_of(node)
        mu, sigma = b.f32(p + "mu", w.encoding.mean()), b.f32(p + "sigma", w.encoding.stddev())
        eps = noise_input(f"noise/{w.name}", list(w.encoding.shape), "sample")
        ws = b.add("Add", [mu, b.add("Mul", [sigma, eps], p + "scaled")], p + "W_s")  # [S, *shape]
        out_dim = int(w.encoding.shape[0])
        bias_s = None
        if bias_w is not None:
            beps = noise_input(f"noise/{bias_w.name}", [out_dim], "sample")
            bmu, bsig = b.f32(p + "b_mu", bias_w.encoding.mean()), b.f32(p + "b_sigma", bias_w.encoding.stddev())
            bias_s = b.add("Add", [bmu, b.add("Mul", [bsig, beps], p + "b_scaled")], p + "b_s")  # [S, out]
        elif bias:
            bias_s = b.add("Expand", [bias, b.i64(p + "b_expand", samples, out_dim)], p + "b_s")
        if node.op_type == "Conv":
            (_, c, h, wd), (_, _, h2, w2) = conv_shapes(node, w, shapes)
            attrs = attrs_of(node)
            group = int(attrs.pop("group", 1))
            wflat = b.add("Reshape", [ws, b.i64(p + "w_shape", samples * out_dim, *w.encoding.shape[1:])], p + "W")
            inputs = [b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, samples * c, h, wd)], p + "x"), wflat]
            if bias_s is not None:
                inputs.append(b.add("Reshape", [bias_s, b.i64(p + "b_shape", -1)], p + "b"))
            y = b.add("Conv", inputs, p + "y", group=group * samples, **attrs)
            b.add("Reshape", [y, b.i64(p + "out_shape", -1, out_dim, h2, w2)], node.output[0])
            return
        attrs = gemm_attrs(node, w)
        if attrs.get("transB", 0):
            ws = b.add("Transpose", [ws], p + "W_t", perm=[0, 2, 1])  # [S, out, in] -> [S, in, out]
            n_in, n_out = int(w.encoding.shape[1]), out_dim
        else:
            n_in, n_out = out_dim, int(w.encoding.shape[1])
        x = b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, samples, 1, n_in)], p + "x")
        y = b.add("MatMul", [x, ws], p + "xw")
        if bias_s is not None:
            y = b.add("Add", [y, b.add("Unsqueeze", [bias_s, b.i64(p + "axis1", 1)], p + "b3")], p + "y")
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, n_out)], node.output[0])

    def auto(b: Builder, node: onnx.NodeProto, w: EncodedWeight, shapes: dict[str, list[int]]) -> None:
        (weight if node.op_type == "Conv" else local)(b, node, w, shapes)

    rewrite = {"auto": auto, "local": local, "weight": weight}[variant]
    base = rewrite_sampled_layers(model, samples, rewrite, b)
    out = b.model(base, list(base.graph.input), f"edgebnn_noise_{variant}_S{samples}", model.manifest.num_classes)
    set_metadata(out, model, mode="noise", samples=samples, seed=None, noise=variant, noise_inputs=records)
    return out


def fill_noise(noise_inputs: list[dict], batch: int, samples: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Standard-normal float32 arrays for every noise input of a ``noise`` graph, for ``batch`` inputs."""
    out = {}
    for rec in noise_inputs:
        shape = [batch * samples if rec["per"] == "row" else samples, *rec["shape"][1:]]
        out[rec["name"]] = rng.standard_normal(shape, dtype=np.float32)
    return out
