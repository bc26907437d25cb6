"""The search space: scheme × bits × σ bits × S × export mode × weight format × hoisting, and one point of it.

``sigma_bits`` is the lowering option that sets the bits of each weight's σ code (0: one σ per layer); at the
default 2, the σ codes of a 3-bit fixed-point model are 2 of its 5 bits per weight, so it decides as much of the
size as ``bits`` does.

The space is *define-by-run* (Optuna's term): ``scheme``, ``samples`` and ``hoist`` are always drawn,
``sigma_bits`` whenever the scheme has a σ code (every scheme but ``float`` and ``prune`` alone); ``bits`` among
the widths the scheme's pass accepts (its own config check decides: binary takes only 1 bit, ternary 2, so their
trials take ``auto``);
the export mode is drawn among the modes the scheme's encodings can be exported in (``noise`` draws Gaussian
weights only, so not codebook or binary ones; ``shared`` needs codebook layers, lowered with shared draws), and
the weight format only in
``baked`` mode (the only mode with quantized member weights). Each mode choice set is its own parameter
(``mode[baked,noise,analytic]``, ``bits[auto,3]``; ``bits`` when every width is accepted), because Optuna keeps one
distribution per parameter name. Parameters that are
always drawn are evolved by NSGA-II; the conditional ones are drawn by its seeded random sampler.

A posterior family's IR (:func:`family_space`) is searched over what varies for it: the schemes
:mod:`edgebnn.passes` registers for its encodings (deep ensembles, SWAG and Kronecker/dense Laplace: ``fixed`` and
``float``, and whatever is registered later), the bits of those, and the modes and S that export it exactly
(:func:`edgebnn.exporters.families.check_family`): a deep ensemble is ``baked`` at S = M with the device's weight
formats and ``ir`` (the IR's own codes: a lowered ensemble's member-code store), and no σ code (a member has none, a
Laplace layer's factors have their own codes); SWAG takes S from the space, ``baked`` and ``noise`` (drawn per
weight: :func:`exact_noise`), and the σ bits its lowering uses (at least ``FAMILY_SIGMA_BITS``). An axis given
explicitly with choices that cannot be exact for the family is refused in one line; a defaulted one is narrowed to
the family's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import MODES, STORE_CHOICES, WEIGHT_FORMATS, check_samples
from edgebnn.passes.base import MAX_SIGMA_BITS
from edgebnn.passes.config import config_fields, parse_scheme, pass_configs

if TYPE_CHECKING:
    import optuna

    from edgebnn.ir import BNNModel

DEFAULT_SCHEMES = ("mcq", "fixed", "codebook", "ternary", "binary", "prune+fixed")
DEFAULT_BITS = ("auto", "3", "4", "6")
"""auto (per layer, from the posterior variance) and the widths between the two that lose (2 bits: the digits CNN
falls to 0.27-0.79 accuracy in every scheme) and the one rarely smallest within a budget (8)."""
DEFAULT_SIGMA_BITS = (2, 1, 0)
DEFAULT_SAMPLES = (4, 8, 16, 32)
DEFAULT_HOIST = ("off", "auto")
HOIST_CHOICES = ("off", "auto")
NO_SIGMA_CODE = frozenset({"deep ensemble", "Laplace posterior"})
"""Families whose lowering reads no ``sigma_bits`` (a member is a point; a Kronecker/dense factor has its own code):
their trials draw none."""

_NOT_NOISE = {"codebook", "binary"}  # encodings --mode noise cannot draw (it draws Gaussian weights)


def has_sigma_code(scheme: str) -> bool:
    """Whether ``scheme`` takes ``sigma_bits`` (its last pass stores a σ code)."""
    return "sigma_bits" in config_fields(parse_scheme(scheme)[-1])[0]


def bits_for(scheme: str, bits: Sequence[str]) -> tuple[str, ...]:
    """The widths among ``bits`` that the last pass of ``scheme`` accepts (its config's own check)."""
    out = []
    for b in bits:
        try:
            pass_configs(scheme, b if b == "auto" else int(b), {}, {})
        except InvalidOptionError:
            continue
        out.append(b)
    return tuple(out)


def modes_for(scheme: str, modes: Sequence[str] = MODES) -> tuple[str, ...]:
    """The export modes (among ``modes``) that an IR lowered with ``scheme`` can be exported in."""
    last = parse_scheme(scheme)[-1]
    out = []
    for mode in modes:
        if (mode == "noise" and last in _NOT_NOISE) or (mode == "shared" and last != "codebook"):
            continue
        out.append(mode)
    return tuple(out)


@dataclass(frozen=True)
class TrialConfig:
    """One point of the space: how a trial lowers and exports the model.

    Attributes:
        scheme: Lowering scheme (``fixed``, ``prune+fixed``, ...).
        bits: ``"auto"`` or a forced width (as a string, the way the CLI and the config take it).
        sigma_bits: Bits of the σ code (0: one σ per layer); None for a scheme without one.
        samples: Ensemble size S.
        mode: Export mode.
        weights: Member weight format (outside ``baked`` mode every trial stores the IR's own codes, as
            ``edgebnn export`` does by default); ``ir`` (a family's space only): the
            IR's own codes, which a lowered deep ensemble's baked members keep (its member-code store).
        hoist: ``off`` or ``auto``.

    A ``noise``-mode trial of a family exact only with per-weight noise (SWAG) exports with ``--noise weight``
    (:func:`exact_noise`); the config does not name it, it follows from the model.
    """

    scheme: str
    bits: str
    sigma_bits: int | None
    samples: int
    mode: str
    weights: str
    hoist: str

    def to_dict(self) -> dict[str, Any]:
        """The config as the report writes it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialConfig:
        """Inverse of :meth:`to_dict` (a study file's stored config)."""
        return cls(**{k: data[k] for k in ("scheme", "bits", "sigma_bits", "samples", "mode", "weights", "hoist")})

    @property
    def bits_value(self) -> str | int:
        """``bits`` as :func:`edgebnn.api.lower` takes it."""
        return self.bits if self.bits == "auto" else int(self.bits)

    @property
    def options(self) -> dict[str, Any]:
        """Scheme options :func:`edgebnn.api.lower` takes: ``sigma_bits`` when the scheme has a σ code, and
        ``sampling="shared"`` for a ``shared``-mode trial (that mode exports the codebook's shared draws, which
        the codebook pass records only when asked; on a posterior not trained with shared draws they widen the
        predictive, which the trial's NLL and ECE measure)."""
        options: dict[str, Any] = {} if self.sigma_bits is None else {"sigma_bits": self.sigma_bits}
        return {**options, "sampling": "shared"} if self.mode == "shared" else options


@dataclass(frozen=True)
class SearchSpace:
    """The choices of each axis (defaults: :data:`DEFAULT_SCHEMES`, ...); ``family`` names the posterior family
    :func:`family_space` narrowed it for (None: a mean-field IR's space)."""

    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    bits: tuple[str, ...] = DEFAULT_BITS
    sigma_bits: tuple[int, ...] = DEFAULT_SIGMA_BITS
    samples: tuple[int, ...] = DEFAULT_SAMPLES
    modes: tuple[str, ...] = MODES
    weights: tuple[str, ...] = WEIGHT_FORMATS
    hoist: tuple[str, ...] = DEFAULT_HOIST
    family: str | None = None

    def __post_init__(self) -> None:
        for axis in ("schemes", "bits", "sigma_bits", "samples", "modes", "weights", "hoist"):
            if not getattr(self, axis):
                raise InvalidOptionError(f"search space: no {axis} to choose from")
        for b in self.bits:
            if b != "auto" and not (b.isdigit() and 1 <= int(b) <= 32):
                raise InvalidOptionError(f"search space: bits {b!r}: give 'auto' or an integer 1..32")
        for sb in self.sigma_bits:
            if not (isinstance(sb, int) and 0 <= sb <= MAX_SIGMA_BITS):
                raise InvalidOptionError(f"search space: sigma bits {sb!r}: give an integer 0..{MAX_SIGMA_BITS}")
        for scheme in self.schemes:
            if not modes_for(scheme, self.modes):
                raise InvalidOptionError(f"search space: scheme {scheme} exports in none of the modes "
                                         f"{', '.join(self.modes)}")
            if not bits_for(scheme, self.bits):
                raise InvalidOptionError(f"search space: scheme {scheme} takes none of the bits "
                                         f"{', '.join(self.bits)}")
        for s in self.samples:
            check_samples(s)
        for axis, allowed in (("modes", MODES), ("weights", STORE_CHOICES), ("hoist", HOIST_CHOICES)):
            bad = sorted(set(getattr(self, axis)) - set(allowed))
            if bad:
                raise InvalidOptionError(f"search space: unknown {axis} {bad}; choose among {', '.join(allowed)}")

    def to_dict(self) -> dict[str, Any]:
        """The space as JSON (stored in the study, so a resume with another space is refused); ``family`` only
        when there is one."""
        out: dict[str, Any] = {k: list(v) for k, v in asdict(self).items() if k != "family"}
        return out if self.family is None else {**out, "family": self.family}

    def suggest(self, trial: optuna.Trial) -> TrialConfig:
        """Draw one config through Optuna's define-by-run API (see the module docstring)."""
        scheme = trial.suggest_categorical("scheme", self.schemes)
        widths = bits_for(scheme, self.bits)
        bits = widths[0] if len(widths) == 1 else trial.suggest_categorical(
            "bits" if widths == self.bits else f"bits[{','.join(widths)}]", widths)
        sigma_code = has_sigma_code(scheme) and self.family not in NO_SIGMA_CODE
        sigma_bits = trial.suggest_categorical("sigma_bits", self.sigma_bits) if sigma_code else None
        samples = trial.suggest_categorical("samples", self.samples)
        modes = modes_for(scheme, self.modes)
        mode = modes[0] if len(modes) == 1 else trial.suggest_categorical(f"mode[{','.join(modes)}]", modes)
        weights = "ir"  # noise/shared/analytic: the IR's own codes, what `edgebnn export` writes by default
        if mode == "baked" and len(self.weights) > 1:
            weights = trial.suggest_categorical("weights", self.weights)
        elif mode == "baked":
            weights = self.weights[0]
        hoist = trial.suggest_categorical("hoist", self.hoist)
        return TrialConfig(str(scheme), str(bits), None if sigma_bits is None else int(sigma_bits), int(samples),
                           str(mode), str(weights), str(hoist))


def exact_noise(model: BNNModel, mode: str, samples: int) -> str | None:
    """The ``--noise`` variant with which ``model`` exports exactly in ``mode`` at S ``samples`` (``auto``, or
    ``weight`` for a family whose layers must be drawn per weight, SWAG), None when no variant is exact
    (:func:`edgebnn.exporters.families.check_family`)."""
    from edgebnn.exporters.families import check_family

    for noise in ("auto", "weight"):
        try:
            check_family(model, mode, samples, noise)
        except InvalidOptionError:
            continue
        return noise
    return None


def family_space(space: SearchSpace, model: BNNModel, default_weights: Sequence[str] = WEIGHT_FORMATS) -> SearchSpace:
    """``space`` narrowed to what varies for ``model``'s posterior family (the module docstring): every encoding
    :mod:`edgebnn.passes` registers family lowerings for (deep ensemble, SWAG, Kronecker/dense Laplace) limits the
    schemes to those registered for it; ``space`` itself for a mean-field IR. Weights left at ``default_weights``
    (the device's formats) gain ``ir``: the IR's own codes, the member-code store of a lowered ensemble's baked
    members (on a TensorRT device the export decodes them to fp32).

    Raises:
        InvalidOptionError: An axis given explicitly (not its default) whose choices cannot be exact for the
            family: one line naming the option and what the family takes.
    """
    from edgebnn.exporters.families import ensemble_members, family_of_model
    from edgebnn.ir import DOMAIN
    from edgebnn.passes.base import family_lowerings

    tables = [t for n in model.proto.graph.node if n.domain == DOMAIN and (t := family_lowerings(n.op_type))]
    if not tables:
        return space
    family = family_of_model(model) or "posterior family"
    registered = set.intersection(*({*t, "float"} for t in tables))

    def takes(scheme: str) -> bool:
        return all(name in registered for name in parse_scheme(scheme))

    given = space.schemes != DEFAULT_SCHEMES
    schemes = tuple(s for s in (space.schemes if given else (*DEFAULT_SCHEMES, "float")) if takes(s))
    if given and schemes != space.schemes:
        bad = [s for s in space.schemes if s not in schemes]
        raise InvalidOptionError(f"--schemes {','.join(bad)}: a {family} lowers with {' or '.join(sorted(registered))} "
                                 "only")
    members = ensemble_members(model)
    samples = space.samples
    if members is not None:
        if samples not in (DEFAULT_SAMPLES, (members,)):
            raise InvalidOptionError(f"--samples {','.join(map(str, samples))}: a deep ensemble of {members} members "
                                     f"exports exactly with S = {members} only; drop --samples")
        samples = (members,)
    sigma_bits = space.sigma_bits
    if family in NO_SIGMA_CODE and sigma_bits != DEFAULT_SIGMA_BITS:
        raise InvalidOptionError(f"--sigma-bits: a {family}'s lowering codes no σ with them; drop --sigma-bits")
    if family not in NO_SIGMA_CODE:  # SWAG: its σ code takes at least FAMILY_SIGMA_BITS, whatever is asked
        from edgebnn.passes.fixed import FAMILY_SIGMA_BITS

        sigma_bits = tuple(sorted({max(b, FAMILY_SIGMA_BITS) for b in sigma_bits}))
    def exact(mode: str) -> bool:  # exact at every S, and some scheme's encodings export in it
        return (all(exact_noise(model, mode, s) is not None for s in samples)
                and any(mode in modes_for(s) for s in schemes))

    modes = tuple(m for m in space.modes if exact(m))
    if space.modes != MODES and modes != space.modes:
        bad = [m for m in space.modes if m not in modes]
        exact_modes = [m for m in MODES if exact(m)]
        raise InvalidOptionError(f"--modes {','.join(bad)}: not exact for a {family}; it exports exactly in "
                                 f"{' or '.join(exact_modes)}")
    if not schemes or not modes:
        raise InvalidOptionError(f"{model.where}: a {family}: no scheme or mode of the search space lowers and "
                                 "exports it exactly")
    weights = space.weights
    if "baked" in modes and tuple(weights) == tuple(default_weights) and "ir" not in weights:
        weights = ("ir", *weights)
    return dataclasses.replace(space, schemes=schemes, samples=samples, modes=modes, sigma_bits=sigma_bits,
                               weights=weights, family=family)
