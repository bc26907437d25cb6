"""The workflows behind the CLI, callable from Python: lower, evaluate, profile.

Each returns a plain dict report (JSON-ready); the CLI and the demo print them with
:mod:`edgebnn.tables`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebnn import schemas
from edgebnn.errors import InvalidArtifactError, InvalidOptionError

if TYPE_CHECKING:
    from edgebnn.exporters.metadata import ExportMetadata
    from edgebnn.passes import LowerConfig


def load_ir(path: str | Path) -> Any:
    """Load an .ebnn file (refusing exported .onnx files with a pointer to the right command)."""
    from edgebnn import ir

    if Path(path).suffix == ".onnx":
        raise InvalidArtifactError(f"{path}: this command takes an .ebnn IR file (from edgebnn lower), not an export")
    return ir.load(path)


def export_metadata(path: str | Path) -> ExportMetadata:
    """The validated ``edgebnn.export`` metadata of an exported ONNX file (:mod:`edgebnn.exporters.metadata`)."""
    from edgebnn.runtime.session import read_export

    return read_export(path)[1]


def lower_model(model_spec: str, weights: str | Path, input_shape: tuple[int, ...], *,
                scheme: str | LowerConfig = "float", seed: int | None = None, bits: str | int | None = None,
                output_index: int = 0, evaluate: str | None = None) -> tuple[Any, dict[str, Any]]:
    """Build, load, import and lower a torch model; returns (IR, lowering report).

    ``scheme`` is a scheme string (with ``seed``, default 0, and ``bits``, default auto) or a
    :class:`~edgebnn.passes.LowerConfig` (which holds both). ``evaluate="digits"`` adds ``report["eval"]``:
    the lowered model against the float BNN it came from on the validation split (:func:`lowering_quality`).
    """
    from edgebnn.importers import import_model
    from edgebnn.importers.checkpoint import load_factory, load_weights
    from edgebnn.passes import lower

    model = load_weights(load_factory(model_spec), weights)
    bnn = import_model(model, input_shape, output_index=output_index, where=f"{model_spec} ({weights})")
    res = lower(bnn, scheme, seed=seed, bits=bits)
    if evaluate:
        res.report["eval"] = lowering_quality(bnn, res.model, data=evaluate, seed=res.report["seed"])
    return res.model, res.report


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


def lowering_quality(float_ir: Any, lowered: Any, *, data: str = "digits", split: str = "val", samples: int = 16,
                     seed: int = 0) -> dict[str, Any]:
    """Accuracy/NLL/ECE/Brier of a lowered IR and of the float BNN it came from (same split, S and seed)."""
    from edgebnn.data import digits
    from edgebnn.metrics import classification_report
    from edgebnn.runtime.reference import predict

    if data != "digits":
        raise InvalidOptionError(f"--eval {data}: only 'digits' ships offline")
    x, y = digits().split(split)
    _check_data_shape(lowered.where, tuple(lowered.manifest.input_shape[1:]), x.shape[1:], data)
    before = classification_report(predict(float_ir, x, samples, seed).probs, y)
    after = classification_report(predict(lowered, x, samples, seed).probs, y)
    return {"data": data, "split": split, "samples": samples, "seed": seed, "n": len(y),
            "float_bnn": before, "lowered": after,
            "delta": {k: after[k] - before[k] for k in before}}


def evaluate_artifact(artifact: str | Path, *, data: str = "digits", split: str = "test", samples: int = 16,
                      seed: int = 0) -> dict[str, Any]:
    """Accuracy/NLL/ECE/Brier of an .ebnn (reference runtime, S samples) or an exported .onnx."""
    from edgebnn.data import digits
    from edgebnn.metrics import classification_report

    if data != "digits":
        raise InvalidOptionError(f"--data {data}: only 'digits' ships offline")
    x, y = digits().split(split)
    if Path(artifact).suffix == ".onnx":
        from edgebnn.runtime import Session

        sess = Session(artifact, seed=seed)
        _check_data_shape(artifact, sess.input_shape, x.shape[1:], data)
        probs = sess.predict(x).probs
        samples = sess.samples
        runtime = f"onnxruntime ({sess.mode})"
    else:
        from edgebnn.runtime.reference import predict

        model = load_ir(artifact)
        _check_data_shape(artifact, tuple(model.manifest.input_shape[1:]), x.shape[1:], data)
        probs = predict(model, x, samples, seed).probs
        runtime = "reference"
    return {"artifact": str(artifact), "runtime": runtime, "data": data, "split": split,
            **classification_report(probs, y), "samples": samples, "n": len(y)}


def _check_data_shape(artifact: str | Path, want: tuple[int, ...], got: tuple[int, ...], data: str) -> None:
    if tuple(want) != tuple(got):
        raise InvalidOptionError(f"{artifact}: takes inputs {tuple(want)}, {data} has {tuple(got)}")


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
