"""Training recipes: the mean-field ELBO trainer and one compression-aware recipe per paper.

* :mod:`~edgebnn.train.elbo` — mean-field Gaussian ELBO with KL warm-up (:func:`train_bnn`), MC evaluation;
* :mod:`~edgebnn.train.vnq` — Variational Network Quantization (ternary quantizing prior);
* :mod:`~edgebnn.train.bc` — Bayesian Compression (group normal-Jeffreys scales, pruning, bits per layer);
* :mod:`~edgebnn.train.dgbnn` — 2DGBNN stage 3 (retraining with weights tied to codebook components);
* :mod:`~edgebnn.train.ebp` — Expectation Backpropagation for binary-weight MLPs.
"""

from __future__ import annotations

from edgebnn.train.elbo import EpochStats, TrainResult, mc_accuracy, mc_predict, train_bnn

__all__ = ["EpochStats", "TrainResult", "mc_accuracy", "mc_predict", "train_bnn"]
