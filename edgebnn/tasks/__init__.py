"""Tasks: what a network's output is, and how an exported graph reduces its S members' outputs to the predictive.

- :mod:`.spec`: :class:`Task` (recorded in the IR manifest and the export metadata) and the task names;
- one module per task (:mod:`.classification`, :mod:`.segmentation`, :mod:`.regression`; the contract in
  :mod:`.head`): its graph head, the same reduction in numpy and its metric accumulator, registered in
  :mod:`.registry`. The metric formulas they share (NLL, ECE, ...) are in :mod:`edgebnn.metrics`.
"""

from edgebnn.tasks.head import GraphBuilder, Head, MetricAccumulator, Points
from edgebnn.tasks.registry import HEADS, analytic_head, head_of, metric_sums, predictive_from_samples, sampled_head
from edgebnn.tasks.spec import CLASSIFICATION, REGRESSION, REGRESSION_HEADS, SEGMENTATION, TASK_ALIASES, TASKS, Task

__all__ = ["CLASSIFICATION", "HEADS", "REGRESSION", "REGRESSION_HEADS", "SEGMENTATION", "TASKS", "TASK_ALIASES",
           "GraphBuilder", "Head", "MetricAccumulator", "Points", "Task", "analytic_head", "head_of", "metric_sums",
           "predictive_from_samples", "sampled_head"]
