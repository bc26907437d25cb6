"""The stopping rule of an anytime ensemble (``--samples auto``): draw samples in chunks, stop an input when more
would not change its answer.

One rule, three users: the exported graph computes it in an ONNX ``Loop`` (:mod:`edgebnn.exporters.anytime`), the
reference runtime in numpy (:meth:`edgebnn.runtime.reference.Reference.predict_anytime`), and both read their
constants from :meth:`StoppingRule.constants`. docs/anytime.md gives the derivation and the measurements.

**The rule.** Members arrive in chunks of ``c``; after each chunk an input that has seen ``n`` members
(``n = S_min, S_min + c, ..., S_max - c``: the looks, ``L`` of them) has, per class k, the running mean ``p̄_k`` and
sample standard deviation ``s_k`` of its members' probabilities, and the half-width::

    r_k = q_n · s_k · sqrt(1/n - 1/S_max),     q_n = t_{n-1}^{-1}(1 - δ / (2·K·L))     (Student's t quantile)

It stops when every ``r_k < ε`` and the top class's interval ``[p̄_k* - r_k*, p̄_k* + r_k*]`` lies above every other
class's interval. Otherwise it draws the next chunk; at ``S_max`` it has the fixed export's predictive.

**The guarantee.** Assume that, for this input, the members' probability vectors are independent draws whose
per-class coordinates are Gaussian (any means, variances and correlation between classes). Then, for every input,

    P( some class's probability is ε or more away from its S_max-member value,
       or the predicted class is not the S_max-member class )  <=  δ,

where the S_max-member values are those the same draws would give had the input run to S_max (the fixed export
at S_max). Why: ``p̄_{S_max} - p̄_n = (1 - n/S_max)(p̄_rest - p̄_n)`` with ``p̄_rest`` the mean of the S_max - n draws
not made, so it is Gaussian with variance ``σ_k²(1/n - 1/S_max)``, independent of ``s_k``: the ratio
``(p̄_{S_max,k} - p̄_{n,k}) / (s_k·sqrt(1/n - 1/S_max))`` is t-distributed with n - 1 degrees of freedom (a
prediction interval for a future mean). A union bound over the K classes and the L looks gives probability at most
δ that any of these ratios exceeds its ``q_n``; outside that event a stop leaves every class within ``r_k < ε`` and,
the intervals being disjoint, the same top class. The decision needs no budget of its own.

**What it does not assume, and what breaks it.** No bound on the number of classes, no prior. Members need not be
Gaussian for the *average* rate to hold; what breaks the per-input rate is skew: an input whose members are 90%
confident and 10% far off can look settled after a few draws (measured in docs/anytime.md). No distribution-free
test can stop at 4 draws: a two-point population with 55% of its mass on another class hides from 4 draws with
probability 4% and flips the 16-member decision; so some assumption is needed at the sample sizes that save time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgebnn.errors import InvalidOptionError

RULE = "t-prediction/1"  # the rule's name and version in export metadata (a change of its math changes the number)
NEVER = -1.0  # the squared-width threshold of an iteration that is not a look: max r² < -1 never holds


@dataclass(frozen=True)
class StoppingRule:
    """When an anytime ensemble stops drawing (module docstring): the smallest and largest sample count, the chunk
    size, the tolerance ``epsilon`` on every class probability and the error probability ``delta``.

    ``epsilon = 0`` switches the rule off: every input draws ``max_samples`` (the fixed export at S_max)."""

    min_samples: int = 4
    max_samples: int = 16
    chunk: int = 4
    epsilon: float = 0.1
    delta: float = 0.1

    def __post_init__(self) -> None:
        for name in ("min_samples", "max_samples", "chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidOptionError(f"--{name.replace('_', '-')} {value}: must be a positive integer")
        c = self.chunk
        if self.min_samples < 2:
            raise InvalidOptionError(f"--min-samples {self.min_samples}: the rule needs at least 2 samples to estimate "
                                     "a spread")
        for name in ("max_samples", "min_samples"):
            if getattr(self, name) % c:
                raise InvalidOptionError(f"--chunk {c}: must divide --{name.replace('_', '-')} {getattr(self, name)} "
                                         f"(samples are drawn {c} at a time)")
        if self.min_samples > self.max_samples:
            raise InvalidOptionError(f"--min-samples {self.min_samples}: more than --max-samples {self.max_samples}")
        if not (isinstance(self.epsilon, (int, float)) and 0.0 <= self.epsilon <= 1.0):
            raise InvalidOptionError(f"--epsilon {self.epsilon}: must be in [0, 1] (0 switches the rule off)")
        if not (isinstance(self.delta, (int, float)) and 0.0 < self.delta < 1.0):
            raise InvalidOptionError(f"--delta {self.delta}: must be in (0, 1)")

    @property
    def chunks(self) -> int:
        """Loop iterations at most: ``max_samples / chunk``."""
        return self.max_samples // self.chunk

    @property
    def looks(self) -> list[int]:
        """Sample counts at which an input may stop (``min_samples .. max_samples - chunk``, every chunk)."""
        return list(range(self.min_samples, self.max_samples, self.chunk))

    def quantile(self, n: int, classes: int) -> float:
        """``q_n``: the two-sided Student-t quantile of one class at one look (Bonferroni over classes and looks)."""
        from scipy.stats import t

        return float(t.ppf(1.0 - self.delta / (2.0 * classes * len(self.looks)), n - 1))

    def constants(self, classes: int) -> tuple[np.ndarray, np.ndarray]:
        """Per loop iteration i (n = (i+1)·chunk members seen): ``a_i`` with ``r² = a_i · M2`` (M2: the sum of
        squared deviations of the n members' probabilities), and the threshold ``ε²`` at a look, :data:`NEVER`
        elsewhere (and everywhere when the rule is off). float32, as the graph holds them."""
        coef = np.zeros(self.chunks, np.float64)
        thresh = np.full(self.chunks, NEVER, np.float64)
        looks = set(self.looks)
        for i in range(self.chunks):
            n = (i + 1) * self.chunk
            if n in looks:
                q = self.quantile(n, classes)
                coef[i] = q * q * (1.0 / n - 1.0 / self.max_samples) / (n - 1)
                if self.epsilon > 0:
                    thresh[i] = self.epsilon ** 2
        return coef.astype(np.float32), thresh.astype(np.float32)

    def settled(self, mean: np.ndarray, m2: np.ndarray, iteration: int, classes: int) -> np.ndarray:
        """Per row [B]: whether an input with running ``mean`` and ``m2`` [B, K] after loop iteration ``iteration``
        stops (the test the graph computes; float32 like it)."""
        coef, thresh = self.constants(classes)
        mean = mean.astype(np.float32)
        r2 = m2.astype(np.float32) * coef[iteration]
        r = np.sqrt(r2)
        lower = (mean - r).max(-1, keepdims=True)
        alone = (mean + r >= lower).sum(-1) < 1.5  # only the top class's interval reaches the best lower bound
        return (r2.max(-1) < thresh[iteration]) & alone

    def settled_regression(self, mean: np.ndarray, m2: np.ndarray, aleatoric: np.ndarray | float, iteration: int,
                           dims: int) -> np.ndarray:
        """Per row [B]: whether a regression input stops after loop iteration ``iteration``: every output dimension's
        half-width ``r_d = q_n · s_d · sqrt(1/n - 1/S_max)`` of its members' means (``mean``, ``m2`` [B, D]) is
        below ε times the predictive std the export reports there, ``sqrt(aleatoric + M2 / n)`` (float32 like the
        graph)."""
        coef, thresh = self.constants(dims)
        n = (iteration + 1) * self.chunk
        m2 = m2.astype(np.float32)
        var = np.float32(aleatoric) + m2 * np.float32(1.0 / n)
        return (m2 * coef[iteration] - var * thresh[iteration]).max(-1) < 0

    def settled_pixels(self, m2: np.ndarray, iteration: int, classes: int) -> np.ndarray:
        """Per image [B]: whether a segmentation input stops after ``iteration``: at every pixel every class's
        half-width (``m2`` [B, C, *sp] of its members' probabilities) is below ε (no class test: a pixel on a class
        boundary would never stop an image)."""
        coef, thresh = self.constants(classes)
        r2 = m2.astype(np.float32) * coef[iteration]
        return r2.reshape(len(r2), int(np.prod(r2.shape[1:]))).max(-1, initial=-np.inf) < thresh[iteration]

    def to_dict(self) -> dict[str, Any]:
        return {"rule": RULE, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> StoppingRule:
        """The rule of export metadata; a malformed record is an :class:`InvalidOptionError` naming ``where``."""
        if not isinstance(raw, Mapping) or raw.get("rule") != RULE:
            raise InvalidOptionError(f"{where}: anytime rule {raw.get('rule') if isinstance(raw, Mapping) else raw!r} "
                                     f"is not {RULE}")
        fields = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in raw.items() if k in fields})
        except (TypeError, InvalidOptionError) as e:
            raise InvalidOptionError(f"{where}: anytime rule: {e}") from e


class RunningPredictive:
    """Per-row running mean, squared deviations (M2) and mean member entropy of member probabilities, merged a chunk
    at a time (Chan et al.'s pairwise update, what the graph computes), and the sample count of each row.

    A settled row stops contributing: :meth:`add` updates only the rows it is given."""

    def __init__(self, batch: int, classes: int) -> None:
        self.n = np.zeros(batch, np.float64)
        self.mean = np.zeros((batch, classes), np.float64)
        self.m2 = np.zeros((batch, classes), np.float64)
        self.neg_entropy = np.zeros(batch, np.float64)  # mean over members of sum_k p log p

    def add(self, rows: np.ndarray, probs: np.ndarray) -> None:
        """Merge member probabilities ``probs`` [c, len(rows), K] into ``rows``."""
        c = probs.shape[0]
        cm = probs.mean(0)
        cm2 = ((probs - cm) ** 2).sum(0)
        cneg = (probs * np.log(np.maximum(probs, 1e-30))).sum(-1).mean(0)
        n = self.n[rows]
        total = n + c
        d = cm - self.mean[rows]
        self.mean[rows] += d * (c / total)[:, None]
        self.m2[rows] += cm2 + d * d * (n * c / total)[:, None]
        self.neg_entropy[rows] += (cneg - self.neg_entropy[rows]) * (c / total)
        self.n[rows] = total

    def outputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(probs [B, K], entropy [B], mutual_info [B], samples [B]) as the graph's head computes them."""
        probs = self.mean.astype(np.float32)
        entropy = -(probs * np.log(np.maximum(probs, 1e-12))).sum(-1)
        mi = np.maximum(entropy + self.neg_entropy.astype(np.float32), 0.0)
        return probs, entropy.astype(np.float32), mi.astype(np.float32), self.n.astype(np.int64)


def parse_samples(text: str | int | None) -> int | str | None:
    """``--samples``: a positive integer, or ``auto`` (an anytime ensemble)."""
    if text is None or isinstance(text, int):
        return text
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise InvalidOptionError(f"--samples {text}: a positive integer, or auto (draw until the predictive has "
                                 "settled)") from None


def describe(rule: StoppingRule, classes: int) -> str:
    """One line: what the rule stops on and its guarantee."""
    looks = rule.looks
    where = f"at {', '.join(map(str, looks))} samples" if looks else "never (min = max)"
    if rule.epsilon == 0:
        return f"rule off (--epsilon 0): every input draws {rule.max_samples} samples, {rule.chunk} at a time"
    q = ", ".join(f"q_{n} = {rule.quantile(n, classes):.2f}" for n in looks[:3]) + (", ..." if len(looks) > 3 else "")
    return (f"samples {rule.min_samples}..{rule.max_samples}, {rule.chunk} at a time; stops {where} when every class "
            f"probability is within ε = {rule.epsilon:g} of its {rule.max_samples}-sample value and the class is "
            f"settled, with probability >= {1 - rule.delta:g} for Gaussian members ({q})")

