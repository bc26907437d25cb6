"""The lowering configuration: everything ``lower`` does, as a versioned value that round-trips through JSON.

::

    {"version": 1, "scheme": "prune+fixed", "bits": "auto", "seed": 0,
     "options": {"noise_fraction": 0.5, "log_alpha_threshold": 2.5},
     "overrides": [{"pattern": "fc*", "scheme": "codebook", "options": {"clusters": 16}},
                   {"pattern": "features.0", "bits": 8}]}

``options`` are fields of the scheme's pass configs (each goes to every pass of the composition that has
it): numbers, booleans, strings or null. Array-valued settings (``gradients``, ``group_scales``) are data,
not configuration: ``lower(..., gradients=...)`` takes them from Python and they are not stored.

``overrides`` apply per layer, in order; a layer (``fnmatch`` of ``pattern`` on its module path, e.g.
``features.*``, or on the weight name when the node has no layer) takes the LAST override that matches it.
An override's unset fields inherit: ``scheme`` the config's; ``bits`` the config's when the scheme is
unchanged, else ``auto``; ``options`` the config's options that its scheme takes, updated with its own.

The manifest of a lowered ``.ebnn`` stores the config (``lower_config``), so ``edgebnn lower --config
model.ebnn`` replays the lowering byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.ir import DOMAIN, BNNModel
from edgebnn.passes.base import ASKED_GRAMS, Pass, PassConfig, check_int, family_lowerings, refuse_unhonoured
from edgebnn.passes.binary import BinaryPass
from edgebnn.passes.codebook import CodebookPass
from edgebnn.passes.fixed import FixedPass
from edgebnn.passes.float_ import FloatPass
from edgebnn.passes.mcq import McqPass
from edgebnn.passes.prune import PrunePass
from edgebnn.passes.ternary import TernaryPass

CONFIG_VERSION = 1
PASSES: dict[str, type[Pass]] = {
    p.name: p for p in (FloatPass, McqPass, FixedPass, CodebookPass, TernaryPass, BinaryPass, PrunePass)
}
SCHEMES = tuple(PASSES)
MAX_SEED = 2**63 - 1
_SCALARS = (bool, int, float, str, type(None))


def parse_scheme(scheme: str) -> list[str]:
    """Split ``"prune+codebook"`` into pass names, checking how they compose.

    ``prune`` may come first and compose with any scheme but ``binary``; at most one other scheme.

    Raises:
        InvalidOptionError: Unknown name, empty part, or a composition that makes no sense.
    """
    if not isinstance(scheme, str) or not scheme.strip():
        raise InvalidOptionError(f"--scheme {scheme!r}: give one of {', '.join(SCHEMES)} (prune composes: prune+X)")
    names = [p.strip() for p in scheme.split("+")]
    for name in names:
        if name not in PASSES:
            raise InvalidOptionError(f"--scheme {scheme}: unknown scheme {name!r}; known: {', '.join(SCHEMES)}")
    rest = [n for n in names if n != "prune"]
    if len(names) - len(rest) > 1 or ("prune" in names and names[0] != "prune"):
        raise InvalidOptionError(f"--scheme {scheme}: prune may appear once, first (prune+codebook)")
    if len(rest) > 1:
        raise InvalidOptionError(f"--scheme {scheme}: only prune composes; pick one of {', '.join(rest)}")
    if "prune" in names and rest == ["binary"]:
        raise InvalidOptionError(f"--scheme {scheme}: a binary weight cannot be 0, so pruning cannot carry over")
    return names


def config_fields(name: str) -> tuple[set[str], set[str]]:
    """(settings, data) field names of pass ``name``'s config; data fields hold arrays (``compare=False``)."""
    fields = dataclasses.fields(PASSES[name].config_type)
    return {f.name for f in fields if f.compare}, {f.name for f in fields if not f.compare}


DATA_OPTIONS = frozenset().union(*(config_fields(n)[1] for n in PASSES))  # gradients, group_scales, grams, ...


def data_fields(config: LowerConfig) -> set[str]:
    """The data options (:data:`DATA_OPTIONS`) some pass of ``config`` takes, its overrides' schemes included."""
    schemes = {config.scheme, *(o.scheme for o in config.overrides if o.scheme)}
    return set().union(*(config_fields(n)[1] for s in schemes for n in parse_scheme(s)))


def refuse_uncalibratable(config: LowerConfig, model: BNNModel) -> None:
    """Refuse (one line) ``--calibrate`` before its inputs are run when a layer that would get input second
    moments is lowered by a family's lowering that does not honour them (the pass would refuse only after)."""
    owned = {w.name: (w, lowerings) for w in model.iter_encoded_weights()  # one weight decoded at a time
             if (lowerings := family_lowerings(w.encoding.op_type)) is not None}
    for plan in config.plan(model):
        takers = [n for n in parse_scheme(plan.scheme) if "grams" in config_fields(n)[1]]
        for weight, lowerings in (owned[n] for n in plan.weights if n in owned):
            for scheme in (s for s in takers if s in lowerings):
                refuse_unhonoured(scheme, lowerings[scheme], weight, {"grams": ASKED_GRAMS})


@dataclass(frozen=True)
class Plan:
    """What one group of layers gets: the passes to run, in order (each restricted to ``weights``)."""

    scheme: str
    bits: int | str
    options: dict[str, Any]
    weights: tuple[str, ...]


@dataclass(frozen=True)
class LayerOverride:
    """Per-layer settings: layers whose name matches ``pattern`` (fnmatch) take these instead.

    Attributes:
        pattern: fnmatch pattern on the layer's module path (``fc*``, ``features.[03]``).
        scheme: Scheme for these layers (None: the config's).
        bits: ``"auto"`` or N (None: inherit, see the module docstring).
        options: Pass options for these layers (over the inherited ones).
    """

    pattern: str
    scheme: str | None = None
    bits: int | str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        key = f"override {self.pattern!r}"
        if not isinstance(self.pattern, str) or not self.pattern:
            raise InvalidOptionError(f"config override pattern={self.pattern!r}: must be a non-empty fnmatch pattern")
        if self.scheme is not None:
            object.__setattr__(self, "scheme", "+".join(parse_scheme(self.scheme)))
        if self.bits is not None:
            object.__setattr__(self, "bits", _check_bits(self.bits, f"{key} bits"))
        object.__setattr__(self, "options", _check_options(self.options, f"{key} options"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pattern": self.pattern}
        if self.scheme is not None:
            out["scheme"] = self.scheme
        if self.bits is not None:
            out["bits"] = self.bits
        if self.options:
            out["options"] = dict(self.options)
        return out


@dataclass(frozen=True)
class LowerConfig:
    """How to lower a model; validated on construction (:class:`InvalidOptionError` naming the key).

    Attributes:
        scheme: ``float``, ``mcq``, ``fixed``, ``codebook``, ``ternary``, ``binary``, ``prune`` or ``prune+X``.
        bits: ``"auto"`` (from the posterior variance) or bits per weight for the last scheme of the composition.
        seed: Seeds every random choice; the same config and model give the same bytes.
        options: Pass settings (see the module docstring).
        overrides: Per-layer settings; a layer takes the last override whose pattern matches it.
        version: Format of this config.
    """

    scheme: str = "float"
    bits: int | str = "auto"
    seed: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)
    overrides: tuple[LayerOverride, ...] = ()
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise InvalidOptionError(f"config version={self.version!r}: must be a positive integer")
        if self.version > CONFIG_VERSION:
            raise InvalidOptionError(f"config version={self.version}: this edgebnn reads lowering configs up to "
                                     f"version {CONFIG_VERSION}")
        object.__setattr__(self, "scheme", "+".join(parse_scheme(self.scheme)))
        object.__setattr__(self, "bits", _check_bits(self.bits, "bits"))
        check_int(self.seed, "seed", 0, MAX_SEED)
        object.__setattr__(self, "options", _check_options(self.options, "options"))
        if not isinstance(self.overrides, (tuple, list)):
            raise InvalidOptionError(f"config overrides={self.overrides!r}: must be a list of overrides")
        object.__setattr__(self, "overrides", tuple(self.overrides))
        _settings(self.scheme, self.bits, self.options, {}, "config")
        for o in self.overrides:
            if not isinstance(o, LayerOverride):
                raise InvalidOptionError(f"config overrides: {o!r} is not a LayerOverride")
            self.resolve(o, {}, f"config override {o.pattern!r}")

    # -- JSON -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON object (``from_dict(to_dict())`` gives an equal config)."""
        return {"version": self.version, "scheme": self.scheme, "bits": self.bits, "seed": self.seed,
                "options": dict(self.options), "overrides": [o.to_dict() for o in self.overrides]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, raw: object, where: str = "config") -> LowerConfig:
        """Validate a JSON object; errors are one line naming ``where`` and the key."""
        try:
            return cls(**_fields_of(raw))
        except InvalidOptionError as e:
            raise InvalidOptionError(f"{where}: {e}") from e

    @classmethod
    def from_json(cls, text: str, where: str = "config") -> LowerConfig:
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise InvalidOptionError(f"{where}: not a JSON lowering config ({type(e).__name__})") from e
        return cls.from_dict(raw, where)

    # -- planning ---------------------------------------------------------------------------------
    def resolve(self, override: LayerOverride | None, data: Mapping[str, Any], where: str = "config",
                ) -> tuple[str, int | str, dict[str, Any]]:
        """(scheme, bits, options) of the layers ``override`` selects (None: the config's own)."""
        if override is None:
            return _settings(self.scheme, self.bits, self.options, data, where)
        scheme = override.scheme or self.scheme
        bits = override.bits if override.bits is not None else self.bits if scheme == self.scheme else "auto"
        takes = set().union(*(config_fields(n)[0] for n in parse_scheme(scheme)))
        options = {k: v for k, v in self.options.items() if k in takes} | dict(override.options)
        return _settings(scheme, bits, options, data, where)

    def plan(self, model: BNNModel, data: Mapping[str, Any] | None = None) -> list[Plan]:
        """Groups of weights with the same settings, in order of their first weight (one group without overrides)."""
        data = data or {}
        groups: dict[str, Plan] = {}
        for name, layer in _layers(model):
            override = next((o for o in reversed(self.overrides) if fnmatchcase(layer or name, o.pattern)), None)
            scheme, bits, options = self.resolve(override, data)
            key = json.dumps([scheme, bits, options], sort_keys=True)
            if key not in groups:
                groups[key] = Plan(scheme, bits, options, ())
            plan = groups[key]
            groups[key] = dataclasses.replace(plan, weights=(*plan.weights, name))
        return list(groups.values()) or [Plan(*self.resolve(None, data), ())]  # no weights: the passes still record


def _fields_of(raw: object) -> dict[str, Any]:
    """The constructor arguments of a config's JSON object (overrides as :class:`LayerOverride`)."""
    if not isinstance(raw, Mapping):
        raise InvalidOptionError(f"config must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(LowerConfig)})
    if unknown:
        raise InvalidOptionError(f"config has unknown key(s) {unknown}; a lowering config has version, scheme, bits, "
                                 "seed, options, overrides")
    overrides = raw.get("overrides", [])
    if not isinstance(overrides, list):
        raise InvalidOptionError(f"config overrides={overrides!r}: must be a list of objects")
    items = []
    for i, o in enumerate(overrides):
        if not isinstance(o, Mapping) or "pattern" not in o:
            raise InvalidOptionError(f"config overrides[{i}]={o!r}: must be an object with a pattern")
        extra = sorted(set(o) - {f.name for f in dataclasses.fields(LayerOverride)})
        if extra:
            raise InvalidOptionError(f"config overrides[{i}] has unknown key(s) {extra}; an override has pattern, "
                                     "scheme, bits, options")
        items.append(LayerOverride(**o))
    return {**raw, "overrides": tuple(items)}


def _layers(model: BNNModel) -> list[tuple[str, str]]:
    """(weight name, layer) of every encoded weight, read from the nodes without decoding any tensor."""
    out = []
    for node in model.proto.graph.node:
        if node.domain == DOMAIN and node.output:
            attr = next((a for a in node.attribute if a.name == "layer"), None)
            out.append((node.output[0], attr.s.decode("utf-8", "replace") if attr is not None else ""))
    return out


def _check_bits(bits: object, key: str) -> int | str:
    if bits == "auto":
        return "auto"
    if isinstance(bits, str):
        try:
            bits = int(bits)
        except ValueError as e:
            raise InvalidOptionError(f"config {key}={bits!r}: give 'auto' or an integer") from e
    return check_int(bits, f"config {key}", 1, 32)


def _check_options(options: object, key: str) -> dict[str, Any]:
    if not isinstance(options, Mapping):
        raise InvalidOptionError(f"config {key}={options!r}: must be an object of pass settings")
    for k, v in options.items():
        if not isinstance(k, str):
            raise InvalidOptionError(f"config {key}: key {k!r} is not a string")
        if k == "bits":
            raise InvalidOptionError(f"config {key}.bits: give bits as the config's bits, not as an option")
        if not isinstance(v, _SCALARS):
            raise InvalidOptionError(f"config {key}.{k}={v!r}: a setting is a number, boolean, string or null "
                                     "(arrays are data: pass them to lower() from Python)")
    return dict(sorted(options.items()))


def _settings(scheme: str, bits: int | str, options: Mapping[str, Any], data: Mapping[str, Any], where: str,
              ) -> tuple[str, int | str, dict[str, Any]]:
    """Check that ``options`` (and ``data``) fit ``scheme`` and ``bits`` by building its pass configs."""
    try:
        pass_configs(scheme, bits, options, data)
    except EdgeBNNError as e:
        raise InvalidOptionError(f"{where}: {e}") from e
    return scheme, bits, dict(options)


def pass_configs(scheme: str, bits: int | str, options: Mapping[str, Any], data: Mapping[str, Any],
                 ) -> list[tuple[str, PassConfig]]:
    """(pass name, its config) for each pass of ``scheme``: each takes the options its config has, the last
    one the forced ``bits``."""
    names = parse_scheme(scheme)
    takes = {n: config_fields(n) for n in names}
    settings = set().union(*(s for s, _ in takes.values()))
    unknown = sorted(set(options) - settings)
    if unknown:
        raise InvalidOptionError(f"--scheme {scheme}: unknown option(s) {unknown}; this scheme takes "
                                 f"{sorted(settings - {'bits'})}")
    last = names[-1]
    if bits != "auto" and "bits" not in takes[last][0]:
        raise InvalidOptionError(f"--bits {bits}: the {last} scheme has no bit width to set")
    out = []
    for name in names:
        settings_n, data_n = takes[name]
        kwargs = {k: v for k, v in options.items() if k in settings_n}
        kwargs |= {k: v for k, v in data.items() if k in data_n}
        if name == last and bits != "auto":
            kwargs["bits"] = bits
        out.append((name, PASSES[name].config_type(**kwargs)))
    return out


def build_passes(plan: Plan, data: Mapping[str, Any], restrict: bool) -> list[Pass]:
    """The passes of ``plan`` (restricted to its weights when ``restrict``), configured."""
    return [PASSES[name](config, weights=plan.weights if restrict else None)
            for name, config in pass_configs(plan.scheme, plan.bits, plan.options, data)]


def merge_sets(config: LowerConfig, assignments: Sequence[str]) -> LowerConfig:
    """``config`` with ``KEY=VALUE`` assignments applied (``edgebnn lower --set``), left to right.

    KEY is ``scheme``, ``bits``, ``seed``, ``overrides`` or ``options.NAME``; VALUE is JSON (``0.5``, ``true``,
    ``[{"pattern": "fc*", "bits": 8}]``), else taken as a string (``prune+fixed``, ``auto``).

    Raises:
        InvalidOptionError: A malformed assignment, unknown key, or a value the config refuses.
    """
    raw = config.to_dict()
    for text in assignments:
        key, sep, value_text = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidOptionError(f"--set {text}: expected KEY=VALUE, e.g. options.noise_fraction=0.5")
        try:
            value = json.loads(value_text)
        except ValueError:
            value = value_text
        if key.startswith("options."):
            name = key.removeprefix("options.")
            if not name:
                raise InvalidOptionError(f"--set {text}: name the option, e.g. options.noise_fraction=0.5")
            raw["options"] = {**raw["options"], name: value}
        elif key in ("scheme", "bits", "seed", "overrides"):
            raw[key] = value
        else:
            raise InvalidOptionError(f"--set {text}: unknown key {key!r}; set scheme, bits, seed, overrides or "
                                     "options.NAME")
        config = LowerConfig.from_dict(raw, f"--set {text}")
    return config
