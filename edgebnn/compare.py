"""``edgebnn compare A B``: do two artifacts give the same predictive distribution?

Element-wise equality is meaningless for Monte Carlo outputs: an S-sample ensemble is one random draw of
S posterior members, and one draw is shared by every test example, so errors are correlated across
examples. The test therefore calibrates itself by simulation (a parametric bootstrap from the IR):

    d_ik = pA_ik − pB_ik                 (mean probabilities of example i, class k)
    v_ik = Var_s(p_s,ik) · (1/S_A + 1/S_B)   member variance from 64 reference draws; 1/S = 0 for a
                                          deterministic (analytic) artifact; at least a tenth of its mean
                                          over (i, k) (FLOOR_FRACTION: a near-zero 64-member estimate would
                                          weight an entry by its estimation error, and give T a heavy tail)
    T = mean_ik d_ik² / v_ik             (a mean squared z-score; E[T] ≈ 1 under the null, less where v is floored)

The compared quantity is the task's (:meth:`edgebnn.tasks.Task.point` and :meth:`~edgebnn.tasks.Task.members`):
mean probabilities (classification; per pixel for segmentation; per label for a sigmoid multi-label task) or the
predictive mean (regression, members' means μ_s in v).

Under the null (both artifacts sample the IR's posterior) T's distribution is simulated from R pairs of
independent S_A- and S_B-member reference ensembles (a deterministic side is replaced by a 256-member
ensemble). p = (1 + #{T_null ≥ T}) / (R + 1); the verdict is "different" when p ≤ alpha.

A large p says only that T is typical of Monte Carlo error, and at S = 16 that error can hide a real difference. So
the report states the test's power, in the units of the compared quantity, as an RMS over (example, class):

    Δ = rms_ik(d_ik)                     the observed difference
    detectable = the smallest RMS shift λ spread as the Monte Carlo error (û = sqrt(v / mean v): the same number
                 of standard deviations on every entry) that the test detects with 80% power: each simulated null
                 pair r (difference e_r), shifted by ±λ·û, gives T_r(λ) = mean (e_r ± λû)² / v, a quadratic in λ
                 whose larger root λ*_r is where it passes the critical value (the smallest T with p ≤ alpha);
                 detectable = the 80th percentile of the 2R values λ*_r (the smallest with 80% at or below it)

and calls p > alpha "same" only when both Δ and detectable are within ``tolerance`` (default 0.01: an RMS
difference of 0.01 in the mean probabilities); otherwise "cannot tell". Sampling more shrinks detectable like
1/sqrt(draws) (its factor sqrt(mean v); the null's spread relative to its mean shrinks too, so at small S a little
faster): ``calls`` averages that many calls of a side that draws afresh per call (a noise/shared export;
an .ebnn draws S·calls members), while a baked export's S members are one draw whatever the calls and an analytic
one has no draws; the null simulation draws what each side drew (S·calls members, or S).
"""

from __future__ import annotations

import math
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
FLOOR_FRACTION = 0.1  # v is at least this share of its mean: the null simulation keeps T exact for any weights
REF_MEMBERS = 64
DETERMINISTIC_STANDIN = 256  # members that stand in for an infinite ensemble in the null simulation
POWER = 0.8  # the power at which the detectable difference is stated
TOLERANCE = 0.01  # default: the RMS difference of the compared quantity (mean probabilities) "same" allows
STREAM_STEP = 2**20  # an .ebnn side's seed moves by this past a baked export's: clear of seed + 2 and the null's
REDRAWN = ("noise", "shared")  # export modes whose every call draws afresh (more calls: more draws)


def _open(path: str, seed: int) -> Any:
    """A :class:`~edgebnn.runtime.Session` for an export (independent calls: no noise pool), the IR for an .ebnn."""
    from edgebnn.api import load_ir

    if Path(path).suffix == ".onnx":
        from edgebnn.runtime import Session

        return Session(path, seed=seed, noise_pool=False)
    return load_ir(path)


def _free(seed: int, taken: set[int | None]) -> int:
    """``seed``, moved by :data:`STREAM_STEP` until no export's members were drawn from it: an .ebnn side run with
    the seed of a baked export draws that export's very members (the reference runtime's streams), and the test
    assumes independent draws."""
    while seed in taken:
        seed += STREAM_STEP
    return seed


def _side(side: Any, x: np.ndarray, samples: int, calls: int, seed: int
          ) -> tuple[AnyPredictive, np.ndarray, int | None, bool, Any]:
    """(the predictive of one call, the compared quantity averaged over ``calls`` calls, S or None for a
    deterministic artifact, whether each call draws afresh, the IR if ``side`` is one)."""
    from edgebnn.runtime import Session

    if isinstance(side, Session):
        s = None if side.mode == "analytic" else side.samples
        first = side.predict(x)
        task = side.task
        if side.mode not in REDRAWN:  # baked: the same members every call; analytic: no draws
            return first, _point(task, first), s, False, None
        points = [_point(task, first), *(_point(task, side.predict(x)) for _ in range(calls - 1))]
        return first, np.mean(points, axis=0), s, True, None
    from edgebnn.runtime.reference import Reference

    ref = Reference(side)
    first = ref.predict(x, samples, seed)  # members 0..S-1 of the seed's stream: the first S of the S·calls below
    pooled = first if calls == 1 else ref.predict(x, samples * calls, seed)
    return first, _point(ref.task, pooled), samples, True, side


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
                      samples: int = 16, calls: int = 1, null_runs: int = 99, alpha: float = 0.01,
                      tolerance: float = TOLERANCE, seed: int = 0,
                      progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Compare the predictive distributions of artifacts ``a`` and ``b`` on ``data``.

    ``data`` is ``digits`` (split ``split``, default test), a labelled ``.npz``, a folder of shards or
    ``(x, y)`` arrays (:func:`edgebnn.data.load_data`); it is held in memory (the null simulation runs the
    IR on it many times). ``calls``: calls of a noise/shared export averaged (an .ebnn draws ``samples · calls``
    members). ``tolerance``: the RMS difference of the compared quantity a "same" verdict allows (module
    docstring). ``progress(done, null_runs)`` is called after each simulated null pair.

    Returns:
        The report: ``verdict`` ("same", "different" or "cannot tell"), ``p_value``, ``observed_diff`` and
        ``detectable_diff`` (RMS, at ``power``), ``same_distribution`` (the verdict is "same"), each side's
        metrics (of one call) and ``draws``.
    """
    from edgebnn.api import dataset_for, load_ir
    from edgebnn.ir import BNNModel
    from edgebnn.runtime.reference import Reference

    if null_runs < 19:
        raise InvalidOptionError(f"--null-runs {null_runs}: need at least 19 for a p-value of 0.05")
    if not 0 < alpha < 1:
        raise InvalidOptionError(f"--alpha {alpha}: must be in (0, 1)")
    if 1 / (null_runs + 1) > alpha:
        raise InvalidOptionError(f"--null-runs {null_runs}: its smallest p-value, 1/{null_runs + 1}, is above --alpha "
                                 f"{alpha}, so nothing could be called different; give --null-runs "
                                 f"{math.ceil(1 / alpha - 1e-9) - 1} or more (or a larger --alpha)")
    if calls < 1:
        raise InvalidOptionError(f"--calls {calls}: must be at least 1")
    if not tolerance > 0:
        raise InvalidOptionError(f"--tolerance {tolerance}: must be positive")
    side_a, side_b = _open(a, seed), _open(b, seed + 1)
    dataset = dataset_for(side_a, data, split=split)
    x, y = dataset.arrays()
    assert y is not None  # labels=True
    taken = {side.meta.seed for side in (side_a, side_b) if not isinstance(side, BNNModel)} - {None}
    pred_a, pa, sa, redraw_a, ir_a = _side(side_a, x, samples, calls, _free(seed, taken))
    pred_b, pb, sb, redraw_b, ir_b = _side(side_b, x, samples, calls, _free(seed + 1, taken))
    da, db = (s * calls if s and redraws else s for s, redraws in ((sa, redraw_a), (sb, redraw_b)))
    model = load_ir(ir) if ir else (ir_a or ir_b)
    if model is None:
        raise InvalidOptionError("both artifacts are exports: pass --ir MODEL.ebnn, the IR they came from")
    ref = Reference(model)
    task, classes = ref.task, model.manifest.num_classes
    tasks = [_task(side) for side in (side_a, side_b)]
    if tasks != [task, task]:
        raise InvalidOptionError(f"{a}, {b} and {model.where} are of different tasks "
                                 f"({', '.join(t.name for t in (*tasks, task))}): compare the artifacts of one model")
    if pa.shape != pb.shape or type(pred_a) is not type(pred_b):
        raise InvalidOptionError(f"{a} and {b} give predictions of different shapes {pa.shape} vs {pb.shape}")
    member_p = _members(task, ref.logits(x, REF_MEMBERS, seed=seed + 2))
    scale = sum(1.0 / d for d in (da, db) if d)
    if scale == 0:
        raise InvalidOptionError("both artifacts are deterministic (analytic): compare them with an .ebnn or export")
    var = member_p.var(axis=0, ddof=1) * scale
    var = np.maximum(var, max(VAR_FLOOR, FLOOR_FRACTION * float(np.mean(var))))

    def statistic(p: np.ndarray, q: np.ndarray) -> float:
        return float(np.mean((p - q) ** 2 / var))

    observed = statistic(pa, pb)
    null, cross = [], []
    for r in range(null_runs):
        base = seed + 1000 + 2 * r  # null draws: streams disjoint from the artifacts' own (seed, seed + 1)
        draws = [_point(task, task.reduce(ref.logits(x, d or DETERMINISTIC_STANDIN, seed=base + i)))
                 for i, d in enumerate((da, db))]
        null.append(statistic(*draws))
        cross.append(float(np.mean((draws[0] - draws[1]) / np.sqrt(var))))
        if progress:
            progress(r + 1, null_runs)
    null_arr = np.array(null)
    p_value = (1 + int((null_arr >= observed).sum())) / (null_runs + 1)
    detectable = detectable_difference(null_arr, np.array(cross), var, alpha)
    diff = pa - pb
    rms = rms_of(diff)
    verdict = ("different" if p_value <= alpha else
               "same" if max(rms, detectable) <= tolerance else "cannot tell")
    return {
        "a": {"artifact": a, "samples": sa, "draws": da, "redraws": redraw_a, **_report(task, classes, pred_a, y)},
        "b": {"artifact": b, "samples": sb, "draws": db, "redraws": redraw_b, **_report(task, classes, pred_b, y)},
        "calls": calls,
        "statistic": observed,
        "null_mean": float(null_arr.mean()),
        "null_p99": float(np.percentile(null_arr, 99)),
        "null_runs": null_runs,
        "p_value": p_value,
        "alpha": alpha,
        "verdict": verdict,
        "same_distribution": verdict == "same",
        "observed_diff": rms,  # RMS over (example, class) of the compared quantity's difference
        "detectable_diff": detectable,  # the RMS difference the test detects with `power`
        "power": POWER,
        "tolerance": tolerance,
        "calls_needed": calls_needed(detectable, tolerance, calls, [(sa, redraw_a), (sb, redraw_b)]),
        "max_abs_prob_diff": float(np.abs(diff).max()),  # regression: of the predictive means
        **task.record(options=False),
        **dataset.describe(),
    }



def critical_value(null: np.ndarray, alpha: float) -> float:
    """The statistic a p-value of at most ``alpha`` needs to exceed: with m = floor(alpha (R + 1)) - 1 null values
    allowed at or above T, the (m + 1)-th largest null value (inf when even m = 0 cannot reach ``alpha``)."""
    allowed = int(np.floor(alpha * (len(null) + 1) + 1e-9)) - 1
    if allowed < 0:
        return float("inf")
    return float(np.sort(null)[::-1][allowed])


def rms_of(values: np.ndarray) -> float:
    """The root mean square over every entry (example, class): how the report sizes a difference."""
    return float(np.sqrt(np.mean(np.square(values, dtype=np.float64))))


def detectable_difference(null: np.ndarray, cross: np.ndarray, var: np.ndarray, alpha: float,
                          power: float = POWER) -> float:
    """The RMS size of the smallest difference spread as the Monte Carlo error that the test detects with
    ``power`` (module docstring).

    The shift λ·û, û = sqrt(v / mean v) (the same number of standard deviations on every entry, RMS λ), added to or
    subtracted from null pair r gives T_r(λ) = q λ² ± 2 b_r λ + T_r (``null``: T_r; ``cross``: mean e_r / sqrt(v),
    so b_r = cross_r / sqrt(mean v); q = 1 / mean v). It passes the critical value c beyond λ*_r, the larger root
    of T_r(λ) = c (0 when it is past c for every λ >= 0); the answer is the smallest root with at least ``power`` of
    the 2R roots at or below it: past that shift at least that share of the simulated pairs is called different.
    For given T_r it scales as sqrt(mean v), i.e. as 1 / sqrt(draws).
    """
    c = critical_value(null, alpha)
    if not np.isfinite(c):
        return float("inf")
    mean_var = float(np.mean(var))
    q = 1.0 / mean_var
    b = np.concatenate([cross, -cross]) / np.sqrt(mean_var)  # the shift added and subtracted
    t = np.concatenate([null, null])
    disc = b ** 2 - q * (t - c)
    roots = np.where(disc < 0, 0.0, np.maximum((-b + np.sqrt(np.maximum(disc, 0.0))) / q, 0.0))
    return float(np.sort(roots)[math.ceil(power * len(roots)) - 1])  # at least `power` of the roots are at or below


def calls_needed(detectable: float, tolerance: float, calls: int, sides: list[tuple[int | None, bool]]) -> int | None:
    """The ``calls`` at which the detectable difference would reach ``tolerance``, or None when it already does or
    more calls cannot get there (a baked side's S members alone keep it above). It scales as the square root of
    Σ 1/draws over the sides (S, redraws per call) that draw: S·calls draws for one that redraws, S for one that
    does not."""
    if detectable <= tolerance or not np.isfinite(detectable):
        return None
    fixed = sum(1.0 / s for s, redraws in sides if s and not redraws)
    redrawn = sum(1.0 / s for s, redraws in sides if s and redraws)
    target = (fixed + redrawn / calls) * (tolerance / detectable) ** 2
    if redrawn == 0 or target <= fixed:
        return None
    return int(np.ceil(redrawn / (target - fixed)))
