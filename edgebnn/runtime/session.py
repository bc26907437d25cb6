"""On-device sample averaging in user code: ``Session(path).predict(x)`` for any exported ensemble.

The S-sample average happens inside the graph for every mode; for ``noise`` graphs the session draws
the standard-normal noise inputs on the host (numpy, seedable) so callers never see them::

    from edgebnn.runtime import Session
    sess = Session("model.onnx", seed=0)
    pred = sess.predict(x)          # pred.probs [B, K], pred.entropy [B], pred.mutual_info [B]

Seeds: a host-noise graph draws from ``numpy.random.default_rng(seed)``; a graph that draws its noise itself
(``--rng graph``, the CPU default: seeded RandomNormal/RandomUniform(Like) nodes, also inside an anytime export's
Loop body or If branches) runs a copy whose random ops are reseeded from ``(seed, node index)``
(:func:`reseed`). onnxruntime seeds each such node from its ``seed`` attribute and a fresh session repeats its
first draw, so two Sessions with one seed give the same sequence of draws over their ``predict`` calls (with the
same batch sizes) and another seed gives others.

The answer is the export's task's (:meth:`edgebnn.tasks.Task.predictive` of its graph outputs): a regression
export gives :class:`edgebnn.metrics.RegressionPredictive` (``mean``, ``variance``, ``aleatoric``, ``epistemic``,
each [B, D]); a segmentation export per-pixel probs [B, C, *spatial] and maps [B, *spatial].

An anytime export (``edgebnn export --samples auto``) adds ``pred.samples`` [B], the members each input drew before
its predictive settled (:mod:`edgebnn.stopping`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.exporters.anytime import RANDOM_OPS
from edgebnn.exporters.metadata import ExportMetadata, load_onnx, read_metadata
from edgebnn.exporters.noise import NoisePool, fill_noise
from edgebnn.ir import check_text
from edgebnn.metrics import AnyPredictive
from edgebnn.runtime._ort import check_finite, external_data_options, ort_errors

Source = str | os.PathLike[str] | bytes | onnx.ModelProto


def read_export(source: Source) -> tuple[onnx.ModelProto, ExportMetadata, str]:
    """(model, validated export metadata, name for messages) of an edgebnn-exported ONNX file, bytes or proto.

    Raises:
        InvalidArtifactError: Unreadable, not ONNX, or its ``edgebnn.export`` metadata is missing or malformed.
    """
    proto, _, where = load_onnx(source)
    check_text(proto, where)  # before onnx or onnxruntime see it: they fail on non-UTF-8 names with a traceback
    return proto, read_metadata(proto, where), where


class Session:
    """Run an exported ensemble and get its predictive distribution.

    Args:
        source: path, bytes or ``onnx.ModelProto`` written by ``edgebnn export``.
        seed: seed of the draws of a ``noise``/``shared`` graph: the host noise's, or (noise drawn in the graph)
            the random ops' (reseeded from ``(seed, node index)``; module docstring). ``None`` (the default) keeps
            what the file fixes: the seeds its random ops were written with at export (``export --seed``), so every
            fresh Session repeats the same draws; host noise is then drawn from seed 0. A non-negative int.
            ``baked`` and ``analytic`` graphs draw nothing at run time (a baked export's members were drawn at
            export from its recorded seed): the seed changes nothing there.
        noise_pool: ``noise`` graphs: slice the noise from a pre-drawn pool at a random offset per call
            (:class:`edgebnn.exporters.noise.NoisePool`: i.i.d. within a call, calls share numbers) instead of
            drawing afresh each call (``False``).
        threads: onnxruntime intra-op threads (0: onnxruntime's default).
        providers: onnxruntime execution providers (default: CPU).
    """

    def __init__(self, source: Source, *, seed: int | None = None, noise_pool: bool = True,
                 threads: int = 0, providers: list[str] | None = None) -> None:
        proto, self.meta, self.where = read_export(source)
        if self.meta.is_baseline:
            raise InvalidArtifactError(f"{self.where}: a float baseline graph, not an ensemble")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0):
            raise InvalidOptionError(f"{self.where}: seed {seed!r}: give a non-negative integer (or None)")
        self.seed = seed
        if seed is not None:
            proto = reseed(proto, int(seed))
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if threads:
            opts.intra_op_num_threads = threads
        external_data_options(opts, proto, self.where)
        with ort_errors(self.where):  # onnxruntime's failures as one line naming the artifact and the op
            # enable_fallback=0: a model onnxruntime refuses is not retried on another provider after a banner on
            # stdout; its error is the one line.
            self._sess = ort.InferenceSession(proto.SerializeToString(), opts,
                                              providers=providers or ["CPUExecutionProvider"], enable_fallback=0)
        self.input_name = self.meta.input_name
        self.input_shape = tuple(self.meta.input_shape[1:])
        self.noise_inputs = [dict(r) for r in self.meta.noise_inputs or ()]
        self.rng = np.random.default_rng(0 if seed is None else seed)
        self.task = self.meta.task_spec(self.where)
        self._pool = NoisePool(self.noise_inputs, self.samples, self.rng) if noise_pool and self.noise_inputs else None

    @property
    def mode(self) -> str:
        return self.meta.mode

    @property
    def samples(self) -> int:
        """S of a fixed export; an anytime export's largest sample count (``predict(x).samples``: what each input
        used)."""
        return self.meta.samples

    @property
    def anytime(self) -> bool:
        """Whether this is an anytime ensemble (``--samples auto``: each input draws until its predictive settles)."""
        return self.meta.anytime is not None

    def predict(self, x: np.ndarray, *, noise: dict[str, np.ndarray] | None = None) -> AnyPredictive:
        """The S-sample predictive distribution for a batch ``x`` of shape ``(B, *input_shape)``, as the export's
        task gives it (:meth:`edgebnn.tasks.Task.predictive`): a :class:`~edgebnn.metrics.Predictive`
        (classification, segmentation) or a :class:`~edgebnn.metrics.RegressionPredictive` (regression).

        ``noise`` overrides the host-drawn noise of a ``noise`` graph (standard normal, float32, shapes as
        in ``self.noise_inputs`` with -1 meaning B·S rows).
        """
        x = self._check_input(x)
        feed = {self.input_name: x}
        if self.noise_inputs:
            feed.update(self._check_noise(noise, len(x)) if noise is not None
                        else self._pool.fill(len(x)) if self._pool is not None
                        else fill_noise(self.noise_inputs, len(x), self.samples, self.rng))
        elif noise:
            raise InvalidOptionError(f"{self.where}: a {self.mode} graph takes no noise inputs")
        with ort_errors(self.where):
            outs = self._sess.run([*self.task.outputs, *(["samples"] if self.anytime else [])], feed)
        if self.anytime:  # an anytime ensemble (--samples auto): the members each input used come last
            check_finite(outs[:-1], self.where)
            return dataclasses.replace(self.task.predictive(outs[:-1]), samples=outs[-1])
        check_finite(outs, self.where)
        return self.task.predictive(outs)

    def _check_input(self, x: Any) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype.kind != "f":
            raise InvalidOptionError(f"{self.where}: input dtype {x.dtype} is not floating point; pass float32")
        if x.ndim != len(self.input_shape) + 1 or tuple(x.shape[1:]) != self.input_shape:
            want = ", ".join(map(str, self.input_shape))
            raise InvalidOptionError(f"{self.where}: input has shape {tuple(x.shape)}, the model takes (batch, {want})")
        if len(x) == 0:
            raise InvalidOptionError(f"{self.where}: empty batch")
        outside = outside_input_range(x, self.meta.input_range)
        if outside:  # the same rule as edgebnn eval (edgebnn.api._evaluate.checked_range)
            raise InvalidOptionError(f"{self.where}: {outside}")
        return np.ascontiguousarray(x, dtype=np.float32)

    def _check_noise(self, noise: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
        out = {}
        for rec in self.noise_inputs:
            name = rec["name"]
            if name not in noise:
                raise InvalidOptionError(f"{self.where}: noise input {name!r} is missing")
            arr = np.asarray(noise[name])
            want = (batch * self.samples if rec["per"] == "row" else self.samples, *rec["shape"][1:])
            if arr.dtype != np.float32:
                raise InvalidOptionError(f"{self.where}: noise input {name!r} must be float32, got {arr.dtype}")
            if tuple(arr.shape) != want:
                raise InvalidOptionError(f"{self.where}: noise input {name!r} has shape {arr.shape}, expected {want}")
            out[name] = arr
        extra = set(noise) - set(out)
        if extra:
            raise InvalidOptionError(f"{self.where}: unknown noise inputs {sorted(extra)}")
        return out


SEED_RANGE = 2**24
"""A random op's ``seed`` attribute is a float: float32 holds every integer below this exactly."""


def random_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """The random ops of ``graph`` and of its nodes' subgraphs (Loop bodies, If branches), depth first in node
    order."""
    for node in graph.node:
        if node.op_type in RANDOM_OPS and node.domain in ("", "ai.onnx"):
            yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from random_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from random_nodes(sub)


def reseed(proto: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """``proto`` (itself when it has no random op, else a copy) whose k-th of n random ops (:func:`random_nodes`'
    order) seeds from ``(seed·n + k) mod 2^24``: distinct within a graph, and disjoint between seeds below
    2^24 / n."""
    nodes = list(random_nodes(proto.graph))
    if not nodes:
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for k, node in enumerate(random_nodes(out.graph)):
        for attr in [a for a in node.attribute if a.name == "seed"]:
            node.attribute.remove(attr)
        node.attribute.append(onnx.helper.make_attribute("seed", float((seed * len(nodes) + k) % SEED_RANGE)))
    return out


RANGE_MARGIN = 1.0
"""Inputs are refused when they leave the recorded input range widened by this many times its width on each side:
a scale error (raw 0..16 pixels for a model lowered on 0..1, 0..255 for 0..1, unnormalised for standardised)
lands far outside it, new data of the same preprocessing does not."""


def outside_input_range(x: np.ndarray, limits: Any) -> str | None:
    """What is wrong when ``x`` leaves the recorded ``[lo, hi]`` widened by :data:`RANGE_MARGIN` widths on each
    side, else None (also when no range is recorded)."""
    if limits is None:
        return None
    lo, hi = float(limits[0]), float(limits[1])
    width = max(hi - lo, 1e-6)
    xmin, xmax = float(np.min(x)), float(np.max(x))
    if lo - RANGE_MARGIN * width <= xmin and xmax <= hi + RANGE_MARGIN * width:
        return None
    return (f"inputs span [{xmin:.4g}, {xmax:.4g}], far outside [{lo:.4g}, {hi:.4g}], the range of the inputs the "
            "model was lowered with; preprocess them the same way (another scale or normalisation?)")
