"""edgebnn: a deployment compiler for Bayesian neural networks.

A trained BNN goes in (edgebnn, bayesian-torch, torchbnn or blitz layers); out comes an ONNX model or
TensorRT engine that computes the whole S-sample predictive distribution on the device.

    import ──> IR (.ebnn) ──lowering passes──> IR (encoded weights) ──export──> ONNX / TensorRT

The workflow in Python (each step has an ``edgebnn`` command that does the same)::

    import edgebnn

    ir = edgebnn.from_torch(model, (1, 1, 28, 28))          # a trained torch BNN -> IR    (edgebnn lower)
    # also: from_torch([m1, ..., mM], shape) for a deep ensemble; from_swag(model, stats, shape) for SWAG
    small = edgebnn.lower(ir, "fixed")                       # compress; small.lowering_report
    edgebnn.save(small, "model.ebnn")                        # the .ebnn file               (edgebnn inspect)
    edgebnn.export(small, "model.onnx", samples=16)          # the S-sample ensemble        (edgebnn export)
    report = edgebnn.evaluate("model.onnx", data="test.npz", ood_data="ood.npz")   # (edgebnn eval)
    pred = edgebnn.Session("model.onnx").predict(x)          # probs, entropy, mutual_info per input

Data (``data=``, ``--data``) is ``"digits"`` (the built-in set), an ``.npz`` with ``x`` (N, ...) float32
inputs and ``y`` (N,) integer labels, a folder of ``.npy``/``.npz`` shards (streamed in batches), or
``(x, y)`` arrays: see :func:`load_data`. Errors a user can cause raise :class:`EdgeBNNError` subclasses
whose message names the file, key, layer or option at fault.

Importing ``edgebnn`` is light: torch is imported by :func:`from_torch` only, onnxruntime by
:class:`Session` (resolved on first use) and the functions that run models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgebnn._version import __version__
from edgebnn.api import evaluate_artifact as evaluate
from edgebnn.api import export, from_swag, from_torch, load_ir, lower, save
from edgebnn.errors import EdgeBNNError
from edgebnn.registry import REGISTRY as _REGISTRY

if TYPE_CHECKING:
    from edgebnn.data import Dataset, load_data
    from edgebnn.runtime import Session

__all__ = [
    "Dataset",
    "EdgeBNNError",
    "Session",
    "__version__",
    "evaluate",
    "export",
    "from_swag",
    "from_torch",
    "load",
    "load_data",
    "lower",
    "save",
]

load = load_ir

_LAZY = ("Dataset", "Session", "load_data")


def __getattr__(name: str) -> Any:
    """``Session``, ``load_data`` and ``Dataset`` are imported on first use (they need numpy/onnxruntime)."""
    value: Any
    if name == "Session":
        from edgebnn.runtime import Session

        value = Session
    elif name in ("load_data", "Dataset"):
        from edgebnn import data

        value = getattr(data, name)
    else:
        raise AttributeError(f"module 'edgebnn' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _load_plugins() -> None:
    """The registry's loader hook: the plug-in loader (:func:`edgebnn.plugins.load_sources`), imported on the first
    lookup that misses. The package root installs it because it sits above every unit and runs before any of them:
    the units below the loader never name it, and ``import edgebnn`` stays light."""
    from edgebnn.plugins import load_sources

    load_sources()


_REGISTRY.set_loader(_load_plugins)
