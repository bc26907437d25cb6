"""Deployed bytes: what every export of a lowered BNN costs the device, and what it keeps (issue 20's table).

Two models, each imported with ``edgebnn.from_torch``:

- **bayesian-torch digits CNN**: ``dnn_to_bnn`` CNN trained on sklearn digits exactly as ``bench/budget.py``
  and ``examples/deploy_bayesian_torch.py`` build and train it, lowered with ``lower_within_budget`` (default
  ``--budget nll=+0.05,ece=+0.01,accuracy=-0.005`` on the digits validation split, S = 16, seed 0). Metrics on
  the held-out test split.
- **ResNet-20** at the zoo's recipe (``tests/integration/test_zoo.py``): bayesian-torch's
  ``resnet_variational.resnet20``, batch-norm statistics from 3 random batches, posterior σ spread per weight
  over [0.1, 0.6] x the layer's weight-mean std (seed 2), no training data (no download at run time): its
  "test set" is ``--resnet-rows`` random 3x32x32 inputs labelled with the float export's argmax, so its accuracy
  is top-1 agreement with the float export (an untrained net's predictive is nearly flat: it barely tells the
  exports apart). ``--resnet-epochs N`` trains it instead (ELBO, as the example trains, N epochs) on digits
  upsampled to 3x32x32 and evaluates on the digits test split, which gives the accuracy and calibration
  columns a meaning. Lowered with ``--resnet-scheme`` (the variance rule, ``fixed``; a budget search over a
  ResNet with the reference runtime takes hours here); ``--resnet-blocks 1`` gives ResNet-8
  (bayesian-torch's widths are fixed) for a quick run.

For each model, the exports of the lowered IR: every ``mode x weights`` the exporter knows
(``edgebnn.exporters.MODES`` x ``WEIGHT_FORMATS``; int8/int4 both at ``form=auto`` (what ``export --device cpu``
writes) and ``form=qdq`` (codes in the file)); ``shared`` exports a codebook lowering with shared draws of the
same float BNN. A combination the exporter refuses is printed as ``refused: <reason>``. ``--export-opt KEY=VALUE``
(repeatable, JSON values) passes extra keyword arguments to every export (an option an export does not take makes
that row a refusal), so new modes and options are measured as they arrive.

Per export: file bytes (``edgebnn.exporters.sizes.deployed_bytes``) and its breakdown, ratio = fp32 BNN bytes
(μ and σ of every Bayesian weight in fp32) / file bytes, graph inputs (self-contained: one), whether a plain
onnxruntime session runs it on the data alone, dNLL / dECE / accuracy change against the float export (the float
BNN baked in fp32 at the same S and seed), and batch-1 latency on onnxruntime CPU (one thread, median of
``--runs``, through ``edgebnn.Session``, which fills any noise inputs). The summary names the smallest
self-contained export within dNLL <= 0.05, dECE <= 0.01, accuracy >= -0.015 (issue 20's goal) and the baked
int4 S = 16 ratio.

Prints one JSON line, then a table per model. Run from the repository root:

    .venv/bin/python bench/deployed_size.py [--models digits,resnet20] [--samples 16] [--runs 20]
        [--resnet-blocks 3] [--resnet-rows 64 | --resnet-epochs 3] [--export-opt KEY=VALUE ...]
        [--json out.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import edgebnn
from edgebnn._io import atomic_write_json
from edgebnn.errors import EdgeBNNError
from edgebnn.exporters import MODES, WEIGHT_FORMATS

GOAL = {"nll": 0.05, "ece": 0.01, "accuracy": -0.015}  # issue 20: within these of the float export
BUDGET = "nll=+0.05,ece=+0.01,accuracy=-0.005"


# -- models ------------------------------------------------------------------------------------------------


def digits_model(budget: str, epochs: int) -> dict[str, Any]:
    """The bayesian-torch digits CNN, its budget lowering, a shared-codebook lowering, and the test split."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from budget import bayesian_torch_cnn

    from edgebnn.api import lower_within_budget
    from edgebnn.data import digits
    from edgebnn.passes import LowerConfig

    bnn = edgebnn.from_torch(bayesian_torch_cnn(epochs), (1, 1, 8, 8), name="bayesian-torch digits CNN")
    lowered = lower_within_budget(bnn, LowerConfig(), budget)
    data = digits(0)
    return {"name": "bayesian-torch digits CNN", "float": bnn, "lowered": lowered,
            "lowering": f"lower --budget {budget} (met: {lowered.lowering_report['budget']['met']})",
            "data": (data.x_test.astype(np.float32), data.y_test)}


def digits32(x: np.ndarray) -> np.ndarray:
    """Digits (N, 1, 8, 8) as CIFAR-shaped inputs: bilinear upsampling to 32 x 32, the channel repeated 3 times."""
    import torch

    up = torch.nn.functional.interpolate(torch.from_numpy(x.astype(np.float32)), size=(32, 32), mode="bilinear")
    return up.repeat(1, 3, 1, 1).numpy()


def resnet_model(blocks: int, scheme: str, rows: int, epochs: int = 0) -> dict[str, Any]:
    """bayesian-torch's ResNet (3 blocks per stage: ResNet-20), lowered with ``scheme``: at the zoo test's recipe
    (``epochs`` 0), or trained for ``epochs`` on digits upsampled to 3x32x32 (ELBO, as the example trains)."""
    import torch
    from bayesian_torch.models.bayesian import resnet_variational as lib

    torch.manual_seed(0)
    model = lib.ResNet(lib.BasicBlock, [blocks] * 3)
    name = f"ResNet-{6 * blocks + 2} (bayesian-torch"
    if epochs > 0:
        import contextlib
        import io

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
        from deploy_bayesian_torch import train

        from edgebnn.data import digits

        data = digits(0)
        with contextlib.redirect_stdout(io.StringIO()):
            train(model, digits32(data.x_train), data.y_train, epochs=epochs, batch=64, lr=1e-2, seed=0)
        bnn = edgebnn.from_torch(model, (1, 3, 32, 32), name=name)
        return {"name": f"{name}, {epochs} epochs on digits 3x32x32)", "float": bnn,
                "lowered": edgebnn.lower(bnn, scheme), "lowering": f"lower --scheme {scheme}",
                "data": (digits32(data.x_test), data.y_test)}
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in norms:
        m.momentum = None
        m.reset_running_stats()
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(16, 3, 32, 32))
    model.eval()
    gen = torch.Generator().manual_seed(2)
    for module in model.modules():
        own = dict(module.named_parameters(recurse=False))
        mu = own.get("mu_kernel", own.get("mu_weight"))
        if mu is None:
            continue
        scale = float(mu.detach().std())
        for name, param in own.items():
            if name.startswith("rho"):
                sigma = scale * (0.1 + 0.5 * torch.rand(param.shape, generator=gen))
                param.data.copy_(torch.log(torch.expm1(sigma)))
    name += ", zoo recipe)"
    bnn = edgebnn.from_torch(model, (1, 3, 32, 32), name=name)
    lowered = edgebnn.lower(bnn, scheme)
    x = np.random.default_rng(1).standard_normal((rows, 3, 32, 32)).astype(np.float32)
    return {"name": name, "float": bnn, "lowered": lowered, "lowering": f"lower --scheme {scheme}",
            "data": (x, None)}


# -- one export ----------------------------------------------------------------------------------------------


def rows_to_export() -> list[dict[str, Any]]:
    """Every mode x weights (x form for integer weights) the exporter names."""
    return [{"mode": mode, "weights": weights, "form": form} for mode in MODES for weights in WEIGHT_FORMATS
            for form in (("auto",) if weights == "fp32" else ("auto", "qdq"))]


def label(row: dict[str, Any]) -> str:
    form = "" if row["weights"] == "fp32" else f" ({row['form']})"
    return f"{row['mode']} {row['weights']}{form}"


def latency_ms(onnx_bytes: bytes, x1: np.ndarray, runs: int) -> float:
    """Median batch-1 wall time of ``Session.predict`` (one onnxruntime thread), ms."""
    from edgebnn.runtime import Session

    session = Session(onnx_bytes, seed=0, threads=1)
    for _ in range(3):
        session.predict(x1)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.predict(x1)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def runs_on_data_alone(onnx_bytes: bytes, x1: np.ndarray) -> tuple[bool, str | None]:
    """A plain onnxruntime session fed only the data input (no edgebnn, no noise) computes ``probs``."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
        data = sess.get_inputs()[0].name
        probs = sess.run(["probs"], {data: x1})[0]
        return bool(np.isfinite(probs).all()), None
    except Exception as e:  # a missing noise input is the expected failure
        return False, str(e).strip().splitlines()[0][:120]


def metrics(onnx_bytes: bytes, data: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    from edgebnn.api import evaluate_artifact
    from edgebnn.runtime import Session

    ev = evaluate_artifact(Session(onnx_bytes, seed=0, threads=1), data=data, seed=0)
    return {k: float(ev[k]) for k in ("accuracy", "nll", "ece")}


def measure_export(model: Any, row: dict[str, Any], samples: int, extra: dict[str, Any], data: Any,
                   reference: dict[str, float], runs: int) -> dict[str, Any]:
    from edgebnn.exporters.ensemble import export_onnx
    from edgebnn.exporters.sizes import deployed_bytes

    out: dict[str, Any] = {"export": label(row), **row, "samples": samples}
    options = {"weights": row["weights"], "form": row["form"], "device": "cpu", **extra}
    try:
        proto = export_onnx(model, samples, mode=row["mode"], seed=0, **options)
    except (EdgeBNNError, TypeError, ValueError) as e:  # refused, or an option this exporter does not take
        out["refused"] = str(e).strip().splitlines()[0]
        return out
    onnx_bytes = proto.SerializeToString(deterministic=True)
    size = deployed_bytes(onnx_bytes)
    x1 = data[0][:1]
    alone, why = runs_on_data_alone(onnx_bytes, x1)
    m = metrics(onnx_bytes, data)
    out.update(bytes=size.file_bytes, ratio=size.ratio_float_bnn, breakdown=size.breakdown, inputs=len(size.inputs),
               self_contained=size.self_contained, runs_on_data_alone=alone, data_alone_error=why,
               metrics=m, delta={k: m[k] - reference[k] for k in m}, latency_ms_b1=latency_ms(onnx_bytes, x1, runs))
    return out


def within_goal(r: dict[str, Any]) -> bool:
    d = r.get("delta")
    return bool(d) and d["nll"] <= GOAL["nll"] and d["ece"] <= GOAL["ece"] and d["accuracy"] >= GOAL["accuracy"]


def bench_model(spec: dict[str, Any], samples: int, extra: dict[str, Any], runs: int) -> dict[str, Any]:
    from edgebnn.exporters.ensemble import export_onnx
    from edgebnn.passes import float_bnn_bytes

    bnn, lowered = spec["float"], spec["lowered"]
    float_export = export_onnx(bnn, samples, mode="baked", seed=0).SerializeToString(deterministic=True)
    x, y = spec["data"]
    if y is None:  # no labels: the float export's argmax (accuracy = top-1 agreement with it)
        from edgebnn.runtime import Session

        y = Session(float_export, seed=0, threads=1).predict(x).probs.argmax(axis=-1)
    data = (x, y)
    reference = metrics(float_export, data)
    shared = None
    report = lowered.lowering_report
    result: dict[str, Any] = {
        "model": spec["name"], "lowering": spec["lowering"], "samples": samples, "n": len(y),
        "float_bnn_bytes": float_bnn_bytes(bnn), "ir_bytes": int(report["total_bytes"]),
        "ebnn_bytes": int(report["ebnn_bytes"]), "float_export": {"bytes": len(float_export), "metrics": reference},
        "exports": [],
    }
    for row in rows_to_export():
        model = lowered
        if row["mode"] == "shared":  # shared draws need a codebook lowered with sampling=shared
            if shared is None:
                try:
                    shared = edgebnn.lower(bnn, "codebook", sampling="shared")
                except EdgeBNNError as e:
                    shared = e
            if isinstance(shared, EdgeBNNError):
                result["exports"].append({"export": label(row), **row, "refused": f"codebook lowering: {shared}"})
                continue
            model = shared
        r = measure_export(model, row, samples, extra, data, reference, runs)
        if row["mode"] == "shared":
            r["lowering"] = "codebook, sampling=shared"
        result["exports"].append(r)
        print(f"  {spec['name']}: {label(row)}: " + (f"refused ({r['refused'][:80]})" if "refused" in r else
              f"{r['bytes']:,} bytes, {r['ratio']:.2f}x"), file=sys.stderr, flush=True)
    done = [r for r in result["exports"] if "bytes" in r]
    best = min((r for r in done if r["self_contained"] and r["runs_on_data_alone"] and within_goal(r)),
               key=lambda r: r["bytes"], default=None)
    int4 = next((r for r in done if r["mode"] == "baked" and r["weights"] == "int4" and r["form"] == "qdq"), None)
    result["summary"] = {
        "smallest_self_contained_within_goal": None if best is None else {
            "export": best["export"], "bytes": best["bytes"], "ratio": best["ratio"]},
        "baked_int4_qdq_file_over_fp32_bnn": None if int4 is None else int4["bytes"] / result["float_bnn_bytes"],
    }
    return result


# -- output --------------------------------------------------------------------------------------------------


def print_tables(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from edgebnn.tables import fmt_bytes, times_smaller

    console = Console(width=200)
    for m in result["models"]:
        title = (f"{m['model']} · {m['lowering']} · S={m['samples']} · fp32 BNN {fmt_bytes(m['float_bnn_bytes'])}, "
                 f".ebnn {fmt_bytes(m['ebnn_bytes'])}, IR tensors {fmt_bytes(m['ir_bytes'])} · n={m['n']}")
        table = Table(title=title, title_justify="left")
        for col in ("export", "bytes", "ratio", "codes", "tables", "float w.", "graph", "inputs", "data alone",
                    "dNLL", "dECE", "d acc", "ms b1"):
            table.add_column(col, justify="left" if col == "export" else "right")
        refused = [r for r in m["exports"] if "refused" in r]
        for r in m["exports"]:
            if "refused" in r:
                continue
            b, d = r["breakdown"], r["delta"]
            table.add_row(r["export"], fmt_bytes(r["bytes"]), f"{r['ratio']:.2f}x",
                          *(fmt_bytes(b[k]) for k in ("codes", "tables", "float_weights", "graph")),
                          str(r["inputs"]), "yes" if r["runs_on_data_alone"] else "no",
                          f"{d['nll']:+.4f}", f"{d['ece']:+.4f}", f"{d['accuracy']:+.4f}", f"{r['latency_ms_b1']:.2f}")
        console.print(table)
        for r in refused:
            console.print(f"{r['export']}: refused: {r['refused']}", highlight=False, markup=False)
        s = m["summary"]
        best = s["smallest_self_contained_within_goal"]
        console.print("smallest self-contained within dNLL<=0.05, dECE<=0.01, dacc>=-0.015: "
                      + ("none" if best is None else f"{best['export']}: {fmt_bytes(best['bytes'])}, "
                         + times_smaller(m["float_bnn_bytes"], best["bytes"], "fp32 BNN")))
        if s["baked_int4_qdq_file_over_fp32_bnn"] is not None:
            console.print(f"baked int4 (qdq) S={m['samples']}: {s['baked_int4_qdq_file_over_fp32_bnn']:.2f}x "
                          "the fp32 BNN's bytes")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from edgebnn._io import atomic_write

    fig, axes = plt.subplots(1, len(result["models"]), figsize=(6.4 * len(result["models"]), 4.8), squeeze=False)
    for ax, m in zip(axes[0], result["models"], strict=True):
        done = [r for r in m["exports"] if "bytes" in r]
        for r in done:
            ax.scatter(r["ratio"], r["delta"]["nll"], marker="o" if r["self_contained"] else "x",
                       color="#2a7" if within_goal(r) else "#c33")
            ax.annotate(r["export"], (r["ratio"], r["delta"]["nll"]), fontsize=6)
        ax.axhline(GOAL["nll"], color="#999", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("fp32 BNN bytes / file bytes (o: self-contained, x: noise inputs)")
        ax.set_ylabel("dNLL vs the float export")
        ax.set_title(m["model"], fontsize=9)
    fig.suptitle(f"deployed bytes on {platform.machine()} ({platform.processor() or platform.system()})", fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def parse_opts(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--export-opt {item!r}: give KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits,resnet20", help="digits, resnet20 (comma-separated)")
    parser.add_argument("--budget", default=BUDGET, help="digits model: lower --budget")
    parser.add_argument("--epochs", type=int, default=15, help="digits model: training epochs")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--runs", type=int, default=20, help="timed batch-1 runs per export")
    parser.add_argument("--resnet-blocks", type=int, default=3, help="blocks per stage: 3 = ResNet-20, 1 = ResNet-8")
    parser.add_argument("--resnet-rows", type=int, default=64, help="random inputs the ResNet is evaluated on")
    parser.add_argument("--resnet-scheme", default="fixed", help="the ResNet's lowering")
    parser.add_argument("--resnet-epochs", type=int, default=0,
                        help="0: the zoo recipe on random inputs; N: train N epochs on digits upsampled to 3x32x32")
    parser.add_argument("--export-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="extra export_onnx keyword argument for every export (JSON value), repeatable")
    parser.add_argument("--json", type=Path, help="Also write the JSON here.")
    parser.add_argument("--plot", type=Path, help="Ratio against dNLL per export, a PNG.")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    extra = parse_opts(args.export_opt)
    models = []
    for name in args.models.split(","):
        if name == "digits":
            spec = digits_model(args.budget, args.epochs)
        elif name == "resnet20":
            spec = resnet_model(args.resnet_blocks, args.resnet_scheme, args.resnet_rows, args.resnet_epochs)
        else:
            raise SystemExit(f"--models: unknown model {name!r} (digits, resnet20)")
        models.append(bench_model(spec, args.samples, extra, args.runs))
    result = {"bench": "deployed_size", "edgebnn_version": edgebnn.__version__, "samples": args.samples,
              "export_options": extra, "goal": GOAL, "machine": platform.machine(), "models": models}
    print(json.dumps(result))
    if args.json:
        atomic_write_json(args.json, result)
    print_tables(result)
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
