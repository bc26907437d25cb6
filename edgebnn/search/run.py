"""The search loop: validate, open the study, measure the float BNN once, then ask → run → tell in batches.

Each batch is up to ``population`` trials (one NSGA-II generation when none fails): every config of the batch
is asked first (:func:`edgebnn.search.study.trial_sampler`), the batch runs on the executor in parallel, and
the results are told in trial-number order. So which configs are proposed never depends on the executor, the
number of workers or the order in which trials finish.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgebnn import schemas
from edgebnn._version import __version__
from edgebnn.budget import DEFAULT_CONFIDENCE, BudgetNotMetError, check_confidence
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import DEFAULT_SAMPLES
from edgebnn.exporters.forms import DEVICE_FORMATS
from edgebnn.search.certify import certify_best, rows_spec
from edgebnn.search.executors import LocalExecutor, RayExecutor
from edgebnn.search.objectives import (
    DEFAULT_OBJECTIVES,
    TRIAL_METRICS,
    Objective,
    choose_best,
    for_task,
    parse_budget,
    parse_objectives,
)
from edgebnn.search.space import SearchSpace, TrialConfig, family_space
from edgebnn.search.study import (
    BASELINE_KEY,
    CONFIG_KEY,
    RESULT_KEY,
    file_digest,
    import_optuna,
    open_study,
    trial_sampler,
)
from edgebnn.search.trial import TrialJob, data_split, trial_export_config
from edgebnn.targets.registry import get_target

SCHEMA = schemas.SEARCH
DEFAULT_POPULATION = 6
"""NSGA-II population (and parallel batch). With 24 trials, 4 generations of 6 found a >= 16x digits artifact within
nll=+0.05,ece=+0.01 for 8 of 8 seeds, 3 generations of 8 (or 2 of 12) for 4 of 8 (docs/search.md)."""
Progress = Callable[[int, int, dict[str, Any]], None]
"""Called as ``progress(trials done, trials wanted, the result just told)``."""


@dataclass(frozen=True)
class SearchSettings:
    """What one search explores and measures.

    Attributes:
        model: The float BNN as an ``.ebnn`` IR.
        data: Labelled search data: ``digits`` (its ``val`` split), an ``.npz`` or a shard folder.
        ood_data: Out-of-distribution inputs (adds ``auroc`` to the metrics), or None.
        device: Device profile every trial is profiled on (``cpu``, ``rtx``, ``jetson-orin-nano``, ...).
        trials: How many trials the study should hold when the search ends.
        objectives: Names from :data:`edgebnn.search.objectives.OBJECTIVES`.
        budget: ``--budget`` text (``nll=+0.05,ece=+0.01``), relative to the float BNN.
        space: The choices of each axis.
        seed: Seeds the sampler, the lowering, the baked samples and the host noise.
        population: NSGA-II population size, also the batch run in parallel.
        baseline_samples: S of the float BNN the budget is relative to (reference runtime, same data and seed).
        runs, warmup: Timed and untimed runs of each trial's profile (0 runs: no profile).
        threads: onnxruntime threads per trial.
        confidence: With a budget, the probability that ``best`` keeps it on new data
            (:mod:`edgebnn.search.certify`).
    """

    model: str
    data: str
    ood_data: str | None = None
    device: str = "cpu"
    trials: int = 24
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES
    budget: str | None = None
    space: SearchSpace = field(default_factory=SearchSpace)
    seed: int = 0
    population: int = DEFAULT_POPULATION
    baseline_samples: int = DEFAULT_SAMPLES
    runs: int = 20
    warmup: int = 3
    threads: int = 1
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def rows(self) -> tuple[float, int, int] | None:
        """The rows every trial is measured on: with a budget, the selection rows (:mod:`edgebnn.search.certify`)."""
        return rows_spec(parse_budget(self.budget, ood=True), self.seed)

    def study_settings(self) -> dict[str, Any]:
        """The settings that decide which trials a study holds (stored in it; a resume must match them)."""
        rows = self.rows
        return {"model_sha256": file_digest(self.model), "data": self.data, "ood_data": self.ood_data,
                "device": self.device, "objectives": list(self.objectives), "space": self.space.to_dict(),
                "seed": self.seed, "population": self.population, "baseline_samples": self.baseline_samples,
                "bytes": "deployed",  # search/1 studies measured IR bytes: not resumed with deployed ones
                **({"rows": list(rows)} if rows else {})}  # a budgeted search measures trials on its selection rows


def device_formats(device: str) -> tuple[str, ...]:
    """The member weight formats ``device`` (a device profile name or alias) runs."""
    return DEVICE_FORMATS[get_target(device).name][1]


def validate(settings: SearchSettings) -> tuple[tuple[Objective, ...], dict[str, float], SearchSpace]:
    """Check every input before anything is written: model, data, device, objectives, budget, counts; returns the
    objectives, the budget and the space searched (a posterior family's: :func:`edgebnn.search.space.family_space`).

    Raises:
        InvalidOptionError, InvalidArtifactError: One line naming the option or file at fault.
    """
    from edgebnn.api import dataset_for, load_ir

    if settings.trials < 1:
        raise InvalidOptionError(f"--trials {settings.trials}: must be at least 1")
    if settings.population < 2:
        raise InvalidOptionError(f"--population {settings.population}: NSGA-II needs at least 2")
    if settings.runs < 0 or settings.warmup < 0 or settings.threads < 0:
        raise InvalidOptionError("--runs/--warmup/--threads: must not be negative")
    objectives = parse_objectives(settings.objectives, ood=settings.ood_data is not None)
    budget = parse_budget(settings.budget, ood=settings.ood_data is not None)
    check_confidence(settings.confidence)
    if settings.runs == 0 and any(not o.deterministic for o in objectives):
        raise InvalidOptionError("--runs 0 measures no latency or energy: drop them from --objectives")
    device = get_target(settings.device).name
    formats = device_formats(device)
    bad = [w for w in settings.space.weights if w not in formats and w != "ir"]  # ir: the lowered codes, anywhere
    if bad:
        raise InvalidOptionError(f"--weights {','.join(bad)}: {device} ({DEVICE_FORMATS[device][0]}) takes "
                                 f"{' or '.join(formats)}; search with --weights {','.join(formats)}")
    model = load_ir(settings.model)
    if model.manifest.scheme != "float":  # its trials would lower it again and call it the float BNN
        raise InvalidOptionError(
            f"{settings.model}: is already lowered ({model.manifest.scheme}); search lowers the float BNN itself and "
            "measures every trial against it: give the .ebnn edgebnn lower writes without --scheme/--budget")
    # a family: what varies for it (weights left at the device's formats gain its own codes); an axis meaningless
    # for it refused
    space = family_space(settings.space, model, default_weights=formats)
    dataset_for(model, settings.data, split=data_split(settings.data))
    if settings.ood_data is not None:
        dataset_for(model, settings.ood_data, labels=False, option="--ood-data")
    objectives = for_task(model.manifest.task_spec(model.where).name, objectives, budget,
                          defaulted=tuple(settings.objectives) == DEFAULT_OBJECTIVES,
                          ood=settings.ood_data is not None)
    return objectives, budget, space


def _baseline(settings: SearchSettings) -> dict[str, Any]:
    """The float BNN on the search data (``baseline_samples`` (a deep ensemble: its M), the search seed): the
    reference runtime, or with a budget its default export in onnxruntime on the selection rows (what the
    certification compares the trials' exports with, :mod:`edgebnn.search.certify`)."""
    from edgebnn.api import evaluate_artifact, load_ir
    from edgebnn.budget import default_export
    from edgebnn.errors import EdgeBNNError
    from edgebnn.exporters.families import default_samples
    from edgebnn.passes import float_bnn_bytes
    from edgebnn.runtime import Session
    from edgebnn.search.trial import open_inputs

    model = load_ir(settings.model)
    samples = default_samples(model, settings.baseline_samples)
    _, data, ood = open_inputs(str(settings.model), str(settings.data),
                               None if settings.ood_data is None else str(settings.ood_data), settings.rows)
    artifact: Any = model
    if settings.rows is not None:
        try:
            artifact = Session(default_export(model, samples, settings.seed)[0], seed=settings.seed,
                               threads=settings.threads)
        except EdgeBNNError:  # a float BNN the default export refuses: the reference runtime
            artifact = model
    ev = evaluate_artifact(artifact, data=data, samples=None if artifact is not model else samples,
                           seed=settings.seed, ood_data=ood)
    metrics = {k: ev[k] for k in TRIAL_METRICS if k in ev}
    if "ood" in ev:
        metrics["auroc"] = ev["ood"]["auroc_mutual_info"]
    return {"scheme": "float", "runtime": ev["runtime"], "samples": samples, "n": ev["n"],
            "bytes": float_bnn_bytes(model), "metrics": metrics}


def _job(settings: SearchSettings, number: int, config: TrialConfig) -> TrialJob:
    return TrialJob(number=number, config=config, model=str(settings.model), data=str(settings.data),
                    ood_data=None if settings.ood_data is None else str(settings.ood_data), seed=settings.seed,
                    device=get_target(settings.device).name, runs=settings.runs, warmup=settings.warmup,
                    threads=settings.threads, rows=settings.rows)


def run_search(settings: SearchSettings, study_path: str | Path, executor: LocalExecutor | RayExecutor,
               *, progress: Progress | None = None) -> dict[str, Any]:
    """Run (or continue) a search until the study holds ``settings.trials`` trials; return the report.

    Trials an interrupted run left unfinished are run again first (with the configs they were asked with).

    Returns:
        The ``edgebnn.search/2`` report (without ``schema``): ``trials`` (each ``number``, ``state``,
        ``config``, ``metrics``, ``bytes`` (the deployed ONNX file), ``artifact_bytes`` (the same), ``ir_bytes``,
        ``deployed`` (its breakdown), ``latency_ms``, ``energy_mj``, ``error``),
        ``pareto`` (the non-dominated completed trials), ``best`` and ``best_reason``, ``closest`` (when no
        trial is within the budget), ``baseline`` (the float BNN), ``objectives``, ``budget``, ``settings``.

    Raises:
        InvalidOptionError, InvalidArtifactError: Bad inputs (checked before the study file is touched).
    """
    import dataclasses

    objectives, budget, space = validate(settings)
    settings = dataclasses.replace(settings, space=space)
    import_optuna()  # a missing optuna is reported before a Ray cluster is joined
    with executor:  # started (a Ray cluster joined) before the study file is touched
        # The workers import and open the inputs while this process measures the baseline.
        executor.warm_up(str(settings.model), str(settings.data),
                         None if settings.ood_data is None else str(settings.ood_data), settings.population,
                         settings.rows)
        study = open_study(study_path, settings.study_settings(),
                           ["maximize" if o.maximize else "minimize" for o in objectives])
        baseline = study.user_attrs.get(BASELINE_KEY)
        if baseline is None:
            baseline = _baseline(settings)
            study.set_user_attr(BASELINE_KEY, baseline)
        _run_trials(study, settings, objectives, executor, progress)
    return build_report(study, settings, objectives, budget, baseline, executor.describe())


def _run_trials(study: Any, settings: SearchSettings, objectives: tuple[Objective, ...],
                executor: LocalExecutor | RayExecutor, progress: Progress | None) -> None:
    """Finish the trials an interrupted run left running, then ask → run → tell batches up to ``trials``."""
    optuna = import_optuna()
    running = optuna.trial.TrialState.RUNNING

    def tell(trial: Any, result: dict[str, Any]) -> None:
        measured = [o.value(result) for o in objectives]
        values = [v for v in measured if v is not None and math.isfinite(v)]
        if result["state"] == "complete" and len(values) < len(objectives):
            missing = [o.name for o, v in zip(objectives, measured, strict=True) if v is None or not math.isfinite(v)]
            result = {**result, "state": "failed",
                      "error": result.get("profile_error") or f"objective(s) {', '.join(missing)} not measured"}
        trial.set_user_attr(RESULT_KEY, result)
        if result["state"] != "complete":
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, values)
        if progress:
            progress(len([t for t in study.get_trials(deepcopy=False) if t.state != running]), settings.trials,
                     result)

    def run_batch(batch: list[tuple[Any, TrialConfig]]) -> None:
        jobs = [_job(settings, trial.number, config) for trial, config in batch]
        for (trial, _), result in zip(batch, executor.map(jobs), strict=True):
            tell(trial, result)

    stale = [t for t in study.get_trials(deepcopy=False) if t.state == running]
    resumed = []
    for frozen in stale:
        trial = optuna.Trial(study, frozen._trial_id)
        if CONFIG_KEY in frozen.user_attrs:
            resumed.append((trial, TrialConfig.from_dict(frozen.user_attrs[CONFIG_KEY])))
        else:  # killed between ask and storing its config
            trial.set_user_attr(RESULT_KEY, {"number": frozen.number, "state": "failed", "config": None,
                                             "error": "interrupted before its config was stored"})
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    for start in range(0, len(resumed), settings.population):
        run_batch(resumed[start:start + settings.population])
    while (count := len(study.trials)) < settings.trials:
        batch = []
        for number in range(count, min(count + settings.population, settings.trials)):
            study.sampler = trial_sampler(settings.seed, number, settings.population)
            trial = study.ask()
            config = settings.space.suggest(trial)
            trial.set_user_attr(CONFIG_KEY, config.to_dict())
            batch.append((trial, config))
        run_batch(batch)


def build_report(study: Any, settings: SearchSettings, objectives: tuple[Objective, ...],
                 budget: dict[str, float], baseline: dict[str, Any], executor: str) -> dict[str, Any]:
    """The report of a study (see :func:`run_search`)."""
    trials = []
    for t in study.get_trials(deepcopy=False):
        result = t.user_attrs.get(RESULT_KEY) or {"number": t.number, "state": t.state.name.lower(),
                                                  "config": t.user_attrs.get(CONFIG_KEY), "error": None}
        trials.append(result)
    by_number = {t["number"]: t for t in trials}
    complete = [t for t in trials if t["state"] == "complete"]
    pareto = [by_number[t.number] for t in study.best_trials] if complete else []
    certification = None
    if budget:  # certified on the rows no trial was measured on
        chosen = certify_best(settings, trials, baseline, budget)
        best, reason, closest, certification = (chosen["best"], chosen["best_reason"], chosen["closest"],
                                                chosen["certification"])
    else:
        best, reason, closest = choose_best(trials, baseline["metrics"], budget)
    return {
        "edgebnn_version": __version__,
        "settings": {"model": str(settings.model), "data": str(settings.data), "ood_data": settings.ood_data,
                     "device": settings.device, "trials": settings.trials, "seed": settings.seed,
                     "population": settings.population, "space": settings.space.to_dict(),
                     "runs": settings.runs, "executor": executor},
        "objectives": [{"name": o.name, "direction": "maximize" if o.maximize else "minimize"} for o in objectives],
        "budget": budget,
        "baseline": baseline,
        "trials": trials,
        "pareto": sorted(pareto, key=lambda t: t["number"]),
        "best": best,
        "best_reason": reason,
        "closest": closest,
        "certification": certification,
    }


def export_best(report: dict[str, Any], path: str | Path) -> Path:
    """Write the ``best`` trial's artifact (lowered and exported again as :func:`~edgebnn.search.trial.trial_export`
    exported it for its measurement and certificate: the same config gives the same graph; a sampling mode's noise
    comes from the host, ``Session`` fills it).

    Raises:
        BudgetNotMetError: The report has no best trial.
    """
    from edgebnn.api import export, load_ir, lower

    best = report["best"]
    if best is None:
        raise BudgetNotMetError(f"--export-best {path}: nothing written: {report['best_reason']}",
                                report.get("closest") or {})
    c = TrialConfig.from_dict(best["config"])
    seed = report["settings"]["seed"]
    lowered = lower(load_ir(report["settings"]["model"]), c.scheme, seed=seed, bits=c.bits_value, **c.options)
    return export(lowered, path, trial_export_config(lowered, c, seed, get_target(report["settings"]["device"]).name))
