"""``mcq``: Monte Carlo Quantization of the posterior mean into integer counts, σ kept as a code.

Per weight tensor (layer-wise L1 normalisation, not per neuron), with ``n`` weights:

    p_i = |μ_i| / ||μ||₁                         the weights as a probability distribution
    N   = K · n samples, x_j = (j + ξ) / N         jittered equidistant samples, one ξ ~ U[0, 1)
    c_i = #{j : x_j ∈ [P_{i-1}, P_i)} = ceil(N P_i - ξ) - ceil(N P_{i-1} - ξ),   P = cumsum(p)
    q_i = sign(μ_i) · c_i,   w̄_i = s · q_i,   s = ||μ||₁ / N
    B   = 1 + floor(log2 max|q|) + 1               (sign included; at least 2)

Counting by differences of ``ceil`` is O(n) with no search. Every count is ``floor(N p_i)`` or
``ceil(N p_i)``, so E[w̄_i] = μ_i and the rounding error is below one step ``s``; with the shared jitter the
fractional parts are spread evenly, giving a mean squared error of about ``s² / 6`` (the error is a
difference of two uniform fractional parts). Weights never hit are exact zeros. ``sort=True`` orders |μ|
ascending before building the CDF, as the paper offers (it reports more sparsity in small layers); with
one shared jitter every count is ``floor(N p_i)`` or ``ceil(N p_i)`` whatever the order, so only which
weights round up changes — on t-distributed test layers we measured no change in sparsity or error.

K ("samples per weight") is an option. Bits from variance (``bits=None``): the largest step whose noise
``s²/6`` stays at ``noise_fraction`` · mean(σ²) (default 0.1: the noise adds to every weight's variance,
docs/uncertainty.md), i.e. ``N_v = ceil(||μ||₁ / sqrt(6 f mean σ²))``, sets the
width B = 1 + bitlength(ceil(N_v max p_i)); the width fixes the bytes, so N is then raised to the most
samples that width holds, ``N = floor((2^(B-1) - 1) / max p_i) >= N_v`` (finer steps, same bytes).
``--bits B`` takes that N directly. Above 16 bits the auto
rule is capped at 16 (note in the report). σ keeps a per-weight code (the counts hold the mean only).

Degenerate layers: all-zero μ give all-zero counts with s = 1; σ = 0 everywhere leaves no noise budget,
so ``auto`` uses 16 bits. Both are reported in ``note``.

The scale is a normal float32: ``N <= ||μ||₁ / F32_TINY`` (the smallest normal, 1.18e-38), so ``s >= F32_TINY``
(:data:`~edgebnn.passes.base.F32_TINY`). A subnormal s would be stored with fewer significant bits than the
counts it multiplies: μ = 1.2e-38 alone at 16 bits gave s = 3.66e-43, stored as 3.64e-43, and decoded 61 steps
off (and a device flushing subnormals to zero decodes such a scale as 0). Capping N keeps the rule exact: every
count is still ``floor(N p_i)`` or ``ceil(N p_i)``, so each weight is within one step s of μ, and s, a normal
float32, is stored to 2⁻²⁴ of itself; the layer only uses fewer counts (noted). A layer whose ``||μ||₁`` is
itself below F32_TINY (every μ subnormal) is stored as zeros, each weight within 1.18e-38 of its mean.

Report keys besides the common ones: ``samples_per_weight`` (K = N / n), ``scale`` (s), ``hw_dtype``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import EncodedWeight
from edgebnn.ir.encodings import IntCountWeight, SigmaCode
from edgebnn.ir.encodings.packing import MAX_BITS
from edgebnn.passes.base import (
    DEFAULT_NOISE_FRACTION,
    F32_TINY,
    LayerOutcome,
    LayerPass,
    QuantConfig,
    check_float,
    degenerate_note,
    join_notes,
    posterior,
    sum_sq_diff,
)
from edgebnn.passes.fixed import hw_dtype

MAX_SAMPLES_PER_WEIGHT = 1e6
_CHUNK = 1 << 20


@dataclass(frozen=True)
class McqConfig(QuantConfig):
    """Settings of ``mcq``.

    Attributes:
        samples_per_weight: K; when set, it fixes N = K·n and the bits follow from the counts (then
            ``bits`` must be None).
        sort: Sort |μ| ascending before building the CDF (the paper's option; O(n log n)).
        noise_fraction: f of the variance rule (default
            :data:`~edgebnn.passes.base.DEFAULT_NOISE_FRACTION`, docs/uncertainty.md).
    """

    noise_fraction: float = DEFAULT_NOISE_FRACTION
    samples_per_weight: float | None = None
    sort: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.samples_per_weight is not None:
            check_float(self.samples_per_weight, "samples_per_weight", 0.0, MAX_SAMPLES_PER_WEIGHT, lo_open=True)
            if self.bits is not None:
                raise InvalidOptionError(
                    f"samples_per_weight={self.samples_per_weight} and bits={self.bits}: give one, "
                    "the other follows from it"
                )
        if not isinstance(self.sort, bool):
            raise InvalidOptionError(f"sort={self.sort!r}: must be true or false")


def mcq_counts(mu: np.ndarray, n_samples: int, xi: float, *, sort: bool) -> np.ndarray:
    """Signed MCQ counts (int32) of flat ``mu`` for ``n_samples`` jittered stratified samples."""
    cdf = np.abs(mu, dtype=np.float64)
    order = None
    if sort:
        order = np.argsort(cdf, kind="stable")
        cdf = cdf[order]
    np.cumsum(cdf, out=cdf)
    cdf *= n_samples / cdf[-1]
    cdf -= xi
    np.ceil(cdf, out=cdf)
    counts = np.empty(cdf.size, np.int32)
    counts[0] = cdf[0]
    for start in range(1, cdf.size, _CHUNK):
        stop = min(start + _CHUNK, cdf.size)
        counts[start:stop] = cdf[start:stop] - cdf[start - 1 : stop - 1]
    del cdf
    if order is not None:
        unsorted = np.empty_like(counts)
        unsorted[order] = counts
        counts = unsorted
    np.negative(counts, out=counts, where=mu < 0)
    return counts


def _samples_for_bits(p_max: float, bits: int) -> int:
    """The largest N whose top count ``ceil(N · p_max)`` fits ``bits`` signed bits."""
    return max(1, int(((1 << (bits - 1)) - 1) / p_max))


def lower_mcq(
    mu: np.ndarray,
    sigma: np.ndarray,
    shape: tuple[int, ...],
    rng: np.random.Generator,
    config: McqConfig,
) -> LayerOutcome:
    """Encode one Gaussian weight (flat ``mu``, ``sigma``) as an :class:`IntCountWeight`."""
    n = mu.size
    l1 = float(np.sum(np.abs(mu), dtype=np.float64))
    note = degenerate_note(mu, sigma)
    sigma_code = SigmaCode.fit(sigma, config.sigma_bits, rng)
    # The scale ||mu||_1 / N must be a normal float32 (module docstring): subnormal means are stored as zeros.
    tiny = 0 < l1 < F32_TINY
    if tiny:
        note = join_notes(note, "means below float32 resolution (their sum is under the smallest normal float32): "
                                "stored as zeros")
    if l1 == 0 or tiny:
        k = config.samples_per_weight or 1.0
        width = config.bits or 2
        enc = IntCountWeight(np.zeros(shape, np.int16), 1.0, width, sigma_code, samples_per_weight=k)
        return LayerOutcome(enc, note, {"samples_per_weight": k, "scale": 1.0, "hw_dtype": hw_dtype(width)})
    p_max = float(np.max(np.abs(mu))) / l1
    var = sum_sq_diff(sigma) / n
    widest = (1 << (MAX_BITS - 1)) - 1
    if config.samples_per_weight is not None:
        n_samples = max(1, round(config.samples_per_weight * n))
        if n_samples * p_max > widest + 1:
            raise InvalidOptionError(
                f"samples_per_weight={config.samples_per_weight} gives counts up to {n_samples * p_max:.0f}, "
                f"wider than {MAX_BITS} bits; use a smaller K"
            )
    elif config.bits is not None:
        n_samples = _samples_for_bits(p_max, config.bits)
    elif var == 0:
        n_samples = _samples_for_bits(p_max, MAX_BITS)
    else:
        n_samples = max(1, int(np.ceil(l1 / np.sqrt(6.0 * config.noise_fraction * var))))
        asked = 1 + int(np.ceil(n_samples * p_max)).bit_length()
        if asked > MAX_BITS:
            note = join_notes(note, f"variance rule asks for {asked} bits; capped at {MAX_BITS}")
        # The finest grid the chosen width allows (capped at MAX_BITS: more samples would overflow the counts).
        n_samples = _samples_for_bits(p_max, min(max(asked, 2), MAX_BITS))
    normal = int(l1 / F32_TINY)  # the most samples whose scale ||mu||_1 / N is a normal float32
    if n_samples > normal:
        note = join_notes(note, f"means near float32's smallest normal: {normal} samples, not {n_samples}, keep "
                                "the scale a normal float32")
        n_samples = normal
    counts = mcq_counts(mu, n_samples, float(rng.random()), sort=config.sort)
    width = max(2, 1 + int(np.max(np.abs(counts))).bit_length())
    cap = config.bits or MAX_BITS
    if width > cap:  # float rounding at the top of the CDF can add one count
        np.clip(counts, -((1 << (cap - 1)) - 1), (1 << (cap - 1)) - 1, out=counts)
        width = cap
    k = n_samples / n
    q = counts.astype(np.int16).reshape(shape)
    enc = IntCountWeight(q, l1 / n_samples, width, sigma_code, samples_per_weight=k)
    return LayerOutcome(enc, note, {"samples_per_weight": k, "scale": enc.scale, "hw_dtype": hw_dtype(width)})


class McqPass(LayerPass):
    """Lower every Gaussian weight to Monte Carlo Quantization counts plus a σ code."""

    name = "mcq"
    config_type = McqConfig
    config: McqConfig

    def lower_weight(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        mu, sigma = posterior(weight)
        return lower_mcq(mu, sigma, weight.encoding.shape, rng, self.config)
