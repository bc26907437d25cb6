"""Anytime ensembles (``--samples auto``, issue 36): the stopping rule's guarantee, checked statistically with bounds
derived from the number of trials, and the exported graph against the fixed export, the reference runtime and
onnxruntime's random ops."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from scipy import stats
from synthetic import synthetic_cnn

from edgebnn.errors import EdgeBNNError, InvalidArtifactError, InvalidOptionError
from edgebnn.exporters.anytime import RANDOM_OPS, SEED_STEP, member_logits
from edgebnn.exporters.config import ExportConfig, rule_for
from edgebnn.exporters.export import build_graph, export_model
from edgebnn.exporters.metadata import EXPORT_KEY, read_metadata
from edgebnn.exporters.trt_compat import check_trt_compat, has_errors
from edgebnn.runtime import Session
from edgebnn.runtime.reference import Reference
from edgebnn.stopping import RunningPredictive, StoppingRule, parse_samples


def _sess(proto: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _inputs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 1, 6, 6)).astype(np.float32)


# -- the rule's math ----------------------------------------------------------------------------------------------


def _binomial_margin(p: float, n: int) -> float:
    """4 standard errors of a rate p estimated from n trials (a false alarm once in ~30,000 runs)."""
    return 4 * math.sqrt(p * (1 - p) / n)


def test_prediction_bound_is_exact_for_gaussian_members() -> None:
    """One class, one look (4 of 8 members): ``|p̄_8 - p̄_4| >= q_4 · s · sqrt(1/4 - 1/8)`` happens with probability
    exactly δ for Gaussian members (a t prediction interval for the mean of the 4 draws not made); 40,000 trials
    estimate it to ±4 standard errors. A normal quantile in place of the t quantile misses far more often (the test
    can tell them apart)."""
    rule = StoppingRule(min_samples=4, max_samples=8, chunk=4, epsilon=0.1, delta=0.1)
    assert rule.looks == [4]
    trials = 40_000
    x = np.random.default_rng(0).normal(0.6, 0.05, size=(trials, 8))
    first = x[:, :4]
    gap = np.abs(x.mean(1) - first.mean(1))
    half = np.sqrt(1 / 4 - 1 / 8) * first.std(1, ddof=1)
    rate = float(np.mean(gap >= rule.quantile(4, 1) * half))
    assert abs(rate - rule.delta) <= _binomial_margin(rule.delta, trials)
    normal = float(np.mean(gap >= stats.norm.ppf(1 - rule.delta / 2) * half))
    assert normal > rule.delta + 10 * _binomial_margin(rule.delta, trials)


def _gaussian_members(rng: np.random.Generator, reps: int, samples: int, mean: np.ndarray,
                      scale: np.ndarray) -> np.ndarray:
    """[reps, samples, 1, K] correlated Gaussian 'probabilities' (the rule's assumption; not clipped to [0, 1])."""
    k = len(mean)
    corr = 0.5 * np.eye(k) + 0.5  # classes correlated: the guarantee allows any correlation
    z = rng.standard_normal((reps, samples, k)) @ np.linalg.cholesky(corr).T
    return (mean + scale * z)[:, :, None, :]


def _run_rule(rule: StoppingRule, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rule over members ``p`` [samples, B, K] in order (numpy, as the reference runtime runs it):
    (stopped mean [B, K], samples [B])."""
    classes = p.shape[-1]
    state = RunningPredictive(p.shape[1], classes)
    rows = np.arange(p.shape[1])
    for i in range(rule.chunks):
        state.add(rows, p[i * rule.chunk:(i + 1) * rule.chunk, rows])
        rows = rows[~rule.settled(state.mean[rows], state.m2[rows], i, classes)]
    return state.mean, state.n


@pytest.mark.parametrize("spread", [0.004, 0.012, 0.03])
def test_sequential_rule_keeps_its_guarantee_for_gaussian_members(spread: float) -> None:
    """The whole rule (3 looks, 3 correlated classes, decision test) over 20,000 inputs of Gaussian members: the
    share that stops with a class probability ε or more from its 16-member value, or another class, is at most δ
    (+4 standard errors). The spreads put the stops at the first look, across the looks, and mostly at 16."""
    rule = StoppingRule(epsilon=0.05, delta=0.1)
    reps = 20_000
    p = _gaussian_members(np.random.default_rng(1), reps, 16, np.array([0.7, 0.2, 0.1]), np.full(3, spread))
    p = p[:, :, 0, :].transpose(1, 0, 2)  # [16, reps, K]: each rep one input
    stopped, used = _run_rule(rule, p)
    full = p.mean(0)
    bad = (np.abs(stopped - full).max(-1) >= rule.epsilon) | (stopped.argmax(-1) != full.argmax(-1))
    assert bad.mean() <= rule.delta + _binomial_margin(rule.delta, reps)
    assert np.all(bad[used == 16] == 0)  # at S_max the predictive is the S_max one
    assert (used < 16).mean() > 0.05  # the rule does stop some inputs early at every spread


def _union_rate(rule: StoppingRule, p: np.ndarray) -> float:
    """The share of inputs for which, at some look and for some class, the 16-member mean lies ``r_k`` or more from
    the n-member mean: the event whose probability the union bound keeps below δ (outside it every stop is good)."""
    full, classes = p.mean(0), p.shape[-1]
    coef, _ = rule.constants(classes)
    hit = np.zeros(p.shape[1], bool)
    for n in rule.looks:
        first = p[:n]
        m2 = ((first - first.mean(0)) ** 2).sum(0)
        r = np.sqrt(coef[n // rule.chunk - 1] * m2)
        hit |= (np.abs(full - first.mean(0)) >= r).any(-1)
    return float(hit.mean())


class _NoMultiplicity(StoppingRule):
    """The rule with each class and look tested at level δ (no Bonferroni): a wrong rule the test must catch."""

    def quantile(self, n: int, classes: int) -> float:
        return float(stats.t.ppf(1.0 - self.delta / 2.0, n - 1))


def test_union_bound_over_classes_and_looks_holds_and_is_needed() -> None:
    """The event the proof bounds (some look, some class outside its interval) happens for at most δ of the inputs
    (+4 standard errors; below δ by the union bound's slack on 3 correlated classes and 3 looks), and for far more
    than δ if every class and look were tested at level δ: the check can fail."""
    rule = StoppingRule(epsilon=0.05, delta=0.1)
    reps = 20_000
    p = _gaussian_members(np.random.default_rng(2), reps, 16, np.array([0.7, 0.2, 0.1]), np.full(3, 0.05))
    p = p[:, :, 0, :].transpose(1, 0, 2)
    assert _union_rate(rule, p) <= rule.delta + _binomial_margin(rule.delta, reps)
    naive = _NoMultiplicity(epsilon=rule.epsilon, delta=rule.delta)
    assert _union_rate(naive, p) > rule.delta + 10 * _binomial_margin(rule.delta, reps)


def test_running_statistics_equal_the_batch_ones() -> None:
    """Chan's pairwise merge of chunks gives the mean and the sum of squared deviations of all members (float64
    round-off), and rows left out keep theirs."""
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(5), size=(12, 7))  # [12 members, 7 rows, 5 classes]
    state = RunningPredictive(7, 5)
    for i in range(3):
        state.add(np.arange(7), p[4 * i:4 * i + 4])
    np.testing.assert_allclose(state.mean, p.mean(0), atol=1e-12)
    np.testing.assert_allclose(state.m2, ((p - p.mean(0)) ** 2).sum(0), atol=1e-12)
    state.add(np.array([0, 2]), p[:4, [0, 2]])
    assert state.n.tolist() == [16, 12, 16, 12, 12, 12, 12]


def test_rule_options_are_checked_in_one_line() -> None:
    for kwargs, needle in [({"chunk": 3}, "--chunk 3: must divide --max-samples 16"),
                           ({"min_samples": 1, "chunk": 1}, "--min-samples 1"),
                           ({"min_samples": 20}, "more than --max-samples"),
                           ({"epsilon": -0.1}, "--epsilon -0.1"), ({"delta": 1.0}, "--delta 1.0")]:
        with pytest.raises(InvalidOptionError, match=needle.replace("(", r"\(")) as e:
            StoppingRule(**kwargs)
        assert "\n" not in str(e.value)
    assert parse_samples("auto") == "auto" and parse_samples("8") == 8
    with pytest.raises(InvalidOptionError, match="--samples x"):
        parse_samples("x")
    assert StoppingRule().looks == [4, 8, 12]
    _, thresh = StoppingRule(epsilon=0).constants(10)
    assert np.all(thresh < 0)  # the rule off: no iteration may stop


# -- the graph ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, options", [("baked", {}), ("noise", {"rng": "host"}),
                                           ("noise", {"rng": "host", "noise": "mixed"}),
                                           ("noise", {"rng": "host", "noise": "weight"})])
def test_rule_off_equals_the_fixed_export_at_s_max(mode: str, options: dict) -> None:
    """``--epsilon 0``: every row runs 16 members, the same ones as the fixed S = 16 export (baked: the same draws;
    host noise: the same noise, sliced per chunk), so the outputs agree to float32 round-off of sums of 16 terms
    (the chunked means are merged in another order: 16 · 2^-24 relative, 1e-6 absolute on values of at most 1;
    mutual information is a difference of two such sums)."""
    model = synthetic_cnn(sigma=0.3)
    x = _inputs(6)
    anytime = export_model(model, ExportConfig(rule=StoppingRule(epsilon=0), mode=mode, device="cpu", seed=4,
                                               **options)).proto
    fixed = export_model(model, ExportConfig(16, mode=mode, device="cpu", seed=4, **options)).proto
    assert [i.name for i in anytime.graph.input] == sorted(i.name for i in fixed.graph.input)[:1] + \
        sorted(i.name for i in fixed.graph.input[1:])
    feed = {"input": x}
    rng = np.random.default_rng(5)
    for i in _sess(fixed).get_inputs()[1:]:
        feed[i.name] = rng.standard_normal([6 * 16 if isinstance(d, str) else d for d in i.shape]).astype(np.float32)
    probs, entropy, mi, used = _sess(anytime).run(None, feed)
    want = _sess(fixed).run(["probs", "entropy", "mutual_info"], feed)
    assert used.tolist() == [16] * 6 and used.dtype == np.int64
    for got, ref in zip((probs, entropy, mi), want, strict=True):
        np.testing.assert_allclose(got, ref, atol=1e-6, rtol=0)


def test_in_graph_draws_are_fresh_every_chunk_and_call() -> None:
    """``--rng graph``: chunk i's copy of each random op draws with seed + i·SEED_STEP, so with the rule off a fresh
    session's 4 chunks draw what fresh sessions of the fixed S = 4 graph with those seeds draw in their first call:
    the anytime probabilities are the mean of those calls' (to float32 round-off); were every chunk to draw the same
    numbers, they would be the first chunk's. A second call draws afresh (each op's seeded stream goes on)."""
    model = synthetic_cnn(sigma=0.3)
    x = _inputs(3)
    anytime = _sess(export_model(model, ExportConfig(rule=StoppingRule(epsilon=0), mode="noise", rng="graph",
                                                     device="cpu", seed=5)).proto)
    fixed = export_model(model, ExportConfig(4, mode="noise", rng="graph", device="cpu", seed=5)).proto
    calls = []
    for i in range(4):
        shifted = onnx.ModelProto()
        shifted.CopyFrom(fixed)
        for node in shifted.graph.node:
            for a in node.attribute:
                if node.op_type in RANDOM_OPS and a.name == "seed":
                    a.f += i * SEED_STEP
        calls.append(_sess(shifted).run(["probs"], {"input": x})[0])
    probs = anytime.run(["probs"], {"input": x})[0]
    np.testing.assert_allclose(probs, np.mean(calls, 0), atol=1e-6, rtol=0)
    assert np.abs(probs - calls[0]).max() > 0.01
    assert np.abs(anytime.run(["probs"], {"input": x})[0] - probs).max() > 0.01


def test_baked_graph_equals_the_reference_runtime_row_by_row() -> None:
    """Baked anytime export and the reference runtime's ``predict_anytime`` run the same members in the same order
    with the same rule: the same sample count for every row and the same predictive (float32 round-off). Each row
    follows its own rule: run alone it draws what it draws in the batch."""
    model = synthetic_cnn(sigma=0.15)
    x = _inputs(40, seed=6)
    rule = StoppingRule(epsilon=0.1, delta=0.1)
    proto = export_model(model, ExportConfig(rule=rule, mode="baked", device="cpu", seed=7)).proto
    got = Session(proto).predict(x)
    ref = Reference(model).predict_anytime(x, rule, seed=7)
    assert got.samples is not None and ref.samples is not None
    np.testing.assert_array_equal(got.samples, ref.samples)
    assert len(set(got.samples.tolist())) >= 2  # rows stop at different counts
    np.testing.assert_allclose(got.probs, ref.probs, atol=1e-6)
    np.testing.assert_allclose(got.mutual_info, ref.mutual_info, atol=1e-6)
    alone = [int(Session(proto).predict(x[j:j + 1]).samples[0]) for j in range(0, 40, 7)]
    assert alone == got.samples[::7].tolist()


@pytest.mark.parametrize("mode, options", [("baked", {"weights": "fp32"}), ("noise", {"rng": "host"})])
def test_tensorrt_form_equals_the_compressed_form(mode: str, options: dict) -> None:
    """For TensorRT the chunks after the first run in a sequence of Ifs on every row (settled rows keep their
    statistics by Where); elsewhere the rows still drawing leave the batch (NonZero, Gather, ScatterND) into nested
    Ifs. The same members and noise give the same sample counts and predictive either way (float32 round-off)."""
    model = synthetic_cnn(sigma=0.15)
    x = _inputs(40, seed=6)
    got = {}
    for device in ("cpu", "rtx"):
        proto = export_model(model, ExportConfig(rule=StoppingRule(), mode=mode, device=device, seed=7,
                                                 **options)).proto
        nested = [n for n in proto.graph.node if n.op_type == "If"]
        assert len(nested) == (1 if device == "cpu" else 3)
        got[device] = Session(proto, seed=3).predict(x)
    assert got["cpu"].samples is not None and got["rtx"].samples is not None
    np.testing.assert_array_equal(got["cpu"].samples, got["rtx"].samples)
    assert len(set(got["cpu"].samples.tolist())) >= 2
    np.testing.assert_allclose(got["cpu"].probs, got["rtx"].probs, atol=1e-6)
    np.testing.assert_allclose(got["cpu"].mutual_info, got["rtx"].mutual_info, atol=1e-6)


def test_settled_rows_keep_their_statistics() -> None:
    """A row that settles at 4 members keeps the 4-member predictive although the batch runs on: equal to the
    fixed export of the first chunk's members (baked, members 0..3: the S = 4 export of the 16-member draw's
    first 4 = ``window=(0, 16)``)."""
    model = synthetic_cnn(sigma=0.15)
    x = _inputs(40, seed=6)
    proto = export_model(model, ExportConfig(rule=StoppingRule(), mode="baked", device="cpu", seed=7)).proto
    got = Session(proto).predict(x)
    assert got.samples is not None
    resolved = ExportConfig(16, mode="baked", device="cpu", seed=7).resolve(model)
    first = build_graph(model, resolved.spec("baked", "auto", samples=4, window=(0, 16)))
    want = _sess(first).run(["probs"], {"input": x})[0]
    four = got.samples == 4
    assert four.any() and (~four).any()
    np.testing.assert_allclose(got.probs[four], want[four], atol=1e-6)


def test_export_refusals_are_one_line() -> None:
    model = synthetic_cnn()
    with pytest.raises(InvalidOptionError, match="analytic mode draws no samples") as e:
        export_model(model, ExportConfig(rule=StoppingRule(), mode="analytic"))
    assert "\n" not in str(e.value)


def test_rule_defaults_follow_the_model() -> None:
    assert rule_for(synthetic_cnn()) == StoppingRule()
    assert rule_for(synthetic_cnn(), max_samples=6) == StoppingRule(min_samples=4, max_samples=6, chunk=2)
    assert rule_for(synthetic_cnn(), max_samples=5).chunk == 1


def test_metadata_names_the_rule_and_the_samples_output() -> None:
    proto = export_model(synthetic_cnn(), ExportConfig(rule=StoppingRule(epsilon=0.05), mode="baked",
                                                       device="cpu")).proto
    meta = read_metadata(proto, "a.onnx")
    assert meta.samples == 16 and meta.outputs[-1] == "samples"
    assert StoppingRule.from_dict(meta.anytime or {}, "a.onnx") == StoppingRule(epsilon=0.05)
    assert member_logits(export_model(synthetic_cnn(), ExportConfig(4, mode="baked")).proto.graph)
    bad = onnx.ModelProto()
    bad.CopyFrom(proto)
    entry = next(p for p in bad.metadata_props if p.key == EXPORT_KEY)
    entry.value = entry.value.replace('"chunk": 4', '"chunk": 3')
    with pytest.raises(InvalidArtifactError, match="anytime"):
        read_metadata(bad, "a.onnx")


@pytest.mark.parametrize("mode, options", [("baked", {"weights": "int8"}), ("noise", {"rng": "host"}),
                                           ("noise", {"rng": "graph"})])
def test_tensorrt_checker_passes_the_anytime_graphs(mode: str, options: dict) -> None:
    """The static checker reads the Loop body's and the If branches' own constants (axes, shapes); the real build is
    tests/integration/test_tensorrt_rtx.py's."""
    proto = export_model(synthetic_cnn(), ExportConfig(rule=StoppingRule(), mode=mode, device="rtx", **options)).proto
    findings = check_trt_compat(proto, tensorrt="11")
    assert not has_errors(findings), findings


def test_session_and_errors() -> None:
    proto = export_model(synthetic_cnn(sigma=0.3), ExportConfig(rule=StoppingRule(), mode="noise", rng="host",
                                                                device="cpu")).proto
    sess = Session(proto, seed=0)
    assert sess.anytime and sess.samples == 16
    assert {r["name"]: r["shape"][0] for r in sess.noise_inputs}["noise/conv.weight"] == 16
    pred = sess.predict(_inputs(5))
    assert pred.samples is not None and pred.samples.shape == (5,)
    assert set(pred.samples.tolist()) <= {4, 8, 12, 16}
    assert not Session(export_model(synthetic_cnn(), ExportConfig(4, mode="baked")).proto).anytime
    with pytest.raises(EdgeBNNError):
        Session(proto).predict(np.zeros((2, 3), np.float32))


@pytest.mark.parametrize(("chunk", "top", "first"), [(8, 32, 8), (5, 20, 5), (2, 16, 4), (None, 16, 4)])
def test_a_chunk_given_alone_takes_its_own_first_look(chunk, top, first):
    """Without --min-samples, the first look is the chunk's smallest multiple of at least 4 (the documented
    default), never a value the user did not give that the chunk cannot divide."""
    rule = rule_for(None, max_samples=top, chunk=chunk)
    assert (rule.min_samples, rule.chunk or 0) == (first, chunk or 4)
    assert rule.min_samples % rule.chunk == 0 and rule.min_samples < top
