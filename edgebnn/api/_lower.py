"""``edgebnn lower`` as a function: build, load, import and lower a torch model; replay a lowering config."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebnn import schemas
from edgebnn.api._evaluate import Progress, lowering_quality
from edgebnn.api._files import load_ir
from edgebnn.api._model import from_swag, from_torch, lower
from edgebnn.budget import MINIMIZE
from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.exporters import DEFAULT_SAMPLES

if TYPE_CHECKING:
    import numpy as np

    from edgebnn.budget import Budget
    from edgebnn.data import DataSource
    from edgebnn.ir import BNNModel
    from edgebnn.passes import LowerConfig
    from edgebnn.passes.gptq import InputGram

CALIBRATION_INPUTS = 256
QUALITY_LIMITS = {"accuracy": -0.01, "nll": +0.05}
"""The change against the float BNN past which ``lower --eval`` warns: one accuracy point lost, or the NLL up by 0.05
nats (a quarter of the NLL of the demo's float digits CNN; the budgets the docs certify are +0.02-0.05)."""
CERTIFIED_HINT = "--eval DATA --budget nll=+0.02,ece=+0.01"
"""The options of the certified path a quality note points to (docs/uncertainty_budget.md)."""
"""Inputs ``--calibrate`` measures each layer's input second moment on (the first ones of the data)."""


def calibration_grams(model: BNNModel, data: DataSource, *, limit: int = CALIBRATION_INPUTS,
                      split: str | None = None, progress: Progress | None = None) -> dict[str, InputGram]:
    """The input second moments ``fixed`` rounds against (``lower(..., grams=...)``, :mod:`edgebnn.passes.gptq`),
    measured in ``model``'s posterior-mean network on the first ``limit`` inputs of ``data`` (``digits``: the
    train split, which ``--eval`` and the test split do not touch; labels are not read).

    Raises:
        InvalidOptionError: Bad data, inputs of another shape, or ``limit`` < 1.
    """
    from edgebnn.api._evaluate import dataset_for
    from edgebnn.passes.gptq import layer_grams

    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidOptionError(f"--calibrate-inputs {limit!r}: must be a positive integer")
    dataset = dataset_for(model, data, split=split or ("train" if str(data) == "digits" else None), labels=False,
                          option="--calibrate")
    total = min(limit, dataset.n)

    def batches() -> Iterator[np.ndarray]:
        left = total
        for x, _ in dataset.batches(min(32, total)):
            if left <= 0:
                return
            yield x[:left]
            left -= len(x)

    tick = None if progress is None else (lambda done: progress(done, total))
    return layer_grams(model, batches(), progress=tick)


def lower_model(model_spec: str, weights: str | Path, input_shape: tuple[int, ...], *,
                scheme: str | LowerConfig = "float", seed: int | None = None, bits: str | int | None = None,
                output_index: int = 0, evaluate: DataSource | None = None, ood_data: DataSource | None = None,
                budget: Budget | str | None = None, samples: int = DEFAULT_SAMPLES,
                progress: Progress | None = None, mc_dropout: bool = False, swag: str | Path | None = None,
                swag_scale: float = 0.5, laplace: str | Path | None = None, task: str | None = None,
                noise_var: float | None = None, regression_head: str | None = None,
                calibrate: DataSource | None = None, calibrate_inputs: int = CALIBRATION_INPUTS,
                minimize: str = "size") -> tuple[BNNModel, dict[str, Any]]:
    """Build, load, import and lower a torch model (``edgebnn lower``); returns (IR, lowering report).

    ``evaluate`` (``digits`` or a data file/folder, see :func:`edgebnn.data.load_data`) adds ``report["eval"]``:
    the lowered model against the float BNN it came from (:func:`lowering_quality`; ``ood_data`` adds the
    MI-AUROC). ``budget`` (a :class:`edgebnn.budget.Budget` or its text) searches per-layer settings that keep
    it on ``evaluate`` (:func:`lower_within_budget`) and adds ``report["budget"]``. ``mc_dropout``: see
    :func:`from_torch`, as are ``task``, ``noise_var`` and ``regression_head``. A factory returning a list of
    models is a deep ensemble (``weights``: one file, member k's keys prefixed ``k.``; ``samples`` becomes M).
    ``swag``: a SWAG statistics file, imported with :func:`from_swag` at ``swag_scale``. ``laplace``: what
    ``torch.save(la.state_dict(), PATH)`` wrote for a fitted laplace-torch posterior of this network, rebuilt on it
    (:func:`edgebnn.importers.laplace.load_laplace`, loaded with ``weights_only=True``) and imported as
    ``from_torch(la)`` is. ``calibrate``: data whose first ``calibrate_inputs`` inputs ``fixed`` rounds the
    means against (:func:`calibration_grams`; GPTQ, :mod:`edgebnn.passes.gptq`); the report gets
    ``calibration`` {``data``, ``inputs``, ``layers``}. ``minimize="latency"``: the budget search returns the fastest
    export on the cpu instead of the smallest file (:func:`edgebnn.api._fastest.fastest_within_budget`; the report
    adds ``fastest``).

    Raises:
        InvalidOptionError: A budget without ``evaluate``, an ``auroc`` budget without ``ood_data``, bad data.
        BudgetNotMetError: No configuration keeps the budget (carries the closest one); nothing is returned.
    """
    from edgebnn.importers.checkpoint import load_factory, load_weights

    budget = _checked_budget(budget, minimize, evaluate, ood_data)
    from edgebnn.exporters.families import default_samples

    model = load_weights(load_factory(model_spec), weights)
    if laplace is not None:
        from edgebnn.importers.laplace import load_laplace
        from edgebnn.tasks import option_task

        extra = [o for o, on in (("--swag", swag is not None), ("--mc-dropout", mc_dropout),
                                 ("--task", task is not None and not option_task(task).softmax_classifier)) if on]
        if extra:
            raise InvalidOptionError(f"--laplace: the posterior is the Laplace state (a classifier's); drop "
                                     f"{', '.join(extra)}")
        where = f"{model_spec} ({weights})"
        la = load_laplace(model, str(laplace), tuple(input_shape), where=where)
        bnn = from_torch(la, input_shape, name=f"{model_spec} ({weights}, {laplace})")
    elif swag is not None:
        if mc_dropout:
            raise InvalidOptionError("--swag: SWAG's posterior is its statistics; drop --mc-dropout")
        bnn = from_swag(model, swag, input_shape, scale=swag_scale, output_index=output_index,
                        name=f"{model_spec} ({weights}, {swag})")
    else:
        bnn = from_torch(model, input_shape, output_index=output_index, name=f"{model_spec} ({weights})",
                         mc_dropout=mc_dropout, task=task, noise_var=noise_var, regression_head=regression_head)
    samples = default_samples(bnn, samples)  # a deep ensemble is evaluated on its M members
    if calibrate is not None and budget is None:
        from edgebnn.passes.config import data_fields, refuse_uncalibratable

        config = scheme if not isinstance(scheme, str) else _config(scheme, seed, bits)
        if "grams" not in data_fields(config):
            raise InvalidOptionError(f"--calibrate: rounds the means of fixed-point layers against data; --scheme "
                                     f"{config.scheme} lowers none (use --scheme fixed, or an override to fixed)")
        refuse_uncalibratable(config, bnn)
    grams = (None if calibrate is None else
             calibration_grams(bnn, calibrate, limit=calibrate_inputs, progress=progress))
    seen, option = (evaluate, "--eval") if evaluate is not None else (calibrate, "--calibrate")
    if seen is not None:  # what eval later checks inputs against (another scale is refused); lowering keeps it
        bnn.manifest.input_range = _input_range(bnn, seen, "val" if evaluate is not None else "train", option)
    data_options: dict[str, Any] = {} if grams is None else {"grams": grams}
    if budget is not None:
        from edgebnn.budget import BudgetOptions, fastest_within_budget, lower_within_budget

        assert evaluate is not None  # check_budget
        config = scheme if not isinstance(scheme, str) else _config(scheme, seed, bits)
        if minimize == "latency":
            lowered = fastest_within_budget(bnn, config, budget, data=evaluate, ood_data=ood_data, samples=samples,
                                            progress=progress, **data_options)
        else:
            lowered = lower_within_budget(bnn, config, budget, data=evaluate, ood_data=ood_data,
                                          options=BudgetOptions(samples=samples), progress=progress, **data_options)
        report = lowered.lowering_report
    else:  # the float model is only needed again to compare against: otherwise lower it in place
        lowered = lower(bnn, scheme, seed=seed, bits=bits, progress=progress, consume=evaluate is None,
                        **data_options)
        report = lowered.lowering_report
    if grams is not None:
        inputs = max((g.inputs for g in grams.values()), default=0)
        report["calibration"] = {"data": str(calibrate), "inputs": inputs, "layers": sorted(grams)}
    if budget is not None:
        return lowered, report
    if evaluate is not None:
        report["eval"] = lowering_quality(bnn, lowered, data=evaluate, ood_data=ood_data, samples=samples,
                                          seed=report["seed"], progress=progress)
    report["quality_notes"] = quality_notes(report)
    return lowered, report


def quality_notes(report: dict[str, Any]) -> list[str]:
    """What a lowering report says of the lowering's effect on accuracy and calibration, one line each: nothing for
    a float lowering (the posterior's numbers are kept) or one within :data:`QUALITY_LIMITS` of the float BNN on the
    ``eval`` rows; "unmeasured" where there were no rows; each change past its limit otherwise. Every line names the
    certified path (``--eval DATA --budget ...``)."""
    config = report.get("config") or {}
    if config.get("scheme", report.get("scheme")) == "float" and not config.get("overrides"):
        return []
    ev = report.get("eval")
    if ev is None:
        return [f"the {report['scheme']} lowering's effect on accuracy and calibration is unmeasured (no data): "
                f"measure it, and certify a budget, with lower ... {CERTIFIED_HINT}"]
    notes = []
    for key, limit in QUALITY_LIMITS.items():
        before, after = ev["float_bnn"].get(key), ev["lowered"].get(key)
        if before is None or after is None:
            continue
        change = after - before
        if change < limit if limit < 0 else change > limit:
            notes.append(f"{key} {change:+.4f} against the float BNN on {ev['data']} (past {limit:+g}): the "
                         f"{report['scheme']} lowering loses quality; keep it within a budget with lower ... "
                         f"{CERTIFIED_HINT}")
    return notes


def _checked_budget(budget: Budget | str | None, minimize: str, evaluate: DataSource | None,
                    ood_data: DataSource | None) -> Budget | None:
    """The budget, checked against the data (``--minimize latency``: with a metric that sees epistemic uncertainty,
    :func:`edgebnn.budget.epistemic_budget`)."""
    from edgebnn.budget import Budget, check_budget, epistemic_budget

    if minimize not in MINIMIZE:
        raise InvalidOptionError(f"--minimize {minimize}: one of {', '.join(MINIMIZE)}")
    if minimize != "size" and budget is None:
        raise InvalidOptionError(f"--minimize {minimize}: minimizes within an uncertainty budget; add --budget "
                                 "METRIC=CHANGE,... and --eval DATA")
    if budget is None:
        return None
    if minimize == "latency":
        budget = epistemic_budget(Budget.parse(budget) if isinstance(budget, str) else budget, ood_data)[0]
    return check_budget(budget, evaluate, ood_data)


def _input_range(model: BNNModel, data: DataSource, digits_split: str, option: str) -> list[float]:
    """[min, max] over the inputs of ``data`` (digits: the split lowering used), streamed."""
    from edgebnn.api._evaluate import dataset_for

    dataset = dataset_for(model, data, split=digits_split if str(data) == "digits" else None, labels=False,
                          option=option)
    lo, hi = float("inf"), float("-inf")
    for x, _ in dataset.batches():
        lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
    return [lo, hi]


def _config(scheme: str, seed: int | None, bits: str | int | None) -> LowerConfig:
    from edgebnn.passes import LowerConfig

    return LowerConfig(scheme=scheme, bits="auto" if bits is None else bits, seed=0 if seed is None else seed)


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
