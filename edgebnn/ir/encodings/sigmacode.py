"""``SigmaCode``: a per-layer log-domain codebook for a non-negative per-weight spread.

Lowered encodings keep the model Bayesian by storing, next to the quantised mean, a code for each
weight's spread: the posterior standard deviation σ (the fixed-point, MCQ and ternary encodings) or the sign-flip
probability of a binary weight.

Stored as two tensors: ``levels`` (float32, ``L`` entries) and ``codes`` (one ``ceil(log2 L)``-bit code per
weight, packed with :mod:`edgebnn.ir.encodings.packing`; no bytes at all when ``L = 1``).

Fitting (:meth:`SigmaCode.fit`) with a budget of ``b`` bits:

- exact zeros (pruned, deterministic weights) get a reserved level 0.0 when any occur, so a pruned weight
  stays exactly deterministic;
- the positive values are split into the remaining ``2**b`` (or ``2**b - 1``) bins by Lloyd-Max in the log
  domain (1-D k-means of ``log v``, started at equal-mass quantiles, on a seeded subsample of at most
  65 536 values) — spreads span decades, so the error that matters is relative;
- each level is the power mean of its members, ``(mean v^p)^(1/p)``: ``p = 2`` keeps every bin's mean
  variance for σ, ``p = 1`` keeps every bin's mean flip probability;
- bins that end up empty are dropped, so ``L`` may be smaller than ``2**b``.

With ``b = 0`` the whole layer shares one level (its power mean) and stores no per-weight bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgebnn.errors import InvalidArtifactError
from edgebnn.ir.encodings.base import Encoding
from edgebnn.ir.encodings.gaussian import draw_gaussian
from edgebnn.ir.encodings.packing import bits_for, pack_uint, packed_nbytes, unpack_uint

MAX_SIGMA_BITS = 8
_FIT_SAMPLE = 65536
_LLOYD_ITERS = 12
_CHUNK = 1 << 20


@dataclass(frozen=True)
class SigmaCode:
    """Per-weight codes into a small table of non-negative levels.

    Attributes:
        levels: float32 ``[L]``, finite and >= 0.
        codes: packed uint8 codes, ``bits_for(L)`` bits each.
        n: number of coded weights.
    """

    levels: np.ndarray
    codes: np.ndarray
    n: int

    @property
    def bits(self) -> int:
        """Bits per weight of the codes (0 when all weights share one level)."""
        return bits_for(self.levels.size)

    @property
    def nbytes(self) -> int:
        return int(self.levels.nbytes + self.codes.nbytes)

    def decode(self) -> np.ndarray:
        """The coded values, float32 ``[n]``."""
        if self.levels.size == 1:
            return np.full(self.n, self.levels[0], np.float32)
        return self.levels[unpack_uint(self.codes, self.bits, self.n)]

    def select(self, shape: tuple[int, ...], axis: int, index: np.ndarray) -> SigmaCode:
        """The codes of the slices ``index`` along ``axis`` of a weight of ``shape`` (coded in C order), with the
        same levels: every kept weight keeps its value exactly (a level no kept weight uses stays in the table)."""
        kept = int(np.prod(shape, dtype=np.int64)) // shape[axis] * len(index)
        if self.levels.size == 1:
            return SigmaCode(self.levels, self.codes, kept)
        codes = np.take(unpack_uint(self.codes, self.bits, self.n).reshape(shape), index, axis)
        return SigmaCode(self.levels, pack_uint(codes, self.bits), kept)

    @classmethod
    def fit(cls, values: np.ndarray, bits: int, rng: np.random.Generator, *, power: int = 2) -> SigmaCode:
        """Code ``values`` (finite, >= 0) with at most ``2**bits`` levels.

        Args:
            values: The spreads to code, any shape (flattened).
            bits: Code width, 0..8.
            rng: Picks the fitting subsample (so the fit is deterministic for a seed).
            power: 2 keeps each bin's mean square (σ), 1 its mean (probabilities).

        Returns:
            The fitted code.
        """
        if not 0 <= bits <= MAX_SIGMA_BITS:
            raise ValueError(f"sigma code bits {bits} outside 0..{MAX_SIGMA_BITS}")
        v = np.asarray(values, np.float32).reshape(-1)
        n = v.size
        positive = v > 0
        n_pos = int(np.count_nonzero(positive))
        if bits == 0 or n_pos == 0:
            level = _power_mean(v, power) if n else 0.0
            return cls(np.array([level], np.float32), np.zeros(0, np.uint8), n)
        has_zero = n_pos < n
        n_bins = (1 << bits) - int(has_zero)  # >= 1: with one bit, zeros and positives get a level each
        pos = v[positive] if has_zero else v
        cuts = _log_lloyd(pos, n_bins, rng)  # bin boundaries, linear domain, ascending
        del pos
        n_slots = cuts.size + 1 + int(has_zero)
        counts = np.zeros(n_slots, np.int64)
        sums = np.zeros(n_slots, np.float64)
        codes = np.empty(n, np.uint8)
        for start in range(0, n, _CHUNK):
            chunk = v[start : start + _CHUNK]
            slot = bucketize(chunk, cuts)
            if has_zero:  # slot 0 is the exact-zero level, the fitted bins follow
                slot += 1
                slot[chunk == 0] = 0
            counts += np.bincount(slot, minlength=n_slots)
            sums += np.bincount(slot, weights=chunk.astype(np.float64) ** power, minlength=n_slots)
            codes[start : start + _CHUNK] = slot
        used = counts > 0
        levels = ((sums[used] / counts[used]) ** (1.0 / power)).astype(np.float32)
        remap = (np.cumsum(used) - 1).astype(np.uint8)
        width = bits_for(levels.size)
        packed = pack_uint(remap[codes], width) if width else np.zeros(0, np.uint8)
        return cls(levels, packed, n)

    @classmethod
    def from_arrays(cls, levels: np.ndarray, codes: np.ndarray, n: int, what: str, where: str) -> SigmaCode:
        """Rebuild from stored tensors, validating them.

        Raises:
            InvalidArtifactError: Wrong dtype or size, a level negative or not finite, a code >= L.
        """
        if levels.dtype != np.float32 or levels.ndim != 1 or levels.size < 1:
            raise InvalidArtifactError(
                f"{where}: {what} levels must be a non-empty 1-D float32 tensor, got {levels.dtype} {levels.shape}"
            )
        if levels.size > 1 << MAX_SIGMA_BITS:
            raise InvalidArtifactError(f"{where}: {what} has {levels.size} levels, more than {1 << MAX_SIGMA_BITS}")
        if not np.all(np.isfinite(levels)) or np.any(levels < 0):
            raise InvalidArtifactError(f"{where}: {what} levels must be finite and >= 0")
        width = bits_for(levels.size)
        want = packed_nbytes(n, width)
        if codes.dtype != np.uint8 or codes.ndim != 1 or codes.size != want:
            raise InvalidArtifactError(
                f"{where}: {what} codes must be {want} packed uint8 bytes ({n} codes at {width} bits), "
                f"got {codes.dtype} {codes.shape}"
            )
        code = cls(levels, codes, n)
        if width and n and int(unpack_uint(codes, width, n).max()) >= levels.size:
            raise InvalidArtifactError(f"{where}: {what} codes point past its {levels.size} levels")
        return code


def bucketize(values: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """Index of the bin of each value between ascending ``cuts`` (``searchsorted``, left side).

    A few cuts compare faster than a binary search: one vectorised ``>`` per cut.
    """
    if cuts.size > 16:
        return np.searchsorted(cuts, values)
    slot = np.zeros(values.shape, np.intp)
    for cut in cuts:
        slot += values > cut
    return slot


def _power_mean(v: np.ndarray, power: int) -> float:
    return float(np.mean(v.astype(np.float64) ** power) ** (1.0 / power))


def _log_lloyd(pos: np.ndarray, n_bins: int, rng: np.random.Generator) -> np.ndarray:
    """Boundaries between ``n_bins`` Lloyd-Max levels of ``log pos``, mapped back to the linear domain."""
    sample = pos if pos.size <= _FIT_SAMPLE else pos[rng.choice(pos.size, _FIT_SAMPLE, replace=False)]
    logs = np.log(sample.astype(np.float64))
    centres = np.unique(np.quantile(logs, (np.arange(n_bins) + 0.5) / n_bins))
    for _ in range(_LLOYD_ITERS):
        if centres.size == 1:
            break
        bins = np.searchsorted((centres[1:] + centres[:-1]) / 2, logs)
        counts = np.bincount(bins, minlength=centres.size)
        sums = np.bincount(bins, weights=logs, minlength=centres.size)
        new = np.where(counts > 0, sums / np.maximum(counts, 1), centres)
        new = np.unique(new)
        if new.size == centres.size and np.allclose(new, centres, rtol=0, atol=1e-9):
            break
        centres = new
    return np.exp((centres[1:] + centres[:-1]) / 2).astype(np.float32)


class SigmaCodedWeight(Encoding):
    """Base of encodings whose weight is ``mean + σ·ε`` with σ from a :class:`SigmaCode`.

    Subclasses store ``self.sigma`` (coding every weight, C order) and implement ``mean``.
    """

    sigma: SigmaCode
    GAUSSIAN = True

    def stddev(self) -> np.ndarray:
        return self.sigma.decode().reshape(self.shape)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return draw_gaussian(rng, n, self.mean(), self.stddev())
