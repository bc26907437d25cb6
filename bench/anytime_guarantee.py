"""The stopping rule's guarantee on real members (``edgebnn export --samples auto``, issue 36): for each input, 64
posterior draws of the reference runtime are a population; ``--orders`` random orders of 16 of them run through the
rule as the reference runtime runs it (:class:`edgebnn.stopping.RunningPredictive`), and each input's violation rate
is the share of orders that stop with a class probability ε or more from that order's 16-member value, or another
class. Reported per set: the mean rate (the promise averaged over inputs), the largest, and how many inputs are above
δ by more than chance (one-sided binomial p < 0.001), for the default rule and ``--variants``; and, an order being one
member set for every input as a baked export holds, the change of the MI-AUROC (test digits vs each OOD set) from
those 16 members to the anytime predictive: mean and standard deviation over the orders. (Latency and quality of the
anytime export: bench/anytime.py.)

Models (bayesian-torch Reparameterization layers, trained here with the ELBO, seed 0, cached with ``--cache``):

- **LeNet-5** (Caffe layout: conv 1->20 5x5, conv 20->50 5x5, fc 800->500, fc 500->10), 20 epochs on the sklearn
  digits upsampled to 1x28x28;
- **MLP** (784-256-256-10), 30 epochs on the same inputs;
- **ResNet-20** (bayesian-torch's ``resnet_variational``), 8 epochs on the digits upsampled to 3x32x32
  (``bench/deployed_size.py:trained_resnet``).

Data: the digits test split (360 images) in distribution; OOD: the same digits mirrored, smooth noise blobs and
pixel-permuted digits (``bench/analytic_ood.py:ood_sets``), upsampled like the inputs.

Prints one JSON line (schema ``edgebnn.bench.anytime_guarantee/1``) and a markdown table (docs/anytime.md). From the
repository root (about 15 minutes on 2 cores; training adds about 10):

    PYTHONPATH=. .venv/bin/python bench/anytime_guarantee.py --cache bench-cache [--orders 100]
        [--models lenet5,mlp,resnet20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import analytic_ood  # bench scripts import each other from this folder
from anytime import lenet5, upsample

import edgebnn

SCHEMA = "edgebnn.bench.anytime_guarantee/1"
SHAPES = {"lenet5": (1, 1, 28, 28), "mlp": (1, 1, 28, 28), "resnet20": (1, 3, 32, 32)}


def _bt_mlp() -> Any:
    import torch
    from bayesian_torch.layers import LinearReparameterization

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = LinearReparameterization(784, 256), LinearReparameterization(256, 256)
            self.fc3 = LinearReparameterization(256, 10)

        def forward(self, x: Any) -> Any:
            x, k1 = self.fc1(torch.flatten(x, 1))
            x, k2 = self.fc2(torch.relu(x))
            x, k3 = self.fc3(torch.relu(x))
            return x, k1 + k2 + k3

    return MLP()


def _train(net: Any, x: np.ndarray, y: np.ndarray, epochs: int, lr: float = 3e-3) -> None:
    """ELBO (cross-entropy + KL / N), Adam with a cosine schedule, batch 64, seed 0."""
    import torch

    generator = torch.Generator().manual_seed(0)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * -(-len(x) // 64))
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=generator).split(64):
            out, kl = net(xt[idx])
            loss = torch.nn.functional.cross_entropy(out, yt[idx]) + kl / len(x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
    net.eval()


def trained(name: str, cache: Path | None) -> Any:
    """The float IR of model ``name`` trained as the module docstring says (from ``cache`` when there)."""
    path = None if cache is None else cache / f"{name}.ebnn"
    if path is not None and path.exists():
        return edgebnn.load(path)
    import torch

    from edgebnn.data import digits

    torch.manual_seed(0)
    if name == "resnet20":
        import deployed_size

        bnn = deployed_size.trained_resnet(3, 8, cache)
    else:
        data = digits(0)
        net = lenet5() if name == "lenet5" else _bt_mlp()
        _train(net, upsample(data.x_train, SHAPES[name]), data.y_train.astype(np.int64), 20 if name == "lenet5" else 30)

        class Logits(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.m = inner

            def forward(self, x: Any) -> Any:
                return self.m(x)[0]

        bnn = edgebnn.from_torch(Logits(net), SHAPES[name], name=name)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        edgebnn.save(bnn, path)
    return bnn


def guarantee(name: str, *, cache: Path | None, orders: int, variants: list[dict[str, float]],
              progress: Any) -> dict[str, Any]:
    """The rule's violation rate per input on real members (module docstring, ``--parts guarantee``)."""
    from scipy import stats
    from sklearn.metrics import roc_auc_score

    from edgebnn.data import digits
    from edgebnn.exporters.config import rule_for
    from edgebnn.runtime.reference import Reference
    from edgebnn.stopping import RunningPredictive

    bnn = trained(name, cache)
    data = digits(0)
    shape = SHAPES[name]
    sets = {"in": upsample(data.x_test, shape),
            **{k: upsample(v, shape) for k, v in analytic_ood.ood_sets(data.x_test.astype(np.float32), 0).items()}}
    ref = Reference(bnn)
    out: dict[str, Any] = {}
    population = 64
    members = {}
    for k, v in sets.items():
        progress(f"{name}: {population} draws on {k}")
        z = ref.logits(v, population, seed=0).astype(np.float64)
        z -= z.max(-1, keepdims=True)
        members[k] = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    for options in [{}, *variants]:
        rule = rule_for(bnn, **options)
        label = ", ".join(f"{k}={v}" for k, v in options.items()) or "defaults"
        rng = np.random.default_rng(1)
        bad = {k: np.zeros(p.shape[1]) for k, p in members.items()}
        used = dict.fromkeys(members, 0.0)
        auroc: dict[str, list[float]] = {k: [] for k in members if k != "in"}
        for _ in range(orders):
            order = rng.permutation(population)[:rule.max_samples]  # one member set for every input, as baked
            mi = {}
            for k, p_all in members.items():
                p = p_all[order]
                state = RunningPredictive(p.shape[1], p.shape[2])
                rows = np.arange(p.shape[1])
                for i in range(rule.chunks):
                    state.add(rows, p[i * rule.chunk:(i + 1) * rule.chunk, rows])
                    rows = rows[~rule.settled(state.mean[rows], state.m2[rows], i, p.shape[2])]
                full = p.mean(0)
                far = np.abs(state.mean - full).max(-1) >= rule.epsilon
                bad[k] += far | (state.mean.argmax(-1) != full.argmax(-1))
                used[k] += state.n.mean() / orders
                full_h = -(full * np.log(np.maximum(full, 1e-12))).sum(-1)
                mi[k] = (state.outputs()[2], full_h + (p * np.log(np.maximum(p, 1e-12))).sum(-1).mean(0))
            for k in auroc:  # MI-AUROC change, anytime - these 16 members, test digits vs set k
                labels = np.r_[np.zeros(len(mi["in"][0])), np.ones(len(mi[k][0]))]
                auroc[k].append(roc_auc_score(labels, np.r_[mi["in"][0], mi[k][0]])
                                - roc_auc_score(labels, np.r_[mi["in"][1], mi[k][1]]))
        per_set = {}
        for k, b in bad.items():
            rate = b / orders
            above = stats.binom.sf(b - 1, orders, rule.delta) < 1e-3
            per_set[k] = {"mean_rate": float(rate.mean()), "max_rate": float(rate.max()),
                          "inputs_above_delta": int(above.sum()), "inputs": len(rate), "samples_used": used[k]}
            if k in auroc:
                per_set[k]["auroc_change"] = {"mean": float(np.mean(auroc[k])), "sd": float(np.std(auroc[k]))}
        out[label] = {"rule": rule.to_dict(), "sets": per_set}
    return out


def guarantee_markdown(result: dict[str, Any]) -> str:
    lines = ["| model | rule | set | samples used | bad stops, mean over inputs | worst input | inputs above δ "
             "(p < 0.001) | MI-AUROC change: mean ± sd over member sets |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for name, variants in result.get("guarantee", {}).items():
        for label, v in variants.items():
            for k, s in v["sets"].items():
                change = s.get("auroc_change")
                text = f"{change['mean']:+.4f} ± {change['sd']:.4f}" if change else ""
                lines.append(f"| {name} | {label} | {k} | {s['samples_used']:.2f} | {s['mean_rate']:.4f} | "
                             f"{s['max_rate']:.3f} | {s['inputs_above_delta']} of {s['inputs']} | {text} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lenet5,mlp,resnet20")
    parser.add_argument("--cache", type=Path, default=None, help="folder for the trained models (.ebnn)")
    parser.add_argument("--orders", type=int, default=200, help="random 16-member orders per input")
    parser.add_argument("--variants", default='[{"epsilon": 0.05, "delta": 0.05}]',
                        help="further rules (JSON list of rule_for options) besides the defaults")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    t0 = time.time()
    load = os.getloadavg()

    def progress(text: str) -> None:
        print(f"[{time.time() - t0:6.0f} s] {text}", file=sys.stderr, flush=True)

    result: dict[str, Any] = {"schema": SCHEMA, "edgebnn_version": edgebnn.__version__, "guarantee": {}}
    for name in args.models.split(","):
        result["guarantee"][name] = guarantee(name, cache=args.cache, orders=args.orders,
                                              variants=json.loads(args.variants), progress=progress)
    result["machine"] = {"cpu_count": os.cpu_count(), "load_average_start": [round(v, 2) for v in load],
                         "load_average_end": [round(v, 2) for v in os.getloadavg()], "seconds": round(time.time() - t0)}
    text = json.dumps(result, sort_keys=True)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(guarantee_markdown(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
