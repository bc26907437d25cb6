"""``lower --budget``: the smallest lowering that keeps an uncertainty budget on new data, with a stated confidence.

**The guarantee.** With probability at least ``budget.confidence`` (1 - δ) over the validation rows, the
returned lowering keeps every budgeted metric's change, lowered minus float, within its allowance on the
population the rows are drawn from (any data exchangeable with them): the expected metric of its default export
against that of the float BNN's own default export, both at S samples, as onnxruntime runs them
(docs/uncertainty_budget.md states it in full).

**How.** Candidates are tested in a fixed order, largest deployed file first (fixed-sequence testing): a candidate
is *certified* when every budgeted metric's one-sided ``confidence`` limit (:mod:`edgebnn.budget`,
:func:`edgebnn.budget.certify`) lies within its allowance, and the test stops at the first candidate that is
not. The last one certified is the result. An order fixed before the certification rows are read spends no
confidence on the number of candidates, and requiring every metric (an intersection-union test) spends none on
the number of metrics. Two orders (:data:`ORDERS`):

* ``chain`` (the default): a data-free chain of global settings from the start (:func:`start_config`): the
  variance rule made finer (fallbacks), then one σ per layer instead of the σ code, then the variance rule's
  noise fraction raised step by step (:data:`NOISE_FRACTIONS`; an explicit ``--bits N`` steps N
  down instead); every validation row certifies.
* ``split``: a greedy per-layer walk (:class:`edgebnn.budget._greedy._BudgetSearch`) on :data:`SELECT_FRACTION` of
  the rows, chosen at random, certified on the others.

Before any candidate, the float BNN's own weights, exported the same way, are certified against themselves on a
second run of the device's noise: this is where a budget finer than the rows resolve is said, with the number of
rows it would take.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from edgebnn.budget._certify import export_evidence
from edgebnn.budget._greedy import (
    _RECIPES,
    PATH_STEP,
    _BudgetSearch,
    deployed_size,
    lower_config,
    start_config,
)
from edgebnn.errors import InvalidOptionError
from edgebnn.measure import Progress, eval_data, lowering_quality

if TYPE_CHECKING:
    import numpy as np

    from edgebnn._lowered import LoweredModel
    from edgebnn.budget._bounds import Budget, Certificate
    from edgebnn.budget._certify import Evidence
    from edgebnn.data import Dataset, DataSource
    from edgebnn.ir import BNNModel
    from edgebnn.passes import LowerConfig

ORDERS = ("chain", "split")
BUDGET_ROWS = 4000
"""Budget search: at most this many validation rows (and OOD inputs) are read, the first ones."""
SELECT_FRACTION = 0.2
"""``order="split"``: the share of the rows, chosen at random, that the greedy walk chooses on (bench/budget.py)."""
BUDGET_STEPS = 40
"""``order="split"``: at most this many accepted changes of the greedy walk."""
NOISE_FRACTIONS = (0.025, 0.05, 0.1, 0.125, 0.16, 0.2, 0.25, 0.32, 0.4, 0.5, 0.63, 0.8, 1.0, 1.25, 1.6, 2.0, 2.5, 3.2)
"""The chain's variance-rule noise fractions (the rounding noise allowed per layer, as a fraction of its mean
posterior variance; 0.1 is the rule's default): the two below it are fallbacks tried first."""
_SPLIT_SEED = 0xB0D6E7  # the selection/certification split: seeded by this and the lowering seed
_AGAIN = 7919  # the float BNN against itself: its export's random ops seeded this far from the others' (fresh noise)


def check_budget(budget: Budget | str, evaluate: DataSource | None, ood_data: DataSource | None) -> Budget:
    from edgebnn.budget._bounds import Budget

    budget = Budget.parse(budget) if isinstance(budget, str) else budget
    if evaluate is None:
        raise InvalidOptionError(f"--budget {budget}: needs validation data to be measured on: add --eval DATA")
    if budget.needs_ood and ood_data is None:
        raise InvalidOptionError(f"--budget {budget}: auroc is measured against OOD inputs: add --ood-data FILE")
    return budget


def _rows(dataset: Dataset, rows: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The first ``rows`` rows of ``dataset`` in memory (inputs, and labels when it has them)."""
    import numpy as np

    xs, ys = [], []
    for x, y in dataset.batches():
        xs.append(np.asarray(x, np.float32))
        if y is not None:
            ys.append(np.asarray(y))
        if sum(len(b) for b in xs) >= rows:
            break
    x = np.concatenate(xs)[:rows]
    return x, (np.concatenate(ys)[:rows] if ys else None)


class Rows:
    """The validation rows (and OOD inputs) in memory; with ``fraction`` > 0 split at random (seeded) into the
    rows a greedy walk selects on and those that certify."""

    def __init__(self, dataset: Dataset, ood: Dataset | None, max_rows: int, fraction: float, seed: int) -> None:
        import numpy as np

        if not 0 <= fraction < 1:
            raise InvalidOptionError(f"select_fraction {fraction!r}: must be at least 0 and below 1")
        self.x, y = _rows(dataset, max_rows)
        assert y is not None  # dataset_for opened it with labels
        self.y = y
        self.ood = None if ood is None else _rows(ood, max_rows)[0]
        self.of, self.ood_of = dataset.n, None if ood is None else ood.n
        self.name, self.fraction = dataset.name, fraction
        self.ood_name = None if ood is None else ood.name
        rng = np.random.default_rng([_SPLIT_SEED, seed])

        def split(n: int) -> tuple[np.ndarray, np.ndarray]:
            order = rng.permutation(n)
            cut = round(fraction * n)
            return np.sort(order[:cut]), np.sort(order[cut:])

        self.select_idx, self.certify_idx = split(len(self.x))
        self.ood_select, self.ood_certify = split(0 if self.ood is None else len(self.ood))
        if len(self.certify_idx) < 2 or (fraction and len(self.select_idx) < 2):
            raise InvalidOptionError(f"--eval {dataset.name}: {len(self.x)} rows are too few to certify a budget on")

    def check_range(self, model: BNNModel) -> None:
        """Refuse rows far outside the input range ``model`` records (:func:`edgebnn.budget.check_in_range`)."""
        from edgebnn.budget._certify import check_in_range

        check_in_range(model, self.x, self.ood, (f"--eval {self.name}", f"--ood-data {self.ood_name}"))

    @property
    def certify_x(self) -> np.ndarray:
        return self.x[self.certify_idx]

    @property
    def certify_y(self) -> np.ndarray:
        return self.y[self.certify_idx]

    @property
    def certify_ood(self) -> np.ndarray | None:
        return None if self.ood is None else self.ood[self.ood_certify]

    def selection(self) -> tuple[Dataset, Dataset | None]:
        from edgebnn.data import load_data

        sel = load_data((self.x[self.select_idx], self.y[self.select_idx]))
        return sel, None if self.ood is None else load_data(self.ood[self.ood_select], labels=False)

    def describe(self) -> dict[str, Any]:
        ood = None if self.ood is None else len(self.ood)
        return {"rows": len(self.x), "of": self.of, "selection_rows": len(self.select_idx),
                "certification_rows": len(self.certify_idx), "ood_rows": ood, "ood_of": self.ood_of,
                "ood_certification_rows": None if ood is None else len(self.ood_certify)}


@dataclasses.dataclass
class Candidate:
    """One configuration to certify: its config, lowered model, deployed bytes and how it came about."""

    label: str
    config: LowerConfig
    model: LoweredModel
    file_bytes: int
    fallback: bool = False  # a post-training ternary/binary's fixed-point fallback, tried before it


@dataclasses.dataclass(frozen=True)
class BudgetOptions:
    """How :func:`lower_within_budget` finds and certifies its candidates (the defaults are ``lower --budget``'s).

    Attributes:
        samples: S of both exports, the float BNN's and every candidate's (None: the family's default, 16 or a deep
            ensemble's M).
        order: ``chain`` or ``split`` (:data:`ORDERS`; the module docstring).
        max_rows: At most this many validation rows (and OOD inputs) are read, the first ones.
        max_steps, select_fraction: The ``split`` order's greedy walk: at most this many changes, on this share of
            the rows.
        draws: Device calls per certification input when the export samples (None: :data:`edgebnn.budget.DRAWS`).
    """

    samples: int | None = None
    order: str = "chain"
    max_rows: int = BUDGET_ROWS
    max_steps: int = BUDGET_STEPS
    select_fraction: float = SELECT_FRACTION
    draws: int | None = None

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise InvalidOptionError(f"order {self.order!r}: one of {', '.join(ORDERS)}")
        if self.draws is not None and self.draws < 1:
            raise InvalidOptionError(f"draws {self.draws}: at least one device call per input")

    def resolved(self, float_ir: BNNModel) -> BudgetOptions:
        """These options with ``samples`` and ``draws`` filled in for ``float_ir`` (S checked)."""
        from edgebnn.budget._certify import DRAWS
        from edgebnn.exporters.families import default_samples
        from edgebnn.runtime.reference import check_samples

        samples = default_samples(float_ir) if self.samples is None else self.samples
        check_samples(samples)
        return dataclasses.replace(self, samples=samples, draws=DRAWS if self.draws is None else self.draws)


def lower_within_budget(float_ir: BNNModel, config: LowerConfig, budget: Budget | str, *,
                        data: DataSource = "digits", split: str | None = None, ood_data: DataSource | None = None,
                        options: BudgetOptions | None = None, progress: Progress | None = None,
                        **data_options: Any) -> LoweredModel:
    """Lower with the fewest deployed bytes that keep an uncertainty budget on new data with the budget's
    confidence (module docstring: the guarantee, and the two orders).

    Args:
        float_ir: The float BNN.
        config: Where to start (``float``: :data:`BUDGET_START` at the variance rule's bits; a posterior family's
            layers at the first scheme they take); its seed seeds the lowering, the split and the bootstrap.
        budget: A :class:`edgebnn.budget.Budget` (its ``confidence`` too) or its text.
        data, split: Labelled validation data (``digits``: its ``val`` split); the first ``options.max_rows`` rows
            are read.
        ood_data: Out-of-distribution inputs, for an ``auroc`` budget.
        options: S, the order, the rows and the device calls per input (:class:`BudgetOptions`).
        data_options: ``grams``, ``gradients``...: passed to every candidate whose passes take them
            (:func:`edgebnn.passes.lower`).

    Returns:
        The lowered model; its report has ``eval`` (:func:`lowering_quality` on all of ``data``, reference runtime)
        and ``budget``: ``met``, ``confidence``, ``bounds`` (each metric's change on the certification rows with its
        limit), ``deltas``, ``violations``, ``certification`` (every candidate tested in order, and why the test
        stopped), ``floor`` (the float BNN's own weights), ``layers``, ``steps``, ``measured_on``, ``evaluations``,
        ``warnings`` and ``sizes``. The chosen settings are in the config the manifest stores (``edgebnn lower
        --config model.ebnn`` replays them).

    Raises:
        BudgetNotMetError: No candidate is certified (``.closest`` holds the first one's config and figures); the
            message says when the budget is finer than the rows resolve, and how many would.
        InvalidOptionError: A malformed budget, an ``auroc`` budget without ``ood_data``, bad data.
        TypeError: An option of :class:`BudgetOptions` given as a keyword instead of in ``options``.
    """
    misplaced = sorted(set(data_options) & {f.name for f in dataclasses.fields(BudgetOptions)})
    if misplaced:
        raise TypeError(f"lower_within_budget: give {', '.join(misplaced)} in options=BudgetOptions(...)")
    opts = (options or BudgetOptions()).resolved(float_ir)
    assert opts.samples is not None and opts.draws is not None  # resolved
    budget = check_budget(budget, data, ood_data)
    dataset, ood = eval_data(float_ir, data, split, ood_data)
    rows = Rows(dataset, ood, opts.max_rows, opts.select_fraction if opts.order == "split" else 0.0, config.seed)
    rows.check_range(float_ir)
    reference, _ = export_evidence(float_ir, rows.certify_x, rows.certify_ood, seed=config.seed, draws=opts.draws,
                                   fallback_samples=opts.samples)
    certifier = _Certifier(budget, rows, reference, opts.samples, config.seed, opts.draws)
    floor, floor_what = certifier.certify(float_ir, again=True)
    if not floor.kept:
        raise unresolvable(budget, rows, floor, floor_what)
    candidates, search = _candidates(float_ir, config, budget, rows, opts, progress, data_options)
    test = _in_sequence(certifier, candidates, progress)
    if test.chosen is None:
        raise _not_certified(budget, rows, candidates, test.tested, test.stopped)
    cand, cert, what = test.chosen
    warnings = search.warnings if search else _fallback_warnings(config, cand, test, candidates)
    lowered = cand.model
    report = lowered.lowering_report
    if search is not None:
        search.current = next(s for s in search.path() if search.config(s) == cand.config)
        layers = search.layer_rows(lowered)
    else:
        layers = _layer_rows(lowered, cand, test.stopped)
    report["eval"] = lowering_quality(float_ir, lowered, data=data, split=split, ood_data=ood_data,
                                      samples=opts.samples, seed=config.seed)
    report["budget"] = {
        "budget": str(budget), "limits": budget.to_dict(), "confidence": budget.confidence, "met": True,
        "deltas": cert.deltas, "bounds": [b.to_dict() for b in cert.bounds], "violations": [],
        "order": opts.order, "start": start_config(float_ir, config).to_dict(), "chosen": cand.label,
        "measured_on": {**rows.describe(), "samples": opts.samples, "seed": config.seed, "draws": what["draws"],
                        "runtime": what["runtime"]},
        "certification": {"candidates": len(candidates), "tested": test.tested, "stopped": test.stopped},
        "floor": {"bounds": [b.to_dict() for b in floor.bounds], "runtime": floor_what["runtime"]},
        "evaluations": len(test.tested) + (search.evaluations if search else 0),
        "steps": search.steps if search else [], "layers": layers, "warnings": warnings,
        "sizes": budget_sizes(lowered),
    }
    return lowered


def _candidates(float_ir: BNNModel, config: LowerConfig, budget: Budget, rows: Rows, opts: BudgetOptions,
                progress: Progress | None,
                data_options: dict[str, Any]) -> tuple[list[Candidate], _BudgetSearch | None]:
    """The candidates in the order they are certified in, and the greedy walk that chose them (``split`` only)."""
    assert opts.samples is not None
    if opts.order == "chain":
        return data_free_chain(float_ir, config, opts.samples, data_options), None
    sel, sel_ood = rows.selection()
    search = _BudgetSearch(float_ir, config, budget, sel, sel_ood, opts.samples, progress, data_options)
    search.run(opts.max_steps)
    return [Candidate(f"greedy step {i}", search.config(s), search.evaluate(s)[0], search.size(search.evaluate(s)[0]))
            for i, s in enumerate(search.path())], search


def _fallback_warnings(config: LowerConfig, cand: Candidate, test: _Sequence, candidates: list[Candidate]) -> list[str]:
    """A post-training ternary/binary start whose own codes broke the budget: the fixed-point fallback was kept."""
    if not cand.fallback or len(test.tested) <= sum(c.fallback for c in candidates):
        return []
    from edgebnn.passes.config import parse_scheme

    last = parse_scheme(config.scheme)[-1]
    return [f"post-training {config.scheme} breaks the budget ({test.stopped}); {last} reaches its paper's accuracy "
            f"when trained for it: {_RECIPES[last]}; kept {cand.label}"]


@dataclasses.dataclass
class _Sequence:
    """The fixed-sequence test's outcome: every candidate tested, the last certified one, why the test stopped."""

    tested: list[dict[str, Any]]
    chosen: tuple[Candidate, Certificate, dict[str, Any]] | None
    stopped: str | None


def _in_sequence(certifier: _Certifier, candidates: list[Candidate], progress: Progress | None) -> _Sequence:
    """Certify ``candidates`` in order, stopping at the first one that is not (fixed-sequence testing)."""
    out = _Sequence([], None, None)
    for i, cand in enumerate(candidates):
        cert, what = certifier.certify(cand.model)
        out.tested.append({"candidate": cand.label, "total_bytes": int(cand.model.lowering_report["total_bytes"]),
                           "file_bytes": cand.file_bytes, "kept": cert.kept,
                           "bounds": [b.to_dict() for b in cert.bounds]})
        if progress:
            progress(i + 1, len(candidates))
        if not cert.kept:
            out.stopped = f"{cand.label} ({cand.file_bytes} B) was not certified: {'; '.join(map(str, cert.broken))}"
            break
        out.chosen = cand, cert, what
    return out


def data_free_chain(float_ir: BNNModel, config: LowerConfig, samples: int,
                    data_options: dict[str, Any]) -> list[Candidate]:
    """The ``chain`` order's candidates, largest deployed file first, each at least :data:`PATH_STEP` smaller than
    the one before (module docstring); chosen from the weights alone. A post-training ``ternary`` or ``binary``
    start is preceded by the variance rule's ``fixed`` at its three finest noise fractions (``X`` -> ``fixed``), its
    fallback when the post-training codes break the budget."""
    from edgebnn.passes import LayerOverride
    from edgebnn.passes.config import config_fields, parse_scheme

    base = start_config(float_ir, config)
    names = parse_scheme(base.scheme)
    head: list[Candidate] = []
    if names[-1] in _RECIPES:
        fixed = dataclasses.replace(base, scheme="+".join([*names[:-1], "fixed"]), bits="auto", options={})
        head = [dataclasses.replace(c, fallback=True)
                for c in data_free_chain(float_ir, fixed, samples, data_options)[:3]]

    def takes(scheme: str) -> set[str]:
        return set().union(*(config_fields(n)[0] for n in parse_scheme(scheme)))

    def with_options(**options: Any) -> LowerConfig:
        def own(scheme: str, current: dict[str, Any]) -> dict[str, Any]:
            return {**current, **{k: v for k, v in options.items() if k in takes(scheme) and k != "bits"}}

        overrides = tuple(LayerOverride(o.pattern, o.scheme, o.bits, own(o.scheme or base.scheme, dict(o.options)))
                          for o in base.overrides)
        bits = options.get("bits", base.bits)
        return dataclasses.replace(base, bits=bits, options=own(base.scheme, dict(base.options)), overrides=overrides)

    from edgebnn.passes.config import PASSES, parse_scheme

    last = parse_scheme(base.scheme)[-1]
    sigma0 = base.options.get("sigma_bits", getattr(PASSES[last].config_type, "sigma_bits", None))
    from edgebnn.budget._greedy import _layers_of
    from edgebnn.passes.base import family_lowerings

    family = any(family_lowerings(kind) is not None  # a family's lowering codes its own σ
                 for kinds in _layers_of(float_ir)[1].values() for kind in kinds)
    # the σ code at its bits, then one σ per layer: a code of fewer bits than the default kept no model better than
    # one σ per layer did (bench: NLL, ECE and accuracy of 1-bit codes on four digits models), and costs a test
    sigmas: list[int | None] = ([sigma0, 0] if "sigma_bits" in takes(base.scheme) and sigma0 and not family
                                else [None])
    steps: list[tuple[str, dict[str, Any]]] = []
    if base.bits == "auto" and "noise_fraction" in takes(base.scheme):
        rule = base.options.get("noise_fraction", 0.1)
        fractions = sorted({f * rule / 0.1 for f in NOISE_FRACTIONS})
        finer, coarser = [f for f in fractions if f < rule], [f for f in fractions if f > rule]
        steps += [(f"noise fraction {f:g}", {"noise_fraction": f}) for f in finer]
        steps += [(f"σ code {s} bits" if s is not None else "variance rule", {"sigma_bits": s} if s is not None else {})
                  for s in sigmas]
        low = {"sigma_bits": sigmas[-1]} if sigmas[-1] is not None else {}
        steps += [(f"{'σ code ' + str(sigmas[-1]) + ' bits, ' if low else ''}noise fraction {f:g}",
                   {**low, "noise_fraction": f}) for f in coarser]
    elif isinstance(base.bits, int):
        widths = range(min(base.bits + 2, 8), 1, -1)
        top = [b for b in widths if b > base.bits]
        steps += [(f"{b} bits", {"bits": b}) for b in top]
        steps += [(f"{base.bits} bits, σ code {s} bits" if s is not None else f"{base.bits} bits",
                   {"sigma_bits": s} if s is not None else {}) for s in sigmas]
        low = {"sigma_bits": sigmas[-1]} if sigmas[-1] is not None else {}
        steps += [(f"{b} bits" + (f", σ code {sigmas[-1]} bits" if low else ""), {**low, "bits": b})
                  for b in widths if b < base.bits]
    else:
        steps = [("as given", {})]
    out: list[Candidate] = list(head)
    for label, options in steps:
        try:
            cfg = with_options(**options)
            model = lower_config(float_ir, cfg, data_options)
        except InvalidOptionError:
            continue  # a width the scheme does not take
        size = deployed_size(model, samples)
        if out and size > (1 - PATH_STEP) * out[-1].file_bytes:
            continue
        out.append(Candidate(f"{base.scheme}, {label}", cfg, model, size))
    return out


class _Certifier:
    """Certifies models on the certification rows against the float BNN's evidence there."""

    def __init__(self, budget: Budget, rows: Rows, reference: Evidence, samples: int, seed: int, draws: int) -> None:
        self.budget, self.rows, self.reference = budget, rows, reference
        self.samples, self.seed, self.draws = samples, seed, draws

    def certify(self, model: BNNModel, again: bool = False) -> tuple[Certificate, dict[str, Any]]:
        """``model``'s certificate; ``again``: its device noise drawn afresh (the float BNN against itself)."""
        from edgebnn.budget._certify import certify, export_evidence
        from edgebnn.exporters.families import default_samples

        evidence, what = export_evidence(model, self.rows.certify_x, self.rows.certify_ood,
                                         seed=self.seed + _AGAIN if again else self.seed, draws=self.draws,
                                         fallback_samples=default_samples(model, self.samples))
        return certify(self.budget, self.reference, evidence, self.rows.certify_y, seed=self.seed), what


def _layer_rows(model: LoweredModel, cand: Candidate, stopped: str | None) -> list[dict[str, Any]]:
    """Per layer of the chosen lowering: its scheme, bits, options, bytes and why (the chain step chosen; why the
    next was not is the certification's ``stopped``)."""
    from edgebnn.budget._greedy import _layers_of

    names, _ = _layers_of(model)
    by_name = {r["name"]: r for r in model.lowering_report["layers"]}
    plans = {w: p for p in cand.config.plan(model) for w in p.weights}
    why = f"chain: {cand.label}" + ("" if stopped else " (the chain's last candidate)")
    out = []
    for layer, weights in names.items():
        rows = [by_name[w] for w in weights if w in by_name]
        plan = plans.get(weights[0])
        out.append({"layer": layer, "scheme": rows[0].get("scheme", cand.config.scheme) if rows else cand.config.scheme,
                    "bits": max(int(r.get("bits") or 0) for r in rows) if rows else 0,
                    "forced_bits": plan.bits if plan else cand.config.bits,
                    "options": {k: v for k, v in (plan.options if plan else {}).items()
                                if k in ("sigma_bits", "noise_fraction")},
                    "bytes": sum(int(r["bytes"]) for r in rows), "reason": why})
    return out


def unresolvable(budget: Budget, rows: Rows, floor: Certificate, what: dict[str, Any]) -> Exception:
    """The error when even the float BNN's own weights, run again as the device runs them, are not certified."""
    from edgebnn.budget._bounds import BudgetNotMetError, rows_to_resolve

    n = len(rows.certify_idx)
    parts = []
    for b in floor.broken:
        need = rows_to_resolve(b.metric, b.limit, b, budget.confidence)
        total = None if need is None else int(need / (1 - rows.fraction) + 0.999)
        how = ("no number of rows would: it asks the lowering to do better than the float BNN itself" if total is None
               else f"about {total} validation rows would" + (f" ({need} to certify)" if rows.fraction else ""))
        parts.append(f"{b.metric}={b.limit:+g} is finer than {n} rows resolve at {budget.confidence:.0%} confidence: "
                     f"the float BNN's own weights, sampled again as the device samples them ({what['runtime']}), "
                     f"are bounded at {b.bound:+.4f}; {how}")
    return BudgetNotMetError(f"--budget {budget}: {'; '.join(parts)}; nothing was written",
                             {"config": None, "deltas": floor.deltas, "compression_ratio": 1.0, "total_bytes": None,
                              "violations": [str(b) for b in floor.broken], "bounds": floor.to_dict()})


def _not_certified(budget: Budget, rows: Rows, candidates: list[Candidate], tested: list[dict[str, Any]],
                   stopped: str | None) -> Exception:
    """The error when no candidate is certified: the first one's figures (its config, to start from)."""
    from edgebnn.budget._bounds import BudgetNotMetError

    n = len(rows.certify_idx)
    if not candidates:
        return BudgetNotMetError(f"--budget {budget}: no configuration keeps it on the {len(rows.select_idx)} "
                                 "selection rows; nothing was written",
                                 {"config": None, "deltas": {}, "compression_ratio": 1.0, "total_bytes": None,
                                  "violations": []})
    first = candidates[0]
    report = first.model.lowering_report
    bounds = tested[0]["bounds"]
    deltas = {b["metric"]: b["delta"] for b in bounds}
    config = json.dumps(report["config"], sort_keys=True, separators=(",", ":"))
    return BudgetNotMetError(
        f"--budget {budget}: no lowering is certified at {budget.confidence:.0%} confidence on {n} rows: "
        f"{stopped}; closest: {', '.join(f'{k} {v:+.4f}' for k, v in deltas.items())}, "
        f"{report['float_bnn_bytes'] / max(first.file_bytes, 1):.1f}x smaller deployed, config {config}; "
        "nothing was written",
        {"config": report["config"], "deltas": deltas, "compression_ratio": report["compression_ratio"],
         "total_bytes": report["total_bytes"], "violations": [stopped or ""], "bounds": bounds})


def budget_sizes(lowered: LoweredModel) -> dict[str, Any]:
    """Both sizes of the chosen lowering: the IR's (``total_bytes``, and the ``.ebnn`` file) and the deployed ONNX of
    the default export for the device (:data:`edgebnn.exporters.config.DEFAULT_EXPORT`; a deep ensemble's S = M),
    with what was exported; ``deployed`` is null with ``deployed_error`` when that export is refused."""
    from edgebnn.errors import EdgeBNNError
    from edgebnn.exporters.config import DEFAULT_EXPORT
    from edgebnn.exporters.export import export_model
    from edgebnn.exporters.sizes import deployed_bytes

    report = lowered.lowering_report
    out: dict[str, Any] = {"ir_bytes": int(report["total_bytes"]), "ebnn_bytes": int(report["ebnn_bytes"]),
                           "float_bnn_bytes": int(report["float_bnn_bytes"]), "deployed": None, "export": None}
    try:
        result = export_model(lowered, DEFAULT_EXPORT)
    except EdgeBNNError as e:
        out["deployed_error"] = str(e)
        return out
    choice, config = result.choice, result.resolved.config
    what = {"mode": choice.mode, "samples": result.resolved.samples, "weights": config.weights,
            "noise": choice.noise if choice.noise != "auto" else None, "device": config.device}
    out.update(deployed=deployed_bytes(result.proto).to_dict(), export={k: v for k, v in what.items() if v is not None})
    return out
