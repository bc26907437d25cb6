"""A task's graph head: the contract every task module fills (:class:`Head`), and what a head may ask of the
graph builder (:class:`GraphBuilder`, which :class:`edgebnn.exporters._graph.Builder` satisfies).

The reductions of the three tasks (``sampled``: from the member outputs [B·S, ...], row b·S + s, every sampling
mode; ``analytic``: from the output's Gaussian moments (m, v) of ``analytic`` mode; ``outputs``: the graph
outputs' value infos) are in :mod:`.classification`, :mod:`.segmentation` and :mod:`.regression`, registered in
:mod:`.registry`; :func:`edgebnn.metrics.predictive_from_samples` is the same reduction in numpy (the reference
runtime's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnx

from edgebnn.tasks.spec import Task

P = "ens/"  # prefix of every value an exporter adds (as exporters._graph.P)
EPS_PROBS = 1e-12
VAR_FLOOR = 1e-12  # keeps √v finite where a logit has no variance


class GraphBuilder(Protocol):
    """What a head needs of :class:`edgebnn.exporters._graph.Builder`."""

    store_choice: str  # how the moments are stored: "fp32", or a compact store (its quadrature built in the graph)
    outputs: list[onnx.ValueInfoProto] | None  # the graph outputs, set once the head is added

    def add(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str: ...

    def i64(self, name: str, *values: int) -> str: ...

    def f32(self, name: str, value: float | np.ndarray) -> str: ...


# (samples Q, dims) -> [Q, dims] standard-normal quadrature points (exporters.analytic.quadrature_points)
Points = Callable[[int, int], np.ndarray]


@dataclass(frozen=True)
class Head:
    """One task's reduction (module docstring)."""

    sampled: Callable[[GraphBuilder, str, int, Task, int], None]
    analytic: Callable[[GraphBuilder, str, str | None, int, Task, int, Points], None]
    outputs: Callable[[Task, int], list[onnx.ValueInfoProto]]
