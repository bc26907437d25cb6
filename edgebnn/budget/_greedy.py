"""The greedy per-layer walk of ``lower_within_budget(..., order="split")``, on the selection rows.

From the start (:func:`start_config`), take the per-layer change (one bit less, a σ code one bit smaller,
``fixed`` -> ``codebook``, ``X`` -> ``prune+X``) that costs the least budget per deployed byte saved and keeps the
budget on these rows (the certification rows, not these, decide where to stop), measuring each candidate's
point estimates with the reference runtime (S samples, the config's seed). When the
start breaks the budget, layers first get more bits, the variance rule's ``fixed``, or float, best improvement per
byte first. :meth:`_BudgetSearch.path` is the walk thinned to steps of :data:`PATH_STEP`, with wider fallbacks
first: the order the certification tests in. A posterior family's layer moves only among the schemes its family
declares for its encodings (:attr:`edgebnn.families.Family.lowerings`), with no σ-code move, and by bits only where
those lowerings honour a forced width (``Lowering(fn, {"bits"})``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgebnn.exporters import DEFAULT_SAMPLES
from edgebnn.measure import Progress, measure, reference_predictor, task_of

if TYPE_CHECKING:
    from edgebnn._lowered import LoweredModel
    from edgebnn.budget._bounds import Budget
    from edgebnn.data import Dataset
    from edgebnn.ir import BNNModel
    from edgebnn.passes import LowerConfig

BUDGET_START = "prune+fixed"
"""Budget search without a scheme (``float``): starts here; pruning first lets the σ codes shrink further."""
HEAD_BITS = 2
"""The certified path starts with the selection's first configuration this many bits wider per layer, then one
bit (fallbacks when the first is not certified: a test that fails ends the path)."""
PATH_STEP = 0.03
"""A configuration of the walk is certified only when it is this much smaller than the last one."""
_TOP_BITS = 8  # falling back, a layer's bits rise to this before the layer goes to float
_RECIPES = {"ternary": "edgebnn.train.vnq (variational network quantization)",
            "binary": "edgebnn.train.ebp (expectation backpropagation)"}


_Setting = tuple[str, "int | str", tuple[tuple[str, Any], ...]]  # one layer's (scheme, bits, options)


class _BudgetSearch:
    """The greedy per-layer search of :func:`lower_within_budget`, on the selection rows: its :meth:`path` is the
    order the certification tests in."""

    def __init__(self, float_ir: BNNModel, config: LowerConfig, budget: Budget, dataset: Dataset,
                 ood: Dataset | None, samples: int, progress: Progress | None,
                 data_options: dict[str, Any] | None = None) -> None:
        self.float_ir, self.budget, self.dataset, self.ood = float_ir, budget, dataset, ood
        self.samples, self.progress = samples, progress
        self.data_options = data_options or {}
        self.warnings: list[str] = []
        self.layers, self.kinds = _layers_of(float_ir)
        self.base = config = start_config(float_ir, config)
        self.reference = measure([reference_predictor(float_ir, samples, config.seed)], dataset, ood, None,
                                  *task_of(float_ir))[0][0]
        self.cache: dict[str, tuple[LoweredModel, dict[str, float]]] = {}
        self.file_bytes: dict[int, int] = {}  # id(model) -> deployed bytes (the models live in the cache)
        self.evaluations = 0
        self.max_evaluations = 0
        self.steps: list[dict[str, Any]] = []
        plans = {w: p for p in config.plan(float_ir) for w in p.weights}
        self.start: dict[str, _Setting] = {
            layer: (plans[names[0]].scheme, plans[names[0]].bits, tuple(sorted(plans[names[0]].options.items())))
            for layer, names in self.layers.items()}
        self.current = dict(self.start)
        self.trail: list[dict[str, _Setting]] = []  # the settings after each accepted change
        self.kept_from: int | None = None  # the trail's first settings that keep the budget (None: the start)
        self.reasons: dict[str, list[str]] = {}
        self.blocked: dict[tuple[str, str], str] = {}

    # -- measuring ------------------------------------------------------------------------------------
    def config(self, settings: dict[str, _Setting]) -> LowerConfig:
        """The base config with one exact-name override per layer whose settings changed."""
        import dataclasses
        import glob

        from edgebnn.passes import LayerOverride

        overrides = [LayerOverride(pattern=glob.escape(layer), scheme=s[0], bits=s[1], options=dict(s[2]))
                     for layer, s in settings.items() if s != self.start[layer]]
        return dataclasses.replace(self.base, overrides=(*self.base.overrides, *overrides))

    def evaluate(self, settings: dict[str, _Setting]) -> tuple[LoweredModel, dict[str, float]]:
        """The lowered model of ``settings`` and its budgeted deltas on the validation rows (cached)."""
        config = self.config(settings)
        key = config.to_json()
        if key not in self.cache:
            model = lower_config(self.float_ir, config, self.data_options)
            metrics = measure([reference_predictor(model, self.samples, config.seed)], self.dataset, self.ood, None,
                               *task_of(model))[0][0]
            deltas = self.budget.deltas(self.reference, metrics)
            self.cache[key] = model, deltas
            self.evaluations += 1
            if self.progress:
                self.progress(self.evaluations, max(self.evaluations, self.max_evaluations))
        return self.cache[key]

    def bits_of(self, model: LoweredModel, layer: str) -> int:
        names = set(self.layers[layer])
        return max(int(r.get("bits") or 0) for r in model.lowering_report["layers"] if r["name"] in names)

    def size(self, model: LoweredModel) -> int:
        """What the search minimizes: the bytes of the file the default export writes (:func:`deployed_size`)."""
        key = id(model)
        if key not in self.file_bytes:
            self.file_bytes[key] = deployed_size(model, self.samples)
        return self.file_bytes[key]

    # -- the search -----------------------------------------------------------------------------------
    def run(self, max_steps: int) -> None:
        """Fall back until the start keeps the budget (if it does not), then lower bits while it keeps it."""
        self.max_evaluations = 2 + 4 * len(self.layers) * (max_steps + 1)  # at most 4 moves per layer and step
        model, deltas = self.evaluate(self.current)
        for layer in self.layers:
            scheme, bits, _ = self.current[layer]
            rule = "variance rule" if bits == "auto" else "start"
            self.reasons[layer] = [f"{rule}: {scheme} {self.bits_of(model, layer)} bits"]
        broken = self.budget.violations(deltas)
        if broken:
            last = self.base.scheme.split("+")[-1]
            if last in _RECIPES:
                self.warnings.append(f"post-training {self.base.scheme} breaks the budget "
                                     f"({', '.join(map(str, broken))}); {last} reaches its paper's accuracy when "
                                     f"trained for it: {_RECIPES[last]}")
            if not self.raise_bits(max_steps):
                return
        self.kept_from = len(self.trail)
        self.lower_bits(max_steps)

    def path(self) -> list[dict[str, _Setting]]:
        """The configurations to certify, largest first: the first that kept the budget on the selection rows,
        then every smaller one the greedy walk took (each saved bytes). Empty when none kept it."""
        if self.kept_from is None:
            return []
        first = self.trail[self.kept_from - 1] if self.kept_from else self.start
        path = [*self.bigger(first), first]
        for settings in self.trail[self.kept_from:]:  # thinned: each step a test, each test a chance to stop early
            if self.size(self.evaluate(settings)[0]) <= (1 - PATH_STEP) * self.size(self.evaluate(path[-1])[0]):
                path.append(settings)
        return path

    def raise_bits(self, max_steps: int) -> bool:
        """Fall back (more bits, fixed, float) until the budget is kept; False when it cannot be."""
        floats: dict[str, _Setting] = {layer: ("float", "auto", ()) for layer in self.layers}
        if self.budget.violations(self.evaluate(floats)[1]):
            return False  # not even the float BNN's own weights keep it
        while len(self.steps) < max_steps:
            model, deltas = self.evaluate(self.current)
            if not self.budget.violations(deltas):
                return True
            excess = self.budget.excess(deltas)
            best: tuple[float, str, str, _Setting] | None = None
            for layer in self.layers:
                for label, setting in _moves_up(self.current[layer], self.bits_of(model, layer), self.kinds[layer]):
                    trial_model, trial = self.evaluate({**self.current, layer: setting})
                    gain = excess - self.budget.excess(trial)
                    per_byte = gain / max(self.size(trial_model) - self.size(model), 1)
                    if gain > 0 and (best is None or per_byte > best[0]):
                        best = (per_byte, layer, label, setting)
            if best is None:
                return False
            _, layer, label, setting = best
            broken = ", ".join(map(str, self.budget.violations(deltas)))
            self.accept(layer, label, setting, model, f"raised to {label}: the budget was broken ({broken})")
        return not self.budget.violations(self.evaluate(self.current)[1])

    def lower_bits(self, max_steps: int) -> None:
        """Take the change that costs the least budget per byte saved and keeps it, until none does."""
        from edgebnn.budget._bounds import LABELS
        from edgebnn.tables import fmt_bytes

        while len(self.steps) < max_steps:
            model, deltas = self.evaluate(self.current)
            usage = self.budget.usage(deltas)
            best: tuple[float, str, str, _Setting, dict[str, float], int] | None = None
            for layer in self.layers:
                for label, setting in _moves_down(self.current[layer], self.bits_of(model, layer), self.kinds[layer]):
                    if (layer, label) in self.blocked:
                        continue
                    trial_model, trial = self.evaluate({**self.current, layer: setting})
                    saved = self.size(model) - self.size(trial_model)
                    broken = self.budget.violations(trial)
                    if broken or saved <= 0:
                        self.blocked[layer, label] = (f"{label} broke {', '.join(map(str, broken))}" if broken
                                                      else f"{label} saves nothing")
                        continue
                    # a change that looks free (or better than free: noise on the selection rows) is ranked by the
                    # bytes it saves, not by its noise
                    cost = max(self.budget.usage(trial) - usage, 0.0) / saved
                    if best is None or (cost, -saved) < (best[0], -best[5]):
                        best = (cost, layer, label, setting, trial, saved)
            if best is None:
                return
            _, layer, label, setting, trial, saved = best
            change = {k: trial[k] - deltas[k] for k in trial}
            name = self.budget.costliest(change)
            self.accept(layer, label, setting, model, f"{label}: {LABELS.get(name, name)} {change[name]:+.4f} for "
                                                      f"-{fmt_bytes(saved)}")

    def accept(self, layer: str, label: str, setting: _Setting, model: LoweredModel, reason: str) -> None:
        before = self.current[layer]
        self.current = {**self.current, layer: setting}
        self.trail.append(self.current)
        after, deltas = self.evaluate(self.current)
        self.reasons[layer].append(reason)
        self.steps.append({"layer": layer, "change": label, "from": list(before[:2]), "to": list(setting[:2]),
                           "options": dict(setting[2]), "bytes_before": self.size(model),
                           "total_bytes": self.size(after), "deltas": deltas})

    def bigger(self, settings: dict[str, _Setting]) -> list[dict[str, _Setting]]:
        """``settings`` with every layer :data:`HEAD_BITS` bits wider, then one bit (up to 8; the bits it had where
        that is not valid), largest first: certified before it, in case the first configuration the selection
        kept is not (its fallback)."""
        model = self.evaluate(settings)[0]
        out = []
        for extra in range(HEAD_BITS, 0, -1):
            wider = {}
            for layer, (scheme, bits, options) in settings.items():
                up = (scheme, min(self.bits_of(model, layer) + extra, _TOP_BITS), options)
                wider[layer] = up if _valid(up, self.kinds[layer]) else (scheme, bits, options)
            if wider != settings and wider not in out:
                out.append(wider)
        return out

    def layer_rows(self, model: LoweredModel) -> list[dict[str, Any]]:
        """Each layer's final scheme, bits, bytes and why (the changes taken, then the ones refused)."""
        rows = []
        for layer, names in self.layers.items():
            scheme, bits, options = self.current[layer]
            moves = _moves_down(self.current[layer], self.bits_of(model, layer), self.kinds[layer])
            now = {label for label, _ in moves}
            refused = [why for (where, label), why in self.blocked.items() if where == layer and label in now]
            reasons = self.reasons[layer] + ([f"kept: {'; '.join(refused)}"] if refused else [])
            rows.append({"layer": layer, "scheme": scheme, "bits": self.bits_of(model, layer), "forced_bits": bits,
                         "options": dict(options),
                         "bytes": sum(int(r["bytes"]) for r in model.lowering_report["layers"] if r["name"] in names),
                         "reason": "; ".join(reasons)})
        return rows


def default_export(model: BNNModel, samples: int = DEFAULT_SAMPLES, seed: int = 0) -> tuple[bytes, str]:
    """The file ``edgebnn export model.ebnn`` writes (:data:`edgebnn.exporters.config.DEFAULT_EXPORT`, S
    ``samples``; a deep ensemble's M) and its mode.

    Raises:
        EdgeBNNError: The export is refused.
    """
    import dataclasses

    from edgebnn.exporters.config import DEFAULT_EXPORT
    from edgebnn.exporters.export import export_model
    from edgebnn.exporters.families import default_samples

    config = dataclasses.replace(DEFAULT_EXPORT, samples=default_samples(model, samples), seed=seed)
    result = export_model(model, config)
    return result.proto.SerializeToString(deterministic=True), result.choice.mode


def lower_config(float_ir: BNNModel, config: LowerConfig, data_options: dict[str, Any]) -> LoweredModel:
    """``float_ir`` lowered by ``config``, given those of ``data_options`` (``grams``, ``gradients``...) its passes
    take (:func:`edgebnn.passes.lower`)."""
    from edgebnn._lowered import LoweredModel
    from edgebnn.passes import lower
    from edgebnn.passes.config import data_fields

    takes = data_fields(config)
    result = lower(float_ir, config, **{k: v for k, v in data_options.items() if k in takes})
    return LoweredModel(result.model, result.report)


def deployed_size(model: LoweredModel, samples: int = DEFAULT_SAMPLES) -> int:
    """The bytes of the file the default export of ``model`` writes (what a device loads), or its IR's tensor bytes
    when that export is refused."""
    from edgebnn.errors import EdgeBNNError

    try:
        return len(default_export(model, samples)[0])
    except EdgeBNNError:
        return int(model.lowering_report["total_bytes"])


def start_config(float_ir: BNNModel, config: LowerConfig) -> LowerConfig:
    """Where a budget search starts: ``config``, or without a scheme (``float``) :data:`BUDGET_START` at the
    variance rule's bits, each layer moved to the first of :data:`BUDGET_START`, ``fixed`` and ``float`` that its
    encodings take (a posterior family's layer takes its registered schemes only): the most common start is the
    config's scheme, the others are per-layer overrides."""
    import dataclasses
    import glob
    from collections import Counter

    from edgebnn.passes import LayerOverride
    from edgebnn.passes.config import config_fields

    if config.scheme != "float":
        return config
    takes = config_fields("prune")[0] | config_fields("fixed")[0]
    config = dataclasses.replace(config, scheme=BUDGET_START, bits="auto",
                                 options={k: v for k, v in config.options.items() if k in takes})
    kinds_of = _layers_of(float_ir)[1]
    starts = {layer: next(s for s in (config.scheme, "fixed", "float") if _accepts(kinds, s))
              for layer, kinds in kinds_of.items()}
    order = (config.scheme, "fixed", "float")
    counts = Counter(starts.values())
    scheme = min(counts, key=lambda s: (-counts[s], order.index(s))) if counts else config.scheme

    def options(of: str) -> dict[str, Any]:
        return dict(_setting(of, "auto", dict(config.options))[2])

    overrides = [LayerOverride(pattern=glob.escape(layer), scheme=start, options=options(start))
                 for layer, start in starts.items() if start != scheme]
    return dataclasses.replace(config, scheme=scheme, options=options(scheme),
                               overrides=(*config.overrides, *overrides))


def _layers_of(model: BNNModel) -> tuple[dict[str, list[str]], dict[str, frozenset[str]]]:
    """Each layer's encoded weights and their encodings' op types, read from the nodes (nothing decoded)."""
    from edgebnn.ir import DOMAIN

    names: dict[str, list[str]] = {}
    kinds: dict[str, set[str]] = {}
    for node in model.proto.graph.node:
        if node.domain == DOMAIN and node.output:
            attr = next((a for a in node.attribute if a.name == "layer"), None)
            layer = (attr.s.decode("utf-8", "replace") if attr is not None else "") or node.output[0]
            names.setdefault(layer, []).append(node.output[0])
            kinds.setdefault(layer, set()).add(node.op_type)
    return names, {layer: frozenset(k) for layer, k in kinds.items()}


def _accepts(kinds: frozenset[str], scheme: str) -> bool:
    """Whether every pass of ``scheme`` lowers every posterior-family encoding among ``kinds`` (the lowerings
    :mod:`edgebnn.passes` registers; a Gaussian layer takes every scheme)."""
    from edgebnn.passes.base import family_lowerings
    from edgebnn.passes.config import parse_scheme

    tables = [t for t in map(family_lowerings, kinds) if t is not None]
    return all(name == "float" or name in table for table in tables for name in parse_scheme(scheme))


def _honours(kinds: frozenset[str], scheme: str, what: str) -> bool:
    """Whether every posterior-family lowering that ``scheme``'s passes hand a weight of ``kinds`` to declares it
    honours ``what`` (``"bits"``: a forced width; :class:`edgebnn.families.Lowering`), so a walk never asks a
    lowering for a setting it would refuse."""
    from edgebnn.passes.base import family_lowerings, honours
    from edgebnn.passes.config import parse_scheme

    tables = [t for t in map(family_lowerings, kinds) if t is not None]
    return all(what in honours(table[name]) for table in tables for name in parse_scheme(scheme) if name in table)


def _valid(setting: _Setting, kinds: frozenset[str] = frozenset()) -> bool:
    from edgebnn.errors import EdgeBNNError
    from edgebnn.passes.config import pass_configs

    if not _accepts(kinds, setting[0]) or (isinstance(setting[1], int) and not _honours(kinds, setting[0], "bits")):
        return False
    try:
        pass_configs(setting[0], setting[1], dict(setting[2]), {})
    except EdgeBNNError:
        return False
    return True


def _setting(scheme: str, bits: int | str, options: dict[str, Any]) -> _Setting:
    """A layer's settings, keeping the options ``scheme`` takes."""
    from edgebnn.passes.config import config_fields, parse_scheme

    takes = set().union(*(config_fields(n)[0] for n in parse_scheme(scheme)))
    return scheme, bits, tuple(sorted((k, v) for k, v in options.items() if k in takes))


def _moves_down(setting: _Setting, bits: int, kinds: frozenset[str] = frozenset()) -> list[tuple[str, _Setting]]:
    """One layer's smaller settings: a bit less, a σ code a bit smaller, fixed -> codebook, X -> prune+X (those
    the layer's encodings take: a family's lowering codes its covariance itself, and only the schemes its family
    declares)."""
    from edgebnn.passes.base import family_lowerings
    from edgebnn.passes.config import PASSES, parse_scheme

    scheme, forced, options = setting
    names, opts = parse_scheme(scheme), dict(options)
    last = names[-1]
    moves = [(f"{bits - 1} bits", _setting(scheme, bits - 1, opts))]
    sigma_bits = opts.get("sigma_bits", getattr(PASSES[last].config_type, "sigma_bits", 0))
    if sigma_bits and all(family_lowerings(kind) is None for kind in kinds):
        moves.append((f"{sigma_bits - 1}-bit σ code", _setting(scheme, forced, opts | {"sigma_bits": sigma_bits - 1})))
    if last == "fixed":
        moves.append(("codebook", _setting(scheme.replace("fixed", "codebook"), bits, opts)))
    if "prune" not in names and last not in ("float", "binary"):
        moves.append((f"prune+{scheme}", _setting(f"prune+{scheme}", forced, opts)))
    return [(label, s) for label, s in moves if s != setting and _valid(s, kinds)]


def _moves_up(setting: _Setting, bits: int, kinds: frozenset[str] = frozenset()) -> list[tuple[str, _Setting]]:
    """One layer's larger settings: a bit more (up to 8), the variance rule's fixed, float."""
    from edgebnn.passes.config import parse_scheme

    scheme, _, options = setting
    last = parse_scheme(scheme)[-1]
    moves = []
    if bits < _TOP_BITS:
        moves.append((f"{bits + 1} bits", _setting(scheme, bits + 1, dict(options))))
    if last not in ("fixed", "float"):
        moves.append(("fixed (variance rule)", _setting("fixed", "auto", dict(options))))
    if last != "float":
        moves.append(("float", ("float", "auto", ())))
    return [(label, s) for label, s in moves if s != setting and _valid(s, kinds)]
