"""Variational training of Bayesian models (mean-field, ELBO with KL warm-up) and MC evaluation.

The loss per mini-batch is ``NLL + beta · KL / N_train``: the mean cross-entropy over the batch plus the
posterior-to-prior KL (:func:`edgebnn.nn.kl_divergence`) spread over the ``N_train`` training examples.
``beta`` rises linearly from 0 to 1, step by step, over the first ``kl_warmup_epochs`` epochs, so the
means fit the data before the KL pulls the standard deviations towards the prior. The Adam learning rate
decays from ``lr`` to 0 on a cosine over all steps, which settles the means (and the MC accuracy) at the
end of a short run. The loop itself is :func:`edgebnn.train._loop.run_epochs`, shared with the recipes;
:class:`EpochStats`, :class:`TrainResult`, :func:`mc_predict` and :func:`mc_accuracy` live there and are
re-exported here.
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from edgebnn.data import DigitsSplits
from edgebnn.nn import kl_divergence
from edgebnn.train._loop import (
    EpochStats,
    TrainResult,
    check_options,
    mc_accuracy,
    mc_predict,
    run_epochs,
    training_arrays,
)

__all__ = ["EpochStats", "TrainResult", "mc_accuracy", "mc_predict", "train_bnn"]


def train_bnn(
    model: nn.Module,
    data: DigitsSplits | tuple[np.ndarray, np.ndarray],
    *,
    epochs: int = 60,
    batch_size: int = 64,
    lr: float = 3e-3,
    kl_warmup_epochs: int = 10,
    seed: int = 0,
    val_samples: int = 8,
    progress: bool = True,
) -> TrainResult:
    """Train a Bayesian classifier in place by maximising the ELBO with Adam.

    Deterministic for a given ``seed`` and initial model (seed torch before building the model to fix
    its initialisation too). Thread count is the caller's business (``torch.set_num_threads``).

    Args:
        model: A classifier returning logits ``(N, C)``, with edgebnn Bayesian layers.
        data: A :class:`DigitsSplits` (trains on ``train``, reports accuracy on ``val``) or an ``(x, y)``
            pair of training arrays (no validation).
        epochs: Passes over the training data.
        batch_size: Examples per Adam step.
        lr: Peak Adam learning rate (cosine decay to 0 over the run).
        kl_warmup_epochs: Epochs over which the KL weight rises linearly from 0 to 1 (0: full KL at once).
        seed: Seeds torch's global generator and the shuffling.
        val_samples: Weight samples averaged for the per-epoch validation accuracy.
        progress: Show a progress bar over epochs (loss and validation accuracy) on stderr.

    Returns:
        The per-epoch history, the final validation accuracy and the wall time.

    Raises:
        InvalidOptionError: An option is out of range, the data are malformed, or the model rejects them.
        EdgeBNNError: The loss or the parameters became NaN or inf; names the epoch. The model is left with
            its last finite parameters.
    """
    check_options(epochs, batch_size, kl_warmup_epochs, lr, val_samples=val_samples)
    x, y, val = training_arrays(model, data, every_class=False)

    def loss_terms(xb: Tensor, yb: Tensor) -> tuple[Tensor, Tensor]:
        return F.cross_entropy(model(xb), yb), kl_divergence(model).to(xb.device)

    return run_epochs(model, [{"params": list(model.parameters()), "lr": lr}], x, y, val, loss_terms, recipe=None,
                      epochs=epochs, batch_size=batch_size, kl_warmup_epochs=kl_warmup_epochs, seed=seed,
                      val_samples=val_samples, lr=lr, progress=progress)
