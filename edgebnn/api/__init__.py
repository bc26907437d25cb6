"""The Python API, and the workflows behind the CLI: import, lower, export, load, evaluate, profile.

The CLI is a thin layer over these functions (:mod:`edgebnn.cli` parses options and prints tables with
:mod:`edgebnn.tables`); each report is a plain, JSON-ready dict. The package re-exports the public ones:
``edgebnn.from_torch``, ``edgebnn.lower``, ``edgebnn.export``, ``edgebnn.load``, ``edgebnn.save``,
``edgebnn.evaluate``, ``edgebnn.load_data`` (see ``help(edgebnn)``).
"""

from typing import TYPE_CHECKING, Any

from edgebnn.api._evaluate import dataset_for, evaluate_artifact, lowering_quality, profile_artifact
from edgebnn.api._files import PathLike, export_metadata, load_ir, save
from edgebnn.api._lower import calibration_grams, lower_config_of, lower_model
from edgebnn.api._model import export, export_result, from_swag, from_torch, lower
from edgebnn.budget import MINIMIZE
from edgebnn.measure import Progress

if TYPE_CHECKING:
    from edgebnn.budget import BudgetOptions, LatencySpace, fastest_within_budget, lower_within_budget

__all__ = [
    "MINIMIZE",
    "BudgetOptions",
    "LatencySpace",
    "PathLike",
    "Progress",
    "calibration_grams",
    "dataset_for",
    "evaluate_artifact",
    "export",
    "export_metadata",
    "export_result",
    "fastest_within_budget",
    "from_swag",
    "from_torch",
    "load_ir",
    "lower",
    "lower_config_of",
    "lower_model",
    "lower_within_budget",
    "lowering_quality",
    "profile_artifact",
    "save",
]


def __getattr__(name: str) -> Any:
    """The budget's entry points, imported on first use (the command line's options import this package)."""
    if name in ("BudgetOptions", "LatencySpace", "fastest_within_budget", "lower_within_budget"):
        import edgebnn.budget

        value = getattr(edgebnn.budget, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'edgebnn.api' has no attribute {name!r}")
