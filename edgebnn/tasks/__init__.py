"""Tasks: what a network's output is, and how an exported graph reduces its S members' outputs to the predictive.

A task is one subclass of :class:`Task` registered once with :func:`register_task` (:mod:`.base`: the contract,
the registry :data:`TASKS`); an instance is the task with its options, recorded in the IR manifest and the export
metadata. The built-in tasks are one module each, registered the same way a plug-in's task is (docs/extending.md):

- :mod:`.classification`: logits [N, K] -> probs, entropy, mutual_info; accuracy, NLL, ECE, Brier;
- :mod:`.segmentation`: the same per pixel of [N, C, *sp]; pixel accuracy, mean IoU, NLL, ECE;
- :mod:`.regression`: means (and log-variances) -> mean, variance, aleatoric, epistemic; Gaussian NLL, RMSE, ...

:mod:`.infer` gives an imported torch model its task. The metric formulas the tasks share (NLL, ECE, ...) are in
:mod:`edgebnn.metrics`.
"""

from edgebnn.tasks.base import (
    DEFAULT_TASK,
    EPS_PROBS,
    PLUGIN_HINT,
    PREFIX,
    TASKS,
    VAR_FLOOR,
    GraphBuilder,
    MetricAccumulator,
    Points,
    Task,
    analytic_head,
    known_tasks,
    option_task,
    predictive_from_samples,
    probs_entropy_mi,
    register_task,
    sampled_head,
    task_class,
)
from edgebnn.tasks.classification import Classification
from edgebnn.tasks.infer import task_of_output
from edgebnn.tasks.regression import Regression
from edgebnn.tasks.segmentation import Segmentation

__all__ = ["DEFAULT_TASK", "EPS_PROBS", "PLUGIN_HINT", "PREFIX", "TASKS", "VAR_FLOOR", "Classification", "GraphBuilder",
           "MetricAccumulator", "Points", "Regression", "Segmentation", "Task", "analytic_head", "known_tasks",
           "option_task", "predictive_from_samples", "probs_entropy_mi", "register_task", "sampled_head",
           "task_class", "task_of_output"]
