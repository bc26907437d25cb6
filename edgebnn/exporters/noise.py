"""``noise`` mode: the graph draws with standard-normal noise: inputs the host fills (cheap, seedable), or random
ops inside the graph.

``rng="host"`` (the library default, and TensorRT's): no random ops in the graph (TensorRT ignores their seeds,
DLA cannot run them, and onnxruntime's RandomNormal dominated a 16-sample LeNet's time, docs/design.md);
:class:`edgebnn.runtime.Session` fills the noise inputs. ``rng="graph"``: each noise input becomes a seeded
``RandomNormal`` / ``RandomUniform`` ([S, *dims], per sample; [*dims] once per call), or ``RandomNormalLike``
(per row: shaped like the layer's mean pre-activation, [B·S, *dims]), so the data is the graph's only input;
every call draws afresh. onnxruntime draws ~11-17 ns per normal on one thread, so in the graph the number of
draws is the cost: ``auto`` then uses Flipout on large weights (below).

μ and σ (and a codebook's indices) are written by the stores of the ``weights`` choice (:mod:`.stores`: the IR's
own packed codes by default) and decoded once per call, shared by the S samples. Variants:

``local`` (local reparameterization, Kingma et al. 2015): a Gaussian layer's pre-activation given its input
is Gaussian, so each of the B·S rows draws it directly::

    mean = op(x, mu) + b_mu,   var = op(x², sigma²) + b_sigma²,   y = mean + sqrt(var) ⊙ ε_row
    ε: input ``noise/<weight>`` of shape [B·S, *layer output]          (weights stay shared: no grouped conv)

(``op`` is the layer kind's plain op, :mod:`.layers`; mean and variance are the encoding's ``moments()``.)

``weight``: one weight draw per sample in the graph (the encoding's draw, :mod:`.draws`; Gaussian:
W_s = mu + sigma ⊙ ε_s), then the layer kind's batched op, as ``baked``::

    ε: input ``noise/<weight>`` of shape [S, *weight shape] (and ``noise/<bias>`` [S, out])

``local`` is exact for Gemm (each output unit has its own weights) but only approximate for Conv: it draws
every spatial position independently, while a sampled kernel is shared across positions. ``auto`` (the
default) is exact everywhere and keeps noise small (with in-graph noise, Flipout on large weights: below):
``weight`` where the layer kind shares weights across positions (Conv: kernels are small), ``local`` where it
does not (Gemm: a row's outputs are fewer than the layer's weights). A dropout mask (MC dropout) is Bernoulli,
not Gaussian: every variant draws it as ``weight`` does, from a uniform input per sample. So is a correlated
Gaussian (``CORRELATED``: Kronecker-factored or dense Laplace), whose moments are marginals only, and any encoding
that is not Gaussian weight by weight but has its family's draw (a shared codebook, a plug-in family): every
variant draws the whole weight (``weight``, :mod:`.draws`).

``flipout`` (Wen et al. 2018): a mean-field Gaussian weight viewed as a matrix [d0, J] (axis 0 by the rest; a
Conv's im2col GEMM) draws ONE ε per call, shared by the S samples, and flips its sign per sample along the longer
axis (a Conv: J = C/g·k², the input patch)::

    Δ = sigma ⊙ ε  (ε: [d0, J], once per call),   W_s = mu + Δ ⊙ c_s,  c_s ∈ {±1}^J from uniforms [S, J]

then the batched op as ``weight``. Each sample's weights are exactly the posterior's marginal (ε is symmetric),
and two samples' perturbations are uncorrelated (E[c_s c_t] = 0), but not independent: they share |ε|, so the
even part of the network's response to the noise is common to the S samples. Measured, the S = 16 predictive's
Monte Carlo error is 0.99-1.03x that of S independent draws (tests/unit/test_flipout.py; a trained LeNet-5,
docs/speed.md); on a kernel with few entries (4x1x3x3: 9 signs per sample) 1.06-1.10x. ``--noise flipout`` uses
it on every such weight (Gemm stays ``local``, exact and independent per row); ``auto`` with ``rng="graph"`` on
weights of at least :data:`FLIPOUT_MIN_WEIGHTS` numbers, independent draws below (LeNet-5 S = 16: conv2's
400,000 normals per call become 25,000 plus 8,000 uniform signs). ``auto`` with host noise keeps independent
draws (the pool makes numbers nearly free). With host noise Flipout's per-call ε is an input of S rows of
ceil(n / S) numbers, its first n read.

``mixed``: ``local`` where it is exact and the weight is a mean-field Gaussian (Gemm), the baked members
where such a weight is shared across positions (Conv: S kernels drawn at export from the seeded streams of
``baked``, stored as constants in the batched form). Exact sampling with the least run-time noise: the host draws
only the Gemm pre-activations' B·S rows, and the kernels cost what ``baked`` costs (on LeNet-5, S=16, batch 1: 3.4k
numbers per call instead of 44.6k, docs/speed.md). A weight its family draws (:attr:`Family.draws
<edgebnn.family.Family.draws>`: a dropout mask, a codebook, SWAG, Laplace, a plug-in family; and a correlated
Gaussian) is drawn in the graph from its own noise, as ``weight`` draws it, never baked; a weight that is neither
Gaussian nor drawable is refused in one line naming its family, as every variant refuses it.

``shared`` (stochastic weight sharing, 2DGBNN): a codebook layer (:mod:`edgebnn.families.codebook`) takes K
standard-normal numbers per sample, ``c = m + s ⊙ ε`` [S, K], and its weights gather their entry,
``W_s = c[:, index]``; outliers draw independently (input ``noise/<weight>.outliers``) and blended weights pick
their entry with a uniform input (``noise/<weight>.blend``), exactly as the encoding's ``sample`` does. Other layers
follow ``auto``.

Noise inputs are recorded in the export metadata (``noise_inputs``: name, shape with -1 for the B·S rows,
``per`` = ``row`` or ``sample``); :class:`edgebnn.runtime.Session` fills them, from :class:`NoisePool` by default
(:func:`fill_noise` draws afresh: numpy's generator was most of a ``noise`` call's time on LeNet-5, docs/speed.md).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters._graph import Builder, ExportFormat, P, set_metadata
from edgebnn.exporters.config import GraphSpec
from edgebnn.exporters.draws import draw_emitter, gaussian_draw
from edgebnn.exporters.layers import LayerKind, SampledLayer, bias_name
from edgebnn.exporters.rewrite import LayerRewrite, baked_layers, rewrite_sampled_layers
from edgebnn.exporters.stores import compact_names, decode, finish_stores, store_metadata
from edgebnn.family import family_of
from edgebnn.ir import BNNModel, EncodedWeight
from edgebnn.ir.encodings import Encoding

ROWS = "batch_x_samples"
# auto with in-graph noise: Flipout for weights of at least this many numbers; smaller ones draw independently per
# sample (S·n numbers, cheap) where Flipout's few sign bits (a 4x1x3x3 kernel: 9 per sample) would leave the
# samples measurably dependent (MC error 1.06-1.10x independent draws, docs/speed.md)
FLIPOUT_MIN_WEIGHTS = 1024


def export_noise(model: BNNModel, spec: GraphSpec) -> onnx.ModelProto:
    """The ``noise`` graph of the variant ``spec.noise`` (``shared``: the ``shared`` mode; ``spec.seed``: the baked
    members of ``mixed``, ``spec.window`` their draws as in :func:`.rewrite.baked_layers`; with ``rng="graph"`` also
    the first seed of the in-graph random ops).

    ``spec.weights``: how μ and σ are stored (:data:`.stores.STORE_CHOICES`; decoded once per call, shared by the S
    samples); ``spec.runtimes``: where the decodes must run (the float store elsewhere). ``spec.rng``: ``host``
    (noise graph inputs) or ``graph`` (drawn inside, one graph input: the data)."""
    variant, samples, rng = spec.noise, spec.samples, spec.rng
    b = Builder(fmt=ExportFormat(weights=spec.weights, runtimes=spec.runtimes))
    noise = _NoiseLayers(model, spec, b)
    _check_drawable(model, list(noise.encoded.values()), variant)
    base, layers = rewrite_sampled_layers(model, samples, noise.rewrite(), b, spec.hoist,
                                          takes_shared=noise.draws_weights, progress=spec.progress)
    mode = "shared" if variant == "shared" else "noise"
    finish_stores(b)
    out = b.model(base, list(base.graph.input), f"edgebnn_{mode}_{variant}_S{samples}")
    in_graph = rng == "graph"
    set_metadata(out, model, mode=mode, samples=samples,
                 seed=spec.seed if variant == "mixed" or in_graph else None, noise=variant,
                 noise_inputs=[] if in_graph else noise.records, layers=layers, rng=rng if in_graph else None,
                 **store_metadata(b))
    return out if spec.weights == "fp32" else compact_names(out)


class _NoiseLayers:
    """The ``noise`` mode's layer rewrites (the variants of the module docstring, each a
    :data:`~.rewrite.LayerRewrite`) and the standard noise they read (``records``: the noise inputs' metadata)."""

    def __init__(self, model: BNNModel, spec: GraphSpec, b: Builder) -> None:
        self.spec, self.b = spec, b
        self.samples, self.variant = spec.samples, spec.noise
        self.encoded = {w.name: w for w in model.encoded_weights()}
        self.records: list[dict] = []
        self.baked = baked_layers(model, spec.samples, spec.seed, window=spec.window)

    def rewrite(self) -> LayerRewrite:
        """The rewrite of the variant."""
        return {"auto": self.auto, "local": self.local_or_mask, "weight": self.weight, "shared": self.shared,
                "mixed": self.mixed, "flipout": self.flipout_auto}[self.variant]

    def noise_input(self, name: str, dims: list[int], per: str, dist: str = "normal", like: str | None = None) -> str:
        """Standard noise: a graph input the host fills, or (``rng="graph"``) a seeded random op, shaped
        [S, *dims] per sample, like ``like`` ([B·S, *dims]) per row, or [*dims] once per call (``call``: a host
        input of S rows of ceil(n / S) numbers, its first n read)."""
        b, samples, rng, records = self.b, self.samples, self.spec.rng, self.records
        if any(r["name"] == name for r in records):  # a shared input (NoiseNeed.shared): made once
            return P + name if rng == "graph" else name
        if per == "call" and rng == "host":
            n = math.prod(dims)
            rows = self.noise_input(name, [-(-n // samples)], "sample", dist)
            q = P + name + "/"
            flat = b.add("Reshape", [rows, b.i64(q + "flat_shape", -1)], q + "flat")
            first = b.add("Slice", [flat, b.i64(q + "start", 0), b.i64(q + "end", n)], q + "first")
            return b.add("Reshape", [first, b.i64(q + "shape", *dims)], P + name)
        if rng == "graph":
            op = {"normal": "RandomNormal", "uniform": "RandomUniform"}[dist]
            attrs = {"seed": float(self.spec.seed + len(records)), "dtype": onnx.TensorProto.FLOAT}
            records.append({"name": name})
            if per == "row":
                assert like is not None
                return b.add(op + "Like", [like], P + name, **attrs)
            return b.add(op, [], P + name, shape=list(dims) if per == "call" else [samples, *dims], **attrs)
        records.append({"name": name, "shape": [-1 if per == "row" else samples, *dims], "per": per, "dist": dist})
        return b.input(name, [ROWS if per == "row" else samples, *dims])

    def draw(self, name: str, enc: Encoding, p: str, tag: str) -> str:
        """W_s [S, *shape] of one encoded weight, from its noise inputs (one set per sample)."""
        emitter, needs = draw_emitter(enc), enc.noise_needs()
        assert emitter is not None and needs is not None  # _check_drawable
        eps = {n.suffix: self.noise_input(f"noise/{n.suffix.lstrip('.')}" if n.shared else f"noise/{name}{n.suffix}",
                                          list(n.dims), "sample", n.dist) for n in needs}
        return emitter(self.b, enc, p, tag, eps, self.samples)

    def local(self, b: Builder, node: onnx.NodeProto, kind: LayerKind, w: EncodedWeight,
              shapes: dict[str, list[int]], wide: bool) -> None:
        """mean = op(x, mu) + b_mu, var = op(x², σ²) + b_σ², y = mean + √var ⊙ ε_row."""
        p = f"{P}{w.name}/"
        bias = bias_name(node)
        bias_w = self.encoded.get(bias) if bias else None
        x = node.input[0]
        mean_in = [x, decode(b, w.encoding, "mean", p + "mu")]
        var_in = [b.add("Mul", [x, x], p + "x2"), decode(b, w.encoding, "variance", p + "sigma2")]
        if bias_w is not None:
            mean_in.append(decode(b, bias_w.encoding, "mean", p + "b_mu"))
            var_in.append(decode(b, bias_w.encoding, "variance", p + "b_sigma2"))
        elif bias:
            mean_in.append(bias)
        dims = kind.out_dims(node, w.encoding.shape, shapes, f"layer {w.layer!r}")
        mean, var = kind.plain(b, node, mean_in, p + "mean"), kind.plain(b, node, var_in, p + "var")
        eps = self.noise_input(f"noise/{w.name}", dims, "row", like=mean)
        std = b.add("Sqrt", [var], p + "std")
        b.add("Add", [mean, b.add("Mul", [std, eps], p + "scaled")], node.output[0])

    def weight(self, b: Builder, node: onnx.NodeProto, kind: LayerKind, w: EncodedWeight,
               shapes: dict[str, list[int]], wide: bool, ws: str | None = None) -> None:
        """W_s drawn in the graph per sample (or given: ``ws``), then the layer kind's batched op (as ``baked``);
        a Bayesian bias draws per sample."""
        p = f"{P}{w.name}/"
        bias = bias_name(node)
        bias_w = self.encoded.get(bias) if bias else None
        ws = ws or self.draw(w.name, w.encoding, p, "")
        out_dim = kind.out_dim(node, w.encoding.shape)
        bias_s = None
        if bias_w is not None:
            bias_s = self.draw(bias_w.name, bias_w.encoding, p, "b_")  # [S, out]
        elif bias:
            bias_s = b.add("Expand", [bias, b.i64(p + "b_expand", self.samples, out_dim)], p + "b_s")
        layer = SampledLayer(node, p, self.samples, w.encoding.shape, shapes, f"layer {w.layer!r}", shared=wide)
        kind.batched(b, layer, ws, bias_s)

    def flipout(self, b: Builder, node: onnx.NodeProto, kind: LayerKind, w: EncodedWeight,
                shapes: dict[str, list[int]], wide: bool) -> None:
        """Flipout (Wen et al. 2018) on the weight viewed as a matrix [d0, J] (axis 0 by the rest: a Conv's
        im2col GEMM): ``W_s = mu + (sigma ⊙ ε) ⊙ f_s`` with ONE ε per call and random signs per sample f_s along
        the longer of the two axes (J for a Conv: C/g·k² signs per sample), then the layer kind's batched op (as
        ``weight``); a bias draws independently per sample. Two ops over the S members (a Mul by the signs and the
        Add of mu), as the independent draw's ``mu + sigma ⊙ ε_s``; signs on both axes (r_s c_sᵀ) took a third
        (docs/speed.md)."""
        p, samples = f"{P}{w.name}/", self.samples
        enc, shape = w.encoding, [int(d) for d in w.encoding.shape]
        d0, rest = shape[0], math.prod(shape[1:])
        eps = self.noise_input(f"noise/{w.name}", [d0, rest], "call")
        sigma = b.add("Reshape", [decode(b, enc, "stddev", p + "sigma"), b.i64(p + "matrix", d0, rest)], p + "sigma_m")
        delta = b.add("Mul", [sigma, eps], p + "delta")  # [d0, J]: the call's one draw
        n, dims = (rest, (samples, 1, rest)) if rest >= d0 else (d0, (samples, d0, 1))
        u = self.noise_input(f"noise/{w.name}.flip", [n], "sample", "uniform")
        sign = b.add("Where", [b.add("Less", [u, b.f32(p + "half", 0.5)], p + "neg"), b.f32(p + "minus", -1.0),
                               b.f32(p + "plus", 1.0)], p + "sign")  # [S, n]: -1 where u < 1/2
        sign = b.add("Reshape", [sign, b.i64(p + "sign_shape", *dims)], p + "sign_r")
        flipped = b.add("Mul", [delta, sign], p + "flipped")  # [S, d0, J]
        mu = b.add("Reshape", [decode(b, enc, "mean", p + "mu"), b.i64(p + "mu_shape", d0, rest)], p + "mu_m")
        ws = b.add("Reshape", [b.add("Add", [mu, flipped], p + "W_m"), b.i64(p + "ws_shape", samples, *shape)],
                   p + "W_s")
        self.weight(b, node, kind, w, shapes, wide, ws)

    def local_or_mask(self, b: Builder, node: onnx.NodeProto, kind: LayerKind, w: EncodedWeight,
                      shapes: dict[str, list[int]], wide: bool) -> None:
        """``local``: Gaussian layers propagate their moments; a dropout mask is drawn (it is Bernoulli)."""
        (self.local if w.encoding.GAUSSIAN else self.weight)(b, node, kind, w, shapes, wide)

    def auto(self, b: Builder, node: onnx.NodeProto, kind: LayerKind, w: EncodedWeight,
             shapes: dict[str, list[int]], wide: bool) -> None:
        if self.spec.rng == "graph":  # numbers drawn in the graph cost ~11-17 ns each: Flipout where weights are shared
            self.flipout_auto(b, node, kind, w, shapes, wide)
            return
        (self.local if kind.LOCAL_EXACT and w.encoding.GAUSSIAN and not w.encoding.CORRELATED else self.weight)(
            b, node, kind, w, shapes, wide)

    def flipout_auto(self, b: Builder, node: onnx.NodeProto, kind: LayerKind, w: EncodedWeight,
                     shapes: dict[str, list[int]], wide: bool) -> None:
        """``local`` where it is exact, Flipout where a mean-field Gaussian weight is shared across positions."""
        if kind.LOCAL_EXACT and w.encoding.GAUSSIAN and not w.encoding.CORRELATED:
            self.local(b, node, kind, w, shapes, wide)
        elif flips(w) and (self.variant == "flipout" or w.encoding.size >= FLIPOUT_MIN_WEIGHTS):
            self.flipout(b, node, kind, w, shapes, wide)
        else:
            self.weight(b, node, kind, w, shapes, wide)

    def shared(self, b: Builder, node: onnx.NodeProto, kind: LayerKind, w: EncodedWeight,
               shapes: dict[str, list[int]], wide: bool) -> None:
        (self.auto if w.encoding.GAUSSIAN else self.weight)(b, node, kind, w, shapes, wide)

    def mixed(self, b: Builder, node: onnx.NodeProto, kind: LayerKind, w: EncodedWeight,
              shapes: dict[str, list[int]], wide: bool) -> None:
        """``local`` for a mean-field Gaussian Gemm, baked members for a mean-field Gaussian shared across
        positions; anything else its family's own draw in the graph (``weight``)."""
        if not mean_field(w):
            self.weight(b, node, kind, w, shapes, wide)
        else:
            (self.local if kind.LOCAL_EXACT else self.baked)(b, node, kind, w, shapes, wide)

    def draws_weights(self, kind: LayerKind, w: EncodedWeight) -> bool:
        """Whether the layer has S weight sets (the batched op, which takes an input shared by every sample)."""
        variant = self.variant
        if variant == "mixed":
            return not (mean_field(w) and kind.LOCAL_EXACT)
        return variant == "weight" or not (w.encoding.GAUSSIAN and (kind.LOCAL_EXACT or variant == "local"))


def mean_field(w: EncodedWeight) -> bool:
    """Whether ``w`` is drawn ``mean + stddev ⊙ ε`` weight by weight, independently (Gaussian, not correlated, no
    draw of its family's own): what ``local`` propagates exactly and ``mixed`` may bake."""
    enc = w.encoding
    family = family_of(enc.op_type)
    return (enc.GAUSSIAN and not enc.CORRELATED
            and (family is None or enc.op_type not in family.draws))


def flips(w: EncodedWeight) -> bool:
    """Whether Flipout draws ``w``: a mean-field Gaussian (``mean + stddev ⊙ ε``) with two axes or more."""
    enc = w.encoding
    return (enc.GAUSSIAN and not enc.CORRELATED and len(enc.shape) >= 2
            and draw_emitter(enc) is gaussian_draw)


def _check_drawable(model: BNNModel, weights: list[EncodedWeight], variant: str) -> None:
    """Every weight must be Gaussian weight by weight (``GAUSSIAN``: ``local`` propagates its moments) or have its
    family's in-graph draw (drawn whole per sample in every variant: a dropout mask, a codebook, SWAG, Laplace, a
    plug-in family); ``shared`` needs a codebook-style draw."""
    kinds = {w.encoding.op_type for w in weights}
    discrete = {w.encoding.op_type for w in weights if not w.encoding.GAUSSIAN and draw_emitter(w.encoding)}
    if variant == "shared" and not discrete:
        raise InvalidOptionError(
            f"{model.where}: --mode shared needs codebook layers with shared draws (lower with --scheme codebook, "
            f"sampling='shared'); this IR has "
            f"{', '.join(sorted(kinds))}: use --mode baked or noise"
        )
    for w in weights:
        if not (w.encoding.GAUSSIAN or draw_emitter(w.encoding) is not None):
            family = family_of(w.encoding.op_type)
            analytic = family is not None and family.analytic_for(w.encoding).kind != "refused"
            instead = f"use --mode baked{', or analytic' if analytic else ''}"
            if variant == "mixed":  # it bakes only mean-field Gaussian kernels: never a family's weight in silence
                raise InvalidOptionError(
                    f"{model.where}: layer {w.layer!r} is {w.encoding.op_type}, which --noise mixed cannot draw in "
                    f"the graph (the {family.name if family else 'unregistered'} family declares no draw for it, "
                    f"Family.draws): {instead}")
            raise InvalidOptionError(
                f"{model.where}: layer {w.layer!r} is {w.encoding.op_type}, which --mode noise cannot draw (its "
                f"family has no in-graph draw): {instead}")


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


POOL_FACTOR = 16


class NoisePool:
    """Noise for a ``noise`` graph sliced from a pre-drawn pool: one random offset per call, no drawing.

    The pool holds ``factor`` times the numbers one call takes (per distribution: normal, uniform), drawn once
    from ``rng`` (regrown for a larger batch), stored twice over so every window is a contiguous view. A call
    takes the ``n`` numbers at a uniform random offset: within a call they are distinct i.i.d. draws (an exact
    S-sample Monte Carlo predictive); two calls reuse numbers — at the same position with probability 1/P
    (P = pool size: the per-position correlation between calls), and their windows share about ``2n/P`` of
    their numbers (1/8 for ``factor`` 16) at shifted positions. Repeated calls on one input are therefore not
    independent estimates: average S inside the graph (a larger S), not over calls.
    """

    def __init__(self, noise_inputs: list[dict], samples: int, rng: np.random.Generator,
                 factor: int = POOL_FACTOR) -> None:
        self.noise_inputs, self.samples, self.rng, self.factor = noise_inputs, samples, rng, factor
        self._batch = 0
        self._pools: dict[str, np.ndarray] = {}
        self._sizes: dict[str, int] = {}

    def _shapes(self, batch: int) -> list[tuple[str, str, list[int]]]:
        return [(rec["name"], rec.get("dist", "normal"),
                 [batch * self.samples if rec["per"] == "row" else self.samples, *rec["shape"][1:]])
                for rec in self.noise_inputs]

    def _grow(self, batch: int) -> None:
        need: dict[str, int] = {}
        for _, dist, shape in self._shapes(batch):
            need[dist] = need.get(dist, 0) + int(np.prod(shape))
        for dist, n in need.items():
            size = n * self.factor
            pool = (self.rng.random(size, dtype=np.float32) if dist == "uniform"
                    else self.rng.standard_normal(size, dtype=np.float32))
            self._pools[dist] = np.concatenate([pool, pool[:n]])  # a window from any offset < size is contiguous
            self._sizes[dist] = size
        self._batch = batch

    def fill(self, batch: int) -> dict[str, np.ndarray]:
        """Arrays for every noise input of a batch of ``batch`` inputs (views into the pool: do not write)."""
        if batch > self._batch:
            self._grow(batch)
        shapes = self._shapes(batch)
        offset = {dist: int(self.rng.integers(size)) for dist, size in self._sizes.items()}
        out = {}
        for name, dist, shape in shapes:
            n = int(np.prod(shape))
            out[name] = self._pools[dist][offset[dist]:offset[dist] + n].reshape(shape)
            offset[dist] += n
        return out
