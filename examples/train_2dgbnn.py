"""2DGBNN recipe on digits: train a plain BNN (digits_cnn), tie its weights to a codebook (stages 1-2), retrain
(stage 3, Eq. 10), lower with ``codebook`` and export; compare with lowering the plain BNN with ``codebook``
directly. The last stdout line is the JSON result.

The deployed artifact (``after``) is the baked ensemble of ``--samples`` members (32: the paper's predictive
draws N_s = 30, rounded up): one draw per codebook entry per member makes its Monte Carlo error larger than that
of independent draws (``after_s16``: the same at S = 16).

    .venv/bin/python examples/train_2dgbnn.py [--epochs 60] [--stage3-epochs 30] [--component-lr 0.01]
        [--lower-clusters 16] [--samples 32] [--seed 0]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from _common import S, emit, exported, metrics

from edgebnn.data import digits
from edgebnn.importers import import_model
from edgebnn.models import digits_cnn
from edgebnn.passes import lower
from edgebnn.train import mc_predict, train_bnn
from edgebnn.train.dgbnn import TieConfig, lower_stage3, stage_summary, tie_to_codebook, train_stage3


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=60, help="plain BNN training epochs")
    p.add_argument("--stage3-epochs", type=int, default=30)
    p.add_argument("--clusters", type=int, default=16, help="k-means groups per weight matrix")
    p.add_argument("--lower-clusters", type=int, default=16,
                   help="codebook entries per layer for both lowerings (0: the pass's auto rule)")
    p.add_argument("--component-lr", type=float, default=1e-2,
                   help="stage 3: learning rate of the components' (m_k, s_k) (the rest: 1e-3)")
    p.add_argument("--samples", type=int, default=32, help="members of the exported ensemble")
    p.add_argument("--seed", type=int, default=0)
    return p


def train_plain(args: argparse.Namespace) -> torch.nn.Module:
    """The plain BNN stages 1-3 start from: digits_cnn, the ELBO trainer (the demo's, seed ``--seed``)."""
    torch.manual_seed(args.seed)
    model = digits_cnn()
    train_bnn(model, digits(args.seed), epochs=args.epochs, seed=args.seed, progress=False)
    return model


def run(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    """Stages 1-3 on a trained plain BNN (changed in place), both lowerings, the exports: the JSON result."""
    data = digits(args.seed)
    x, y = data.split("test")
    shape = (1, 1, 8, 8)
    torch.manual_seed(args.seed)
    plain = metrics(mc_predict(model, x, samples=S), y)
    options = {"clusters": args.lower_clusters} if args.lower_clusters else {}
    direct_ir = lower(import_model(model, shape), "codebook", seed=args.seed, **options).model
    direct = exported(direct_ir, x, y, seed=args.seed)

    config = TieConfig(clusters=args.clusters)
    tied = tie_to_codebook(model, config, seed=args.seed)
    result = train_stage3(model, data, config=config, epochs=args.stage3_epochs, component_lr=args.component_lr,
                          seed=args.seed)
    torch.manual_seed(args.seed)
    before = metrics(mc_predict(model, x, samples=S), y)
    lowered = lower_stage3(import_model(model, shape), seed=args.seed, **options)
    after = exported(lowered.model, x, y, seed=args.seed, samples=args.samples)
    after_s16 = exported(lowered.model, x, y, seed=args.seed, samples=S)
    return {
        "recipe": "2dgbnn",
        "before": before,
        "after": after,
        "after_s16": {k: after_s16[k] for k in ("accuracy", "nll", "ece")},
        "samples": args.samples,
        "direct_codebook": direct,
        "plain_bnn": plain,
        "stage3_s": round(result.wall_time_s, 1),
        "epochs": {"plain": args.epochs, "stage3": args.stage3_epochs},
        "component_lr": args.component_lr,
        "tied_at_start": tied,
        "tied_at_end": stage_summary(model),
        "codebook_entries": {r["name"]: r.get("clusters") for r in lowered.report["layers"]},
    }


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    emit(run(train_plain(args), args))


if __name__ == "__main__":
    main()
