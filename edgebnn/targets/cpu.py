"""The ``cpu`` target: the host CPU through onnxruntime (or torch).

=================  ===================================================================
runtimes           ``onnxruntime`` (default), ``torch`` (the interpreter of :mod:`.torch_interp`)
ensemble           :class:`~edgebnn.targets.runners.SessionRunner`: onnxruntime, noise of a ``noise`` graph
                   drawn on the host inside every call
baselines          both on onnxruntime (``auto``), or both on torch
default mode       the fastest mode in a benchmark result file when one is given
                   (:func:`fastest_mode_in`), else ``baked``
power meters       ``rapl``
compiled artifacts none: a TensorRT engine runs on rtx or jetson
=================  ===================================================================
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.metadata import ExportMetadata
from edgebnn.targets.base import BASELINES, CompileOptions, Executable, Runtimes, Target, onnx_size
from edgebnn.targets.runners import OrtRunner, Runner, SessionRunner, TorchRunner

MODES = ("baked", "noise", "analytic")
"""Export modes a benchmark result file may rank."""

_CONTEXT_KEYS = ("samples", "batch", "device", "model")


def _bench_records(obj: Any, context: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Mode records at any depth, each carrying the samples/batch/device/model of the objects around it."""
    context = dict(context or {})
    if isinstance(obj, dict):
        context.update({k: obj[k] for k in _CONTEXT_KEYS if k in obj and not isinstance(obj[k], dict | list)})
        if obj.get("mode") in MODES:
            yield {**context, **obj}
        for key, value in obj.items():
            if key in MODES and isinstance(value, dict) and "mode" not in value:
                yield {**context, "mode": key, **value}
            elif isinstance(value, dict | list):
                yield from _bench_records(value, context)
    elif isinstance(obj, list):
        for item in obj:
            yield from _bench_records(item, context)


def _latency(record: dict[str, Any]) -> float | None:
    lat = record.get("latency_ms", record.get("p50_ms", record.get("p50")))
    if isinstance(lat, dict):
        lat = lat.get("p50", lat.get("mean"))
    return float(lat) if isinstance(lat, int | float) and not isinstance(lat, bool) else None


def fastest_mode_in(path: str | Path, *, device: str = "cpu", samples: int | None = None,
                    batch: int | None = None) -> tuple[str, float] | None:
    """The export mode with the lowest latency in a benchmark result file, or None when it has none.

    The file is JSON; every object with a ``mode`` (baked/noise/analytic) and a latency — ``latency_ms``
    as a number or as ``{"p50": ...}`` (an ``edgebnn profile --json`` report qualifies), or ``p50_ms`` — is
    a record, found at any depth; so is ``{"baked": {...}, "noise": {...}}``. A record inherits ``samples``,
    ``batch``, ``device`` and ``model`` from the objects that contain it (``bench/ensemble_latency.py`` writes
    them on the cell); records with a ``device``, ``samples`` or ``batch`` other than asked are skipped.

    Returns:
        ``(mode, p50 ms)`` of the fastest record.

    Raises:
        InvalidOptionError: The file exists but is not JSON.
    """
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidOptionError(f"--bench-results {path}: not a readable JSON file ({e})") from e
    best: tuple[str, float] | None = None
    for rec in _bench_records(data):
        if "device" in rec and str(rec["device"]) != device:
            continue
        if samples is not None and "samples" in rec and rec["samples"] != samples:
            continue
        if batch is not None and "batch" in rec and rec["batch"] != batch:
            continue
        lat = _latency(rec)
        if lat is not None and (best is None or lat < best[1]):
            best = (rec["mode"], lat)
    return best



class CpuTarget(Target):
    """The host CPU (see the module docstring)."""

    kind = "cpu"
    runtimes = ("onnxruntime", "torch")

    def _check(self, meta: ExportMetadata | None, runtime: str, where: str) -> None:
        """onnxruntime and torch run every graph edgebnn exports, noise inputs included."""

    def _compile(self, proto: onnx.ModelProto, path: Path | None, meta: ExportMetadata | None, runtime: str,
                 options: CompileOptions) -> tuple[Runner, int]:
        size = onnx_size(proto, path)
        if runtime == "torch":
            return TorchRunner(proto, threads=options.threads), size
        where = str(path) if path is not None else None  # how a runtime failure names the artifact
        if meta is not None and not meta.is_baseline:  # an ensemble: a noise graph needs its noise drawn per call
            return SessionRunner(proto, threads=options.threads, where=where), size
        return OrtRunner(proto, threads=options.threads, where=where), size

    def _load(self, artifact: Path, samples: int | None) -> Executable:
        raise InvalidOptionError(f"--engine {artifact}: a TensorRT engine runs on rtx or jetson, not the {self.name}")

    def _auto_plan(self) -> dict[str, Runtimes]:
        return dict.fromkeys(BASELINES, "onnxruntime")

    def default_mode(self, *, samples: int | None = None, batch: int | None = None,
                     bench_results: str | Path | None = None) -> tuple[str, str]:
        """The fastest mode measured in ``bench_results`` for this S and batch, else ``baked``.

        Raises:
            InvalidOptionError: The file is not JSON, or holds no measurement of this S and batch.
        """
        if bench_results is None:
            return "baked", "no --bench-results given: baked (no random numbers at run time)"
        path = Path(bench_results)
        found = fastest_mode_in(path, device=self.name, samples=samples, batch=batch)
        if found is None:
            raise InvalidOptionError(f"--bench-results {path}: no CPU mode measurements for S={samples}, "
                                     f"batch {batch} in it")
        return found[0], f"fastest measured mode in {path} ({found[1]:.3g} ms p50)"
