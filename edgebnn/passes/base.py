"""The pass machinery: configs, ``PassResult``, the ``Pass`` base class and the per-layer report.

A pass takes a verified IR and returns ``PassResult(model, modified, report)`` with a *new* model (the
input is never changed), or, called with ``consume=True``, the input itself rewritten in place (no
model-sized copy; the caller gives the input up). :class:`Pass` verifies the input, runs, verifies the
output, records itself in ``manifest.passes`` and wraps unexpected failures in :class:`PassError` naming
the pass and the passes before it. :class:`LayerPass` lowers each ``GaussianWeight`` on its own, with a
generator seeded by ``(seed, weight index)``, so the result is deterministic for a seed and independent of other layers.

Per-layer report (one row per encoded weight, graph order):

    name, layer         weight value name and source module path
    kind                encoding op type after the pass
    n_weights           elements of the weight
    bits                bits per weight of the main payload (32 for a GaussianWeight)
    bits_per_weight     8 · bytes / n_weights: every stored byte, codebooks, σ codes and outliers included
    sparsity            fraction of weights whose posterior mean is exactly 0
    bytes               bytes the encoding's tensors take in the ``.ebnn``
    distortion          distortion_mean + distortion_std, where
    distortion_mean     ||E[w] - μ||₂ / ||μ||₂     (mean after vs the input Gaussian's μ)
    distortion_std      ||sd[w] - σ||₂ / ||σ||₂    (std after vs the input σ)
                        (a zero denominator is replaced by 1: the error is then absolute)
    noise_ratio         mean((E[w] - μ)²) / mean(σ²): quantisation noise as a fraction of the layer's mean
                        posterior variance (None when σ = 0 everywhere)
    skipped             why the layer was left unchanged, else None
    note                a fallback or adjustment the pass made (capped bits, other encoding, degenerate
                        input), else None

plus scheme-specific keys documented in each pass module.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from edgebnn.errors import EdgeBNNError, InvalidArtifactError, InvalidOptionError
from edgebnn.family import family_of
from edgebnn.ir import BNNModel, EncodedWeight, Encoding, GaussianWeight, encoding_class, verify
from edgebnn.ir.encodings.packing import MAX_BITS
from edgebnn.ir.encodings.sigmacode import MAX_SIGMA_BITS

# The variance rule's f, one default for every scheme (fixed, codebook and mcq, and the ``fixed`` fallback that
# ternary and binary use for biases). At 0.25 the quantisation error moved the predictive measurably: fixed's and
# codebook's error is an offset of the mean that every draw shares (digits CNN, fixed: dECE +0.008, noise-blob
# MI-AUROC -0.021, mean MI 0.048 vs 0.041); mcq's is drawn afresh per member but adds up to a quarter of each
# weight's variance (bayesian-torch digits CNN: flipped-digit MI-AUROC -0.021). At 0.1 every mode of all three
# stays inside the uncertainty budget on both models (docs/uncertainty.md, bench/uncertainty_fidelity.py).
DEFAULT_NOISE_FRACTION = 0.1
DEFAULT_SIGMA_BITS = 2
# The smallest normal float32 (1.18e-38): no pass writes a per-layer scale below it. A subnormal scale has fewer
# significant bits than the integers it multiplies (fixed point or MCQ with mu = 1.2e-38 at 16 bits stored
# s = 3.66e-43 as 3.64e-43 and decoded 61 steps off), and a device that flushes subnormals to zero decodes it as 0.
F32_TINY = float(np.finfo(np.float32).tiny)


class PassError(EdgeBNNError):
    """A lowering pass failed unexpectedly or produced an invalid model; names the pass."""


@dataclass(frozen=True)
class PassResult:
    """What a pass returns: the new model, whether anything changed, and its report."""

    model: BNNModel
    modified: bool
    report: dict[str, Any]


@dataclass(frozen=True)
class LayerOutcome:
    """One lowered weight: the new encoding, an optional note, and scheme-specific report keys."""

    encoding: Encoding
    note: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def check_int(value: object, name: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``lo..hi`` or :class:`InvalidOptionError` naming the option."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= int(value) <= hi:
        raise InvalidOptionError(f"{name}={value!r}: must be an integer in {lo}..{hi}")
    return int(value)


def check_float(value: object, name: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """``value`` as a finite float in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (lo < value <= hi if lo_open else lo <= value <= hi):  # type: ignore[operator]
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise InvalidOptionError(f"{name}={value!r}: must be a finite number in {interval}")
    return float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PassConfig:
    """Base of the per-scheme settings: frozen, validated in ``__post_init__``."""

    VERSION: ClassVar[int] = 1

    def options(self) -> dict[str, Any]:
        """JSON-ready settings for ``manifest.passes`` (mappings of arrays become their sorted keys)."""
        out: dict[str, Any] = {"version": self.VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = sorted(value) if isinstance(value, Mapping) else value
        return out


@dataclass(frozen=True)
class QuantConfig(PassConfig):
    """Settings shared by the quantising schemes.

    Attributes:
        bits: Forced bits per weight, or None for "auto": the smallest width whose quantisation noise stays
            at most ``noise_fraction`` of the layer's mean posterior variance.
        noise_fraction: The stated fraction for ``bits=None``.
        sigma_bits: Bits of the per-weight σ code (0: one σ for the whole layer).
    """

    bits: int | None = None
    noise_fraction: float = DEFAULT_NOISE_FRACTION
    sigma_bits: int = DEFAULT_SIGMA_BITS

    BITS_RANGE: ClassVar[tuple[int, int]] = (2, MAX_BITS)

    def __post_init__(self) -> None:
        if self.bits is not None:
            check_int(self.bits, "bits", *self.BITS_RANGE)
        check_float(self.noise_fraction, "noise_fraction", 0.0, 100.0, lo_open=True)
        check_int(self.sigma_bits, "sigma_bits", 0, MAX_SIGMA_BITS)


_CHUNK = 1 << 18


def sum_sq_diff(a: np.ndarray, b: np.ndarray | None = None) -> float:
    """Σ (a - b)² (Σ a² without ``b``) accumulated in float64, chunk by chunk (no n-sized float64 copy)."""
    a, b = a.reshape(-1), None if b is None else b.reshape(-1)
    total = 0.0
    for start in range(0, a.size, _CHUNK):
        d = a[start : start + _CHUNK].astype(np.float64)
        if b is not None:
            d -= b[start : start + _CHUNK]
        total += float(np.sum(np.square(d, out=d)))  # not np.dot: BLAS threads crawl on a busy machine
    return total


def relative_error(new: np.ndarray, ref: np.ndarray) -> float:
    """``||new - ref||₂ / ||ref||₂`` (absolute when ``ref`` is all zero)."""
    num, den = np.sqrt(sum_sq_diff(new, ref)), np.sqrt(sum_sq_diff(ref))
    return float(num / den if den > 0 else num)


def layer_row(
    weight: EncodedWeight,
    new: Encoding,
    *,
    skipped: str | None = None,
    note: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report row of one weight: ``weight.encoding`` is the input, ``new`` the result."""
    old = weight.encoding
    mu, sigma = old.mean(), old.stddev()
    mean, std = new.mean(), new.stddev()
    var = sum_sq_diff(sigma) / new.size
    err2 = sum_sq_diff(mean, mu) / new.size
    d_mean, d_std = relative_error(mean, mu), relative_error(std, sigma)
    nbytes = new.nbytes
    return {
        "name": weight.name,
        "layer": weight.layer,
        "kind": new.op_type,
        "n_weights": new.size,
        "bits": int(getattr(new, "bits", 32)),
        "bits_per_weight": round(8 * nbytes / new.size, 4),
        "sparsity": float(np.count_nonzero(mean == 0) / new.size),
        "bytes": nbytes,
        "distortion": d_mean + d_std,
        "distortion_mean": d_mean,
        "distortion_std": d_std,
        "noise_ratio": err2 / var if var > 0 else None,
        "skipped": skipped,
        "note": note,
        **(extra or {}),
    }


class Pass(ABC):
    """A lowering pass: ``pass_(model, seed=0) -> PassResult``."""

    name: ClassVar[str]
    config_type: ClassVar[type[PassConfig]]

    def __init__(self, config: PassConfig | None = None, *, weights: Collection[str] | None = None) -> None:
        """``weights``: lower only these encoded weights (by name; None: all), as per-layer overrides need."""
        self.weights = None if weights is None else frozenset(weights)
        self.progress: Callable[[], None] | None = None  # called once per weight a run visits (lower's progress bar)
        if config is None:
            config = self.config_type()
        if not isinstance(config, self.config_type):
            raise InvalidOptionError(
                f"pass {self.name!r} takes a {self.config_type.__name__}, got {type(config).__name__}"
            )
        self.config = config

    @abstractmethod
    def run(self, model: BNNModel, seed: int) -> tuple[list[dict[str, Any]], bool]:
        """Rewrite ``model`` (a private copy, or the consumed input) in place; return the layer rows and whether it
        changed."""

    def __call__(self, model: BNNModel, *, seed: int = 0, consume: bool = False) -> PassResult:
        """Verify, run on a copy (on ``model`` itself with ``consume``), verify, record; see the module docstring.

        Raises:
            InvalidArtifactError: The input model fails verification.
            InvalidOptionError: An option does not fit this model (names the pass and layer).
            PassError: The pass failed unexpectedly or produced a model the verifier rejects.
        """
        seed = check_int(seed, "seed", 0, 2**63 - 1)
        before = [str(p.get("name")) for p in model.manifest.passes]
        context = f"pass {self.name!r}" + (f" (after {' -> '.join(before)})" if before else "")
        try:
            verify(model)
        except InvalidArtifactError as e:
            raise InvalidArtifactError(f"{context}: input model is invalid: {e}") from e
        out = model if consume else model.copy()
        try:
            layers, modified = self.run(out, seed)
        except EdgeBNNError as e:
            raise type(e)(f"{context}: {e}") from e
        except Exception as e:
            raise PassError(f"{context} failed on {model.where}: {type(e).__name__}: {e}") from e
        try:
            verify(out)
        except InvalidArtifactError as e:
            raise PassError(f"{context} produced an invalid model: {e}") from e
        options = self.config.options()
        record = {"name": self.name, "options": options, "seed": seed}
        if self.weights is not None:
            record["weights"] = sorted(self.weights)
        out.manifest.passes.append(record)
        report = {"pass": self.name, "options": options, "seed": seed, "layers": layers}
        return PassResult(out, modified, report)


class LayerPass(Pass):
    """A pass that lowers every ``GaussianWeight`` independently, hands a family's own encoding to the lowering its
    family declares for this scheme (refused in one line where there is none; ``float`` keeps it), and skips
    other encodings, with the reason."""

    @abstractmethod
    def lower_weight(self, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        """Encode one Gaussian weight (``weight.encoding`` is a :class:`GaussianWeight`)."""

    def run(self, model: BNNModel, seed: int) -> tuple[list[dict[str, Any]], bool]:
        rows = []
        modified = False
        for i, name in enumerate(model.encoded_weight_names()):  # i seeds the layer: the same with or without others
            if self.progress is not None:
                self.progress()
            if self.weights is not None and name not in self.weights:
                continue
            weight = model.encoded_weight(name)  # one layer decoded at a time
            family = family_lowerings(weight.encoding.op_type)
            if family is not None:  # a posterior family's own encoding (deep ensemble, SWAG): its lowering or none
                lowering = family.get(self.name, kept() if self.name == "float" else None)
                if lowering is None:
                    raise InvalidOptionError(
                        f"layer {weight.layer!r} is a {weight.encoding.op_type}, which {self.name} cannot lower; "
                        f"use --scheme {' or '.join(sorted({*family, 'float'}))}")
                self.check_honoured(lowering, weight)
                lowered = lowering(self, weight, np.random.default_rng([seed, i]))
                if lowered.encoding is not weight.encoding:
                    model.replace_encoding(weight, lowered.encoding)
                    modified = True
                rows.append(layer_row(weight, lowered.encoding, note=lowered.note, extra=lowered.extra))
                continue
            if not isinstance(weight.encoding, GaussianWeight):
                owner = family_of(weight.encoding.op_type)
                reason = (f"kept as {weight.encoding.op_type}: {self.name} lowers mean-field Gaussian posteriors, and "
                          f"the {owner.name if owner else 'unregistered'} family declares no {self.name} lowering "
                          "for it")
                rows.append(layer_row(weight, weight.encoding, skipped=reason))
                continue
            try:
                outcome = self.lower_weight(weight, np.random.default_rng([seed, i]))
            except EdgeBNNError as e:
                raise type(e)(f"weight {weight.name!r}: {e}") from e
            if outcome.encoding is not weight.encoding:
                model.replace_encoding(weight, outcome.encoding)
                modified = True
            rows.append(layer_row(weight, outcome.encoding, note=outcome.note, extra=outcome.extra))
        return rows, modified


    def check_honoured(self, lowering: FamilyLowering, weight: EncodedWeight) -> None:
        """Refuse (one line) a setting of this pass that asks something of ``weight`` its family's ``lowering``
        does not declare it honours (:class:`Lowering`): a forced ``bits``, calibration ``grams`` for it."""
        refuse_unhonoured(self.name, lowering, weight, asks_of(self.config, weight.name))


def refuse_unhonoured(scheme: str, lowering: FamilyLowering, weight: EncodedWeight, asked: Mapping[str, str]) -> None:
    """Refuse (one line) the settings in ``asked`` ({setting: how the user set it}) that ``weight``'s family's
    ``lowering`` under ``scheme`` does not declare it honours."""
    unmet = [s for s in asked if s not in honours(lowering)]
    if unmet:
        family = family_of(weight.encoding.op_type)
        what = " and ".join(asked[s] for s in unmet)
        raise InvalidOptionError(
            f"layer {weight.layer!r} is a {weight.encoding.op_type}, whose {scheme} lowering (the "
            f"{family.name if family else 'unregistered'} family's) cannot honour {what}: it declares "
            f"honours={sorted(honours(lowering))} (edgebnn.families.Lowering); drop "
            f"{' and '.join(OPTION_OF[s] for s in unmet)}")


# a posterior family's lowering of one of its encodings (edgebnn.families: Family.lowerings)
FamilyLowering = Callable[[LayerPass, EncodedWeight, np.random.Generator], LayerOutcome]
# the per-weight settings of a scheme a family's lowering may honour (Lowering.honours), and their options
OPTION_OF = {"bits": "--bits", "grams": "--calibrate"}
ASKED_GRAMS = "--calibrate (its input second moments)"  # how a refusal names the grams a pass was given


@dataclass(frozen=True)
class Lowering:
    """A family's lowering of one encoding under one scheme (an entry of :attr:`Family.lowerings
    <edgebnn.family.Family.lowerings>`) and the settings of the scheme it honours, beyond those every lowering
    reads from ``pass_.config`` as it likes (``noise_fraction``, ``sigma_bits``, ``clip``):

    - ``"bits"``: a forced width (``--bits N``, ``config.bits`` not None) sets the width of what it codes;
    - ``"grams"``: calibration's input second moments (``--calibrate``, ``config.grams[weight.name]``) steer its
      rounding.

    A plain function in the table honours neither: a lowering asked for one it does not honour is refused in one
    line (never silently ignored while the manifest records the setting). Called as the function it wraps.
    """

    lower: FamilyLowering
    honours: Collection[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "honours", frozenset(self.honours))
        stray = sorted(set(self.honours) - set(OPTION_OF))
        if stray:
            raise ValueError(f"Lowering honours {stray}: a lowering honours {sorted(OPTION_OF)}")

    def __call__(self, pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        return self.lower(pass_, weight, rng)


def honours(lowering: FamilyLowering) -> frozenset[str]:
    """The settings ``lowering`` declares it honours (:class:`Lowering`; none for a plain function)."""
    return frozenset(lowering.honours) if isinstance(lowering, Lowering) else frozenset()


def asks_of(config: PassConfig, weight: str) -> dict[str, str]:
    """The honour-needing settings (:data:`OPTION_OF`) ``config`` sets for ``weight``, each as a user reads it."""
    asked = {}
    bits = getattr(config, "bits", None)
    if bits is not None:
        asked["bits"] = f"--bits {bits}"
    grams = getattr(config, "grams", None)
    if grams is not None and weight in grams:
        asked["grams"] = ASKED_GRAMS
    return asked


def family_lowerings(op_type: str) -> Mapping[str, FamilyLowering] | None:
    """{scheme: lowering} the family of ``op_type`` declares for it (``float``, which keeps every weight, is
    implied), or None: no lowering of its own (a Gaussian, lowered by the schemes' passes; a lowered encoding that
    a scheme then skips, saying why). A LayerPass hands such a weight to its lowering and refuses (one line) a
    scheme with none."""
    family = family_of(op_type)
    return None if family is None else family.lowerings.get(op_type)


def lowers(op_type: str, scheme: str) -> bool:
    """Whether the pass ``scheme`` encodes a weight of ``op_type`` (its family's lowering, ``float``'s keep, or a
    mean-field Gaussian, which every scheme's pass lowers) rather than refusing or skipping it."""
    table = family_lowerings(op_type)
    if table is not None:
        return scheme in table or scheme == "float"
    cls = encoding_class(op_type)
    return cls is not None and issubclass(cls, GaussianWeight)


def kept(note: str | None = None) -> FamilyLowering:
    """A family lowering that keeps the weight as it is (with ``note``, e.g. "already fixed point: kept"); what
    ``float`` does with every family's weights."""
    def keep(pass_: LayerPass, weight: EncodedWeight, rng: np.random.Generator) -> LayerOutcome:
        return LayerOutcome(weight.encoding, note)
    return keep


def posterior(weight: EncodedWeight) -> tuple[np.ndarray, np.ndarray]:
    """``(μ, σ)`` of a Gaussian weight as flat float32 views."""
    enc = weight.encoding
    if not isinstance(enc, GaussianWeight):
        raise TypeError(f"{weight.name} is a {enc.op_type}, not a GaussianWeight")
    return enc.mu.reshape(-1), enc.sigma.reshape(-1)


def degenerate_note(mu: np.ndarray, sigma: np.ndarray) -> str | None:
    """A note for the degenerate posteriors every scheme must survive (all-zero μ, σ = 0 everywhere)."""
    notes = []
    if not np.any(mu):
        notes.append("all means are 0")
    if not np.any(sigma):
        notes.append("sigma is 0 everywhere (a deterministic layer: draws equal the mean)")
    return "; ".join(notes) or None


def join_notes(*notes: str | None) -> str | None:
    """Join the non-empty notes with '; ' (None when there are none)."""
    kept = [n for n in notes if n]
    return "; ".join(kept) or None
