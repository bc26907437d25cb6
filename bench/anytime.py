"""Anytime ensembles (``edgebnn export --samples auto``, issue 44): does the anytime graph's cost follow the samples it
draws? Per held-out-style model, the ``--samples auto`` export against fixed exports of the same mode and seed.

Models (``--models``; trained here in seconds to a minute, seed 0, on sklearn's digits: ``edgebnn.data.digits(0)``'s
1077 training images; ``--cache`` keeps the trained IRs):

- ``bt``: the bayesian-torch digits CNN of examples/deploy_bayesian_torch.py (``dnn_to_bnn``), 15 epochs, 1x8x8;
- ``lenet5``: bayesian-torch Reparameterization LeNet-5 (Caffe layout), 6 epochs on the digits upsampled to 1x28x28;
- ``resnet20``: bayesian-torch's ``resnet_variational`` ResNet-20, 3 epochs on the digits upsampled to 3x32x32
  (``bench/deployed_size.py:trained_resnet``);
- ``vit``: a ViT with MC dropout (p = 0.1 in its MLP blocks and on the embeddings; 16 patches of 4x4 of the digits
  upsampled to 1x16x16 and a class token, width 128, 4 pre-norm blocks of 4 heads; 0.8M weights), 12 epochs of
  cross-entropy, imported with ``mc_dropout=True``.

Evaluated on the digits' 360 test images (in distribution) and on OOD sets made from them
(``bench/analytic_ood.py:ood_sets``: mirrored digits, smooth noise blobs, pixel-permuted digits), upsampled like the
inputs. Per model and ``--modes`` (``baked``: members drawn now, constants; ``noise``: weights' noise drawn in the
graph, ``--rng graph``, what ``edgebnn export`` writes for cpu) the exports are: ``auto`` (the rule's defaults,
:func:`edgebnn.exporters.config.rule_for`: chunks of 4 up to 16) and fixed S in {first chunk, 8, 16}, all seed 0
(baked: the anytime export's members are the first of the S = 16 export's, so quality differences are the rule's).

- ``quality``: accuracy, NLL, ECE (15 bins) of ``auto`` and of S = 16 on the test images, and ``auto - S16``;
- ``samples``: members the anytime export used per input, mean over the test images and over each OOD set, and
  ``ood_over_in`` (the OOD mean over the in-distribution mean);
- ``latency``: onnxruntime (CPU, ``--threads`` intra-op threads, graph optimisations at level ALL), batch 1 and 8:
  the test images themselves as the inputs (the first ``--rows``; batch 8: consecutive groups of 8), so the anytime
  graph follows the real stopping pattern. ``--rounds`` rounds, every graph once per input per round, interleaved;
  an input's time is its median over the rounds; per graph the p50 and the mean over the inputs (ms per call), and
  ``ratio_mean``/``ratio_p50`` of each graph to S = 16.

Prints one JSON line (schema ``edgebnn.bench.anytime/2``) with the commit measured. From the repository root (the
four models, two modes: about 10 minutes on 2 cores, most of it training and the ViT's rounds):

    PYTHONPATH=. .venv/bin/python bench/anytime.py [--models bt,lenet5,resnet20,vit] [--modes baked,noise]
        [--rounds 5] [--rows 200] [--threads 2] [--cache bench-cache] [--json out.json] [--quick]

``--quick``: 16 rows, 2 rounds, the quick training of each model (a few epochs less), for tests and smoke runs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import analytic_ood  # bench scripts import each other from this folder

import edgebnn

SCHEMA = "edgebnn.bench.anytime/2"
SHAPES = {"bt": (1, 1, 8, 8), "lenet5": (1, 1, 28, 28), "resnet20": (1, 3, 32, 32), "vit": (1, 1, 16, 16)}
EPOCHS = {"bt": (15, 4), "lenet5": (6, 1), "resnet20": (3, 1), "vit": (12, 1)}  # (full, --quick)
MODES = {"baked": {"mode": "baked"}, "noise": {"mode": "noise", "rng": "graph"}}
BATCHES = (1, 8)


def upsample(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Digits (N, 1, 8, 8) bilinearly upsampled to ``shape[2:]``, the channel repeated to ``shape[1]``."""
    import torch

    if tuple(shape[2:]) == x.shape[2:]:
        return np.ascontiguousarray(x, np.float32)
    up = torch.nn.functional.interpolate(torch.from_numpy(x.astype(np.float32)), size=shape[2:], mode="bilinear")
    return np.ascontiguousarray(up.repeat(1, shape[1], 1, 1).numpy())


def lenet5() -> Any:
    import torch
    from bayesian_torch.layers import Conv2dReparameterization, LinearReparameterization

    class LeNet5(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = Conv2dReparameterization(1, 20, 5), Conv2dReparameterization(20, 50, 5)
            self.fc1, self.fc2 = LinearReparameterization(800, 500), LinearReparameterization(500, 10)

        def forward(self, x: Any) -> Any:
            x, k1 = self.conv1(x)
            x, k2 = self.conv2(torch.max_pool2d(torch.relu(x), 2))
            x, k3 = self.fc1(torch.flatten(torch.max_pool2d(torch.relu(x), 2), 1))
            x, k4 = self.fc2(torch.relu(x))
            return x, k1 + k2 + k3 + k4

    return LeNet5()


def _vit() -> Any:
    """The MC-dropout ViT of the module docstring (input 1x16x16)."""
    import torch
    from torch import nn

    width, blocks, heads = 128, 4, 4

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Linear(16, width)
            self.cls = nn.Parameter(0.02 * torch.randn(1, 1, width))
            self.pos = nn.Parameter(0.02 * torch.randn(1, 17, width))
            self.drop = nn.Dropout(0.1)
            layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.1, activation="gelu",
                                               batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
            for block in self.encoder.layers:
                block.self_attn.dropout = 0.0  # attention's own dropout is no module: MC dropout on the MLPs
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, 10)

        def forward(self, x: Any) -> Any:
            b = x.shape[0]
            p = x.reshape(b, 4, 4, 4, 4).permute(0, 1, 3, 2, 4).reshape(b, 16, 16)
            t = self.drop(torch.cat([self.cls.expand(b, -1, -1), self.patch(p)], 1) + self.pos)
            return self.head(self.norm(self.encoder(t)[:, 0]))

    return ViT()


def _fit(net: Any, x: np.ndarray, y: np.ndarray, epochs: int, lr: float, kl: bool) -> None:
    """Adam with a cosine schedule, batch 64, seed 0: the ELBO (cross-entropy + KL / N) or, ``kl`` off (MC dropout),
    cross-entropy."""
    import torch

    generator = torch.Generator().manual_seed(0)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, epochs * -(-len(x) // 64)))
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=generator).split(64):
            out = net(xt[idx])
            loss = (torch.nn.functional.cross_entropy(out[0], yt[idx]) + out[1] / len(x) if kl
                    else torch.nn.functional.cross_entropy(out, yt[idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
    net.eval()


def trained(name: str, quick: bool, cache: Path | None) -> Any:
    """The IR of model ``name`` trained as the module docstring says (from ``cache`` when there)."""
    epochs = EPOCHS[name][1 if quick else 0]
    path = None if cache is None else cache / f"anytime-{name}-e{epochs}.ebnn"
    if path is not None and path.exists():
        return edgebnn.load(path)
    import torch

    from edgebnn.data import digits

    torch.manual_seed(0)
    data = digits(0)
    x, y = upsample(data.x_train, SHAPES[name]), data.y_train.astype(np.int64)
    if name == "resnet20":
        import deployed_size

        bnn = deployed_size.trained_resnet(3, epochs, None)
    elif name == "bt":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
        from deploy_bayesian_torch import build_model
        from deploy_bayesian_torch import train as fit

        model, _ = build_model((1, 8, 8), 10)
        with contextlib.redirect_stdout(io.StringIO()):  # its per-epoch lines
            fit(model, x, y, epochs=epochs, batch=64, lr=1e-2, seed=0)
        bnn = edgebnn.from_torch(model, SHAPES[name], name="bayesian-torch digits CNN")
    elif name == "lenet5":
        net = lenet5()
        _fit(net, x, y, epochs, 3e-3, kl=True)

        class Logits(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.m = inner

            def forward(self, v: Any) -> Any:
                return self.m(v)[0]

        bnn = edgebnn.from_torch(Logits(net), SHAPES[name], name="LeNet-5 (bayesian-torch)")
    else:
        net = _vit()
        _fit(net, x, y, epochs, 2e-3, kl=False)
        bnn = edgebnn.from_torch(net, SHAPES[name], name="ViT (MC dropout)", mc_dropout=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        edgebnn.save(bnn, path)
    return bnn


def session(proto: Any, threads: int) -> Any:
    """An onnxruntime CPU session with ``threads`` intra-op threads and every graph optimisation on."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def predict(sess: Any, x: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's outputs by name on ``x``, 64 rows a call."""
    name = sess.get_inputs()[0].name
    names = [o.name for o in sess.get_outputs()]
    parts = [dict(zip(names, sess.run(None, {name: x[i:i + 64]}), strict=True)) for i in range(0, len(x), 64)]
    return {k: np.concatenate([p[k] for p in parts]) for k in names}


def quality(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    from edgebnn.metrics import ece

    return {"accuracy": float((probs.argmax(1) == y).mean()),
            "nll": float(-np.log(np.maximum(probs[np.arange(len(y)), y], 1e-12)).mean()),
            "ece": float(ece(probs, y))}


def latency(sessions: dict[str, Any], x: np.ndarray, batch: int, rounds: int) -> dict[str, Any]:
    """Per graph, ms per call over the inputs ``x`` fed ``batch`` rows a call (module docstring)."""
    name = next(iter(sessions.values())).get_inputs()[0].name
    feeds = [{name: x[i:i + batch]} for i in range(0, len(x) - batch + 1, batch)]
    for sess in sessions.values():  # warm-up
        for feed in feeds[:3]:
            sess.run(None, feed)
    times = {k: np.zeros((rounds, len(feeds))) for k in sessions}
    for r in range(rounds):
        for j, feed in enumerate(feeds):
            for k, sess in sessions.items():
                t0 = time.perf_counter()
                sess.run(None, feed)
                times[k][r, j] = time.perf_counter() - t0
    per_input = {k: np.median(t, axis=0) * 1e3 for k, t in times.items()}
    out: dict[str, Any] = {k: {"p50_ms": float(np.median(v)), "mean_ms": float(v.mean())} for k, v in per_input.items()}
    for v in out.values():
        v["ratio_mean"] = v["mean_ms"] / out["S16"]["mean_ms"]
        v["ratio_p50"] = v["p50_ms"] / out["S16"]["p50_ms"]
    return {"calls": len(feeds), "graphs": out}


def run_mode(bnn: Any, mode: str, data: dict[str, np.ndarray], args: argparse.Namespace) -> dict[str, Any]:
    """One model and mode: the exports, their quality, samples used and latency (module docstring)."""
    from edgebnn.exporters.config import ExportConfig, rule_for
    from edgebnn.exporters.export import export_model

    rule = rule_for(bnn)
    counts = sorted({rule.min_samples, 8, 16})
    protos = {"auto": export_model(bnn, ExportConfig("auto", rule=rule, device="cpu", **MODES[mode])).proto}
    protos.update({f"S{s}": export_model(bnn, ExportConfig(s, device="cpu", **MODES[mode])).proto for s in counts})
    sessions = {k: session(p, args.threads) for k, p in protos.items()}
    auto, fixed = predict(sessions["auto"], data["x"]), predict(sessions["S16"], data["x"])
    q_auto, q_fixed = quality(auto["probs"], data["y"]), quality(fixed["probs"], data["y"])
    used = {"in": float(auto["samples"].mean())}
    for k, v in data.items():
        if k.startswith("ood_"):
            used[k[4:]] = float(predict(sessions["auto"], v)["samples"].mean())
    ood = [v for k, v in used.items() if k != "in"]
    rows = data["x"][:args.rows]
    return {"rule": rule.to_dict(), "first_chunk": rule.min_samples,
            "quality": {"auto": q_auto, "S16": q_fixed, "auto_minus_S16": {k: q_auto[k] - q_fixed[k] for k in q_auto}},
            "samples": {**used, "ood_mean": float(np.mean(ood)), "ood_over_in": float(np.mean(ood)) / used["in"],
                        "in_latency_rows": float(predict(sessions["auto"], rows)["samples"].mean())},
            "latency": {f"batch{b}": latency(sessions, rows, b, args.rounds) for b in BATCHES}}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bt,lenet5,resnet20,vit")
    parser.add_argument("--modes", default="baked,noise")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="16 rows, 2 rounds, quick training")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = min(args.rows, 16), min(args.rounds, 2)
    models, modes = args.models.split(","), args.modes.split(",")
    for bad in [m for m in models if m not in SHAPES] + [m for m in modes if m not in MODES]:
        parser.error(f"unknown model or mode {bad!r} (models: {', '.join(SHAPES)}; modes: {', '.join(MODES)})")
    import torch

    from edgebnn.data import digits

    torch.set_num_threads(args.threads)
    t0 = time.time()
    test = digits(0)
    out: dict[str, Any] = {"schema": SCHEMA, "commit": commit(), "edgebnn_version": edgebnn.__version__,
                           "threads": args.threads, "rounds": args.rounds, "rows": args.rows, "quick": args.quick,
                           "models": {}}
    for name in models:
        print(f"[anytime] {name}: training", file=sys.stderr)
        bnn = trained(name, args.quick, args.cache)
        data = {"x": upsample(test.x_test, SHAPES[name]), "y": test.y_test}
        for k, v in analytic_ood.ood_sets(test.x_test.astype(np.float32), 0).items():
            data["ood_" + k] = upsample(v, SHAPES[name])
        out["models"][name] = {}
        for mode in modes:
            print(f"[anytime] {name} {mode}: exports, quality, latency", file=sys.stderr)
            out["models"][name][mode] = run_mode(bnn, mode, data, args)
    out["seconds"] = round(time.time() - t0)
    text = json.dumps(out, sort_keys=True)
    print(text)
    if args.json is not None:
        from edgebnn._io import atomic_write_json

        atomic_write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
