"""The tasks by name (:data:`HEADS`): the two calls an exporter makes to end its graph with a task's head, the
reference runtime's reduction and the metrics of ``eval`` / ``compare``.

A task module (:mod:`.classification`, :mod:`.segmentation`, :mod:`.regression`) defines its ``HEAD``; this
registry imports them (they never import it back).
"""

from __future__ import annotations

import numpy as np

from edgebnn.metrics import AnyPredictive
from edgebnn.tasks import classification, regression, segmentation
from edgebnn.tasks.head import GraphBuilder, Head, MetricAccumulator, Points
from edgebnn.tasks.spec import CLASSIFICATION, REGRESSION, SEGMENTATION, Task

HEADS: dict[str, Head] = {
    CLASSIFICATION: classification.HEAD,
    SEGMENTATION: segmentation.HEAD,
    REGRESSION: regression.HEAD,
}


def head_of(task: Task) -> Head:
    """The head of ``task`` (its name is one of :data:`HEADS`: :class:`Task` parsing checks it)."""
    return HEADS[task.name]


def sampled_head(b: GraphBuilder, logits: str, samples: int, classes: int, task: Task | None = None) -> None:
    """The task's head from the member outputs ``logits`` [B·S, ...], and the graph outputs set on ``b``;
    classification (the default): logits [B·S, K] -> probs [B, K], entropy [B], mutual_info [B]."""
    task = task or Task()
    head_of(task).sampled(b, logits, samples, task, classes)
    b.outputs = head_of(task).outputs(task, classes)


def analytic_head(b: GraphBuilder, logits: str, var: str | None, samples: int, classes: int, task: Task,
                  points: Points) -> None:
    """The task's head from the output's Gaussian moments (``var`` None: variance 0), and the graph outputs set
    on ``b``."""
    head_of(task).analytic(b, logits, var, samples, task, classes, points)
    b.outputs = head_of(task).outputs(task, classes)


def predictive_from_samples(task: Task, outputs: np.ndarray) -> AnyPredictive:
    """The predictive of ``[S, N, ...]`` member outputs for ``task`` (what the exported head computes)."""
    return head_of(task).reduce(task, outputs)


def metric_sums(task: Task, classes: int) -> MetricAccumulator:
    """The running metrics of ``task``: an object with ``add_predictive(pred, y)``, ``report()``, ``reliability()``."""
    return head_of(task).sums(task, classes)
