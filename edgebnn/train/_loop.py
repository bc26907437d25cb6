"""The mini-batch loop shared by the recipes: data checks, Adam, KL warm-up, NaN guards, per-epoch hooks.

Each recipe supplies ``loss_terms(x, y) -> (nll, kl)``; the loop minimises ``nll + β · kl / N_train`` with
β rising linearly from 0 to 1 over the first ``kl_warmup_epochs`` epochs (as :func:`~edgebnn.train.train_bnn`)
and the learning rate of every parameter group decaying on a cosine to 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from edgebnn.data import DigitsSplits
from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.train.elbo import (
    EpochStats,
    TrainResult,
    _as_arrays,
    _check_model_accepts,
    _describe,
    _first_line,
    _model_device,
    _params_finite,
    mc_accuracy,
)

LossTerms = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def training_arrays(
    model: nn.Module, data: DigitsSplits | tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """Checked ``(x_train, y_train, val)``: finite inputs the model accepts, and no empty class.

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


def check_options(epochs: int, batch_size: int, kl_warmup_epochs: int, lr: float) -> None:
    """Refuse out-of-range loop options in one line."""
    for name, value, low in (("epochs", epochs, 1), ("batch_size", batch_size, 1), ("kl_warmup_epochs",
                                                                                     kl_warmup_epochs, 0)):
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
    recipe: str,
    epochs: int,
    batch_size: int,
    kl_warmup_epochs: int,
    seed: int,
    after_step: Callable[[], None] | None = None,
    after_epoch: Callable[[int], None] | None = None,
    val_samples: int = 8,
) -> TrainResult:
    """Minimise ``nll + β · kl / N`` with Adam over ``param_groups``; stop naming the epoch on NaN or inf.

    ``after_step`` runs after every Adam step (clipping), ``after_epoch(epoch)`` after every epoch (e.g.
    re-clustering). On a non-finite loss nothing is stepped; on non-finite parameters the step is undone,
    so the model never holds NaN.
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
    history: list[EpochStats] = []
    started = time.perf_counter()
    step = 0
    for epoch in range(1, epochs + 1):
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
                raise EdgeBNNError(
                    f"{recipe}: epoch {epoch}: loss became {_describe(loss)} (nll={nll.item():.4g}, "
                    f"kl={kl.item():.4g}, beta={beta:.3g}); the model keeps its last finite parameters; "
                    "try a lower lr"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            saved = [p.detach().clone() for p in params]
            try:
                optimizer.step()
                if after_step is not None:
                    after_step()
                problem = None if _params_finite(model) else "parameters became NaN or inf"
            except RuntimeError as e:
                problem = f"the Adam step failed ({_first_line(e)})"
            if problem is not None:
                with torch.no_grad():
                    for p, s in zip(params, saved, strict=True):
                        p.copy_(s)
                raise EdgeBNNError(f"{recipe}: epoch {epoch}: {problem}; try a lower lr")
            schedule.step()
            sums += (loss.item(), nll.item(), kl.item())
        if after_epoch is not None:
            after_epoch(epoch)
        val_acc = None if val is None else mc_accuracy(model, val[0], val[1], samples=val_samples)
        loss_mean, nll_mean, kl_mean = (sums / steps_per_epoch).tolist()
        history.append(EpochStats(epoch, loss_mean, nll_mean, kl_mean, beta, val_acc))
    model.eval()
    return TrainResult(tuple(history), history[-1].val_accuracy, time.perf_counter() - started)
