"""The reference runtime: draw S posterior samples in numpy, run each sampled network in onnxruntime.

It shares no graph rewriting with the exporters (weights enter as graph inputs of the plain float
network), which is what makes it a reference to check exported ensembles against. Samples are drawn
per encoded weight ``i`` (graph order) from ``numpy.random.default_rng([seed, i])``, jointly with the weight's
group where its family couples the layers (deep ensembles, SWAG: :func:`edgebnn.ir.encodings.draw_weight`) —
the same draws the ``baked`` exporter makes, so the same seed gives the same members.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import check_samples
from edgebnn.exporters.families import check_family
from edgebnn.ir import BNNModel
from edgebnn.ir.encodings import draw_weight
from edgebnn.metrics import AnyPredictive, Predictive
from edgebnn.runtime._ort import check_finite, ort_errors
from edgebnn.stopping import RunningPredictive, StoppingRule
from edgebnn.tasks import predictive_from_samples


def sample_weights(model: BNNModel, samples: int, seed: int) -> dict[str, np.ndarray]:
    """``{weight name: [samples, *shape]}`` for every encoded weight."""
    check_samples(samples)
    check_family(model, "baked", samples)  # a deep ensemble: S = M, each member once
    return {w.name: draw_weight(w.encoding, seed, i, samples) for i, w in enumerate(model.encoded_weights())}


def session(proto_bytes: bytes, threads: int = 0) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(proto_bytes, opts, providers=["CPUExecutionProvider"], enable_fallback=0)


def check_input(model: BNNModel, x: np.ndarray) -> np.ndarray:
    want = tuple(model.manifest.input_shape[1:])
    if x.ndim != len(want) + 1 or tuple(x.shape[1:]) != want:
        raise InvalidOptionError(
            f"{model.where}: input has shape {tuple(x.shape)}, the model takes (batch, {', '.join(map(str, want))})"
        )
    return np.ascontiguousarray(x, dtype=np.float32)


class Reference:
    """The reference runtime for one IR: one onnxruntime session, weights fed per sample."""

    def __init__(self, model: BNNModel) -> None:
        self.model = model
        self.task = model.manifest.task_spec(model.where)
        with ort_errors(model.where):
            self.session = session(model.weights_as_inputs().SerializeToString())

    def logits(self, x: np.ndarray, samples: int, seed: int = 0, batch_size: int = 1024) -> np.ndarray:
        """Per-sample outputs ``[S, N, ...]`` (logits ``[S, N, K]`` of a classifier)."""
        x = check_input(self.model, x)
        weights = sample_weights(self.model, samples, seed)
        in_name = self.model.manifest.input_name
        out = []
        for s in range(samples):
            feed_w = {name: w[s] for name, w in weights.items()}
            with ort_errors(self.model.where):
                chunks = [self.session.run(None, {in_name: x[i : i + batch_size], **feed_w})[0]
                          for i in range(0, len(x), batch_size)]
            out.append(np.concatenate(chunks))
        logits = np.stack(out)
        check_finite(list(logits), self.model.where)  # per sample: [N, ...], rows first
        return logits

    def predict(self, x: np.ndarray, samples: int, seed: int = 0) -> AnyPredictive:
        """The task's predictive of ``samples`` posterior draws (:func:`edgebnn.tasks.predictive_from_samples`)."""
        return predictive_from_samples(self.task, self.logits(x, samples, seed))

    def predict_anytime(self, x: np.ndarray, rule: StoppingRule, seed: int = 0) -> Predictive:
        """The anytime predictive (``--samples auto``): members in chunks of ``rule.chunk`` until each input's rule
        settles (:mod:`edgebnn.stopping`), at most ``rule.max_samples``; ``.samples``: the members each input used.

        Member s is draw s of ``rule.max_samples`` (:func:`sample_weights`), the members the baked anytime export
        of this seed holds, in its order; a settled input stops running members."""
        if not self.task.softmax_classifier:
            raise InvalidOptionError(f"{self.model.where}: --samples auto takes a classifier (the rule bounds class "
                                     f"probabilities); this is a {self.task.name} model")
        x = check_input(self.model, x)
        weights = sample_weights(self.model, rule.max_samples, seed)
        in_name = self.model.manifest.input_name
        classes = self.model.manifest.num_classes
        state = RunningPredictive(len(x), classes)
        rows = np.arange(len(x))
        for i in range(rule.chunks):
            logits = []
            for s in range(i * rule.chunk, (i + 1) * rule.chunk):
                feed = {in_name: x[rows], **{name: w[s] for name, w in weights.items()}}
                with ort_errors(self.model.where):
                    logits.append(self.session.run(None, feed)[0])
            check_finite(logits, self.model.where)
            z = np.stack(logits).astype(np.float64)  # [c, rows, K]
            z -= z.max(-1, keepdims=True)
            p = np.exp(z)
            state.add(rows, p / p.sum(-1, keepdims=True))
            rows = rows[~rule.settled(state.mean[rows], state.m2[rows], i, classes)]
            if len(rows) == 0:
                break
        probs, entropy, mi, used = state.outputs()
        return Predictive(probs, entropy, mi, samples=used)


def sample_logits(model: BNNModel, x: np.ndarray, samples: int, seed: int = 0, batch_size: int = 1024) -> np.ndarray:
    """Per-sample logits ``[S, N, K]``."""
    return Reference(model).logits(x, samples, seed, batch_size)


def predict(model: BNNModel, x: np.ndarray, samples: int, seed: int = 0) -> AnyPredictive:
    """The predictive of ``samples`` posterior draws: mean probabilities, predictive entropy and mutual information
    of a classifier (per pixel for segmentation), or the regression moments."""
    return Reference(model).predict(x, samples, seed)
