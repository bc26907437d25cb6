"""The task of an imported torch model: the one stated (``--task``), or the one its output's shape says where
that guesses nothing; and the ``from_torch`` options checked against it."""

from __future__ import annotations

from typing import Any

from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.tasks.base import TASKS, Task, option_task
from edgebnn.tasks.classification import Classification
from edgebnn.tasks.segmentation import Segmentation


def task_of_output(shape: tuple[int, ...], name: str | None, where: str, *, pair: bool = False,
                   **options: Any) -> Task:
    """The task of a model whose output (of a probe batch) has ``shape`` ([batch, ...]).

    Args:
        shape: The output's shape, [batch, ...].
        name: The stated task (``--task``: a registered name or alias), or None: [B, K >= 3] is classification,
            [B, C, *spatial] segmentation, and a 1- or 2-wide output is refused with a hint (a regression head
            would otherwise be read as a classifier).
        where: How messages name the model.
        pair: ``forward`` returned (mean, log-variance), joined into one output (:attr:`Task.joins_output_pair`).
        **options: The ``from_torch`` options (None: not given); each given must be one the task takes
            (:attr:`Task.import_options`).

    Raises:
        InvalidOptionError: An unknown task, an option it does not take, a bad option value.
        UnsupportedLayerError: An output the task cannot take, or one whose task must be stated.
    """
    cls = option_task(name) if name is not None else _inferred(shape, where)
    given = {k: v for k, v in options.items() if v is not None}
    wrong = [k for k in given if k not in cls.import_options]
    if wrong:
        takers = [t for t in TASKS.values() if wrong[0] in t.import_options]
        flags = " / ".join(_flag(o) for t in takers for o in t.import_options) or _flag(wrong[0])
        raise InvalidOptionError(f"{where}: {flags} apply to --task {' or '.join(t.name for t in takers)} only"
                                 if takers else f"{where}: no task takes {_flag(wrong[0])}")
    if cls.joins_output_pair:
        given["pair"] = pair
    return cls.from_output(shape, where, **given)


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _inferred(shape: tuple[int, ...], where: str) -> type[Task]:
    """The task an unstated output's shape says: per-pixel logits, or >= 3 class logits."""
    if len(shape) >= 3:
        return Segmentation
    shown = str(list(shape))
    if shape[1] == 1:
        raise UnsupportedLayerError(
            f"{where}: forward returns one output per example; state what it is: task='regression' (--task "
            "regression) for a mean, or for a sigmoid (binary) classifier return "
            "torch.cat([torch.zeros_like(z), z], 1) (its softmax is [1 - sigmoid(z), sigmoid(z)])"
        )
    if shape[1] == 2:
        raise UnsupportedLayerError(
            f"{where}: forward returns 2 outputs per example {shown}; state what they are: "
            "task='classification' (--task classification: 2-class logits) or task='regression' (--task "
            "regression: a mean and a log-variance, or 2 means with --noise-var)"
        )
    return Classification
