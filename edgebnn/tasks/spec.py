"""What a network's output is: the task named in the IR manifest and the export metadata.

A :class:`Task` says how S member outputs reduce to a predictive (the reductions: :mod:`edgebnn.tasks`' heads in
the graph, :func:`edgebnn.tasks.predictive_from_samples` in numpy):

    classification  logits [N, K]        probs, entropy, mutual_info
    segmentation    logits [N, C, *sp]   the same per pixel: probs [N, C, *sp], entropy/mutual_info [N, *sp]
    regression      [N, D] means (a stated noise variance σ², or none) or [N, 2D] means and log-variances:
                    mean, variance, aleatoric, epistemic [N, D]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgebnn.errors import InvalidArtifactError

CLASSIFICATION, REGRESSION, SEGMENTATION = "classification", "regression", "segmentation"
TASKS = (CLASSIFICATION, REGRESSION, SEGMENTATION)
TASK_ALIASES = {"dense": SEGMENTATION}
REGRESSION_HEADS = ("mean", "mean_logvar")


@dataclass(frozen=True)
class Task:
    """What a network's output is: the reduction of S member outputs to a predictive (module docstring).

    Attributes:
        name: ``classification``, ``regression`` or ``segmentation``.
        head: regression: ``mean`` ([N, D] means) or ``mean_logvar`` ([N, 2D]: means, then log-variances).
        dims: regression: D.
        noise_var: regression ``mean`` head: the stated observation noise variance (None: none, aleatoric 0).
        shape: segmentation: one example's logits shape ``[C, *spatial]``.
    """

    name: str = CLASSIFICATION
    head: str | None = None
    dims: int | None = None
    noise_var: float | None = None
    shape: tuple[int, ...] | None = None

    @property
    def outputs(self) -> tuple[str, ...]:
        """The exported graph's outputs, in order."""
        return ("mean", "variance", "aleatoric", "epistemic") if self.name == REGRESSION else (
            "probs", "entropy", "mutual_info")

    def options(self) -> dict[str, Any] | None:
        """The task's options as stored beside its name (None for classification: nothing to store)."""
        if self.name == REGRESSION:
            return {"head": self.head, "dims": self.dims, "noise_var": self.noise_var}
        if self.name == SEGMENTATION:
            return {"shape": list(self.shape or ())}
        return None

    @classmethod
    def parse(cls, name: str | None, options: Mapping[str, Any] | None, where: str) -> Task:
        """The task stored as ``name`` and ``options`` (None: classification, what files before tasks meant).

        Raises:
            InvalidArtifactError: An unknown task or malformed options (names ``where``).
        """
        if name is None or name == CLASSIFICATION:
            return cls()
        opts = dict(options or {})
        if name == REGRESSION:
            head, dims, noise = opts.get("head"), opts.get("dims"), opts.get("noise_var")
            if head not in REGRESSION_HEADS or not _positive_int(dims) or not (
                    noise is None or (isinstance(noise, (int, float)) and not isinstance(noise, bool)
                                      and np.isfinite(noise) and noise >= 0)):
                raise InvalidArtifactError(f"{where}: regression task options {opts!r} are not "
                                           "{head: mean|mean_logvar, dims: int > 0, noise_var: null or >= 0}")
            assert isinstance(dims, int)
            return cls(REGRESSION, head, dims, None if noise is None else float(noise))
        if name == SEGMENTATION:
            shape = opts.get("shape")
            if not (isinstance(shape, list) and len(shape) >= 2 and all(_positive_int(d) for d in shape)):
                raise InvalidArtifactError(f"{where}: segmentation task shape {shape!r} is not [C, *spatial] "
                                           "positive ints")
            return cls(SEGMENTATION, shape=tuple(shape))
        raise InvalidArtifactError(f"{where}: unknown task {name!r} (this edgebnn knows {', '.join(TASKS)})")

    def width(self) -> int:
        """Regression: the member output's width (D or 2D)."""
        assert self.dims is not None
        return 2 * self.dims if self.head == "mean_logvar" else self.dims


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0
