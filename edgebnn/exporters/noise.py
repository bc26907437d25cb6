"""``noise`` mode: the graph takes standard-normal noise as inputs; the host fills them (cheap, seedable).

No random ops in the graph (TensorRT ignores their seeds, DLA cannot run them, and onnxruntime's
RandomNormal dominated a 16-sample LeNet's time, docs/design.md). Variants:

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

``shared`` (stochastic weight sharing, 2DGBNN): a ``CodebookWeight`` layer takes K standard-normal numbers
per sample, ``c = m + s ⊙ ε`` [S, K], and its weights gather their entry, ``W_s = c[:, index]``; outliers
draw independently (input ``noise/<weight>.outliers``) and blended weights pick their entry with a uniform
input (``noise/<weight>.blend``), exactly as ``CodebookWeight.sample`` does. Other layers follow ``auto``.

Noise inputs are recorded in the export metadata (``noise_inputs``: name, shape with -1 for the B·S rows,
``per`` = ``row`` or ``sample``); :class:`edgebnn.runtime.Session` fills them.
"""

from __future__ import annotations

import numpy as np
import onnx

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters._graph import Builder, P, attrs_of, set_metadata
from edgebnn.ir import BNNModel, EncodedWeight

VARIANTS = ("auto", "local", "weight", "shared")
ROWS = "batch_x_samples"


def export_noise(model: BNNModel, samples: int, *, variant: str = "auto", hoist: str | float = "off",
                 ) -> onnx.ModelProto:
    from edgebnn.exporters.ensemble import bias_name, conv_shapes, gemm_attrs, rewrite_sampled_layers

    if variant not in VARIANTS:
        raise InvalidOptionError(f"--noise {variant}: choose {' or '.join(VARIANTS)}")
    encoded = {w.name: w for w in model.encoded_weights()}
    kinds = {w.encoding.op_type for w in encoded.values()}
    if variant == "shared" and "CodebookWeight" not in kinds:
        raise InvalidOptionError(
            f"{model.where}: --mode shared needs codebook layers (lower with --scheme codebook); this IR has "
            f"{', '.join(sorted(kinds))}: use --mode baked or noise"
        )
    for w in encoded.values():
        codebook_ok = variant in ("shared", "weight") and w.encoding.op_type == "CodebookWeight"
        if not (w.encoding.GAUSSIAN or codebook_ok):
            raise InvalidOptionError(
                f"{model.where}: layer {w.layer!r} is {w.encoding.op_type}, which --mode noise cannot draw "
                f"(it draws Gaussian weights{' and codebooks' if variant == 'weight' else ''}): use --mode baked"
                + (" or shared" if w.encoding.op_type == "CodebookWeight" else "")
            )
    records: list[dict] = []
    b = Builder()

    def bias_of(node: onnx.NodeProto) -> tuple[EncodedWeight | None, str | None]:
        """(the Bayesian bias, or None; the bias value name, or None)."""
        bias = bias_name(node)
        return (encoded.get(bias) if bias else None), bias

    def noise_input(name: str, dims: list[int], per: str, dist: str = "normal") -> str:
        records.append({"name": name, "shape": [-1 if per == "row" else samples, *dims], "per": per, "dist": dist})
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

    def gaussian_draw(w: EncodedWeight) -> str:
        """W_s = mu + sigma ⊙ ε_s, [S, *shape]."""
        p = f"{P}{w.name}/"
        mu, sigma = b.f32(p + "mu", w.encoding.mean()), b.f32(p + "sigma", w.encoding.stddev())
        eps = noise_input(f"noise/{w.name}", list(w.encoding.shape), "sample")
        return b.add("Add", [mu, b.add("Mul", [sigma, eps], p + "scaled")], p + "W_s")

    def codebook_draw(w: EncodedWeight) -> str:
        """2DGBNN sampling in the graph: one value per codebook entry per sample, shared by its weights."""
        p = f"{P}{w.name}/"
        enc = w.encoding
        eps = noise_input(f"noise/{w.name}", [enc.k], "sample")
        c = b.add("Add", [b.f32(p + "cb_mean", enc.codebook[:, 0]),
                          b.add("Mul", [b.f32(p + "cb_std", enc.codebook[:, 1]), eps], p + "cb_scaled")], p + "c")
        idx = b.add("Cast", [b.const(p + "indices", enc.indices.astype(np.uint8 if enc.k <= 256 else np.uint16))],
                    p + "idx", to=onnx.TensorProto.INT64)
        flat = b.add("Gather", [c, idx], p + "w_inliers", axis=1)  # [S, n]
        if enc.blend_index.size:
            j = enc.blend_components.shape[1]
            u = noise_input(f"noise/{w.name}.blend", [enc.blend_index.size], "sample", dist="uniform")
            cum = np.cumsum(enc.blend_weights(), axis=1)[:, :-1]  # pick = #{cum_j <= u}, as CodebookWeight.sample
            ge = b.add("GreaterOrEqual", [b.add("Unsqueeze", [u, b.i64(p + "ax2", 2)], p + "u3"),
                                          b.f32(p + "cum", cum[None])], p + "ge")
            pick = b.add("ReduceSum", [b.add("Cast", [ge], p + "ge_i", to=onnx.TensorProto.INT64),
                                       b.i64(p + "ax2b", 2)], p + "pick", keepdims=1)  # [S, n_b, 1]
            comps = b.add("Expand", [b.const(p + "blend_comp", enc.blend_components.astype(np.int64)[None]),
                                     b.i64(p + "bshape", samples, enc.blend_index.size, j)], p + "comps")
            comp = b.add("Squeeze", [b.add("GatherElements", [comps, pick], p + "comp3", axis=2),
                                     b.i64(p + "ax2c", 2)], p + "comp")
            vals = b.add("GatherElements", [c, comp], p + "blend_vals", axis=1)
            flat = _scatter(b, flat, enc.blend_index, vals, samples, p + "blend")
        if enc.outlier_index.size:
            eps_o = noise_input(f"noise/{w.name}.outliers", [enc.outlier_index.size], "sample")
            vals = b.add("Add", [b.f32(p + "o_mu", enc.outlier_mu),
                                 b.add("Mul", [b.f32(p + "o_sigma", enc.outlier_sigma), eps_o], p + "o_s")], p + "o")
            flat = _scatter(b, flat, enc.outlier_index, vals, samples, p + "outliers")
        return b.add("Reshape", [flat, b.i64(p + "draw_shape", samples, *enc.shape)], p + "W_s")

    def weight(b: Builder, node: onnx.NodeProto, w: EncodedWeight, shapes: dict[str, list[int]]) -> None:
        p = f"{P}{w.name}/"
        bias_w, bias = bias_of(node)
        ws = codebook_draw(w) if w.encoding.op_type == "CodebookWeight" else gaussian_draw(w)  # [S, *shape]
        transposed = node.op_type == "Gemm" and not attrs_of(node).get("transB", 0)  # Gemm weight [in, out]
        out_dim = int(w.encoding.shape[1] if transposed else w.encoding.shape[0])
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
            n_in, n_out = int(w.encoding.shape[0]), out_dim
        x = b.add("Reshape", [node.input[0], b.i64(p + "in_shape", -1, samples, 1, n_in)], p + "x")
        y = b.add("MatMul", [x, ws], p + "xw")
        if bias_s is not None:
            y = b.add("Add", [y, b.add("Unsqueeze", [bias_s, b.i64(p + "axis1", 1)], p + "b3")], p + "y")
        b.add("Reshape", [y, b.i64(p + "out_shape", -1, n_out)], node.output[0])

    def auto(b: Builder, node: onnx.NodeProto, w: EncodedWeight, shapes: dict[str, list[int]]) -> None:
        (weight if node.op_type == "Conv" else local)(b, node, w, shapes)

    def shared(b: Builder, node: onnx.NodeProto, w: EncodedWeight, shapes: dict[str, list[int]]) -> None:
        (weight if w.encoding.op_type == "CodebookWeight" else auto)(b, node, w, shapes)

    rewrite = {"auto": auto, "local": local, "weight": weight, "shared": shared}[variant]
    base, layers = rewrite_sampled_layers(model, samples, rewrite, b, hoist)
    mode = "shared" if variant == "shared" else "noise"
    out = b.model(base, list(base.graph.input), f"edgebnn_{mode}_{variant}_S{samples}", model.manifest.num_classes)
    set_metadata(out, model, mode=mode, samples=samples, seed=None, noise=variant, noise_inputs=records,
                 layers=layers)
    return out


def _scatter(b: Builder, flat: str, index: np.ndarray, values: str, samples: int, p: str) -> str:
    """flat[:, index] = values, for [S, n] flat and [S, len(index)] values."""
    const = b.const(p + "_idx", index.astype(np.int64)[None])
    idx = b.add("Expand", [const, b.i64(p + "_ishape", samples, index.size)], p + "_idx_s")
    return b.add("ScatterElements", [flat, idx, values], p + "_w", axis=1)


def fill_noise(noise_inputs: list[dict], batch: int, samples: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Standard-normal float32 arrays for every noise input of a ``noise`` graph, for ``batch`` inputs."""
    out = {}
    for rec in noise_inputs:
        shape = [batch * samples if rec["per"] == "row" else samples, *rec["shape"][1:]]
        if rec.get("dist", "normal") == "uniform":
            out[rec["name"]] = rng.random(shape, dtype=np.float32)
        else:
            out[rec["name"]] = rng.standard_normal(shape, dtype=np.float32)
    return out
