"""ONNX ensemble graphs: the IR rewritten into standard ONNX that computes the S-sample predictive.

Every mode returns a graph with the IR's input and outputs ``probs`` [B, K], ``entropy`` [B] and
``mutual_info`` [B]. The sample axis is folded into the batch, batch-major (row b·S + s): deterministic
ops (ReLU, pooling, BatchNorm, Flatten, residual Adds) run once on B·S rows and each sampled layer is ONE
batched op, never S unrolled copies.

The exporters are strategies over two registries, so a new layer kind or encoding is one local addition:

- layer kinds (:mod:`.layers`, by op type: Gemm, Conv of any rank) state how their op is emitted over the
  sample axis (one grouped Conv / batched MatMul for S weights) and plainly (on moments);
- encodings (:mod:`edgebnn.ir.encodings`) state their mean, draws, ``moments()``, ``noise_needs()`` and the
  integer grid their mean / draws lie on; :mod:`.draws` holds the in-graph draw of each (by op type), and
  :mod:`.stores` how each encoding's codes are written into the graph and decoded there (by op type).

The strategies (:mod:`.rewrite` copies the deterministic nodes, folds the samples and hands them each sampled
layer):

``baked`` (here) — S posterior samples drawn at export (seeded; the reference runtime's streams) and stored
as constants (fp32, int8 or int4: lossless on the encoding's grid) in the layer kind's batched form; no
random ops, so it runs on TensorRT and DLA.
``noise`` (:mod:`.noise`) takes standard noise as graph inputs that the host fills: ``weight`` draws W_s in
the graph (the encoding's draw) for the batched form, ``local`` runs the plain op on means and variances;
``shared`` draws codebooks per entry. ``analytic`` (:mod:`.analytic`) propagates means and variances in one
pass; on a last-layer posterior it is the GLM predictive with the probit link (:mod:`.glm`).

Float baselines built from the same IR (for ``profile``): ``float_deterministic`` (posterior mean, one
pass) and ``float_bnn`` (w = mu + sigma·RandomNormal drawn inside the graph on every run, the
bayesian-torch way, and dropout masks [RandomUniform ≥ p]/(1-p); S runs make one predictive).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from edgebnn._io import atomic_write_bytes
from edgebnn.devices import DeviceProfile, export_device
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import MODES, RNG_CHOICES, STORE_CHOICES, WEIGHT_FORMATS, check_samples
from edgebnn.exporters._graph import Builder, ExportFormat, P, set_metadata
from edgebnn.exporters.draws import draw_emitter, gaussian_draw
from edgebnn.exporters.families import check_family
from edgebnn.exporters.forms import FormChoice, choose_form
from edgebnn.exporters.metadata import read_metadata, write_metadata
from edgebnn.exporters.rewrite import baked_layers, rewrite_sampled_layers
from edgebnn.exporters.stores import compact_names, finish_stores, store_metadata
from edgebnn.exporters.stores.base import ORT, TRT
from edgebnn.exporters.stores.registry import wrote_members
from edgebnn.ir import DOMAIN, BNNModel


def export_onnx(model: BNNModel, samples: int, *, mode: str = "baked", seed: int = 0,
                noise: str = "auto", weights: str = "ir", hoist: str | float = "off", form: str = "auto",
                device: str | None = None, progress: Callable[[int, int], None] | None = None,
                rng: str = "host", window: tuple[int, int] | None = None) -> onnx.ModelProto:
    """The S-sample predictive ensemble of ``model`` as a standard ONNX model.

    Args:
        model: the IR.
        samples: ensemble size S (the analytic mode uses it for its logit quadrature).
        mode: ``baked``, ``noise`` or ``analytic``.
        seed: seed of the baked samples (baked mode, and the baked layers of ``noise="mixed"``).
        noise: for ``mode="noise"``: ``auto``, ``local`` (noise on pre-activations), ``weight`` (per weight),
            ``mixed`` (local on Gemm, baked members on Conv) or ``flipout`` (one weight draw per call shared by the
            S samples with per-sample signs: :mod:`.noise`; ``auto`` uses it on large weights with ``rng="graph"``).
        weights: ``ir`` (the default: noise/shared/analytic store μ and σ in the IR's own encoding, its packed codes
            decoded in the graph once per call, :mod:`.stores`; baked stores its fp32 draws), ``fp32``, ``int8``
            (noise/shared/analytic: μ per-channel int8 and σ an 8-bit log code, decoded in the graph; baked mode:
            each member's weights, and each hoisted layer's mean, as int8 + DequantizeLinear; weights on an
            encoding's integer grid of at most 8 bits are stored exactly) or ``int4`` (noise/shared/analytic: as
            int8 at 4 bits; baked: int4 weights, per output channel in the portable form, block-wise where
            TensorRT takes them — Gemm weights, reduction axis blocked, even output dim —; exact on grids of at
            most 4 bits; the graph moves to opset 21, which TensorRT 10.3 on Jetson does not parse).
        hoist: ``off`` (default: every layer samples), ``auto`` (layers whose σ is below their quantization
            step run once, before the sample axis), or a σ threshold. Off by default because it trades
            epistemic signal for speed: on the digits CNN lowered with ``fixed``, ``auto`` hoisted 3 of 4 layers
            and cut the mean mutual information from 0.040 to 0.015.
        form: how int8/int4 weights are written (:mod:`.forms`): ``qdq`` (int8/int4 + DequantizeLinear:
            storage, TensorRT), ``folded`` (the same values as fp32 constants: onnxruntime CPU), ``integer``
            (dense layers in MatMulInteger for int8, MatMulNBits for int4, on per-call quantized activations; Conv
            weights folded), or ``auto``: chosen from ``device``
            (``qdq`` without one). The chosen form and the reason are recorded in the export metadata.
        device: where the graph runs (:data:`.forms.DEVICE_FORMATS`: ``cpu``, ``arm64``, ``rtx``, ``jetson*``);
            refuses a weight format the device cannot run.
        progress: called as ``progress(done, total)`` while the graph is built (a progress bar).
        rng: noise/shared: ``host`` (standard noise as graph inputs that ``Session`` fills: reproducible),
            ``graph`` (seeded RandomNormal/RandomUniform(Like) inside: the data is the only input; TensorRT builds
            them unseeded), or ``auto`` (``graph`` where the device runs random ops with their seeds, else host).
        window: ``(first, total)``: baked members (and ``mixed``'s) are draws ``first .. first + samples - 1`` of the
            ``total`` an S = ``total`` export draws: one chunk of an anytime ensemble (:mod:`.anytime`).
    """
    check_samples(samples)
    if weights not in STORE_CHOICES:
        raise InvalidOptionError(f"--weights {weights}: choose one of {', '.join(STORE_CHOICES)}")
    profile = export_device(device) if device is not None else None
    rng = _check_rng(rng, mode, profile)
    check_family(model, mode, samples if window is None else window[1], noise)
    if mode == "baked":
        stores = weights if profile is None or profile.decodes else "fp32"  # hoisted means: the IR's codes
        weights = "fp32" if weights == "ir" else weights  # the members are draws: fp32 unless asked otherwise
        choice = choose_form(device, weights, form)
        _check_baked_size(model, samples if window is None else window[1], weights)
        out = _baked(model, samples, seed, weights, hoist, choice, progress, profile, stores, window)
    else:
        if weights in WEIGHT_FORMATS:
            choose_form(device, weights, form)  # refuses a format the device does not run
        if profile is not None and (not profile.decodes or (profile.on_tensorrt and weights == "ir"
                                                             and _unrolled_recurrent(model))):
            # a runtime whose decode of the stores is unverified (Jetson) gets float moments; so does an unrolled
            # recurrent layer on TensorRT: TensorRT-RTX 1.7's compiler fails an internal check (Myelin
            # "desired_so.size() == t->dim_count()") on a fixed-lowered bayesian-torch LSTM's packed-code decode
            weights = "fp32"
        runtimes = None if profile is None else (TRT,) if profile.on_tensorrt else (ORT,)
        if mode in ("noise", "shared"):
            from edgebnn.exporters.noise import export_noise

            out = export_noise(model, samples, variant="shared" if mode == "shared" else noise, hoist=hoist,
                               seed=seed, progress=progress, weights=weights, rng=rng, runtimes=runtimes,
                               window=window)
        elif mode == "analytic":
            from edgebnn.exporters.analytic import export_analytic
            from edgebnn.exporters.glm import check_analytic, export_glm, uses_glm

            glm = uses_glm(model)  # a last-layer posterior: the exact GLM logit variance and the probit link (glm.py)
            approximations = check_analytic(model, glm)  # a family that refuses analytic ends here, in one line
            if glm:
                out = export_glm(model, samples, progress=progress)
            else:
                out = export_analytic(model, samples, progress=progress, weights=weights, runtimes=runtimes)
            if approximations:  # what the moments drop, in the file: eval, inspect and Session report it
                meta = read_metadata(out, model.where)
                write_metadata(out, dataclasses.replace(meta, approximations=tuple(approximations)))
        else:
            raise InvalidOptionError(f"--mode {mode}: choose one of {', '.join(MODES)}")
    onnx.checker.check_model(out)
    return out


def _unrolled_recurrent(model: BNNModel) -> bool:
    """Whether the graph holds per-step copies of an unrolled recurrent layer's weights (``name@t``)."""
    from edgebnn.exporters.recurrent import USE_SEPARATOR

    return any(USE_SEPARATOR in name for n in model.proto.graph.node if n.op_type == "Gemm" for name in n.input)


def _check_rng(rng: str, mode: str, profile: DeviceProfile | None) -> str:
    """``host`` or ``graph`` for a noise/shared export (``auto``: graph where the device runs random ops with their
    seeds; host on TensorRT, which imports them as a Fill layer that ignores the seed: ``--rng graph`` builds there
    and draws at run time, unseeded, and the builder says so)."""
    if rng not in RNG_CHOICES:
        raise InvalidOptionError(f"--rng {rng}: choose one of {', '.join(RNG_CHOICES)}")
    runs_random = profile is None or profile.random_ops
    if rng == "auto":
        return "graph" if runs_random and mode in ("noise", "shared") else "host"
    if rng == "graph" and mode not in ("noise", "shared"):
        raise InvalidOptionError(f"--rng graph: only --mode noise and shared draw at run time (got --mode {mode})")
    return rng


MAX_GRAPH_BYTES = 2**31 - 2**26  # protobuf refuses messages of 2 GiB; keep room for the graph around them
_BYTES_PER_WEIGHT = {"fp32": 4.0, "int8": 1.0, "int4": 0.5}


def _check_baked_size(model: BNNModel, samples: int, weights: str) -> None:
    """Refuse, before drawing anything, a baked graph too large for one ONNX file."""
    n = sum(math.prod(next(a.ints for a in node.attribute if a.name == "shape"))
            for node in model.proto.graph.node if node.domain == DOMAIN)
    need = samples * n * _BYTES_PER_WEIGHT[weights]
    if need > MAX_GRAPH_BYTES:
        most = int(MAX_GRAPH_BYTES // (n * _BYTES_PER_WEIGHT[weights]))
        smaller = next((f"--weights {w}, " for w, b in _BYTES_PER_WEIGHT.items() if b < _BYTES_PER_WEIGHT[weights]), "")
        raise InvalidOptionError(
            f"--samples {samples}: {samples} baked members of {n:,} weights need {need / 2**30:.1f} GiB of "
            f"{weights} constants, over ONNX's 2 GiB file limit; use at most -S {most}, {smaller}or "
            "--mode noise (noise drawn at run time)"
        )


def _baked(model: BNNModel, samples: int, seed: int, weights: str, hoist: str | float, choice: FormChoice,
           progress: Callable[[int, int], None] | None = None, profile: DeviceProfile | None = None,
           stores: str = "fp32", window: tuple[int, int] | None = None) -> onnx.ModelProto:
    """S members drawn at export from the reference runtime's streams ``[seed, i]`` (weight ``i`` in graph
    order; ``window``: a chunk of them, :func:`.rewrite.baked_layers`), stored as constants in the ``weights``
    format (exactly, when the draws lie on the encoding's grid), written in ``form`` (:mod:`.forms`)."""
    channels = weights == "int4" and choice.form == "qdq" and profile is not None and not profile.on_tensorrt
    b = Builder(fmt=ExportFormat(
        weights="ir" if stores == "ir" else "fp32",  # hoisted fp32 means (--hoist), members on a grid: the IR's codes
        runtimes=(TRT,) if profile is not None and profile.on_tensorrt else None,
        form=choice.form, integer_min_bytes=choice.integer_min_bytes,
        # onnxruntime: every weight int4, one scale per output channel shared by the members, member biases int8
        int4_layout="channels" if channels else "blocks", samples=samples if channels else 1))
    rewrite = baked_layers(model, samples, seed, weights, window)
    base, layers = rewrite_sampled_layers(model, samples, rewrite, b, hoist, weights, lambda kind, w: True, progress,
                                          wide=True)
    finish_stores(b)
    out = b.model(base, list(base.graph.input), f"edgebnn_baked_S{samples}")
    if (b.fmt.int4_layout == "channels" and choice.form == "qdq") or wrote_members(b):
        out = compact_names(out)  # the compact storage form: short value names (the graph is what is left)
    compact = None
    if weights != "fp32" and choice.form in ("folded", "integer"):
        compact = (f"--form qdq: the {weights} weights stored as {weights} ({choice.form} keeps "
                   f"{'some' if choice.form == 'integer' else 'all'} of them as fp32 constants, for speed)")
    set_metadata(out, model, mode="baked", samples=samples, seed=seed, weights=weights, layers=layers,
                 form=choice.form, form_reason=choice.reason, compact=compact, **store_metadata(b),
                 **({"integer_min_bytes": choice.integer_min_bytes} if choice.form == "integer" else {}))
    return out


def float_deterministic(model: BNNModel) -> onnx.ModelProto:
    """Posterior-mean fp32 network ending in the task's one-pass output ``probs`` (a classifier's softmax): one
    pass."""
    proto = model.float_model()
    _softmax_output(proto, model)
    set_metadata(proto, model, mode="float_deterministic", samples=1, seed=None)
    return proto


def float_bnn(model: BNNModel) -> onnx.ModelProto:
    """fp32 Gaussian network drawing every weight with RandomNormal inside the graph (output ``probs``); an
    MC-dropout mask is drawn as a Bernoulli keep-mask (RandomUniform ≥ p, scaled by 1/(1-p)); every other family's
    weight with a draw of its own by that draw (:mod:`.draws`) from random ops, the rest as Gaussians of their
    mean and σ.

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
        emit = draw_emitter(w.encoding)
        if emit is not None and emit is not gaussian_draw:  # the family's own draw (a dropout mask, Kronecker /
            # dense Laplace), from random ops: uniform or normal as the draw consumes them, one sample
            noise = {n.suffix: b.add("RandomUniform" if n.dist == "uniform" else "RandomNormal", [],
                                     f"{P}{w.name}.eps{n.suffix}", shape=[1, *n.dims], dtype=TensorProto.FLOAT)
                     for n in w.encoding.noise_needs() or ()}
            draw = emit(b, w.encoding, f"{P}{w.name}.", "", noise, 1)
            b.add("Reshape", [draw, b.i64(f"{P}{w.name}.shape", *w.encoding.shape)], w.name)
            continue
        mu = b.f32(f"{P}{w.name}.mu", w.encoding.mean())
        sigma = b.f32(f"{P}{w.name}.sigma", w.encoding.stddev())
        eps = b.add("RandomNormal", [], f"{P}{w.name}.eps", shape=list(w.encoding.shape), dtype=TensorProto.FLOAT)
        b.add("Add", [mu, b.add("Mul", [sigma, eps], f"{P}{w.name}.noise")], w.name)
    graph.initializer.extend(b.inits)
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(b.nodes + rest)
    _softmax_output(proto, model)
    set_metadata(proto, model, mode="float_bnn", samples=1, seed=None)
    return proto


def save_onnx(proto: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Write deterministically and atomically."""
    return atomic_write_bytes(path, proto.SerializeToString(deterministic=True))


def _softmax_output(proto: onnx.ModelProto, model: BNNModel) -> None:
    """The one-pass output ``probs``, as the task ends a baseline (:meth:`edgebnn.tasks.Task.baseline_output`: a
    classifier's softmax over the classes; a regression passes its raw output through: it is timed, never read as
    probabilities)."""
    graph = proto.graph
    logits = graph.output[0]
    graph.node.append(model.manifest.task_spec(model.where).baseline_output(logits.name))
    dims = [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim]
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, dims or None))
