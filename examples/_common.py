"""Helpers shared by the recipe examples: evaluate a torch BNN or an exported ONNX ensemble, print JSON."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

S = 16


def metrics(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """accuracy, nll, ece rounded for the JSON line."""
    from edgebnn.metrics import classification_report

    report = classification_report(probs, y)
    return {k: round(report[k], 4) for k in ("accuracy", "nll", "ece")}


def exported(ir: Any, x: np.ndarray, y: np.ndarray, *, seed: int = 0, samples: int = S) -> dict[str, Any]:
    """Export the baked ``samples``-member ONNX ensemble, run it with onnxruntime, report metrics and sizes."""
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.runtime.session import Session

    proto = export_model(ir, ExportConfig(samples, mode="baked", seed=seed)).proto
    probs = Session(proto).predict(x).probs
    return {**metrics(probs, y), "bytes": int(ir.nbytes()), "onnx_bytes": len(proto.SerializeToString())}


def emit(line: dict[str, Any]) -> None:
    """Print the result as the last JSON line on stdout."""
    print(json.dumps(line), flush=True)


def deterministic(ir: Any, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Metrics of the lowered model's mean network (every weight at its decoded mean), one pass."""
    import onnxruntime as ort

    from edgebnn.metrics import log_softmax

    sess = ort.InferenceSession(ir.float_model().SerializeToString(), providers=["CPUExecutionProvider"])
    logits = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    return metrics(np.exp(log_softmax(logits)), y)
