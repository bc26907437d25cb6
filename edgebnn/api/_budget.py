"""``lower --budget``: the greedy per-layer search for the smallest lowering within an uncertainty budget.

Every candidate is judged by the predictive the model exports: the reference runtime draws what ``baked`` stores
(:func:`edgebnn.ir.encodings.draw_weight`), S ``samples`` with the config's seed, against the float BNN's. A
posterior family's layers (a deep ensemble's member sets, SWAG's low-rank Gaussians, ...) move only among the
schemes their family declares for their encodings (:attr:`edgebnn.families.Family.lowerings`: ``fixed`` and
``float`` for member sets, SWAG and Kronecker/dense Laplace factors), with no σ-code move (a family's lowering
codes its covariance itself), so a deep ensemble is searched over the bits of its one per-layer grid, with float as
each layer's fallback, and judged at S = M (each member once: the exact ensemble).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from edgebnn.api._evaluate import Progress, _eval_data, _measure, _reference, lowering_quality, task_of
from edgebnn.api._model import lower
from edgebnn.errors import InvalidOptionError

if TYPE_CHECKING:
    from edgebnn._lowered import LoweredModel
    from edgebnn.budget import Budget
    from edgebnn.data import Dataset, DataSource
    from edgebnn.ir import BNNModel
    from edgebnn.passes import LowerConfig

BUDGET_ROWS = 2000
"""Budget search: candidates are measured on at most this many validation rows (the first ones)."""
BUDGET_STEPS = 40
"""Budget search: at most this many accepted changes (each one measures every layer's next moves)."""
BUDGET_START = "prune+fixed"
"""Budget search without a scheme (``float``): starts here; pruning first lets the σ codes shrink further."""
_TOP_BITS = 8  # falling back, a layer's bits rise to this before the layer goes to float
_RECIPES = {"ternary": "edgebnn.train.vnq (variational network quantization)",
            "binary": "edgebnn.train.ebp (expectation backpropagation)"}


def _check_budget(budget: Budget | str, evaluate: DataSource | None, ood_data: DataSource | None) -> Budget:
    from edgebnn.budget import Budget

    budget = Budget.parse(budget) if isinstance(budget, str) else budget
    if evaluate is None:
        raise InvalidOptionError(f"--budget {budget}: needs validation data to be measured on: add --eval DATA")
    if budget.needs_ood and ood_data is None:
        raise InvalidOptionError(f"--budget {budget}: auroc is measured against OOD inputs: add --ood-data FILE")
    return budget


def lower_within_budget(float_ir: BNNModel, config: LowerConfig, budget: Budget | str, *,
                        data: DataSource = "digits", split: str | None = None, ood_data: DataSource | None = None,
                        samples: int | None = None, max_rows: int = BUDGET_ROWS, max_steps: int = BUDGET_STEPS,
                        progress: Progress | None = None, **data_options: Any) -> LoweredModel:
    """Lower with the fewest bytes per layer that keep an uncertainty budget on validation data.

    Starts from ``config`` (``float``: :data:`BUDGET_START`) with each layer at the posterior-variance rule's
    bits, then greedily takes the per-layer change (one bit less, a σ code one bit smaller, ``fixed`` -> ``codebook``,
    ``X`` -> ``prune+X``) that costs the least budget per byte saved and still keeps the budget, measuring
    each candidate with the reference runtime (S ``samples``, the config's seed; default 16, a deep ensemble's
    M) on the first ``max_rows`` rows of ``data``, until no change fits or after ``max_steps`` changes. When the
    start already breaks the budget, layers first get more bits, the variance rule's ``fixed``, or float, best
    improvement per byte first. A posterior family's layer takes only the schemes registered for its encoding
    (module docstring); without a scheme it starts at the first of :data:`BUDGET_START`, ``fixed``, ``float``
    that it takes. The chosen per-layer settings are overrides in the returned model's config, which its manifest
    stores (``edgebnn lower --config model.ebnn`` replays it). ``data_options`` (``grams``, ``gradients``...: see
    :func:`edgebnn.passes.lower`) go to every candidate whose passes take them.

    Returns:
        The lowered model; its report has ``eval`` (:func:`lowering_quality` on all of ``data``) and ``budget``:
        ``met``, ``deltas``, ``violations``, ``layers`` (each layer's scheme, bits, bytes and ``reason``),
        ``steps``, ``measured_on``, ``evaluations`` and ``warnings``.

    Raises:
        BudgetNotMetError: No configuration tried keeps the budget; ``.closest`` holds the nearest one's config
            and figures.
        InvalidOptionError: A malformed budget, an ``auroc`` budget without ``ood_data``, bad data.
    """
    from edgebnn.exporters.families import default_samples
    from edgebnn.runtime.reference import check_samples

    samples = default_samples(float_ir, 16) if samples is None else samples
    check_samples(samples)
    budget = _check_budget(budget, data, ood_data)
    dataset, ood = _eval_data(float_ir, data, split, ood_data)
    full_n = dataset.n
    dataset, ood = _head(dataset, max_rows), None if ood is None else _head(ood, max_rows)
    search = _BudgetSearch(float_ir, config, budget, dataset, ood, samples, progress, data_options)
    search.run(max_steps)
    lowered = search.best()
    report = lowered.lowering_report
    quality = lowering_quality(float_ir, lowered, data=data, split=split, ood_data=ood_data, samples=samples,
                               seed=config.seed)
    report["eval"] = quality
    violations = budget.check(quality["float_bnn"], quality["lowered"])
    warnings = search.warnings
    if violations and dataset.n < full_n:
        warnings.append(f"on all {full_n} rows the chosen configuration breaks the budget "
                        f"({', '.join(map(str, violations))}); it was chosen on the first {dataset.n}")
    report["budget"] = {
        "budget": str(budget), "limits": budget.to_dict(), "met": not violations,
        "deltas": budget.deltas(quality["float_bnn"], quality["lowered"]),
        "violations": [str(v) for v in violations], "start": search.base.to_dict(),
        "measured_on": {"rows": dataset.n, "of": full_n, "ood_rows": ood.n if ood else None, "samples": samples,
                        "seed": config.seed},
        "evaluations": search.evaluations, "steps": search.steps, "layers": search.layer_rows(lowered),
        "warnings": warnings, "sizes": budget_sizes(lowered),
    }
    return lowered


def budget_sizes(lowered: LoweredModel) -> dict[str, Any]:
    """Both sizes of the chosen lowering: the IR's (what the budget search minimizes: ``total_bytes``, and the
    ``.ebnn`` file) and the deployed ONNX of the default export for the device
    (:data:`edgebnn.exporters.defaults.DEFAULT_EXPORT`; a deep ensemble's S = M), with what was exported;
    ``deployed`` is null with ``deployed_error`` when that export is refused."""
    from edgebnn.errors import EdgeBNNError
    from edgebnn.exporters.defaults import DEFAULT_EXPORT, export_size
    from edgebnn.exporters.families import default_samples

    report = lowered.lowering_report
    out: dict[str, Any] = {"ir_bytes": int(report["total_bytes"]), "ebnn_bytes": int(report["ebnn_bytes"]),
                           "float_bnn_bytes": int(report["float_bnn_bytes"]), "deployed": None, "export": None}
    try:
        fallback = DEFAULT_EXPORT["samples"]
        assert isinstance(fallback, int)
        size, what = export_size(lowered, samples=default_samples(lowered, fallback))
    except EdgeBNNError as e:
        out["deployed_error"] = str(e)
        return out
    out.update(deployed=size.to_dict(), export=what)
    return out


def _head(dataset: Dataset, rows: int) -> Dataset:
    """``dataset``, or its first ``rows`` rows in memory when it has more."""
    import numpy as np

    from edgebnn.data import load_data

    if dataset.n <= rows:
        return dataset
    xs, ys = [], []
    for x, y in dataset.batches():
        xs.append(x)
        ys.append(y)
        if sum(len(b) for b in xs) >= rows:
            break
    x = np.concatenate(xs)[:rows]
    if ys[0] is None:
        return load_data(x, labels=False)
    return load_data((x, np.concatenate([np.asarray(y) for y in ys])[:rows]))


_Setting = tuple[str, "int | str", tuple[tuple[str, Any], ...]]  # one layer's (scheme, bits, options)


class _BudgetSearch:
    """The greedy per-layer search of :func:`lower_within_budget`."""

    def __init__(self, float_ir: BNNModel, config: LowerConfig, budget: Budget, dataset: Dataset,
                 ood: Dataset | None, samples: int, progress: Progress | None,
                 data_options: dict[str, Any] | None = None) -> None:
        import dataclasses

        from edgebnn.passes.config import config_fields

        self.float_ir, self.budget, self.dataset, self.ood = float_ir, budget, dataset, ood
        self.samples, self.progress = samples, progress
        self.data_options = data_options or {}
        self.warnings: list[str] = []
        self.layers, self.kinds = _layers_of(float_ir)
        if config.scheme == "float":  # no scheme given: the variance rule's bits after pruning (bench/budget.py)
            takes = config_fields("prune")[0] | config_fields("fixed")[0]
            config = dataclasses.replace(config, scheme=BUDGET_START, bits="auto",
                                         options={k: v for k, v in config.options.items() if k in takes})
            config = self.family_starts(config)
        self.base = config
        self.reference = _measure([_reference(float_ir, samples, config.seed)], dataset, ood, None,
                                  *task_of(float_ir))[0][0]
        self.cache: dict[str, tuple[LoweredModel, dict[str, float]]] = {}
        self.evaluations = 0
        self.max_evaluations = 0
        self.steps: list[dict[str, Any]] = []
        plans = {w: p for p in config.plan(float_ir) for w in p.weights}
        self.start: dict[str, _Setting] = {
            layer: (plans[names[0]].scheme, plans[names[0]].bits, tuple(sorted(plans[names[0]].options.items())))
            for layer, names in self.layers.items()}
        self.current = dict(self.start)
        self.reasons: dict[str, list[str]] = {}
        self.blocked: dict[tuple[str, str], str] = {}

    def family_starts(self, config: LowerConfig) -> LowerConfig:
        """``config`` starting each layer at the first of :data:`BUDGET_START`, ``fixed`` and ``float`` that its
        encodings take (a posterior family's layer takes its registered schemes only; see the module docstring):
        the most common start is the config's scheme, the others are per-layer overrides."""
        import dataclasses
        import glob
        from collections import Counter

        from edgebnn.passes import LayerOverride

        starts = {layer: next(s for s in (config.scheme, "fixed", "float") if _accepts(kinds, s))
                  for layer, kinds in self.kinds.items()}
        order = (config.scheme, "fixed", "float")
        counts = Counter(starts.values())
        scheme = min(counts, key=lambda s: (-counts[s], order.index(s))) if counts else config.scheme

        def options(of: str) -> dict[str, Any]:
            return dict(_setting(of, "auto", dict(config.options))[2])

        overrides = [LayerOverride(pattern=glob.escape(layer), scheme=start, options=options(start))
                     for layer, start in starts.items() if start != scheme]
        return dataclasses.replace(config, scheme=scheme, options=options(scheme),
                                   overrides=(*config.overrides, *overrides))

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
            from edgebnn.passes.config import data_fields

            takes = data_fields(config)
            model = lower(self.float_ir, config, **{k: v for k, v in self.data_options.items() if k in takes})
            metrics = _measure([_reference(model, self.samples, config.seed)], self.dataset, self.ood, None,
                               *task_of(model))[0][0]
            self.cache[key] = model, self.budget.deltas(self.reference, metrics)
            self.evaluations += 1
            if self.progress:
                self.progress(self.evaluations, max(self.evaluations, self.max_evaluations))
        return self.cache[key]

    def bits_of(self, model: LoweredModel, layer: str) -> int:
        names = set(self.layers[layer])
        return max(int(r.get("bits") or 0) for r in model.lowering_report["layers"] if r["name"] in names)

    def size(self, model: LoweredModel) -> int:
        return int(model.lowering_report["total_bytes"])

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
        self.lower_bits(max_steps)

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
        from edgebnn.budget import LABELS
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
                    cost = (self.budget.usage(trial) - usage) / saved
                    if best is None or cost < best[0]:
                        best = (cost, layer, label, setting, trial, saved)
            if best is None:
                return
            _, layer, label, setting, trial, saved = best
            change = {k: trial[k] - deltas[k] for k in trial}
            name = self.budget.costliest(change)
            self.accept(layer, label, setting, model, f"{label}: {LABELS[name]} {change[name]:+.4f} for "
                                                      f"-{fmt_bytes(saved)}")

    def accept(self, layer: str, label: str, setting: _Setting, model: LoweredModel, reason: str) -> None:
        before = self.current[layer]
        self.current = {**self.current, layer: setting}
        after, deltas = self.evaluate(self.current)
        self.reasons[layer].append(reason)
        self.steps.append({"layer": layer, "change": label, "from": list(before[:2]), "to": list(setting[:2]),
                           "options": dict(setting[2]), "bytes_before": self.size(model),
                           "total_bytes": self.size(after), "deltas": deltas})

    def best(self) -> LoweredModel:
        """The current settings' model; :class:`BudgetNotMetError` (with the closest one) when it breaks."""
        from edgebnn.budget import BudgetNotMetError

        model, deltas = self.evaluate(self.current)
        if not self.budget.violations(deltas):
            return model
        closest_model, closest = min(self.cache.values(),
                                     key=lambda md: (self.budget.excess(md[1]), self.size(md[0])))
        report = closest_model.lowering_report
        figures = ", ".join(f"{k} {v:+.4f}" for k, v in closest.items())
        config = json.dumps(report["config"], sort_keys=True, separators=(",", ":"))
        raise BudgetNotMetError(
            f"--budget {self.budget}: no configuration tried keeps it on {self.dataset.name} ({self.dataset.n} "
            f"rows, {self.evaluations} tried); closest: {figures}, {report['compression_ratio']:.1f}x smaller, "
            f"config {config}; nothing was written",
            {"config": report["config"], "deltas": closest, "compression_ratio": report["compression_ratio"],
             "total_bytes": report["total_bytes"], "violations": [str(v) for v in self.budget.violations(closest)]})

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


def _valid(setting: _Setting, kinds: frozenset[str] = frozenset()) -> bool:
    from edgebnn.errors import EdgeBNNError
    from edgebnn.passes.config import pass_configs

    if not _accepts(kinds, setting[0]):
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
    the layer's encodings take: a family's lowering codes its covariance itself, and only its registered schemes)."""
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
