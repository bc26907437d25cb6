"""The Python API, and the workflows behind the CLI: import, lower, export, load, evaluate, profile.

The CLI is a thin layer over these functions (:mod:`edgebnn.cli` parses options and prints tables with
:mod:`edgebnn.tables`); each report is a plain, JSON-ready dict. The package re-exports the public ones:
``edgebnn.from_torch``, ``edgebnn.lower``, ``edgebnn.export``, ``edgebnn.load``, ``edgebnn.save``,
``edgebnn.evaluate``, ``edgebnn.load_data`` (see ``help(edgebnn)``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebnn import schemas
from edgebnn.errors import InvalidArtifactError, InvalidOptionError

if TYPE_CHECKING:
    import numpy as np

    from edgebnn._lowered import LoweredModel
    from edgebnn.budget import Budget
    from edgebnn.data import Dataset, DataSource
    from edgebnn.exporters.metadata import ExportMetadata
    from edgebnn.ir import BNNModel
    from edgebnn.metrics import Predictive
    from edgebnn.passes import LowerConfig
    from edgebnn.runtime import Session

PathLike = str | os.PathLike[str]
Progress = Callable[[int, int], None]
"""A progress callback: ``progress(done, total)`` in rows (evaluation) or batches."""

def load_ir(path: PathLike) -> BNNModel:
    """Load an .ebnn IR file, verified (an exported .onnx is refused with a pointer to ``Session``).

    Args:
        path: The ``.ebnn`` file (from ``edgebnn lower`` or :func:`save`).

    Returns:
        The IR.

    Raises:
        InvalidArtifactError: Missing, corrupt or unverifiable file, or an exported ``.onnx``.
    """
    from edgebnn import ir

    if Path(path).suffix == ".onnx":
        raise InvalidArtifactError(f"{path}: this takes an .ebnn IR file (from edgebnn lower), not an export; "
                                   "run an export with edgebnn.Session")
    return ir.load(path)


def save(model: BNNModel, path: PathLike) -> Path:
    """Write an IR as an ``.ebnn`` file, atomically; the same model gives the same bytes."""
    from edgebnn import ir

    return ir.save(model, path)


def export_metadata(path: PathLike) -> ExportMetadata:
    """The validated ``edgebnn.export`` metadata of an exported ONNX file (:mod:`edgebnn.exporters.metadata`)."""
    from edgebnn.runtime.session import read_export

    return read_export(path)[1]


def from_torch(model: Any, input_shape: Sequence[int], *, output_index: int = 0, name: str | None = None) -> BNNModel:
    """Import a trained PyTorch BNN into the IR (needs torch).

    Args:
        model: The trained ``torch.nn.Module``: edgebnn, bayesian-torch (reparameterization or flipout,
            hand-written or ``dnn_to_bnn``), torchbnn or blitz layers; plain Linear/Conv2d/BatchNorm layers are
            carried through as deterministic layers.
        input_shape: One example's shape with a leading batch dim, e.g. ``(1, 1, 28, 28)``.
        output_index: Which output to use when ``forward`` returns a tuple such as ``(logits, kl)``.
        name: How errors name the model (default: its class name).

    Returns:
        The IR, one ``GaussianWeight`` per Bayesian weight; lower it with :func:`lower`.

    Raises:
        UnsupportedLayerError: No Bayesian layer, or a layer edgebnn cannot import (named by its path).
        MissingDependencyError: torch is not installed.
    """
    from edgebnn.importers import import_model

    return import_model(model, tuple(input_shape), output_index=output_index, where=name or type(model).__name__)


def lower(model: BNNModel, scheme: str | LowerConfig = "float", *, seed: int | None = None,
          bits: str | int | None = None, **options: Any) -> LoweredModel:
    """Lower an IR with a compression scheme; the lowering report is attached as ``result.lowering_report``.

    Args:
        model: The IR (not modified).
        scheme: ``float``, ``mcq``, ``fixed``, ``codebook``, ``ternary``, ``binary``, ``prune`` or
            ``prune+SCHEME``; or a :class:`edgebnn.passes.LowerConfig` (per-layer overrides; it holds the seed,
            bits and options, so give none of them here).
        seed: Seeds every random choice; the same seed gives the same bytes (default 0).
        bits: ``"auto"`` (default: bits per layer from the posterior variance) or a forced width.
        **options: Scheme options, e.g. ``clusters=16`` for codebook (see :func:`edgebnn.passes.lower`).

    Returns:
        The lowered IR (a ``LoweredModel``, which is a ``BNNModel``): ``.lowering_report`` holds ``scheme``, ``layers``,
        ``total_bytes``, ``float_bnn_bytes``, ``compression_ratio``, ...
    """
    from edgebnn._lowered import LoweredModel
    from edgebnn.passes import lower as run_passes

    result = run_passes(model, scheme, seed=seed, bits=bits, **options)
    return LoweredModel(result.model, result.report)


def export(model: BNNModel | PathLike, path: PathLike, *, samples: int = 16, mode: str = "baked",
           weights: str = "fp32", seed: int = 0, noise: str = "auto", hoist: str | float = "off") -> Path:
    """Export an IR as an ONNX ensemble computing the S-sample predictive (probs, entropy, mutual_info).

    Args:
        model: The IR, or the path of an ``.ebnn``.
        path: The ``.onnx`` to write (atomically).
        samples: Ensemble size S.
        mode: ``baked`` (S samples stored as constants; TensorRT/DLA-safe), ``noise`` (host-drawn noise
            inputs, filled by :class:`Session`), ``shared`` (codebook models) or ``analytic``.
        weights: Baked mode: ``fp32``, ``int8`` or ``int4`` member weights.
        seed: Seed of the baked samples.
        noise: Noise mode variant: ``auto``, ``local`` or ``weight``.
        hoist: ``off``, ``auto`` or a σ threshold below which layers run once (see ``edgebnn export --help``).

    Returns:
        The path written. Run it with ``edgebnn.Session(path).predict(x)``.
    """
    from edgebnn.exporters.ensemble import export_onnx, save_onnx

    ir_model = model if not isinstance(model, (str, os.PathLike)) else load_ir(model)
    return save_onnx(export_onnx(ir_model, samples, mode=mode, seed=seed, noise=noise, weights=weights,
                                 hoist=hoist), path)


def lower_model(model_spec: str, weights: str | Path, input_shape: tuple[int, ...], *,
                scheme: str | LowerConfig = "float", seed: int | None = None, bits: str | int | None = None,
                output_index: int = 0, evaluate: DataSource | None = None, ood_data: DataSource | None = None,
                budget: Budget | str | None = None, samples: int = 16,
                progress: Progress | None = None) -> tuple[BNNModel, dict[str, Any]]:
    """Build, load, import and lower a torch model (``edgebnn lower``); returns (IR, lowering report).

    ``evaluate`` (``digits`` or a data file/folder, see :func:`edgebnn.data.load_data`) adds ``report["eval"]``:
    the lowered model against the float BNN it came from (:func:`lowering_quality`; ``ood_data`` adds the
    MI-AUROC). ``budget`` (a :class:`edgebnn.budget.Budget` or its text) searches per-layer settings that keep
    it on ``evaluate`` (:func:`lower_within_budget`) and adds ``report["budget"]``.

    Raises:
        InvalidOptionError: A budget without ``evaluate``, an ``auroc`` budget without ``ood_data``, bad data.
        BudgetNotMetError: No configuration keeps the budget (carries the closest one); nothing is returned.
    """
    from edgebnn.importers.checkpoint import load_factory, load_weights

    if budget is not None:
        budget = _check_budget(budget, evaluate, ood_data)
    model = load_weights(load_factory(model_spec), weights)
    bnn = from_torch(model, input_shape, output_index=output_index, name=f"{model_spec} ({weights})")
    if budget is not None:
        assert evaluate is not None  # _check_budget
        config = scheme if not isinstance(scheme, str) else _config(scheme, seed, bits)
        lowered = lower_within_budget(bnn, config, budget, data=evaluate, ood_data=ood_data, samples=samples,
                                      progress=progress)
        return lowered, lowered.lowering_report
    lowered = lower(bnn, scheme, seed=seed, bits=bits)
    report = lowered.lowering_report
    if evaluate is not None:
        report["eval"] = lowering_quality(bnn, lowered, data=evaluate, ood_data=ood_data, samples=samples,
                                          seed=report["seed"], progress=progress)
    return lowered, report


def _config(scheme: str, seed: int | None, bits: str | int | None) -> LowerConfig:
    from edgebnn.passes import LowerConfig

    return LowerConfig(scheme=scheme, bits="auto" if bits is None else bits, seed=0 if seed is None else seed)


def _check_budget(budget: Budget | str, evaluate: DataSource | None, ood_data: DataSource | None) -> Budget:
    from edgebnn.budget import Budget

    budget = Budget.parse(budget) if isinstance(budget, str) else budget
    if evaluate is None:
        raise InvalidOptionError(f"--budget {budget}: needs validation data to be measured on: add --eval DATA")
    if budget.needs_ood and ood_data is None:
        raise InvalidOptionError(f"--budget {budget}: auroc is measured against OOD inputs: add --ood-data FILE")
    return budget


def lower_config_of(path: str | Path) -> LowerConfig:
    """The lowering config in a JSON file (a config, or a ``lower --report``), or the one an ``.ebnn``'s manifest
    stores: what replays a lowering exactly.

    Raises:
        InvalidArtifactError: The file is unreadable, or an ``.ebnn`` that stores no config.
        InvalidOptionError: The config is malformed (names the file and the key).
    """
    from edgebnn.passes import LowerConfig
    from edgebnn.passes.config import DATA_OPTIONS

    if Path(path).suffix == ".ebnn":
        manifest = load_ir(path).manifest
        if manifest.lower_config is None:
            raise InvalidArtifactError(f"{path}: stores no lowering config (not written by edgebnn lower)")
        options = [p["options"] for p in manifest.passes if isinstance(p.get("options"), dict)]
        data = sorted({k for o in options for k in DATA_OPTIONS if o.get(k)})
        if data:
            raise InvalidOptionError(f"{path}: was lowered with {', '.join(data)} arrays passed from Python, which "
                                     "the manifest does not store; a config cannot replay it")
        return LowerConfig.from_dict(manifest.lower_config, f"{path}: lower_config")
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError as e:
        raise InvalidArtifactError(f"{path}: no such file") from e
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deeply
        raise InvalidOptionError(f"{path}: not a JSON lowering config ({type(e).__name__})") from e
    except OSError as e:
        raise InvalidArtifactError(f"{path}: cannot read ({e.strerror or e})") from e
    if isinstance(raw, dict) and raw.get("schema") == schemas.LOWER:  # a lower --report: replay its config
        return LowerConfig.from_dict(raw.get("config"), f"{path}: config")
    return LowerConfig.from_dict(raw, str(path))




def lowering_quality(float_ir: BNNModel, lowered: BNNModel, *, data: DataSource = "digits",
                     split: str | None = None, ood_data: DataSource | None = None, samples: int = 16, seed: int = 0,
                     progress: Progress | None = None) -> dict[str, Any]:
    """Accuracy/NLL/ECE/Brier of a lowered IR and of the float BNN it came from (same data, S and seed).

    ``data`` is ``digits`` (split ``split``, default ``val``) or a labelled file or folder; ``ood_data`` (inputs
    only) adds each side's ``ood`` report (:func:`edgebnn.metrics.ood_report`) and ``delta["auroc"]``, the
    change of the mutual-information AUROC.
    """
    from edgebnn.runtime.reference import check_samples

    check_samples(samples)
    dataset, ood = _eval_data(float_ir, data, split, ood_data)
    before, after = _measure([_reference(float_ir, samples, seed), _reference(lowered, samples, seed)], dataset,
                             ood, progress)[0]
    out = {**dataset.describe(), "samples": samples, "seed": seed, "float_bnn": before, "lowered": after,
           "delta": _delta(before, after)}
    if ood is not None:
        out["ood_data"] = ood.name
    return out


def _eval_data(model: BNNModel, data: DataSource, split: str | None,
               ood_data: DataSource | None) -> tuple[Dataset, Dataset | None]:
    """The ``--eval`` data (digits: the validation split) and the ``--ood-data`` inputs, checked for ``model``."""
    dataset = dataset_for(model, data, split=split or ("val" if str(data) == "digits" else None), option="--eval")
    ood = None if ood_data is None else dataset_for(model, ood_data, labels=False, option="--ood-data")
    return dataset, ood


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """``after - before`` of each scalar metric, and of the MI-AUROC (``auroc``) when both have OOD reports."""
    out = {k: after[k] - before[k] for k, v in before.items() if isinstance(v, float)}
    if "ood" in before and "ood" in after:
        out["auroc"] = after["ood"]["auroc_mutual_info"] - before["ood"]["auroc_mutual_info"]
    return out


BUDGET_ROWS = 2000
"""Budget search: candidates are measured on at most this many validation rows (the first ones)."""
BUDGET_STEPS = 40
"""Budget search: at most this many accepted changes (each one measures every layer's next moves)."""
BUDGET_START = "prune+fixed"
"""Budget search without a scheme (``float``): starts here; pruning first lets the σ codes shrink further."""
_TOP_BITS = 8  # falling back, a layer's bits rise to this before the layer goes to float
_RECIPES = {"ternary": "edgebnn.train.vnq (variational network quantization)",
            "binary": "edgebnn.train.ebp (expectation backpropagation)"}


def lower_within_budget(float_ir: BNNModel, config: LowerConfig, budget: Budget | str, *,
                        data: DataSource = "digits", split: str | None = None, ood_data: DataSource | None = None,
                        samples: int = 16, max_rows: int = BUDGET_ROWS, max_steps: int = BUDGET_STEPS,
                        progress: Progress | None = None) -> LoweredModel:
    """Lower with the fewest bytes per layer that keep an uncertainty budget on validation data.

    Starts from ``config`` (``float``: :data:`BUDGET_START`) with each layer at the posterior-variance rule's
    bits, then greedily takes the per-layer change (one bit less, a σ code one bit smaller, ``fixed`` -> ``codebook``,
    ``X`` -> ``prune+X``) that costs the least budget per byte saved and still keeps the budget, measuring
    each candidate with the reference runtime (S ``samples``, the config's seed) on the first ``max_rows``
    rows of ``data``, until no change fits or after ``max_steps`` changes. When the start already breaks the
    budget, layers first get more bits, the variance rule's ``fixed``, or float, best improvement per byte
    first. The chosen per-layer settings are overrides in the returned model's config, which its manifest
    stores (``edgebnn lower --config model.ebnn`` replays it).

    Returns:
        The lowered model; its report has ``eval`` (:func:`lowering_quality` on all of ``data``) and ``budget``:
        ``met``, ``deltas``, ``violations``, ``layers`` (each layer's scheme, bits, bytes and ``reason``),
        ``steps``, ``measured_on``, ``evaluations`` and ``warnings``.

    Raises:
        BudgetNotMetError: No configuration tried keeps the budget; ``.closest`` holds the nearest one's config
            and figures.
        InvalidOptionError: A malformed budget, an ``auroc`` budget without ``ood_data``, bad data.
    """
    from edgebnn.runtime.reference import check_samples

    check_samples(samples)
    budget = _check_budget(budget, data, ood_data)
    dataset, ood = _eval_data(float_ir, data, split, ood_data)
    full_n = dataset.n
    dataset, ood = _head(dataset, max_rows), None if ood is None else _head(ood, max_rows)
    search = _BudgetSearch(float_ir, config, budget, dataset, ood, samples, progress)
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
        "warnings": warnings,
    }
    return lowered


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
                 ood: Dataset | None, samples: int, progress: Progress | None) -> None:
        import dataclasses

        from edgebnn.passes.config import config_fields

        self.float_ir, self.budget, self.dataset, self.ood = float_ir, budget, dataset, ood
        self.samples, self.progress = samples, progress
        if config.scheme == "float":  # no scheme given: the variance rule's bits after pruning (bench/budget.py)
            takes = config_fields("prune")[0] | config_fields("fixed")[0]
            config = dataclasses.replace(config, scheme=BUDGET_START, bits="auto",
                                         options={k: v for k, v in config.options.items() if k in takes})
        self.base = config
        self.reference = _measure([_reference(float_ir, samples, config.seed)], dataset, ood, None)[0][0]
        self.cache: dict[str, tuple[LoweredModel, dict[str, float]]] = {}
        self.evaluations = 0
        self.max_evaluations = 0
        self.steps: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        plans = {w: p for p in config.plan(float_ir) for w in p.weights}
        self.layers: dict[str, list[str]] = {}
        for row in lower(float_ir, config).lowering_report["layers"]:
            self.layers.setdefault(row.get("layer") or row["name"], []).append(row["name"])
        self.start: dict[str, _Setting] = {
            layer: (plans[names[0]].scheme, plans[names[0]].bits, tuple(sorted(plans[names[0]].options.items())))
            for layer, names in self.layers.items()}
        self.current = dict(self.start)
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
            model = lower(self.float_ir, config)
            metrics = _measure([_reference(model, self.samples, config.seed)], self.dataset, self.ood, None)[0][0]
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
                for label, setting in _moves_up(self.current[layer], self.bits_of(model, layer)):
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
                for label, setting in _moves_down(self.current[layer], self.bits_of(model, layer)):
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
            now = {label for label, _ in _moves_down(self.current[layer], self.bits_of(model, layer))}
            refused = [why for (where, label), why in self.blocked.items() if where == layer and label in now]
            reasons = self.reasons[layer] + ([f"kept: {'; '.join(refused)}"] if refused else [])
            rows.append({"layer": layer, "scheme": scheme, "bits": self.bits_of(model, layer), "forced_bits": bits,
                         "options": dict(options),
                         "bytes": sum(int(r["bytes"]) for r in model.lowering_report["layers"] if r["name"] in names),
                         "reason": "; ".join(reasons)})
        return rows


def _valid(setting: _Setting) -> bool:
    from edgebnn.errors import EdgeBNNError
    from edgebnn.passes.config import pass_configs

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


def _moves_down(setting: _Setting, bits: int) -> list[tuple[str, _Setting]]:
    """One layer's smaller settings: a bit less, a σ code a bit smaller, fixed -> codebook, X -> prune+X."""
    from edgebnn.passes.config import PASSES, parse_scheme

    scheme, forced, options = setting
    names, opts = parse_scheme(scheme), dict(options)
    last = names[-1]
    moves = [(f"{bits - 1} bits", _setting(scheme, bits - 1, opts))]
    sigma_bits = opts.get("sigma_bits", getattr(PASSES[last].config_type, "sigma_bits", 0))
    if sigma_bits:
        moves.append((f"{sigma_bits - 1}-bit σ code", _setting(scheme, forced, opts | {"sigma_bits": sigma_bits - 1})))
    if last == "fixed":
        moves.append(("codebook", _setting(scheme.replace("fixed", "codebook"), bits, opts)))
    if "prune" not in names and last not in ("float", "binary"):
        moves.append((f"prune+{scheme}", _setting(f"prune+{scheme}", forced, opts)))
    return [(label, s) for label, s in moves if s != setting and _valid(s)]


def _moves_up(setting: _Setting, bits: int) -> list[tuple[str, _Setting]]:
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
    return [(label, s) for label, s in moves if s != setting and _valid(s)]


def _reference(model: BNNModel, samples: int, seed: int) -> Callable[[np.ndarray], Predictive]:
    from edgebnn.metrics import predictive_from_logits
    from edgebnn.runtime.reference import Reference

    ref = Reference(model)
    return lambda x: predictive_from_logits(ref.logits(x, samples, seed))


class _Sums:
    """One predictor's running metrics over a stream, plus its per-input uncertainties."""

    def __init__(self) -> None:
        from edgebnn.metrics import MetricSums

        self.metrics = MetricSums()
        self.entropy: list[np.ndarray] = []
        self.mutual_info: list[np.ndarray] = []

    def report(self) -> dict[str, float]:
        return self.metrics.report()


def _stream(predictors: Iterable[Callable[[np.ndarray], Predictive]], dataset: Dataset,
            progress: Progress | None, *, labelled: bool = True) -> list[_Sums]:
    """Run every predictor on every batch of ``dataset``; only metric sums and two floats per input are kept."""
    from edgebnn.data import DEFAULT_BATCH

    fns = list(predictors)
    sums = [_Sums() for _ in fns]
    done = 0
    for x, y in dataset.batches(DEFAULT_BATCH):
        for fn, acc in zip(fns, sums, strict=True):
            pred = fn(x)
            if labelled and y is not None:
                acc.metrics.add(pred.probs, y)
            acc.entropy.append(pred.entropy)
            acc.mutual_info.append(pred.mutual_info)
        done += len(x)
        if progress:
            progress(done, dataset.n)
    return sums


def _measure(predictors: Sequence[Callable[[np.ndarray], Predictive]], dataset: Dataset, ood: Dataset | None,
             progress: Progress | None) -> tuple[list[dict[str, Any]], list[_Sums], list[_Sums] | None]:
    """Each predictor's metrics on ``dataset`` (and its ``ood`` report against the ``ood`` inputs), with the sums."""
    import numpy as np

    total = dataset.n + (ood.n if ood else 0)

    def step(offset: int) -> Progress | None:
        return (lambda done, _n: progress(offset + done, total)) if progress else None

    sums = _stream(predictors, dataset, step(0))
    reports: list[dict[str, Any]] = [dict(s.report()) for s in sums]
    if ood is None:
        return reports, sums, None
    from edgebnn.metrics import ood_report

    outs = _stream(predictors, ood, step(dataset.n), labelled=False)
    for report, s, out in zip(reports, sums, outs, strict=True):
        in_mi, ood_mi = np.concatenate(s.mutual_info), np.concatenate(out.mutual_info)
        report["ood"] = {"data": ood.name, "n": ood.n,
                         **ood_report(np.concatenate(s.entropy), in_mi, np.concatenate(out.entropy), ood_mi),
                         "mean_mutual_info_in": float(in_mi.mean()), "mean_mutual_info_ood": float(ood_mi.mean())}
    return reports, sums, outs


def dataset_for(model: BNNModel | Session, data: DataSource, *, split: str | None = None, labels: bool = True,
                option: str = "--data") -> Dataset:
    """Open ``data`` (:func:`edgebnn.data.load_data`) for ``model``: its input shape and class count are checked."""
    from edgebnn.data import load_data
    from edgebnn.ir import BNNModel

    shape: tuple[int, ...]
    classes: int | None
    if isinstance(model, BNNModel):
        shape, classes = tuple(model.manifest.input_shape[1:]), model.manifest.num_classes
    else:
        shape, classes = model.input_shape, model.meta.num_classes
    where = model.where
    # Files are checked against the model's input shape as they are opened (the message names the file).
    want = None if isinstance(data, str) and data == "digits" else shape
    dataset = load_data(data, split=split, input_shape=want, num_classes=classes, labels=labels, option=option)
    if tuple(dataset.input_shape) != tuple(shape):
        raise InvalidOptionError(f"{where}: takes inputs {tuple(shape)}, {dataset.name} has {dataset.input_shape}")
    return dataset


def evaluate_artifact(artifact: BNNModel | Session | PathLike, *, data: DataSource = "digits",
                      split: str | None = None, samples: int = 16, seed: int = 0, ood_data: DataSource | None = None,
                      plot: PathLike | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Accuracy, NLL, ECE (15 bins) and Brier of an IR (reference runtime, S samples) or an exported ensemble.

    Data streams in batches, so a shard folder larger than memory is evaluated in bounded memory.

    Args:
        artifact: An ``.ebnn`` or exported ``.onnx`` path, an IR, or a :class:`Session`.
        data: ``digits``, a labelled ``.npz`` (``x``, ``y``), a folder of shards, or ``(x, y)`` arrays
            (:func:`edgebnn.data.load_data`).
        split: Digits split (default ``test``); digits only.
        samples: S for an IR (an export has S built in).
        seed: Sampling seed for an IR, and of the host-drawn noise of a ``noise`` export.
        ood_data: Out-of-distribution inputs (``x`` only; any labels are ignored). Adds ``ood``:
            ``auroc_mutual_info``, ``auroc_entropy``, ``aupr_mutual_info``, ``fpr_at_95_tpr``
            (:func:`edgebnn.metrics.ood_report`), ``data``, ``n`` and the mean mutual information of each side.
        plot: Write a PNG: reliability diagram, and the mutual-information histogram (in vs OOD).
        progress: Called as ``progress(rows done, rows total)`` after each batch.

    Returns:
        The ``edgebnn.eval/1`` report: ``artifact``, ``runtime``, ``data``, ``split``, ``accuracy``, ``nll``,
        ``ece``, ``brier``, ``samples``, ``n`` (and ``ood``).

    Raises:
        InvalidOptionError: Bad data (named by file and key), inputs of another shape than the model's.
        InvalidArtifactError: A missing or corrupt artifact.
    """
    import numpy as np

    from edgebnn.ir import BNNModel
    from edgebnn.runtime import Session
    from edgebnn.runtime.reference import check_samples

    if isinstance(artifact, (BNNModel, Session)):
        model: BNNModel | Session = artifact
        name = model.where
    elif Path(artifact).suffix == ".onnx":
        model, name = Session(artifact, seed=seed), str(artifact)
    else:
        model, name = load_ir(artifact), str(artifact)
    if isinstance(model, Session):
        predict: Callable[[np.ndarray], Predictive] = model.predict
        samples, runtime = model.samples, f"onnxruntime ({model.mode})"
    else:
        check_samples(samples)
        predict, runtime = _reference(model, samples, seed), "reference"
    dataset = dataset_for(model, data, split=split)
    ood = None if ood_data is None else dataset_for(model, ood_data, split=None, labels=False, option="--ood-data")
    reports, sums, outs = _measure([predict], dataset, ood, progress)
    report: dict[str, Any] = {"artifact": name, "runtime": runtime, **dataset.describe(), **reports[0],
                              "samples": samples}
    report["n"] = dataset.n
    in_mi = np.concatenate(sums[0].mutual_info)
    ood_mi = None if outs is None else np.concatenate(outs[0].mutual_info)
    if plot:
        from edgebnn.plots import plot_evaluation

        plot_evaluation(sums[0].metrics.reliability(), in_mi, ood_mi, plot,
                        title=f"{Path(name).name} on {dataset.name}" + (f" vs {ood.name}" if ood else ""))
    return report


def profile_artifact(artifact: str | Path, *, device: str = "cpu", samples: int = 16, mode: str = "auto",
                     onnx_path: str | None = None, engine: str | None = None, baseline_runner: str = "auto",
                     bench_results: str | None = None, remote: str | None = None, remote_edgebnn: str = "edgebnn",
                     batch: int = 1, runs: int = 200, warmup: int = 20, threads: int = 2,
                     power_meter: str | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Profile an .ebnn's ensemble against its float baselines built from the same IR, on one target.

    The ensemble is ``engine`` (a TensorRT engine, rtx/jetson), ``onnx_path`` (an exported ONNX), or exported
    on the fly in ``mode`` (``auto``: the target's :meth:`~edgebnn.targets.base.Target.default_mode`, reading
    ``bench_results`` on the CPU). ``remote="user@host"`` runs the whole profile on that machine over ssh
    (:mod:`edgebnn.targets.remote`) and returns its report.
    """
    from edgebnn.exporters.ensemble import export_onnx
    from edgebnn.runtime.session import read_export
    from edgebnn.targets.profiler import profile
    from edgebnn.targets.registry import get_target

    model = load_ir(artifact)  # validated here, also before copying it to a remote machine
    if remote:
        from edgebnn.targets.remote import profile_remote

        options = {"device": device, "samples": samples, "mode": None if mode == "auto" else mode,
                   "baseline_runner": baseline_runner, "batch": batch, "runs": runs, "warmup": warmup,
                   "threads": threads, "power_meter": power_meter}
        if progress:
            progress(f"on {remote}")
        return profile_remote(remote, artifact, options, engine=engine, onnx_path=onnx_path,
                              remote_edgebnn=remote_edgebnn)
    ensemble = None
    mode_reason = None
    if engine:
        if onnx_path:
            raise InvalidOptionError("--engine and --onnx: give one (the engine is the ensemble that is profiled)")
    elif onnx_path:
        ensemble, meta, _ = read_export(onnx_path)
        if meta.samples != samples:
            raise InvalidOptionError(f"{onnx_path}: was exported with S={meta.samples}; pass --samples {meta.samples}")
    else:
        if mode == "auto":
            mode, mode_reason = get_target(device).default_mode(samples=samples, batch=batch,
                                                                bench_results=bench_results)
        ensemble = export_onnx(model, samples, mode=mode)
    report = profile(model, ensemble, device=device, samples=samples, engine=engine,
                     baseline_runner=baseline_runner, batch=batch, runs=runs, warmup=warmup,
                     threads=threads, power_meter=power_meter, progress=progress)
    report["mode_reason"] = mode_reason
    return report
