"""Tasks: what a network's output is, and how an exported graph reduces its S members' outputs to the predictive.

- :mod:`.spec`: :class:`Task` (recorded in the IR manifest and the export metadata) and the task names;
- one module per task with its graph head (:mod:`.classification`, :mod:`.segmentation`, :mod:`.regression`;
  the contract in :mod:`.head`), registered in :mod:`.registry`.

The numpy reductions and the metric accumulators of each task are in :mod:`edgebnn.metrics`.
"""

from edgebnn.tasks.head import GraphBuilder, Head, Points
from edgebnn.tasks.registry import HEADS, analytic_head, head_of, sampled_head
from edgebnn.tasks.spec import CLASSIFICATION, REGRESSION, REGRESSION_HEADS, SEGMENTATION, TASK_ALIASES, TASKS, Task

__all__ = ["CLASSIFICATION", "HEADS", "REGRESSION", "REGRESSION_HEADS", "SEGMENTATION", "TASKS", "TASK_ALIASES",
           "GraphBuilder", "Head", "Points", "Task", "analytic_head", "head_of", "sampled_head"]
