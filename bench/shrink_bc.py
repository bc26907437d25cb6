"""Bytes before and after the ``shrink`` pass on the Bayesian Compression digits example (issue 20: pruned units
leave the graph).

The model is ``examples/train_bc.py``'s: a group normal-Jeffreys CNN with digits_cnn's shape (conv 16, conv 32,
fc 128->64, fc 64->10), ``train_bc`` on the digits training split (``--epochs``, lr 0.01, KL warm-up 30, seed 0,
one torch thread), then ``edgebnn.train.bc.compress`` (``prune+fixed``, group threshold ``--threshold``, noise
fraction 0.05, σ code 8 bits), as the example runs it. ``--small`` trains the integration test's smaller CNN
instead (conv 8 -> fc 128->32 -> fc 32->10 on 360 rows, 25 epochs, warm-up 5, σ bits 2).

"before" is the same lowering without the final shrink (the pruned groups stored as zeros), "after" is
``compress``'s model. For each: layer shapes, IR tensor bytes, ``.ebnn`` bytes and the deployed bytes
(``edgebnn.exporters.sizes.deployed_bytes``) of every export mode x weights format (S = ``--samples``, seed 0;
int8/int4 baked in the ``qdq`` form, codes in the file); the test-split accuracy / NLL of the analytic export
and the largest |Δ probability| between the two analytic exports (exact up to float32 rounding), and the
baked export's accuracy / NLL at seed 0 (its members are other draws of the same posterior after shrinking), and
at seeds 1 and 2 for the spread between draws. Prints one
JSON object. Run from the repository root:

    PYTHONPATH=$PWD .venv/bin/python bench/shrink_bc.py [--small] [--epochs N] [--threshold -2] [--samples 16]
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from torch import nn

from edgebnn.data import digits
from edgebnn.errors import EdgeBNNError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.sizes import deployed_bytes
from edgebnn.importers import import_model
from edgebnn.ir import BNNModel
from edgebnn.metrics import classification_report
from edgebnn.passes import ebnn_bytes
from edgebnn.passes.config import PASSES, pass_configs
from edgebnn.runtime.session import Session
from edgebnn.train.bc import GroupNJConv2d, GroupNJLinear, compress, group_scales, train_bc

EXPORTS = (("baked", "fp32"), ("baked", "int8"), ("baked", "int4"), ("noise", "ir"), ("noise", "fp32"),
           ("analytic", "ir"), ("analytic", "fp32"))


def bc_cnn(small: bool) -> nn.Module:
    if small:  # tests/integration/test_recipes.py::test_bc_prunes_groups_and_picks_bits
        return nn.Sequential(OrderedDict([
            ("conv1", GroupNJConv2d(1, 8, 3, padding=1)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
            ("flatten", nn.Flatten()), ("fc1", GroupNJLinear(128, 32)), ("relu2", nn.ReLU()),
            ("fc2", GroupNJLinear(32, 10))]))
    return nn.Sequential(OrderedDict([  # examples/train_bc.py
        ("conv1", GroupNJConv2d(1, 16, 3, padding=1)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", GroupNJConv2d(16, 32, 3, padding=1)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()), ("fc1", GroupNJLinear(128, 64)), ("relu3", nn.ReLU()),
        ("fc2", GroupNJLinear(64, 10))]))


def measure(model: BNNModel, samples: int, x: np.ndarray, y: np.ndarray) -> tuple[dict[str, Any], np.ndarray]:
    out: dict[str, Any] = {"shapes": {w.name: list(w.encoding.shape) for w in model.encoded_weights()},
                           "ir_bytes": model.nbytes(), "ebnn_bytes": ebnn_bytes(model), "exports": {}}
    analytic = np.zeros(0)
    for mode, weights in EXPORTS:
        form = "qdq" if mode == "baked" and weights != "fp32" else "auto"
        try:
            proto = export_model(model, ExportConfig(samples, mode=mode, weights=weights, seed=0, form=form,
                                                     rng="host")).proto
        except EdgeBNNError as e:
            out["exports"][f"{mode} {weights}"] = f"refused: {e}"
            continue
        out["exports"][f"{mode} {weights}"] = deployed_bytes(proto).file_bytes
        if (mode, weights) in (("analytic", "ir"), ("baked", "fp32")):
            probs = Session(proto).predict(x).probs
            report = classification_report(probs, y)
            out[f"{mode}_accuracy_nll"] = [round(report["accuracy"], 4), round(report["nll"], 4)]
            if mode == "analytic":
                analytic = probs
    # the baked members' spread over seeds: what separates the two files' baked predictive (other draws)
    out["baked_accuracy_nll_seeds_1_2"] = []
    for seed in (1, 2):
        report = classification_report(Session(export_model(model, ExportConfig(samples, mode="baked",
                                                                                seed=seed)).proto).predict(x).probs, y)
        out["baked_accuracy_nll_seeds_1_2"].append([round(report["accuracy"], 4), round(report["nll"], 4)])
    return out, analytic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the integration test's smaller CNN")
    parser.add_argument("--epochs", type=int, default=None, help="default 100 (--small: 25)")
    parser.add_argument("--threshold", type=float, default=-2.0)
    parser.add_argument("--samples", type=int, default=16)
    args = parser.parse_args()
    epochs = args.epochs or (25 if args.small else 100)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = digits(0)
    model = bc_cnn(args.small)
    if args.small:
        train_bc(model, (data.x_train[:360], data.y_train[:360]), epochs=epochs, lr=0.01, kl_warmup_epochs=5)
    else:
        train_bc(model, data, epochs=epochs, lr=0.01, kl_warmup_epochs=30, seed=0)
    ir = import_model(model, (1, 1, 8, 8))
    options = {"group_log_alpha_threshold": args.threshold, "noise_fraction": 0.05,
               **({} if args.small else {"sigma_bits": 8})}
    before = ir
    for name, config in pass_configs("prune+fixed", "auto", options, {"group_scales": group_scales(model)}):
        before = PASSES[name](config)(before, seed=0).model  # compress's passes without the final shrink
    after, report = compress(model, ir, threshold=args.threshold, noise_fraction=0.05,
                             **({} if args.small else {"sigma_bits": 8}))
    x, y = data.split("test")
    measured_before, probs_before = measure(before, args.samples, x, y)
    measured_after, probs_after = measure(after, args.samples, x, y)
    print(json.dumps({
        "args": {**vars(args), "epochs": epochs}, "architecture": report["architecture"], "shrink": report["shrink"],
        "before": measured_before, "after": measured_after,
        "analytic_max_abs_dprob": float(np.abs(probs_after - probs_before).max()),
    }, indent=1))


if __name__ == "__main__":
    main()
