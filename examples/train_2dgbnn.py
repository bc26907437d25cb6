"""2DGBNN recipe on digits: train a plain BNN (digits_cnn), tie its weights to a codebook (stages 1-2), retrain
(stage 3, Eq. 10), lower with ``codebook`` and export; compare with lowering the plain BNN with ``codebook``
directly. The last stdout line is the JSON result.

    .venv/bin/python examples/train_2dgbnn.py [--epochs 60] [--stage3-epochs 30] [--lower-clusters 16] [--seed 0]
"""

from __future__ import annotations

import argparse

import torch
from _common import S, emit, exported, metrics

from edgebnn.data import digits
from edgebnn.importers import import_model
from edgebnn.models import digits_cnn
from edgebnn.passes import lower
from edgebnn.train import mc_predict, train_bnn
from edgebnn.train.dgbnn import TieConfig, lower_stage3, stage_summary, tie_to_codebook, train_stage3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60, help="plain BNN training epochs")
    parser.add_argument("--stage3-epochs", type=int, default=30)
    parser.add_argument("--clusters", type=int, default=16, help="k-means groups per weight matrix")
    parser.add_argument("--lower-clusters", type=int, default=16,
                        help="codebook entries per layer for both lowerings (0: the pass's auto rule)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    data = digits(args.seed)
    x, y = data.split("test")
    shape = (1, 1, 8, 8)

    model = digits_cnn()
    train_bnn(model, data, epochs=args.epochs, seed=args.seed, progress=False)
    torch.manual_seed(args.seed)
    plain = metrics(mc_predict(model, x, samples=S), y)
    options = {"clusters": args.lower_clusters} if args.lower_clusters else {}
    direct_ir = lower(import_model(model, shape), "codebook", seed=args.seed, **options).model
    direct = exported(direct_ir, x, y, seed=args.seed)

    config = TieConfig(clusters=args.clusters)
    tied = tie_to_codebook(model, config, seed=args.seed)
    result = train_stage3(model, data, config=config, epochs=args.stage3_epochs, seed=args.seed)
    torch.manual_seed(args.seed)
    before = metrics(mc_predict(model, x, samples=S), y)
    lowered = lower_stage3(import_model(model, shape), seed=args.seed, **options)
    after = exported(lowered.model, x, y, seed=args.seed)
    emit({
        "recipe": "2dgbnn",
        "before": before,
        "after": after,
        "direct_codebook": direct,
        "plain_bnn": plain,
        "stage3_s": round(result.wall_time_s, 1),
        "epochs": {"plain": args.epochs, "stage3": args.stage3_epochs},
        "tied_at_start": tied,
        "tied_at_end": stage_summary(model),
        "codebook_entries": {r["name"]: r.get("clusters") for r in lowered.report["layers"]},
    })


if __name__ == "__main__":
    main()
