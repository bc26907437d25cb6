"""``edgebnn compare A B``: do two artifacts give the same predictive distribution?

Element-wise equality is meaningless for Monte Carlo outputs: an S-sample ensemble is one random draw of
S posterior members, and one draw is shared by every test example, so errors are correlated across
examples. The test therefore calibrates itself by simulation (a parametric bootstrap from the IR):

    d_ik = pA_ik − pB_ik                 (mean probabilities of example i, class k)
    v_ik = Var_s(p_s,ik) · (1/S_A + 1/S_B)   member variance from 64 reference draws; 1/S = 0 for a
                                          deterministic (analytic) artifact
    T = mean_ik d_ik² / v_ik             (a mean squared z-score; E[T] ≈ 1 under the null)

The compared quantity is the task's (:meth:`edgebnn.tasks.Task.point` and :meth:`~edgebnn.tasks.Task.members`):
mean probabilities (classification; per pixel for segmentation; per label for a sigmoid multi-label task) or the
predictive mean (regression, members' means μ_s in v).

Under the null (both artifacts sample the IR's posterior) T's distribution is simulated from R pairs of
independent S_A- and S_B-member reference ensembles (a deterministic side is replaced by a 256-member
ensemble). p = (1 + #{T_null ≥ T}) / (R + 1); the verdict is "different" when p ≤ alpha.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgebnn.errors import InvalidOptionError
from edgebnn.metrics import AnyPredictive
from edgebnn.tasks import Task

if TYPE_CHECKING:
    from edgebnn.data import DataSource

VAR_FLOOR = 1e-8
REF_MEMBERS = 64
DETERMINISTIC_STANDIN = 256  # members that stand in for an infinite ensemble in the null simulation


def _open(path: str, seed: int) -> Any:
    """A :class:`~edgebnn.runtime.Session` for an export, the IR for an .ebnn."""
    from edgebnn.api import load_ir

    if Path(path).suffix == ".onnx":
        from edgebnn.runtime import Session

        return Session(path, seed=seed)
    return load_ir(path)


def _side(side: Any, x: np.ndarray, samples: int, seed: int) -> tuple[AnyPredictive, int | None, Any]:
    """(predictive, S or None for a deterministic artifact, the IR if ``side`` is one)."""
    from edgebnn.runtime import Session

    if isinstance(side, Session):
        s = None if side.mode == "analytic" else side.samples
        return side.predict(x), s, None
    from edgebnn.runtime.reference import predict

    return predict(side, x, samples, seed), samples, side


def _task(side: Any) -> Task:
    """The task of a :class:`~edgebnn.runtime.Session` or an IR."""
    from edgebnn.runtime import Session

    return side.task if isinstance(side, Session) else side.manifest.task_spec(side.where)


def _point(task: Task, pred: AnyPredictive) -> np.ndarray:
    """The compared quantity per example, flattened (the task's: mean probabilities, the regression mean)."""
    values = task.point(pred)
    return values.reshape(len(values), -1)


def _members(task: Task, outputs: np.ndarray) -> np.ndarray:
    """Each member's own value of the compared quantity, ``[S, N, -1]`` (from ``[S, N, ...]`` outputs)."""
    values = task.members(outputs)
    return values.reshape(len(values), values.shape[1], -1)


def _report(task: Task, classes: int, pred: AnyPredictive, y: np.ndarray) -> dict[str, Any]:
    sums = task.metrics(classes)
    sums.add_predictive(pred, y)
    return dict(sums.report())


def compare_artifacts(a: str, b: str, data: DataSource = "digits", *, split: str | None = None, ir: str | None = None,
                      samples: int = 16, null_runs: int = 99, alpha: float = 0.01, seed: int = 0,
                      progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Compare the predictive distributions of artifacts ``a`` and ``b`` on ``data``.

    ``data`` is ``digits`` (split ``split``, default test), a labelled ``.npz``, a folder of shards or
    ``(x, y)`` arrays (:func:`edgebnn.data.load_data`); it is held in memory (the null simulation runs the
    IR on it many times). ``progress(done, null_runs)`` is called after each simulated null pair.
    """
    from edgebnn.api import dataset_for, load_ir
    from edgebnn.runtime.reference import Reference

    if null_runs < 19:
        raise InvalidOptionError(f"--null-runs {null_runs}: need at least 19 for a p-value of 0.05")
    if not 0 < alpha < 1:
        raise InvalidOptionError(f"--alpha {alpha}: must be in (0, 1)")
    side_a, side_b = _open(a, seed), _open(b, seed + 1)
    dataset = dataset_for(side_a, data, split=split)
    x, y = dataset.arrays()
    assert y is not None  # labels=True
    pred_a, sa, ir_a = _side(side_a, x, samples, seed)
    pred_b, sb, ir_b = _side(side_b, x, samples, seed + 1)
    model = load_ir(ir) if ir else (ir_a or ir_b)
    if model is None:
        raise InvalidOptionError("both artifacts are exports: pass --ir MODEL.ebnn, the IR they came from")
    ref = Reference(model)
    task, classes = ref.task, model.manifest.num_classes
    tasks = [_task(side) for side in (side_a, side_b)]
    if tasks != [task, task]:
        raise InvalidOptionError(f"{a}, {b} and {model.where} are of different tasks "
                                 f"({', '.join(t.name for t in (*tasks, task))}): compare the artifacts of one model")
    pa, pb = _point(task, pred_a), _point(task, pred_b)
    if pa.shape != pb.shape or type(pred_a) is not type(pred_b):
        raise InvalidOptionError(f"{a} and {b} give predictions of different shapes {pa.shape} vs {pb.shape}")
    member_p = _members(task, ref.logits(x, REF_MEMBERS, seed=seed + 2))
    scale = sum(1.0 / s for s in (sa, sb) if s)
    if scale == 0:
        raise InvalidOptionError("both artifacts are deterministic (analytic): compare them with an .ebnn or export")
    var = np.maximum(member_p.var(axis=0, ddof=1) * scale, VAR_FLOOR)

    def statistic(p: np.ndarray, q: np.ndarray) -> float:
        return float(np.mean((p - q) ** 2 / var))

    observed = statistic(pa, pb)
    null = []
    for r in range(null_runs):
        base = seed + 1000 + 2 * r  # null draws: streams disjoint from the artifacts' own (seed, seed + 1)
        draws = [_point(task, task.reduce(ref.logits(x, s or DETERMINISTIC_STANDIN, seed=base + i)))
                 for i, s in enumerate((sa, sb))]
        null.append(statistic(*draws))
        if progress:
            progress(r + 1, null_runs)
    null_arr = np.array(null)
    p_value = (1 + int((null_arr >= observed).sum())) / (null_runs + 1)
    return {
        "a": {"artifact": a, "samples": sa, **_report(task, classes, pred_a, y)},
        "b": {"artifact": b, "samples": sb, **_report(task, classes, pred_b, y)},
        "statistic": observed,
        "null_mean": float(null_arr.mean()),
        "null_p99": float(np.percentile(null_arr, 99)),
        "null_runs": null_runs,
        "p_value": p_value,
        "alpha": alpha,
        "same_distribution": p_value > alpha,
        "max_abs_prob_diff": float(np.abs(pa - pb).max()),  # regression: of the predictive means
        **task.record(options=False),
        **dataset.describe(),
    }

