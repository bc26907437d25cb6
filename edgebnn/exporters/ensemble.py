"""The ``baked`` mode's graph, the float baselines, and writing an export.

``baked`` (:func:`export_baked`, the handler :mod:`.export` calls for ``mode="baked"``): S posterior samples drawn
at export (seeded: the reference runtime's streams ``[seed, i]``) and stored as constants (fp32, int8 or int4:
lossless on the encoding's grid) in each layer kind's batched form (:mod:`.layers`), the deterministic nodes
copied and the sample axis folded into the batch, batch-major (row b·S + s), by :mod:`.rewrite`: deterministic ops
run once on B·S rows and each sampled layer is ONE batched op, never S unrolled copies. No random ops, so it runs
on TensorRT and DLA. The graph ends in the task's head (:mod:`edgebnn.tasks`: a classifier's ``probs``,
``entropy``, ``mutual_info``); the other modes are :mod:`.noise` and :mod:`.analytic`.

Float baselines built from the same IR (for ``profile``): :func:`float_deterministic` (posterior mean, one
pass) and :func:`float_bnn` (w = mu + sigma·RandomNormal drawn inside the graph on every run, the
bayesian-torch way, and dropout masks [RandomUniform ≥ p]/(1-p); S runs make one predictive).

:func:`save_onnx` writes any export deterministically and atomically.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

import onnx
from onnx import TensorProto, helper

from edgebnn import _io
from edgebnn.exporters._graph import Builder, ExportFormat, P, set_metadata
from edgebnn.exporters.config import GraphSpec
from edgebnn.exporters.draws import draw_emitter, gaussian_draw
from edgebnn.exporters.forms import FormChoice, choose_form
from edgebnn.exporters.rewrite import baked_layers, rewrite_sampled_layers
from edgebnn.exporters.stores import compact_names, finish_stores, store_metadata
from edgebnn.exporters.stores.base import TRT
from edgebnn.exporters.stores.registry import wrote_members
from edgebnn.ir import BNNModel, proto_writer


def export_baked(model: BNNModel, spec: GraphSpec) -> onnx.ModelProto:
    """The ``baked`` graph of ``spec`` (module docstring): ``spec.weights`` is the members' constant format (``ir``:
    fp32 members, the IR's codes for hoisted means where the device decodes them), written in ``spec.form``
    (:mod:`.forms`: chosen from the device and recorded with its reason)."""
    profile = spec.profile
    stores = spec.weights if profile is None or profile.decodes else "fp32"  # hoisted means: the IR's codes
    weights = "fp32" if spec.weights == "ir" else spec.weights  # the members are draws: fp32 unless asked otherwise
    choice = choose_form(spec.device, weights, spec.form)
    return _baked(model, dataclasses.replace(spec, weights=weights), choice, stores)


def _baked(model: BNNModel, spec: GraphSpec, choice: FormChoice, stores: str) -> onnx.ModelProto:
    """S members drawn at export from the reference runtime's streams ``[seed, i]`` (weight ``i`` in graph
    order; ``spec.window``: a chunk of them, :func:`.rewrite.baked_layers`), stored as constants in the
    ``spec.weights`` format (exactly, when the draws lie on the encoding's grid), written in ``choice.form``
    (:mod:`.forms`); hoisted means in ``stores`` (``ir``: the IR's codes)."""
    profile, samples, weights = spec.profile, spec.samples, spec.weights
    channels = weights == "int4" and choice.form == "qdq" and profile is not None and not profile.on_tensorrt
    b = Builder(fmt=ExportFormat(
        weights="ir" if stores == "ir" else "fp32",  # hoisted fp32 means (--hoist), members on a grid: the IR's codes
        runtimes=(TRT,) if profile is not None and profile.on_tensorrt else None,
        form=choice.form, integer_min_bytes=choice.integer_min_bytes,
        # onnxruntime: every weight int4, one scale per output channel shared by the members, member biases int8
        int4_layout="channels" if channels else "blocks", samples=samples if channels else 1))
    rewrite = baked_layers(model, samples, spec.seed, weights, spec.window)
    base, layers = rewrite_sampled_layers(model, samples, rewrite, b, spec.hoist, weights, lambda kind, w: True,
                                          spec.progress, wide=True)
    finish_stores(b)
    out = b.model(base, list(base.graph.input), f"edgebnn_baked_S{samples}")
    if (b.fmt.int4_layout == "channels" and choice.form == "qdq") or wrote_members(b):
        out = compact_names(out)  # the compact storage form: short value names (the graph is what is left)
    compact = None
    if weights != "fp32" and choice.form in ("folded", "integer"):
        compact = (f"--form qdq: the {weights} weights stored as {weights} ({choice.form} keeps "
                   f"{'some' if choice.form == 'integer' else 'all'} of them as fp32 constants, for speed)")
    set_metadata(out, model, mode="baked", samples=samples, seed=spec.seed, weights=weights, layers=layers,
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


EXTERNAL_DATA_BYTES = 2**31 - 2**26
"""An export whose file would be larger (protobuf refuses messages of 2 GiB; room kept for the graph) is written as
ONNX external data (:func:`save_onnx`)."""
EXTERNAL_MIN_TENSOR = 1024  # smaller constants stay in the graph (onnx.save_model's own default threshold)


def save_onnx(proto: onnx.ModelProto, path: str | os.PathLike[str], *,
              progress: Callable[[int, int], None] | None = None) -> Path:
    """Write deterministically and atomically, one initializer at a time (never the whole model's bytes at once).

    A model of at most :data:`EXTERNAL_DATA_BYTES` is one file, the bytes ``SerializeToString`` gives; a larger
    one (past protobuf's 2 GiB) is written in ONNX's external data format: the constants of at least
    :data:`EXTERNAL_MIN_TENSOR` bytes in ``<file>.data`` beside it, in graph order, each file written atomically
    (the data first, so the ``.onnx`` never names data that is not there). ``proto`` itself is not changed.
    ``progress(bytes written, bytes in all)`` is called after each write (a progress bar; both files count).
    """
    dest = Path(path)
    size, write = proto_writer(proto)
    if size <= EXTERNAL_DATA_BYTES:
        return _io.atomic_write(dest, _counted(write, progress, 0, size))
    data = dest.with_name(dest.name + ".data")
    spans: dict[str, tuple[int, int]] = {}
    offset = 0
    for t in proto.graph.initializer:
        n = len(t.raw_data) if t.HasField("raw_data") else 0
        if n >= EXTERNAL_MIN_TENSOR:
            spans[t.name] = (offset, n)
            offset += n

    def write_data(f: IO[bytes]) -> None:
        for t in proto.graph.initializer:
            if t.name in spans:
                f.write(t.raw_data)

    def stub(t: onnx.TensorProto) -> onnx.TensorProto:
        if t.name not in spans:
            return t
        out = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims, doc_string=t.doc_string,
                               data_location=onnx.TensorProto.EXTERNAL)
        offset, length = spans[t.name]
        for key, value in (("location", data.name), ("offset", offset), ("length", length)):
            entry = out.external_data.add()
            entry.key, entry.value = key, str(value)
        return out

    head, write_head = proto_writer(proto, stub)
    _io.atomic_write(data, _counted(write_data, progress, 0, offset + head))
    return _io.atomic_write(dest, _counted(write_head, progress, offset, offset + head))


def _counted(write: Callable[[IO[bytes]], object], progress: Callable[[int, int], None] | None, done: int,
             total: int) -> Callable[[IO[bytes]], object]:
    """``write``, calling ``progress(done + bytes written so far, total)`` after each of its writes."""
    if progress is None:
        return write
    tick = progress
    return lambda f: write(_CountingFile(f, tick, done, total))  # type: ignore[arg-type]  # it calls .write only


class _CountingFile:
    """A file whose ``write`` also reports the bytes written so far (:func:`_counted`)."""

    def __init__(self, f: IO[bytes], progress: Callable[[int, int], None], done: int, total: int) -> None:
        self.f, self.progress, self.done, self.total = f, progress, done, total

    def write(self, b: bytes) -> int:
        n = self.f.write(b)
        if len(b):
            self.done += len(b)
            self.progress(self.done, self.total)
        return n


def _softmax_output(proto: onnx.ModelProto, model: BNNModel) -> None:
    """The one-pass output ``probs``, as the task ends a baseline (:meth:`edgebnn.tasks.Task.baseline_output`: a
    classifier's softmax over the classes; a regression passes its raw output through: it is timed, never read as
    probabilities). The node's one output is named ``probs`` here, whatever the task named it (a count task's
    ``rate``): the baseline's metadata records that output."""
    graph = proto.graph
    logits = graph.output[0]
    node = model.manifest.task_spec(model.where).baseline_output(logits.name)
    node.output[0] = "probs"
    graph.node.append(node)
    dims = [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim]
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, dims or None))
