"""The models issue 43 names, at their size: lowering and export time and memory, bytes, fidelity and latency.

Models (freshly initialised, seed 0; bayesian-torch layers throughout, their σ as the library initialises it):

    resnet18, resnet50  bayesian-torch's ImageNet ``resnet_variational_large`` at 1x3x224x224 (built by
                        ``bench/zoo_scale.py``'s ``resnet_large``; ``--width`` does not apply)
    vit                 a ViT on 3x32x32 (64 patches of 4x4 + a class token; ``nn.TransformerEncoder``, pre-norm,
                        GELU, 6 blocks of width 192, 3 heads) whose MLP blocks are ``LinearReparameterization``
                        (as ``tests/integration/test_transformers.py`` builds its small one)
    unet                a 3-level U-Net on 3x128x128 (``Conv2dReparameterization``, width 32; max-pool down,
                        bilinear up, skip Concat), 4-class segmentation
    tcn                 a TCN on 8x256 (6 residual levels of dilated causal ``Conv1dReparameterization``, 64
                        channels, kernel 3, dilation 1..32; the causal pad's tail sliced off), mean over time,
                        10 classes

``--width W`` scales the ViT's, U-Net's and TCN's channels (0.1 for a quick run). Per model, one JSON line:

    lower        ``lower/float`` in a fresh process (``bench/memory.py``'s stage: load, lower, save): seconds and
                 peak RSS over the process's baseline after imports
    export       per mode (baked, noise, analytic; S = ``--samples``): ``export/float`` in a fresh process (load,
                 ``export_model``, ``save_onnx``): seconds, peak RSS, the bytes written and peak / bytes; a mode
                 the model does not export in gives its one-line reason
    fidelity     per mode, on ``--inputs`` random inputs: max |export's predictive mean - torch's ``--draws``-pass
                 Monte Carlo mean| over every entry, and the Monte Carlo standard deviation of that difference
                 (σ·sqrt(1/S + 1/R), σ one torch draw's spread; analytic, a deterministic value: σ·sqrt(1/R)),
                 its largest over the entries and the mean difference over the mean deviation (about 0.8 when
                 the export is within Monte Carlo error)
    latency      per batch (``--batches``), onnxruntime on the CPU (2 intra-op threads, sequential): p50 ms of
                 ``--rounds`` interleaved rounds of ``--calls`` calls after a warm-up, for ``float`` (the
                 posterior-mean net, one pass), ``det16`` (it on 16·B rows: S deterministic passes batched) and
                 each mode, and each mode's p50 over float's and over det16's

Run from the repository root (one model at a time; resnet50 needs ~8 GB free and tens of minutes on 2 cores)::

    .venv/bin/python bench/scale.py [--models resnet18,resnet50,vit,unet,tcn] [--width 1.0] [--rounds 5]
        [--calls 3] [--samples 16] [--batches 1,8] [--draws 32] [--inputs 4]

Prints one JSON line per model (schema ``edgebnn.bench.scale/1``) on stdout, progress on stderr. Measured:
docs/results/2026-12-07-scale.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import memory  # bench/memory.py: one stage in a fresh process
import numpy as np
from zoo_scale import resnet_large  # bench/zoo_scale.py: the freshly initialised bayesian-torch ResNets

SCHEMA = "edgebnn.bench.scale/1"
MODES = ("baked", "noise", "analytic")


def _scaled(n: int, width: float, multiple: int = 1) -> int:
    return max(multiple, round(n * width / multiple) * multiple)


def _library_forward(model: Any) -> Any:
    """Every bayesian-torch layer returns its output alone (as after ``dnn_to_bnn``), not ``(out, kl)``."""
    for m in model.modules():
        if hasattr(m, "dnn_to_bnn_flag"):
            m.dnn_to_bnn_flag = True
    return model.eval()


def vit(width: float) -> tuple[Any, tuple[int, ...], str | None]:
    import bayesian_torch.layers as bl
    import torch
    from torch import nn

    heads = 3
    d = _scaled(192, width, 2 * heads)

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Linear(48, d)
            self.cls = nn.Parameter(0.02 * torch.randn(1, 1, d))
            self.pos = nn.Parameter(0.02 * torch.randn(1, 65, d))
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                                               norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            for block in self.encoder.layers:
                block.linear1 = bl.LinearReparameterization(d, 4 * d)
                block.linear2 = bl.LinearReparameterization(4 * d, d)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, 10)

        def forward(self, x: Any) -> Any:
            b = x.shape[0]
            p = x.reshape(b, 3, 8, 4, 8, 4).permute(0, 2, 4, 1, 3, 5).reshape(b, 64, 48)
            t = torch.cat([self.cls.expand(b, -1, -1), self.patch(p)], 1) + self.pos
            return self.head(self.norm(self.encoder(t)[:, 0]))

    torch.manual_seed(0)
    return _library_forward(ViT()), (1, 3, 32, 32), None


def unet(width: float) -> tuple[Any, tuple[int, ...], str | None]:
    import bayesian_torch.layers as bl
    import torch
    from torch import nn

    w = _scaled(32, width)

    def conv(i: int, o: int, k: int = 3) -> Any:
        return bl.Conv2dReparameterization(i, o, k, padding=k // 2)

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e1, self.e2, self.e3 = conv(3, w), conv(w, 2 * w), conv(2 * w, 4 * w)
            self.d2, self.d1 = conv(6 * w, 2 * w), conv(3 * w, w)
            self.out = conv(w, 4, 1)

        def forward(self, x: Any) -> Any:
            f = nn.functional
            a = torch.relu(self.e1(x))
            b = torch.relu(self.e2(f.max_pool2d(a, 2)))
            c = torch.relu(self.e3(f.max_pool2d(b, 2)))
            up = f.interpolate(c, scale_factor=2, mode="bilinear", align_corners=False)
            b = torch.relu(self.d2(torch.cat([b, up], 1)))
            up = f.interpolate(b, scale_factor=2, mode="bilinear", align_corners=False)
            return self.out(torch.relu(self.d1(torch.cat([a, up], 1))))

    torch.manual_seed(0)
    return _library_forward(UNet()), (1, 3, 128, 128), "segmentation"


def tcn(width: float) -> tuple[Any, tuple[int, ...], str | None]:
    import bayesian_torch.layers as bl
    import torch
    from torch import nn

    c, k = _scaled(64, width), 3

    class Level(nn.Module):
        def __init__(self, i: int, dilation: int) -> None:
            super().__init__()
            self.pad = (k - 1) * dilation
            self.conv = bl.Conv1dReparameterization(i, c, k, padding=self.pad, dilation=dilation)
            self.skip = nn.Conv1d(i, c, 1) if i != c else None

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.conv(x)[..., :-self.pad])  # causal: the tail the left pad shifted out
            return y + (x if self.skip is None else self.skip(x))

    class TCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.levels = nn.Sequential(*(Level(8 if i == 0 else c, 2 ** i) for i in range(6)))
            self.head = bl.LinearReparameterization(c, 10)

        def forward(self, x: Any) -> Any:
            return self.head(self.levels(x).mean(-1))

    torch.manual_seed(0)
    return _library_forward(TCN()), (1, 8, 256), None


def resnet(name: str) -> Callable[[float], tuple[Any, tuple[int, ...], str | None]]:
    return lambda _width: (resnet_large(name, "variational"), (1, 3, 224, 224), None)


BUILDERS: dict[str, Callable[[float], tuple[Any, tuple[int, ...], str | None]]] = {
    "resnet18": resnet("resnet18"), "resnet50": resnet("resnet50"), "vit": vit, "unet": unet, "tcn": tcn}


# -- stages -----------------------------------------------------------------------------------------------


def _stage(stage: str, workdir: Path, samples: int, mode: str = "baked") -> dict[str, Any]:
    """One ``bench/memory.py`` stage in a fresh process, its numbers trimmed for the row."""
    r = memory.spawn(stage, "float", workdir, samples, 0, mode)
    if "error" in r:
        return {"error": r["error"]}
    out = {"seconds": r["seconds"], "peak_rss": r["peak_rss"], "stage_bytes": r["stage_bytes"],
           "bytes": r["artifact_bytes"]}
    if stage == "export":
        out["peak_over_bytes"] = round(r["peak_rss"] / r["artifact_bytes"], 2)
    return out


def torch_draws(model: Any, x: np.ndarray, draws: int, task: str | None) -> np.ndarray:
    """torch's own Monte Carlo: ``draws`` forward passes (a fresh weight per call), softmax over the classes."""
    import torch

    torch.manual_seed(1)
    with torch.no_grad():
        xt = torch.from_numpy(x)
        out = []
        for _ in range(draws):
            y = model(xt)
            out.append(torch.softmax(y[0] if isinstance(y, tuple) else y, 1).numpy())
    return np.stack(out)


def fidelity(probs: np.ndarray, draws: np.ndarray, samples: int | None) -> dict[str, float]:
    """The export's predictive against torch's R draws (module docstring); ``samples`` None: a deterministic one."""
    sd = draws.std(0) * np.sqrt((1 / samples if samples else 0.0) + 1 / len(draws))
    diff = np.abs(probs - draws.mean(0))
    return {"max_abs_diff": float(diff.max()), "mc_sd_max": float(sd.max()),
            "mean_diff_over_mc_sd": round(float(diff.mean() / sd.mean()), 3)}


def _session(proto: Any) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def p50_ms(calls: dict[str, Callable[[], Any]], rounds: int, per_round: int) -> dict[str, float]:
    """p50 ms per call over interleaved rounds, after one warm-up call each."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for fn in calls.values():
        fn()
    for _ in range(rounds):
        for name, fn in calls.items():
            for _ in range(per_round):
                t = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t) * 1e3)
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def latency(ir: Any, protos: dict[str, Any], shape: tuple[int, ...], samples: int, batches: list[int],
            rounds: int, per_round: int) -> dict[str, Any]:
    sessions = {"float": _session(ir.float_model()), **{m: _session(p) for m, p in protos.items()}}
    name = sessions["float"].get_inputs()[0].name
    out = {}
    for batch in batches:
        x = np.random.default_rng(2).standard_normal((batch, *shape[1:])).astype(np.float32)
        feeds = {k: {s.get_inputs()[0].name: x} for k, s in sessions.items()}
        rep = {name: np.repeat(x, samples, 0)}
        calls: dict[str, Callable[[], Any]] = {k: (lambda s=s, f=feeds[k]: s.run(None, f))
                                              for k, s in sessions.items()}
        calls["det16"] = lambda s=sessions["float"], f=rep: s.run(None, f)
        ms = p50_ms(calls, rounds, per_round)
        out[str(batch)] = {"p50_ms": ms, **{m: {"over_float": round(ms[m] / ms["float"], 3),
                                                "over_det16": round(ms[m] / ms["det16"], 3)} for m in protos}}
    return out


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from edgebnn import ir as ir_io
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.importers import import_model
    from edgebnn.runtime import Session

    model, shape, task = BUILDERS[name](args.width)
    row: dict[str, Any] = {"schema": SCHEMA, "model": name, "input_shape": list(shape), "samples": args.samples,
                           "width": 1.0 if name.startswith("resnet") else args.width}
    t = time.perf_counter()
    ir = import_model(model, shape, where=name, task=task)
    row["import_s"] = round(time.perf_counter() - t, 2)
    row["bayesian_weights"] = int(sum(np.prod(w.encoding.shape) for w in ir.iter_encoded_weights()))
    x = np.random.default_rng(1).standard_normal((args.inputs, *shape[1:])).astype(np.float32)
    draws = torch_draws(model, x, args.draws, task)
    del model
    with tempfile.TemporaryDirectory(prefix="edgebnn-scale-") as tmp:
        ir_io.save(ir, Path(tmp) / "posterior.ebnn")
        row["lower"] = _stage("lower", Path(tmp), args.samples)
        say(f"{name}: lower {row['lower']}")
        row["export"] = {}
        for mode in MODES:
            row["export"][mode] = _stage("export", Path(tmp), args.samples, mode)
            say(f"{name}: export {mode} {row['export'][mode]}")
            for f in Path(tmp).glob("*.onnx*"):
                f.unlink()
    row["fidelity"], protos = {}, {}
    for mode in MODES:
        if "error" in row["export"][mode]:
            continue
        protos[mode] = export_model(ir, ExportConfig(args.samples, mode=mode, seed=0)).proto
        probs = Session(protos[mode], seed=0).predict(x).probs
        row["fidelity"][mode] = fidelity(probs, draws, None if mode == "analytic" else args.samples)
        say(f"{name}: fidelity {mode} {row['fidelity'][mode]}")
    row["latency"] = latency(ir, protos, shape, args.samples, args.batches, args.rounds, args.calls)
    return row


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BUILDERS))
    parser.add_argument("--width", type=float, default=1.0, help="scale of the ViT's, U-Net's and TCN's channels")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3, help="timed calls per graph per round")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[1, 8])
    parser.add_argument("--draws", type=int, default=32, help="torch Monte Carlo passes for the fidelity")
    parser.add_argument("--inputs", type=int, default=4, help="inputs the fidelity is measured on")
    args = parser.parse_args()
    for name in args.models.split(","):
        if name not in BUILDERS:
            sys.exit(f"--models {name}: choose from {', '.join(BUILDERS)}")
        print(json.dumps(run(name, args)), flush=True)


if __name__ == "__main__":
    main()
