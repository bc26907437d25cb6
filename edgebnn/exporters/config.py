"""The export configuration: every choice an export makes, as one frozen value that round-trips through JSON.

::

    {"version": 1, "samples": 16, "rule": null, "mode": "auto", "noise": "auto", "weights": "ir", "rng": "auto",
     "hoist": "off", "form": "auto", "seed": 0, "device": null}

(plus ``"variance": "separable"`` where analytic mode's separable variance is asked for.)

:class:`ExportConfig` is validated when it is made (the one-line :class:`~edgebnn.errors.InvalidOptionError` the
command line shows), holds the defaults (those of ``edgebnn export``: :data:`DEFAULT_EXPORT` names the device the
command line adds), and is resolved against a model once (:meth:`ExportConfig.resolve`): S from the posterior
family when none is given (a deep ensemble's M members, else :data:`~edgebnn.exporters.DEFAULT_SAMPLES`), the
anytime rule of ``samples="auto"`` (:func:`rule_for`), the device's profile, and for ``mode="auto"`` the modes to
try, in order (module docstring of :mod:`edgebnn.exporters.export`). The resolved value hands each mode handler a
:class:`GraphSpec`: one graph's mode, noise variant, S and the rest, with ``rng="auto"`` resolved for that mode.

Every export records the configuration that reproduces it (the ``config`` field of its metadata,
:mod:`.metadata`), with everything ``auto`` decided: the S, the mode and noise variant chosen, where the noise is
drawn. Exporting the same IR with that configuration writes the same bytes, as the manifest's ``lower_config``
replays a lowering.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgebnn.devices import DeviceProfile, export_device
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import (
    AUTO,
    DEFAULT_SAMPLES,
    MODE_CHOICES,
    NOISE_VARIANTS,
    ORT,
    RNG_CHOICES,
    STORE_CHOICES,
    TRT,
    VARIANCE_CHOICES,
    check_samples,
)
from edgebnn.exporters.forms import FORMS
from edgebnn.stopping import StoppingRule

if TYPE_CHECKING:
    from edgebnn.ir import BNNModel

__all__ = ["AUTO", "CONFIG_VERSION", "DEFAULT_EXPORT", "DEFAULT_SAMPLES", "MODE_CHOICES", "ExportConfig",
           "GraphSpec", "ResolvedExport", "rule_for"]

CONFIG_VERSION = 1
SAMPLING = ("noise", "shared")  # the modes that draw at run time (where --rng applies)
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ExportConfig:
    """How to export an IR as an ONNX ensemble; validated on construction (one line naming the option).

    Attributes:
        samples: Ensemble size S; None: the posterior family's (a deep ensemble's M members, each once; else
            :data:`~edgebnn.exporters.DEFAULT_SAMPLES`); ``"auto"``: an anytime ensemble that draws samples in
            chunks until each input's predictive has settled (``rule``; :mod:`edgebnn.stopping`).
        rule: ``samples="auto"``: the stopping rule (None: :func:`rule_for`'s defaults for the model; a deep
            ensemble's largest count is its M). Giving one with ``samples`` None means ``"auto"``.
        mode: ``auto`` (the device's default: :mod:`edgebnn.exporters.export`), ``baked`` (S members drawn now,
            stored as constants), ``noise`` (μ and σ stored, noise drawn per call), ``shared`` (codebook draws) or
            ``analytic`` (one pass on means and variances).
        noise: The ``noise`` mode's variant: ``auto``, ``local``, ``weight``, ``mixed``, ``flipout``
            (:mod:`.noise`).
        weights: How the graph stores its weights: ``ir`` (the IR's own codes where it has them), ``fp32``, ``int8``,
            ``int4`` (:mod:`.stores`).
        rng: ``noise``/``shared``: ``host`` (noise inputs the host fills), ``graph`` (seeded random ops inside) or
            ``auto`` (graph where the device runs random ops with their seeds, else host).
        hoist: ``off``, ``auto`` (layers whose σ is below their quantization step run once) or a σ threshold.
        form: How int8/int4 constants are written: ``auto`` (by device), ``qdq``, ``folded``, ``integer``
            (:mod:`.forms`).
        seed: Seed of the baked members (and of ``--noise mixed``'s, and of in-graph random ops).
        device: Where the graph runs (``cpu``, ``arm64``, ``rtx``, ``jetson*``; None: no device, the portable
            forms; ``mode="auto"`` then takes the cpu's default).
        variance: ``analytic``: how a layer's variance convolutions are computed: ``exact`` (each term the layer's
            own k×k Conv) or ``separable`` (a per-channel k×k filter and a 1×1 mix, about 2/9 of the cost for 3×3
            kernels; an approximation whose fitted error the export records: :mod:`.analytic`).
        version: Format of this config.
    """

    samples: int | str | None = None
    rule: StoppingRule | None = None
    mode: str = AUTO
    noise: str = "auto"
    weights: str = "ir"
    rng: str = "auto"
    hoist: str | float = "off"
    form: str = "auto"
    seed: int = 0
    device: str | None = None
    variance: str = "exact"
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise InvalidOptionError(f"export config version={self.version!r}: must be a positive integer")
        if self.version > CONFIG_VERSION:
            raise InvalidOptionError(f"export config version={self.version}: this edgebnn reads export configs up "
                                     f"to version {CONFIG_VERSION}")
        self._check_samples()
        if self.weights not in STORE_CHOICES:
            raise InvalidOptionError(f"--weights {self.weights}: choose one of {', '.join(STORE_CHOICES)}")
        if self.device is not None:
            export_device(self.device)  # refuses an unknown device, listing the names it takes
        if self.rng not in RNG_CHOICES:
            raise InvalidOptionError(f"--rng {self.rng}: choose one of {', '.join(RNG_CHOICES)}")
        if self.mode not in MODE_CHOICES:
            raise InvalidOptionError(f"--mode {self.mode}: choose one of {', '.join(MODE_CHOICES)}")
        if self.noise not in NOISE_VARIANTS:
            raise InvalidOptionError(f"--noise {self.noise}: choose {' or '.join(NOISE_VARIANTS)}")
        if self.form not in FORMS:
            raise InvalidOptionError(f"--form {self.form}: choose one of {', '.join(FORMS)}")
        if self.variance not in VARIANCE_CHOICES:
            raise InvalidOptionError(f"--variance {self.variance}: choose one of {', '.join(VARIANCE_CHOICES)}")
        if self.variance != "exact" and self.mode not in (AUTO, "analytic"):
            raise InvalidOptionError(f"--variance {self.variance}: only --mode analytic computes variances (got "
                                     f"--mode {self.mode})")
        hoist = self.hoist
        if hoist not in ("off", "auto") and (isinstance(hoist, bool) or not isinstance(hoist, (int, float))
                                             or hoist < 0):
            raise InvalidOptionError(f"--hoist {hoist}: use auto, off or a non-negative sigma")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise InvalidOptionError(f"--seed {self.seed}: must be a non-negative integer")
        if self.samples == AUTO and self.mode == "analytic":
            raise InvalidOptionError("--samples auto --mode analytic: analytic mode draws no samples (one pass "
                                     "computes the predictive), so there are none to save; give --samples N")

    def _check_samples(self) -> None:
        samples = self.samples
        if self.rule is not None:
            if not isinstance(self.rule, StoppingRule):
                raise InvalidOptionError(f"rule={self.rule!r}: must be an edgebnn.stopping.StoppingRule")
            if samples not in (AUTO, None):
                raise InvalidOptionError(f"samples={samples!r} with a stopping rule: give samples='auto'")
            object.__setattr__(self, "samples", AUTO)
        elif isinstance(samples, str) and samples != AUTO:
            raise InvalidOptionError(f"samples={samples!r}: a positive integer, or 'auto'")
        elif samples is not None and samples != AUTO:
            check_samples(samples)  # type: ignore[arg-type]

    # -- JSON -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON object (``from_dict(to_dict())`` gives an equal config); ``variance`` only where it is not
        ``exact`` (so the configs recorded before it existed are the same bytes)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["rule"] = None if self.rule is None else self.rule.to_dict()
        if self.variance == "exact":
            del out["variance"]
        return out

    @classmethod
    def from_dict(cls, raw: object, where: str = "export config") -> ExportConfig:
        """Validate a JSON object (what :meth:`to_dict` wrote; missing keys take their defaults); errors are one line
        naming ``where`` and the key."""
        if not isinstance(raw, Mapping):
            raise InvalidOptionError(f"{where}: must be a JSON object, got {type(raw).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise InvalidOptionError(f"{where}: unknown key(s) {unknown}; an export config has {sorted(names)}")
        fields = dict(raw)
        if fields.get("rule") is not None:
            fields["rule"] = StoppingRule.from_dict(fields["rule"], where)
        try:
            return cls(**fields)
        except InvalidOptionError as e:
            raise InvalidOptionError(f"{where}: {e}") from e

    # -- against a model --------------------------------------------------------------------------
    def resolve(self, model: BNNModel) -> ResolvedExport:
        """This config against ``model``: S (the family's default when none is given), the anytime rule, the device
        profile and the modes to try, in order.

        Raises:
            InvalidOptionError: ``samples="auto"`` on a model the rule cannot take (a task that is no softmax
                classifier, a deep ensemble's largest count other than its M).
        """
        from edgebnn.exporters.families import default_samples

        rule = None
        if self.samples == AUTO:
            rule = self.rule or rule_for(model)
            _check_anytime(model, rule)
            samples = rule.max_samples
        else:
            samples = int(self.samples) if self.samples is not None else default_samples(model)
        profile = export_device(self.device) if self.device is not None else None
        return ResolvedExport(self, samples, rule, profile, _candidates(model, self, samples))


DEFAULT_EXPORT = ExportConfig(device="cpu")
"""What ``edgebnn export model.ebnn -o m.onnx`` writes unless told otherwise (the command line names the device:
``cpu`` for ``--target onnx``)."""


@dataclass(frozen=True)
class GraphSpec:
    """One graph a mode handler builds: a mode and noise variant of a resolved config, with its S and, for one chunk
    of an anytime ensemble, its window.

    Attributes:
        mode, noise, samples, seed, weights, hoist, form, device, variance: as in :class:`ExportConfig`
            (``samples``: this graph's S, a chunk's size in an anytime ensemble).
        profile: The device's profile (None without a device).
        rng: ``host`` or ``graph``: ``auto`` resolved for ``mode``.
        window: ``(first, total)``: the graph's members are draws ``first .. first + samples - 1`` of the ``total``
            an S = ``total`` export draws (one chunk of an anytime ensemble, :mod:`.anytime`); None: all of them.
        progress: Called as ``progress(done, total)`` while the graph is built.
    """

    mode: str
    noise: str
    samples: int
    seed: int
    weights: str
    hoist: str | float
    form: str
    device: str | None
    profile: DeviceProfile | None
    rng: str
    window: tuple[int, int] | None = None
    progress: Progress | None = None
    variance: str = "exact"

    @property
    def total(self) -> int:
        """The S whose draws this graph holds (a chunk's: the anytime ensemble's largest count)."""
        return self.window[1] if self.window is not None else self.samples

    @property
    def runtimes(self) -> tuple[str, ...] | None:
        """Where the graph's decodes must run (None: any): TensorRT or onnxruntime, from the device."""
        return None if self.profile is None else (TRT,) if self.profile.on_tensorrt else (ORT,)


@dataclass(frozen=True)
class ResolvedExport:
    """An :class:`ExportConfig` resolved against one model (:meth:`ExportConfig.resolve`).

    Attributes:
        config: The config as given.
        samples: S (an anytime ensemble: its largest count, ``rule.max_samples``).
        rule: The anytime ensemble's stopping rule, or None for a fixed S.
        profile: The device's profile (None without a device).
        candidates: ``(mode, noise variant)`` to try, in order: the one asked for, or ``mode="auto"``'s order.
    """

    config: ExportConfig
    samples: int
    rule: StoppingRule | None
    profile: DeviceProfile | None
    candidates: tuple[tuple[str, str], ...]

    @property
    def where(self) -> str:
        """The device ``mode="auto"`` chose for (``cpu`` when none is given)."""
        return self.config.device or "cpu"

    def spec(self, mode: str, noise: str, *, samples: int | None = None, window: tuple[int, int] | None = None,
             progress: Progress | None = None) -> GraphSpec:
        """The graph of ``mode`` and ``noise`` (``samples``: this graph's S, default :attr:`samples`).

        Raises:
            InvalidOptionError: ``rng="graph"`` with a mode that draws nothing at run time.
        """
        c = self.config
        return GraphSpec(mode, noise, self.samples if samples is None else samples, c.seed, c.weights, c.hoist,
                         c.form, c.device, self.profile, self.rng_for(mode), window, progress, c.variance)

    def rng_for(self, mode: str) -> str:
        """``host`` or ``graph`` for ``mode`` (``auto``: graph where the device runs random ops with their seeds;
        host on TensorRT, which imports them as a Fill layer that ignores the seed: ``--rng graph`` builds there
        and draws at run time, unseeded, and the builder says so)."""
        rng = self.config.rng
        if rng == AUTO:
            runs_random = self.profile is None or self.profile.random_ops
            return "graph" if runs_random and mode in SAMPLING else "host"
        if rng == "graph" and mode not in SAMPLING:
            raise InvalidOptionError(f"--rng graph: only --mode noise and shared draw at run time (got --mode {mode})")
        return rng

    def record(self, mode: str, noise: str) -> ExportConfig:
        """The config that reproduces the export written in ``mode`` and ``noise``: every ``auto`` decided (S, the
        rule, the mode, where the noise is drawn)."""
        return dataclasses.replace(self.config, samples=AUTO if self.rule is not None else self.samples,
                                   rule=self.rule, mode=mode, noise=noise, rng=self.rng_for(mode))


def rule_for(model: BNNModel, *, min_samples: int | None = None, max_samples: int | None = None,
             chunk: int | None = None, epsilon: float | None = None, delta: float | None = None) -> StoppingRule:
    """The stopping rule of ``model`` with the options given and :class:`~edgebnn.stopping.StoppingRule`'s defaults
    for the rest: at most 16 samples (a deep ensemble: its M members), 4 at a time and at least 4 (where 4 does not
    divide the largest count: its largest divisor up to 4)."""
    from edgebnn.exporters.families import ensemble_members

    default = StoppingRule()
    top = max_samples if max_samples is not None else ensemble_members(model) or default.max_samples
    if chunk is None or min_samples is None:  # the largest chunk up to 4 that leaves a look before the top
        pairs = [(c, c * -(-default.min_samples // c)) for c in ([chunk] if chunk else range(default.chunk, 0, -1))
                 if top % c == 0]
        c, m = next(((c, m) for c, m in pairs if m < top), (chunk or 1, min(2, top)))
        chunk = chunk or c
        min_samples = min_samples if min_samples is not None else m
    return StoppingRule(min_samples=min_samples, max_samples=top, chunk=chunk,
                        epsilon=default.epsilon if epsilon is None else epsilon,
                        delta=default.delta if delta is None else delta)


def _check_anytime(model: BNNModel, rule: StoppingRule) -> None:
    """Refuse an anytime ensemble the model cannot take: a task the rule has no statement for (a plug-in's), a
    largest count other than the S the family fixes (a deep ensemble's M)."""
    from edgebnn.exporters.families import samples_fixed_by

    task = model.manifest.task_spec(model.where)
    if task.name not in ("classification", "segmentation", "regression"):
        raise InvalidOptionError(f"{model.where}: --samples auto: the stopping rule has a statement for "
                                 f"classification, segmentation and regression; this is a {task.name} model: give "
                                 "--samples N")
    fixed = samples_fixed_by(model)
    if fixed is not None and rule.max_samples != fixed[1]:
        noun, members = fixed
        raise InvalidOptionError(f"{model.where}: --max-samples {rule.max_samples}: a {noun} of {members} "
                                 f"members draws each member once (--max-samples {members})")


def _candidates(model: BNNModel, config: ExportConfig, samples: int) -> tuple[tuple[str, str], ...]:
    """(mode, noise variant) to try, in order: the mode asked for, or for ``mode="auto"`` the device's default mode
    (with ``--noise auto``, then ``weight`` where the family refuses ``auto``: SWAG), then ``baked``; a deep ensemble
    and a TensorRT device: ``baked`` alone."""
    from edgebnn.exporters.families import ensemble_members, refusal

    noise = config.noise
    if config.mode != AUTO:
        return ((config.mode, noise),)
    profile = export_device(config.device or "cpu")
    if ensemble_members(model) is not None or profile.export_mode == "baked":
        return (("baked", noise),)
    variants = [noise] if noise != "auto" else [  # a variant the family refuses (SWAG: only weight draws) is skipped
        v for v in ("auto", "weight") if v == "weight" or refusal(model, profile.export_mode, samples, v) is None]
    return (*((profile.export_mode, v) for v in variants), ("baked", noise))
