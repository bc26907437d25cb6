"""Bytes before and after the ``shrink`` pass on a Bayesian Compression digits model (issue 20: pruned units leave
the graph).

The model is the one ``tests/integration/test_recipes.py::test_bc_prunes_groups_and_picks_bits`` trains: a group
normal-Jeffreys CNN (conv1 8 filters 3x3 -> ReLU -> MaxPool 2 -> Flatten -> fc1 128->32 -> ReLU -> fc2 32->10),
``train_bc`` on the first ``--rows`` rows of the digits training split (``--epochs``, lr 0.01, KL warm-up 5, torch
seed 0), then ``edgebnn.train.bc.compress`` (``prune+fixed``, group threshold ``--threshold``, noise fraction
0.05). "before" is the same lowering without the final shrink (the pruned groups stored as zeros), "after" is
``compress``'s model. For each: layer shapes, ``.ebnn`` bytes, and the deployed bytes
(``edgebnn.exporters.sizes.deployed_bytes``) of every export mode x weights format the exporter takes (S =
``--samples``, seed 0), with the test-split accuracy of the analytic export. Prints one JSON object. Run from the
repository root:

    PYTHONPATH=$PWD .venv/bin/python bench/shrink_bc.py [--epochs 25] [--rows 360] [--threshold -2] [--samples 16]
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
from edgebnn.exporters.ensemble import export_onnx
from edgebnn.exporters.sizes import deployed_bytes
from edgebnn.importers import import_model
from edgebnn.ir import BNNModel
from edgebnn.passes import ebnn_bytes
from edgebnn.passes.config import PASSES, pass_configs
from edgebnn.runtime.session import Session
from edgebnn.train.bc import GroupNJConv2d, GroupNJLinear, compress, group_scales, train_bc

EXPORTS = (("baked", "fp32"), ("baked", "int8"), ("baked", "int4"), ("noise", "ir"), ("noise", "fp32"),
           ("analytic", "ir"), ("analytic", "fp32"))


def bc_cnn() -> nn.Module:
    return nn.Sequential(OrderedDict([
        ("conv1", GroupNJConv2d(1, 8, 3, padding=1)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()), ("fc1", GroupNJLinear(128, 32)), ("relu2", nn.ReLU()),
        ("fc2", GroupNJLinear(32, 10)),
    ]))


def measure(model: BNNModel, samples: int, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"shapes": {w.name: list(w.encoding.shape) for w in model.encoded_weights()},
                           "ebnn_bytes": ebnn_bytes(model), "exports": {}}
    for mode, weights in EXPORTS:
        try:
            proto = export_onnx(model, samples, mode=mode, weights=weights, seed=0, form="qdq" if mode == "baked"
                                and weights != "fp32" else "auto")
        except EdgeBNNError as e:
            out["exports"][f"{mode} {weights}"] = f"refused: {e}"
            continue
        out["exports"][f"{mode} {weights}"] = deployed_bytes(proto).file_bytes
        if (mode, weights) == ("analytic", "ir"):
            out["analytic_accuracy"] = float(np.mean(Session(proto).predict(x).probs.argmax(1) == y))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--rows", type=int, default=360)
    parser.add_argument("--threshold", type=float, default=-2.0)
    parser.add_argument("--samples", type=int, default=16)
    args = parser.parse_args()
    d = digits(0)
    torch.manual_seed(0)
    model = bc_cnn()
    train_bc(model, (d.x_train[: args.rows], d.y_train[: args.rows]), epochs=args.epochs, lr=0.01,
             kl_warmup_epochs=5)
    ir = import_model(model, (1, 1, 8, 8))
    options = {"group_log_alpha_threshold": args.threshold, "noise_fraction": 0.05}
    before = ir
    for name, config in pass_configs("prune+fixed", "auto", options, {"group_scales": group_scales(model)}):
        before = PASSES[name](config)(before, seed=0).model  # compress's passes without the final shrink
    after, report = compress(model, ir, threshold=args.threshold, noise_fraction=0.05)
    print(json.dumps({
        "args": vars(args), "architecture": report["architecture"], "shrink": report["shrink"],
        "before": measure(before, args.samples, d.x_test, d.y_test),
        "after": measure(after, args.samples, d.x_test, d.y_test),
    }, indent=1))


if __name__ == "__main__":
    main()
