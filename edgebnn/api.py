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


def from_torch(model: Any, input_shape: Sequence[int], *, output_index: int = 0, name: str | None = None,
               mc_dropout: bool = False) -> BNNModel:
    """Import a trained PyTorch BNN into the IR (needs torch).

    Args:
        model: The trained ``torch.nn.Module``: edgebnn, bayesian-torch (reparameterization or flipout,
            hand-written or ``dnn_to_bnn``), torchbnn or blitz layers; plain Linear/Conv2d/BatchNorm layers are
            carried through as deterministic layers.
        input_shape: One example's shape with a leading batch dim, e.g. ``(1, 1, 28, 28)``.
        output_index: Which output to use when ``forward`` returns a tuple such as ``(logits, kl)``.
        name: How errors name the model (default: its class name).
        mc_dropout: MC dropout (Gal & Ghahramani): keep the model's ``nn.Dropout``/``Dropout1d/2d/3d`` on at
            prediction, each a ``DropoutMask`` posterior on its input (a plain torch model needs nothing else).

    Returns:
        The IR, one ``GaussianWeight`` per Bayesian weight (and one ``DropoutMask`` per dropout layer with
        ``mc_dropout``); lower it with :func:`lower`.

    Raises:
        UnsupportedLayerError: No Bayesian layer (nor dropout, with ``mc_dropout``), a layer edgebnn cannot
            import, or dropout called outside an ``nn.Dropout*`` module with ``mc_dropout`` (named by its path).
        MissingDependencyError: torch is not installed.
    """
    from edgebnn.importers import import_model

    return import_model(model, tuple(input_shape), output_index=output_index, where=name or type(model).__name__,
                        mc_dropout=mc_dropout)


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
                output_index: int = 0,
                evaluate: DataSource | None = None, mc_dropout: bool = False) -> tuple[BNNModel, dict[str, Any]]:
    """Build, load, import and lower a torch model (``edgebnn lower``); returns (IR, lowering report).

    ``evaluate`` (``digits`` or a data file/folder, see :func:`edgebnn.data.load_data`) adds ``report["eval"]``:
    the lowered model against the float BNN it came from (:func:`lowering_quality`). ``mc_dropout``: see
    :func:`from_torch`.
    """
    from edgebnn.importers.checkpoint import load_factory, load_weights

    model = load_weights(load_factory(model_spec), weights)
    bnn = from_torch(model, input_shape, output_index=output_index, name=f"{model_spec} ({weights})",
                     mc_dropout=mc_dropout)
    lowered = lower(bnn, scheme, seed=seed, bits=bits)
    report = lowered.lowering_report
    if evaluate is not None:
        report["eval"] = lowering_quality(bnn, lowered, data=evaluate, seed=report["seed"])
    return lowered, report


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
                     split: str | None = None, samples: int = 16, seed: int = 0,
                     progress: Progress | None = None) -> dict[str, Any]:
    """Accuracy/NLL/ECE/Brier of a lowered IR and of the float BNN it came from (same data, S and seed).

    ``data`` is ``digits`` (split ``split``, default ``val``) or a labelled file or folder.
    """
    from edgebnn.runtime.reference import check_samples

    check_samples(samples)
    dataset = dataset_for(lowered, data, split=split or ("val" if str(data) == "digits" else None), option="--eval")
    before, after = _stream([_reference(float_ir, samples, seed), _reference(lowered, samples, seed)], dataset,
                            progress)
    b, a = before.report(), after.report()
    return {**dataset.describe(), "samples": samples, "seed": seed, "float_bnn": b, "lowered": a,
            "delta": {k: a[k] - b[k] for k in b}}


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
    total = dataset.n + (ood.n if ood else 0)

    def step(offset: int) -> Progress | None:
        return (lambda done, _n: progress(offset + done, total)) if progress else None

    sums = _stream([predict], dataset, step(0))[0]
    report: dict[str, Any] = {"artifact": name, "runtime": runtime, **dataset.describe(), **sums.report(),
                              "samples": samples}
    report["n"] = dataset.n
    in_mi = np.concatenate(sums.mutual_info)
    ood_mi = None
    if ood is not None:
        from edgebnn.metrics import ood_report

        out = _stream([predict], ood, step(dataset.n), labelled=False)[0]
        ood_mi = np.concatenate(out.mutual_info)
        report["ood"] = {"data": ood.name, "n": ood.n,
                         **ood_report(np.concatenate(sums.entropy), in_mi, np.concatenate(out.entropy), ood_mi),
                         "mean_mutual_info_in": float(in_mi.mean()), "mean_mutual_info_ood": float(ood_mi.mean())}
    if plot:
        from edgebnn.plots import plot_evaluation

        plot_evaluation(sums.metrics.reliability(), in_mi, ood_mi, plot,
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
