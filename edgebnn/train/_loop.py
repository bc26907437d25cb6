"""The mini-batch loop shared by every Adam trainer: data checks, KL warm-up, NaN guards, MC validation.

Each trainer supplies ``loss_terms(x, y) -> (nll, kl)``; the loop minimises ``nll + β · kl / N_train`` with
β rising linearly from 0 to 1, step by step, over the first ``kl_warmup_epochs`` epochs and the learning
rate of every parameter group decaying on a cosine to 0. :func:`~edgebnn.train.train_bnn` (the mean-field
ELBO) and the recipes (:mod:`~edgebnn.train.vnq`, :mod:`~edgebnn.train.bc`, :mod:`~edgebnn.train.dgbnn`)
all run it; :mod:`~edgebnn.train.ebp` reuses its result types.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgebnn.data import DigitsSplits
from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.nn import posterior_mean

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

LossTerms = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class EpochStats:
    """Averages over one training epoch (numbered from 1).

    ``loss``, ``nll`` and ``kl`` are means over the epoch's mini-batches; ``kl`` is the whole-model KL in
    nats (not divided by ``N_train``); ``beta`` is the KL weight at the epoch's last step;
    ``val_accuracy`` is the MC-averaged validation accuracy after the epoch, None without validation data.
    """

    epoch: int
    loss: float
    nll: float
    kl: float
    beta: float
    val_accuracy: float | None


@dataclass(frozen=True)
class TrainResult:
    """What a trainer did: per-epoch history, final validation accuracy, wall time."""

    history: tuple[EpochStats, ...]
    val_accuracy: float | None
    wall_time_s: float


def mc_predict(model: nn.Module, x: np.ndarray, *, samples: int = 16, batch_size: int = 512) -> np.ndarray:
    """Monte Carlo predictive distribution: the softmax averaged over ``samples`` eval-mode forwards.

    The model is put in eval mode (one weight sample per forward) and left there. Sampling draws from
    torch's global generator; seed it with ``torch.manual_seed`` for repeatable results.

    Args:
        model: A classifier returning logits ``(N, C)``.
        x: Inputs ``(N, ...)``.
        samples: Number of weight samples (ensemble members), at least 1.
        batch_size: Examples per forward.

    Returns:
        Class probabilities ``(N, C)`` as float32.
    """
    if samples < 1 or batch_size < 1:
        raise InvalidOptionError(f"samples={samples} and batch_size={batch_size} must be at least 1")
    device = _model_device(model)
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32), device=device)
    model.eval()
    probs = []
    with torch.no_grad():
        for start in range(0, len(xt), batch_size):
            chunk = xt[start : start + batch_size]
            total = F.softmax(model(chunk), dim=-1)
            for _ in range(samples - 1):
                total += F.softmax(model(chunk), dim=-1)
            probs.append(total / samples)
    return torch.cat(probs).cpu().numpy().astype(np.float32)


def mc_accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, *, samples: int = 16) -> float:
    """Accuracy of the argmax of :func:`mc_predict` against labels ``y``.

    Args:
        model: A classifier returning logits ``(N, C)``.
        x: Inputs ``(N, ...)``.
        y: Integer labels ``(N,)``.
        samples: Number of weight samples averaged.

    Returns:
        The fraction of correct predictions.
    """
    probs = mc_predict(model, x, samples=samples)
    return float(np.mean(probs.argmax(axis=1) == np.asarray(y)))


def training_arrays(
    model: nn.Module, data: DigitsSplits | tuple[np.ndarray, np.ndarray], *, every_class: bool = True
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """Checked ``(x_train, y_train, val)``: finite inputs the model accepts, and (``every_class``) no empty class.

    ``val`` is the validation split of a :class:`DigitsSplits`, None for an ``(x, y)`` pair.

    Raises:
        InvalidOptionError: Malformed data, inputs the model rejects, or a class without training examples.
    """
    if isinstance(data, DigitsSplits):
        x, y = _as_arrays(data.x_train, data.y_train, "training")
        val: tuple[np.ndarray, np.ndarray] | None = _as_arrays(data.x_val, data.y_val, "validation")
    else:
        x, y = _as_arrays(*data, "training")
        val = None
    device = _model_device(model)
    _check_model_accepts(model, x, y, device)
    if every_class:
        with torch.no_grad():
            classes = int(model.eval()(torch.as_tensor(x[:1], device=device)).shape[1])
        counts = np.bincount(y, minlength=classes)
        empty = [int(c) for c in np.flatnonzero(counts == 0)]
        if empty:
            raise InvalidOptionError(
                f"before epoch 1: class(es) {empty} of the model's {classes} outputs have no training examples "
                "(an empty class cannot be learned); drop it from the model or add examples"
            )
    return x, y, val


def check_options(epochs: int, batch_size: int, kl_warmup_epochs: int, lr: float, *, val_samples: int = 1) -> None:
    """Refuse out-of-range loop options in one line."""
    for name, value, low in (
        ("epochs", epochs, 1),
        ("batch_size", batch_size, 1),
        ("kl_warmup_epochs", kl_warmup_epochs, 0),
        ("val_samples", val_samples, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise InvalidOptionError(f"{name}={value!r} must be an integer >= {low}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise InvalidOptionError(f"lr={lr!r} must be a positive finite number")


def run_epochs(
    model: nn.Module,
    param_groups: Iterable[dict[str, Any]],
    x: np.ndarray,
    y: np.ndarray,
    val: tuple[np.ndarray, np.ndarray] | None,
    loss_terms: LossTerms,
    *,
    recipe: str | None,
    epochs: int,
    batch_size: int,
    kl_warmup_epochs: int,
    seed: int,
    after_step: Callable[[], None] | None = None,
    after_epoch: Callable[[int], None] | None = None,
    val_samples: int = 8,
    lr: float | None = None,
    progress: bool = False,
) -> TrainResult:
    """Minimise ``nll + β · kl / N`` with Adam over ``param_groups``; stop naming the epoch on NaN or inf.

    ``after_step`` runs after every Adam step (clipping), ``after_epoch(epoch)`` after every epoch (e.g.
    re-clustering). On a non-finite loss nothing is stepped; on non-finite parameters the step is undone,
    so the model never holds NaN.

    Errors read ``"vnq: epoch 2: …"`` with a ``recipe`` name, ``"epoch 2: …"`` without one (``None``); a
    peak ``lr`` given here is named in them. ``progress`` shows a rich bar over epochs (loss and
    validation accuracy) on stderr.
    """
    device = _model_device(model)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    xt = torch.as_tensor(x, device=device)
    yt = torch.as_tensor(y, device=device)
    n = len(xt)
    steps_per_epoch = math.ceil(n / batch_size)
    warmup = kl_warmup_epochs * steps_per_epoch
    optimizer = torch.optim.Adam(list(param_groups))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * steps_per_epoch)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    lr_note = "" if lr is None else f"lr={lr:g}"
    history: list[EpochStats] = []
    started = time.perf_counter()
    with _EpochBar(epochs, enabled=progress) as bar:
        step = 0
        for epoch in range(1, epochs + 1):
            at = f"epoch {epoch}" if recipe is None else f"{recipe}: epoch {epoch}"
            model.train()
            order = torch.as_tensor(rng.permutation(n), device=device)
            sums = np.zeros(3)
            beta = 1.0
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                step += 1
                beta = min(1.0, step / warmup) if warmup else 1.0
                nll, kl = loss_terms(xt[idx], yt[idx])
                loss = nll + beta * kl / n
                if not torch.isfinite(loss):
                    keeps = "" if recipe is None else "; the model keeps its last finite parameters"
                    raise EdgeBNNError(
                        f"{at}: loss became {_describe(loss)} (nll={nll.item():.4g}, kl={kl.item():.4g}, "
                        f"beta={beta:.3g}{', ' + lr_note if lr_note else ''}){keeps}; try a lower lr"
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                saved = [p.detach().clone() for p in params]
                try:
                    optimizer.step()
                    if after_step is not None:
                        after_step()
                    problem = None if _params_finite(model) else "parameters became NaN or inf"
                except RuntimeError as e:  # e.g. an lr so large that the step overflows float32
                    problem = f"the Adam step failed ({_first_line(e)})"
                if problem is not None:
                    with torch.no_grad():
                        for p, s in zip(params, saved, strict=True):
                            p.copy_(s)
                    raise EdgeBNNError(f"{at}: {problem}{f' ({lr_note})' if lr_note else ''}; try a lower lr")
                schedule.step()
                sums += (loss.item(), nll.item(), kl.item())
            if after_epoch is not None:
                after_epoch(epoch)
            val_acc = None if val is None else mc_accuracy(model, val[0], val[1], samples=val_samples)
            loss_mean, nll_mean, kl_mean = (sums / steps_per_epoch).tolist()
            stats = EpochStats(epoch, loss_mean, nll_mean, kl_mean, beta, val_acc)
            history.append(stats)
            bar.advance(stats)
    model.eval()
    return TrainResult(tuple(history), history[-1].val_accuracy, time.perf_counter() - started)


def _as_arrays(x: object, y: object, what: str) -> tuple[np.ndarray, np.ndarray]:
    xa = np.asarray(x, dtype=np.float32)
    ya = np.asarray(y)
    if xa.ndim < 2 or len(xa) == 0:
        raise InvalidOptionError(f"{what} images must be a non-empty batch (N, ...), got shape {xa.shape}")
    if ya.shape != (len(xa),) or not np.issubdtype(ya.dtype, np.integer):
        raise InvalidOptionError(f"{what} labels must be {len(xa)} integers, got shape {ya.shape} dtype {ya.dtype}")
    if ya.min() < 0:
        raise InvalidOptionError(f"{what} labels must be non-negative, got {int(ya.min())}")
    if not np.all(np.isfinite(xa)):
        raise InvalidOptionError(f"{what} images contain NaN or inf values")
    return xa, ya.astype(np.int64)


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    raise InvalidOptionError("model has no parameters to train")


def _params_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def _describe(t: torch.Tensor) -> str:
    return "NaN" if bool(torch.isnan(t)) else "inf"


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _check_model_accepts(model: nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device) -> None:
    """Refuse, in one line, a model that cannot take the inputs or has too few outputs for the labels."""
    was_training = model.training
    try:
        with torch.no_grad(), posterior_mean(model):
            out = model(torch.as_tensor(x[:1], device=device))
    except RuntimeError as e:
        raise InvalidOptionError(f"model rejects inputs of shape {tuple(x.shape[1:])}: {_first_line(e)}") from e
    finally:
        model.train(was_training)
    if out.ndim != 2 or out.shape[1] <= int(y.max()):
        raise InvalidOptionError(
            f"model output shape {tuple(out.shape[1:])} cannot score labels up to {int(y.max())}; "
            "it must return logits (N, num_classes)"
        )


class _EpochBar:
    """A rich progress bar over epochs showing the loss and validation accuracy; inert when disabled."""

    def __init__(self, epochs: int, *, enabled: bool):
        self._epochs = epochs
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("training"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}  val acc {task.fields[val]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )

    def __enter__(self) -> _EpochBar:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task("train", total=self._epochs, loss="-", val="-")
        return self

    def advance(self, stats: EpochStats) -> None:
        if self._progress is not None and self._task is not None:
            val = "-" if stats.val_accuracy is None else f"{stats.val_accuracy:.3f}"
            self._progress.update(self._task, advance=1, loss=f"{stats.loss:.4f}", val=val)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
