"""A task's contract, which every task module fills (:class:`Head`), and what a head may ask of the
graph builder (:class:`GraphBuilder`, which :class:`edgebnn.exporters._graph.Builder` satisfies).

The three tasks (:mod:`.classification`, :mod:`.segmentation`, :mod:`.regression`, registered in :mod:`.registry`)
each give their reduction in the graph (``sampled``: from the member outputs [B·S, ...], row b·S + s, every
sampling mode; ``analytic``: from the output's Gaussian moments (m, v) of ``analytic`` mode; ``outputs``: the graph
outputs' value infos), the same reduction in numpy (``reduce``: the reference runtime's) and their metrics
(``sums``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnx

from edgebnn.metrics import AnyPredictive
from edgebnn.tasks.spec import Task

P = "ens/"  # prefix of every value an exporter adds (as exporters._graph.P)
EPS_PROBS = 1e-12
VAR_FLOOR = 1e-12  # keeps √v finite where a logit has no variance


class GraphBuilder(Protocol):
    """What a head needs of :class:`edgebnn.exporters._graph.Builder`."""

    @property
    def store_choice(self) -> str:
        """How the moments are stored: "fp32", or a compact store (its quadrature built in the graph)."""
    outputs: list[onnx.ValueInfoProto] | None  # the graph outputs, set once the head is added

    def add(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str: ...

    def i64(self, name: str, *values: int) -> str: ...

    def f32(self, name: str, value: float | np.ndarray) -> str: ...


# (samples Q, dims) -> [Q, dims] standard-normal quadrature points (exporters.analytic.quadrature_points)
Points = Callable[[int, int], np.ndarray]


class MetricAccumulator(Protocol):
    """A task's running metrics over a stream of batches."""

    def add_predictive(self, pred: AnyPredictive, y: np.ndarray) -> None: ...

    def report(self) -> dict[str, Any]: ...

    def reliability(self) -> dict[str, list[float]]: ...


@dataclass(frozen=True)
class Head:
    """One task: its reduction of S member outputs, in the graph and in numpy, and its metrics.

    Attributes:
        sampled: the graph head from the member outputs [B·S, ...] (every sampling mode).
        analytic: the graph head from the output's Gaussian moments (m, v) (``analytic`` mode).
        outputs: the graph outputs' value infos.
        reduce: the same reduction as ``sampled`` in numpy, on member outputs [S, N, ...] (the reference runtime's).
        sums: a fresh metric accumulator for ``(task, classes)`` (``eval``, ``compare``).
    """

    sampled: Callable[[GraphBuilder, str, int, Task, int], None]
    analytic: Callable[[GraphBuilder, str, str | None, int, Task, int, Points], None]
    outputs: Callable[[Task, int], list[onnx.ValueInfoProto]]
    reduce: Callable[[Task, np.ndarray], AnyPredictive]
    sums: Callable[[Task, int], MetricAccumulator]
