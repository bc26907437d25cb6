"""``lower --budget ... --minimize latency``: the fastest export that keeps an uncertainty budget, certified.

**What is chosen.** A candidate is a lowering (the ``--scheme``/``--config`` given), a *deterministic prefix* (the
first k Bayesian layers in graph order replaced by their posterior mean, σ = 0: every export then runs them once on
the B inputs, and only the sampled suffix on B x S; ``hoist``'s rule, :func:`edgebnn.exporters.rewrite.quiet_weights`,
hoists σ ≡ 0 layers under any threshold), an export mode (:data:`MODES`) and S (:data:`SAMPLES`, ``auto``: an anytime
ensemble). At least one layer samples. Each candidate is exported for the device and timed there as the device runs
it (:func:`edgebnn.targets.profiler.measure_interleaved`: the candidates, one float pass and the float BNN's own
export in the same interleaved rounds, batch 1, on validation inputs; ratios are of p50s).

**The guarantee** is ``lower --budget``'s (:func:`~edgebnn.budget.lower_within_budget`): the validation rows are
split at random (seeded) into selection rows (:data:`SELECT_FRACTION`) and certification rows. On the selection rows
each candidate's budgeted changes against the float BNN's export are bounded; of those whose bounds, narrowed to the
certification rows' count, are within budget, the ones no faster candidate beats on the share of the budget used are
ordered slowest (least used) first, at least :data:`LATENCY_STEP` apart: an order fixed before the certification
rows are read. They are certified along it (fixed-sequence testing, each metric's one-sided limit at the budget's
confidence) until the first that is not; the last certified is the result. Every candidate, and the float BNN, is
judged as onnxruntime runs its export.

**Epistemic uncertainty.** NLL and ECE do not see a collapse of the mutual information (the README: MI 0.054 ->
0.013 when three layers stop sampling), so a budget that trades stochastic layers must bound a metric that does: the
MI-AUROC against ``--ood-data`` (``auroc``; added at :data:`EPISTEMIC_ALLOWANCE` when the budget does not name it).
Without OOD data the search is refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgebnn.budget._bounds import MINIMIZE
from edgebnn.budget._certify import DRAWS, certify
from edgebnn.budget._greedy import _layers_of, default_export, lower_config
from edgebnn.budget._lower import _AGAIN, BUDGET_ROWS, Rows, check_budget, unresolvable
from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.measure import Progress, eval_data, lowering_quality

if TYPE_CHECKING:
    import numpy as np

    from edgebnn._lowered import LoweredModel
    from edgebnn.budget._bounds import Budget, Certificate
    from edgebnn.budget._certify import Evidence
    from edgebnn.data import DataSource
    from edgebnn.ir import BNNModel
    from edgebnn.passes import LowerConfig

__all__ = ["MINIMIZE", "LatencySpace", "fastest_within_budget"]

"""``lower --budget --minimize``: what the certified search minimizes (``size``: :func:`lower_within_budget`)."""
MODES = ("analytic", "baked", "noise")
SAMPLES: tuple[int | str, ...] = (4, 8, 16, 32, 64)
"""S of each candidate (analytic: its quadrature points): a short sampled suffix draws many cheaply."""
EPISTEMIC_ALLOWANCE = 0.02
"""The MI-AUROC allowance added to a ``--minimize latency`` budget that names no ``auroc``."""
SELECT_FRACTION = 0.3
"""The share of the validation rows (chosen at random, seeded) the candidates are selected on."""
LATENCY_STEP = 0.15
"""The certification order keeps candidates at least this much slower than the next (fewer tests, fewer to fail)."""
LATENCY_INPUTS = 8  # the timed calls cycle through this many validation inputs (an anytime graph's cost follows them)


@dataclasses.dataclass(frozen=True)
class LatencySpace:
    """What ``--minimize latency`` searches and how it times: export ``modes`` × ``samples`` (S, or ``auto``) ×
    deterministic prefixes (``max_prefix``: at most this many layers; None: all but the last), timed on ``device``
    with ``threads`` onnxruntime threads, ``runs`` interleaved rounds at batch 1; certified on at most ``max_rows``
    rows, ``select_fraction`` of them selecting, ``draws`` device calls per input of a sampling export."""

    modes: tuple[str, ...] = MODES
    samples: tuple[int | str, ...] = SAMPLES
    max_prefix: int | None = None
    device: str = "cpu"
    threads: int = 2
    runs: int = 100
    warmup: int = 10
    max_rows: int = BUDGET_ROWS
    select_fraction: float = SELECT_FRACTION
    draws: int = DRAWS


@dataclasses.dataclass
class _Option:
    """One candidate: its deterministic prefix, export and what was measured of it."""

    prefix: tuple[str, ...]
    sampled: tuple[str, ...]
    mode: str
    samples: int | str
    model: LoweredModel
    data: bytes
    latency_ms: float = float("nan")
    selection: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def label(self) -> str:
        det = ", ".join(self.prefix) or "none"
        return f"{self.mode} S={self.samples}, deterministic: {det}"

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.label, "mode": self.mode, "samples": self.samples, "deterministic": list(self.prefix),
                "sampled": list(self.sampled), "latency_ms": self.latency_ms, "file_bytes": len(self.data),
                "selection_deltas": self.selection}


def epistemic_budget(budget: Budget, ood_data: DataSource | None) -> tuple[Budget, str | None]:
    """``budget`` with a metric that sees epistemic uncertainty (module docstring), and the note saying what was
    added; refused in one line without OOD data."""
    from edgebnn.budget._bounds import Budget

    if "auroc" in budget.limits:
        return budget, None
    if ood_data is None:
        raise InvalidOptionError(f"--budget {budget} --minimize latency: making layers deterministic can collapse "
                                 "epistemic uncertainty, which no metric of this budget sees; add --ood-data FILE "
                                 f"(the MI-AUROC is then bounded, auroc=-{EPISTEMIC_ALLOWANCE:g} unless the budget "
                                 "names it)")
    limits = {**budget.limits, "auroc": -EPISTEMIC_ALLOWANCE}
    return Budget(limits, budget.confidence), (f"auroc=-{EPISTEMIC_ALLOWANCE:g} added: --minimize latency trades "
                                                "stochastic layers, and the MI-AUROC sees what that costs")


def deterministic_prefix(model: LoweredModel, layers: tuple[str, ...]) -> LoweredModel:
    """A copy of ``model`` whose ``layers`` are their posterior mean (σ = 0, fp32): exports run them once."""
    import numpy as np

    from edgebnn._lowered import LoweredModel
    from edgebnn.ir.encodings.gaussian import GaussianWeight
    from edgebnn.passes import ebnn_bytes
    from edgebnn.passes.base import layer_row

    out = model.copy()
    names = _layers_of(out)[0]
    rows = {r["name"]: r for r in model.lowering_report["layers"]}
    for layer in layers:
        for name in names[layer]:
            weight = out.encoded_weight(name)
            mean = np.asarray(weight.encoding.mean(), np.float32)
            new = GaussianWeight(mean, np.zeros_like(mean))
            rows[name] = layer_row(weight, new, note="deterministic prefix: its mean, σ = 0 (runs once)")
            out.replace_encoding(weight, new)
    report = dict(model.lowering_report)
    total = out.nbytes()
    report.update(layers=[rows[n] for n in out.encoded_weight_names() if n in rows], total_bytes=total,
                  compression_ratio=report["float_bnn_bytes"] / total if total else None, ebnn_bytes=ebnn_bytes(out),
                  deterministic_layers=list(layers))
    return LoweredModel(out, report)


def _prefix_layers(model: BNNModel, max_prefix: int | None) -> list[str]:
    """The Bayesian layers in graph order up to the first drawn jointly with others (a deep ensemble's member,
    SWAG: its group samples as a whole); the last one always samples."""

    names = _layers_of(model)[0]
    out = []
    for layer, weights in names.items():
        if any(model.encoded_weight(w).encoding.joint_group() is not None for w in weights):
            break
        out.append(layer)
    limit = len(names) - 1 if max_prefix is None else min(max_prefix, len(names) - 1)
    return out[:max(limit, 0)]


def _options(lowered: LoweredModel, space: LatencySpace, seed: int, progress: Progress | None) -> list[_Option]:
    """Every candidate of ``space`` the exporters take (a mode a model refuses is left out)."""
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model

    layers = list(_layers_of(lowered)[0])
    prefixes = _prefix_layers(lowered, space.max_prefix)
    out: list[_Option] = []
    for k in range(len(prefixes) + 1):
        model = deterministic_prefix(lowered, tuple(prefixes[:k])) if k else lowered
        for mode in space.modes:
            for samples in space.samples:
                if mode == "analytic" and samples == "auto":
                    continue
                try:
                    config = ExportConfig(samples=samples, mode=mode, seed=seed, device=space.device)
                    proto = export_model(model, config).proto
                except EdgeBNNError:
                    continue  # the mode does not take this model
                out.append(_Option(tuple(prefixes[:k]), tuple(layers[k:]), mode, samples, model,
                                   proto.SerializeToString(deterministic=True)))
        if progress:
            progress(k + 1, len(prefixes) + 1)
    return out


def _time(options: list[_Option], float_ir: BNNModel, reference: bytes, inputs: np.ndarray,
          space: LatencySpace) -> dict[str, float]:
    """Each candidate's p50 latency (ms, batch 1) and the baselines', in the same interleaved rounds on the
    device: ``float_pass`` (one pass of the mean network) and ``float_bnn_export`` (the float BNN's own export)."""
    import tempfile

    import onnx

    from edgebnn.targets.base import CompileOptions
    from edgebnn.targets.power.null import NullMeter
    from edgebnn.targets.profiler import measure_interleaved
    from edgebnn.targets.registry import get_target

    target = get_target(space.device)
    graphs = {"float_pass": target.baselines(float_ir)["float_deterministic"],
              "float_bnn_export": onnx.load_from_string(reference)}
    graphs.update({f"c{i}": onnx.load_from_string(o.data) for i, o in enumerate(options)})
    with tempfile.TemporaryDirectory(prefix="edgebnn-fastest-") as tmp:
        calls: dict[str, Callable[[], Any]] = {}
        for name, graph in graphs.items():
            exe = target.compile(graph, options=CompileOptions(name=name, workdir=tmp, threads=space.threads,
                                                               max_batch=1))
            calls[name] = _cycling([exe.bind(inputs[i:i + 1]) for i in range(len(inputs))])
        measured = measure_interleaved(calls, batch=1, runs=space.runs, warmup=space.warmup, meter=NullMeter())
    for i, option in enumerate(options):
        option.latency_ms = measured[f"c{i}"].latency_ms["p50"]
    return {name: measured[name].latency_ms["p50"] for name in ("float_pass", "float_bnn_export")}


def _cycling(calls: list[Callable[[], Any]]) -> Callable[[], Any]:
    """One call that runs ``calls`` in turn (an anytime graph's cost follows its input)."""
    import itertools

    turn = itertools.cycle(calls)
    return lambda: next(turn)()


def device_evidence(data: bytes, x: np.ndarray, ood: np.ndarray | None, seed: int, draws: int) -> Evidence:
    """What the export ``data`` predicts in onnxruntime (no fallback to the reference runtime: every candidate is
    judged as the device runs it)."""
    from edgebnn.budget._certify import session_evidence
    from edgebnn.runtime import Session

    return session_evidence(Session(data, seed=seed, threads=1), x, ood, draws)


def _order(options: list[_Option], budget: Budget, rows: Rows, reference_export: bytes, seed: int,
           draws: int, float_bnn: tuple[str, int | str]) -> list[_Option]:
    """The certification order, slowest first: of the candidates whose bounds on the selection rows, narrowed to the
    certification rows' count (a bound's distance from its change shrinks as 1/sqrt(rows)), are within budget, those
    no faster one beats on the budget they use (so the order goes from the least used to the most: a test that fails
    ends it), thinned to steps of :data:`LATENCY_STEP` from the fastest. The float BNN's own export among the
    candidates (no deterministic layer, the ``float_bnn`` mode and S: every change 0 on the selection rows) goes
    first, so that a first test that fails on few rows does not leave nothing certified."""

    sel_x, sel_y = rows.x[rows.select_idx], rows.y[rows.select_idx]
    sel_ood = None if rows.ood is None else rows.ood[rows.ood_select]
    reference = device_evidence(reference_export, sel_x, sel_ood, seed, draws)
    from edgebnn.budget._bounds import worse

    shrink = math.sqrt(len(rows.select_idx) / len(rows.certify_idx))  # a bound's width goes as 1/sqrt(rows)
    risk: dict[int, float] = {}
    for option in options:
        cert = certify(budget, reference, device_evidence(option.data, sel_x, sel_ood, seed, draws), sel_y, seed=seed)
        option.selection = cert.deltas
        projected = {b.metric: b.delta + (b.bound - b.delta) * shrink for b in cert.bounds}
        risk[id(option)] = max(worse(k, projected[k]) / max(abs(v), 1e-3) for k, v in budget.limits.items())
    frontier: list[_Option] = []  # fastest first, each using less of the budget than every faster one
    for option in sorted((o for o in options if risk[id(o)] <= 1), key=lambda o: o.latency_ms):
        if not frontier or risk[id(option)] < risk[id(frontier[-1])]:
            frontier.append(option)
    out = frontier[:1]
    for option in frontier[1:]:  # thinned from the fastest: each kept one a step slower than the last
        if option.latency_ms * (1 - LATENCY_STEP) >= out[-1].latency_ms:
            out.append(option)
    anchor = [o for o in options if not o.prefix and (o.mode, o.samples) == float_bnn and o not in out]
    return anchor[:1] + out[::-1]


def fastest_within_budget(float_ir: BNNModel, config: LowerConfig, budget: Budget | str, *,
                          data: DataSource = "digits", ood_data: DataSource | None = None,
                          samples: int | None = None, space: LatencySpace | None = None,
                          progress: Progress | None = None, **data_options: Any) -> LoweredModel:
    """The fastest export of ``config``'s lowering of ``float_ir`` that keeps ``budget`` on new data with its
    confidence (module docstring).

    Returns:
        The chosen lowered model (its deterministic layers at their mean); its report has ``eval``, ``budget``
        (as :func:`lower_within_budget`'s, the order ``latency``) and ``fastest``: the chosen ``deterministic`` and
        ``sampled`` layers, ``mode``, ``samples``, ``latency_ms``, ``ratios`` (``vs_float_pass``,
        ``vs_float_bnn_export``), the baselines, every candidate timed and the export command.

    Raises:
        InvalidOptionError: No metric of the budget sees epistemic uncertainty and no OOD data is given, or what
            :func:`lower_within_budget` refuses.
        BudgetNotMetError: No candidate is certified.
    """
    from edgebnn.budget._bounds import Budget
    from edgebnn.exporters.families import default_samples
    space = space or LatencySpace()
    budget = Budget.parse(budget) if isinstance(budget, str) else budget
    budget, note = epistemic_budget(budget, ood_data)
    budget = check_budget(budget, data, ood_data)
    samples = default_samples(float_ir) if samples is None else samples
    draws = space.draws
    dataset, ood = eval_data(float_ir, data, None, ood_data)
    rows = Rows(dataset, ood, space.max_rows, space.select_fraction, config.seed)
    rows.check_range(float_ir)
    reference_export, reference_mode = default_export(float_ir, samples, config.seed)
    reference = device_evidence(reference_export, rows.certify_x, rows.certify_ood, config.seed, draws)
    again = config.seed + _AGAIN  # the float BNN against itself, its device noise drawn afresh
    floor = certify(budget, reference, device_evidence(default_export(float_ir, samples, again)[0], rows.certify_x,
                                                 rows.certify_ood, again, draws), rows.certify_y, seed=config.seed)
    floor_what = {"runtime": f"onnxruntime ({reference_mode})"}
    if not floor.kept:
        raise unresolvable(budget, rows, floor, floor_what)
    lowered = lower_config(float_ir, config, data_options)
    options = _options(lowered, space, config.seed, progress)
    baselines = _time(options, float_ir, reference_export, rows.x[rows.select_idx][:LATENCY_INPUTS], space)
    order = _order(options, budget, rows, reference_export, config.seed, draws, (reference_mode, samples))
    chosen, tested, stopped = _certify_in_order(order, budget, rows, reference, config.seed, draws)
    if chosen is None:
        raise _none_certified(budget, rows, order, stopped)
    option, cert = chosen
    lowered = option.model
    report = lowered.lowering_report
    report["eval"] = lowering_quality(float_ir, lowered, data=data, ood_data=ood_data, samples=samples,
                                      seed=config.seed)
    report["budget"] = _budget_report(budget, cert, rows, option, tested, stopped, floor, floor_what, len(order))
    report["budget"]["measured_on"].update(samples=option.samples, seed=config.seed,
                                           draws=draws if option.mode in ("noise", "shared") else 1)
    report["budget"].update(evaluations=len(options) + len(tested), warnings=[note] if note else [],
                            layers=_layer_rows(lowered, option))
    report["fastest"] = _fastest_report(option, options, baselines, space, config.seed)
    report["fastest"]["float_bnn_export"] = {"mode": reference_mode, "samples": samples}
    report["budget"]["sizes"] = _sizes(lowered, option, report["fastest"]["export_command"])
    return lowered


def _layer_rows(model: LoweredModel, option: _Option) -> list[dict[str, Any]]:
    """Per layer of the chosen export: its scheme, bits and bytes, and whether it samples or runs once."""

    by_name = {r["name"]: r for r in model.lowering_report["layers"]}
    out = []
    for layer, weights in _layers_of(model)[0].items():
        rows = [by_name[w] for w in weights if w in by_name]
        why = ("deterministic (its mean, fp32): runs once on the B inputs" if layer in option.prefix else
               f"sampled: {option.mode}, S={option.samples}")
        scheme = "float, σ = 0" if layer in option.prefix else str(model.lowering_report["scheme"])
        out.append({"layer": layer, "scheme": scheme,
                    "bits": max((int(r.get("bits") or 0) for r in rows), default=0), "options": {},
                    "bytes": sum(int(r["bytes"]) for r in rows), "reason": why})
    return out


def _sizes(model: LoweredModel, option: _Option, command: str) -> dict[str, Any]:
    """:func:`edgebnn.budget.budget_sizes` of the chosen export (not the default one), and the ``export``
    flags that write it."""
    import shlex

    import onnx

    from edgebnn.exporters.sizes import deployed_bytes

    report = model.lowering_report
    return {"ir_bytes": int(report["total_bytes"]), "ebnn_bytes": int(report["ebnn_bytes"]),
            "float_bnn_bytes": int(report["float_bnn_bytes"]),
            "deployed": deployed_bytes(onnx.load_from_string(option.data)).to_dict(),
            "export": {"mode": option.mode, "samples": option.samples}, "flags": shlex.join(shlex.split(command)[5:])}


def _certify_in_order(order: list[_Option], budget: Budget, rows: Rows, reference: Evidence, seed: int,
                      draws: int) -> tuple[tuple[_Option, Certificate] | None, list[dict[str, Any]], str | None]:
    """Fixed-sequence testing along ``order``: the last candidate certified, every test, and why it stopped."""
    chosen, tested, stopped = None, [], None
    for option in order:
        cert = certify(budget, reference, device_evidence(option.data, rows.certify_x, rows.certify_ood, seed, draws),
                       rows.certify_y, seed=seed)
        tested.append({"candidate": option.label, "latency_ms": option.latency_ms, "file_bytes": len(option.data),
                       "kept": cert.kept, "bounds": [b.to_dict() for b in cert.bounds]})
        if not cert.kept:
            stopped = (f"{option.label} ({option.latency_ms:.3f} ms) was not certified: "
                       f"{'; '.join(map(str, cert.broken))}")
            break
        chosen = option, cert
    return chosen, tested, stopped


def _budget_report(budget: Budget, cert: Certificate, rows: Rows, option: _Option, tested: list[dict[str, Any]],
                   stopped: str | None, floor: Certificate, floor_what: dict[str, Any], candidates: int,
                   ) -> dict[str, Any]:
    """``report["budget"]``, the keys :func:`lower_within_budget` writes (``lower``'s table prints them)."""
    runtime = f"onnxruntime ({option.mode})"
    return {"budget": str(budget), "limits": budget.to_dict(), "confidence": budget.confidence, "met": True,
            "deltas": cert.deltas, "bounds": [b.to_dict() for b in cert.bounds], "violations": [],
            "order": "latency", "chosen": option.label,
            "measured_on": {**rows.describe(), "runtime": runtime},
            "certification": {"candidates": candidates, "tested": tested, "stopped": stopped},
            "floor": {"bounds": [b.to_dict() for b in floor.bounds], "runtime": floor_what["runtime"]},
            "steps": [], "layers": []}


def _fastest_report(option: _Option, options: list[_Option], baselines: dict[str, float], space: LatencySpace,
                    seed: int) -> dict[str, Any]:
    import shlex

    command = ["edgebnn", "export", "model.ebnn", "-o", "model.onnx", "--mode", option.mode, "--samples",
               str(option.samples), "--seed", str(seed), "--device", space.device]
    return {"minimize": "latency", "device": space.device, "threads": space.threads, "batch": 1,
            "runs": space.runs, "of": "p50s of interleaved runs", "deterministic": list(option.prefix),
            "sampled": list(option.sampled), "mode": option.mode, "samples": option.samples,
            "latency_ms": option.latency_ms, "file_bytes": len(option.data),
            "baselines_ms": baselines,
            "ratios": {"vs_float_pass": option.latency_ms / baselines["float_pass"],
                       "vs_float_bnn_export": option.latency_ms / baselines["float_bnn_export"]},
            "candidates": [o.to_dict() for o in options], "export_command": shlex.join(command)}


def _none_certified(budget: Budget, rows: Rows, order: list[_Option], stopped: str | None) -> Exception:
    from edgebnn.budget._bounds import BudgetNotMetError

    what = (f"no candidate keeps it on the {len(rows.select_idx)} selection rows" if not order else
            f"none is certified at {budget.confidence:.0%} confidence on {len(rows.certify_idx)} rows: {stopped}")
    return BudgetNotMetError(f"--budget {budget} --minimize latency: {what}; nothing was written",
                             {"config": None, "deltas": {}, "compression_ratio": 1.0, "total_bytes": None,
                              "violations": [stopped or ""]})
