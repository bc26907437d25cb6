"""Deployed bytes: what every export of a lowered BNN costs the device, and what it keeps (issue 20's table).

Two models, each imported with ``edgebnn.from_torch``:

- **bayesian-torch digits CNN**: ``dnn_to_bnn`` CNN trained on sklearn digits exactly as ``bench/budget.py``
  and ``examples/deploy_bayesian_torch.py`` build and train it, lowered with ``lower_within_budget`` (default
  ``--budget nll=+0.05,ece=+0.01,accuracy=-0.005`` on the digits validation split, S = 16, seed 0). Metrics on
  the held-out test split.
- **ResNet-20** (bayesian-torch's ``resnet_variational.resnet20``), by default trained ``--resnet-epochs 8``
  (ELBO, Adam 1e-2 with a cosine decay, batch 64, seed 0; about 2 minutes here, kept in ``--cache DIR``)
  on sklearn digits upsampled to 3x32x32, and evaluated on the digits test split (``--resnet-rows N``: its first
  N), so accuracy and calibration mean something. ``--resnet-epochs 0`` is the zoo test's recipe instead
  (``tests/integration/test_zoo.py``: batch-norm statistics from 3 random batches, σ spread per weight over
  [0.1, 0.6] x the layer's weight-mean std, seed 2) on random 3x32x32 inputs labelled with the float export's
  argmax: an untrained net's predictive is nearly flat, so its deltas barely tell the exports apart (bytes
  only). Lowered with each ``--resnet-lowering`` (a scheme name or a JSON ``LowerConfig``, which may add
  ``"calibrate": N``: round ``fixed``'s means against the first N digits train inputs, as ``edgebnn lower
  --calibrate``); the defaults (:data:`RESNET_LOWERINGS`) are ``fixed`` at 4 bits with one σ per layer
  (``sigma_bits=0``) calibrated on 256 inputs, the same grid rounded to nearest, ``fixed`` at 5 bits, and a
  16-entry (μ, σ) codebook without outliers or blends (one 4-bit index carries both moments). The first lowering
  gets every row, the others the rows that store their own encoding (``noise`` and ``analytic`` with
  ``--weights ir``). A budget search over a ResNet with the reference runtime takes hours here.
  ``--resnet-blocks 1`` gives ResNet-8.

For each model, the exports of the lowered IR: ``baked`` x fp32/int8/int4 (int8/int4 both at ``form=auto``
(what ``export --device cpu`` writes) and ``form=qdq`` (codes in the file)); ``noise``, ``shared`` and
``analytic`` x ``ir`` (the IR's own encoding, the default store) / fp32 / int8 / int4 (re-quantized at export),
``noise`` and ``shared`` with ``--rng graph`` (default: the data is the only input; ``--rng graph,host`` adds
the host-noise rows). ``shared`` exports a codebook lowering with shared draws of the same float BNN. A
combination the exporter refuses is printed as ``refused: <reason>``. ``--export-opt KEY=VALUE`` (repeatable,
JSON values) passes extra keyword arguments to every export (an option an export does not take makes that row
a refusal), so new options are measured as they arrive.

Per export: file bytes (``edgebnn.exporters.sizes.deployed_bytes``) and its breakdown, ratio = fp32 BNN bytes
(μ and σ of every Bayesian weight in fp32, deterministic parameters in fp32) / file bytes, graph inputs
(self-contained: one), whether a plain onnxruntime session runs it on the data alone, dNLL / dECE / accuracy
change against the float export of the same mode (the float BNN exported in fp32 with the same mode, S, seed
and rng; ``shared``: against ``noise``, as shared draws need a codebook), and batch-1 latency on onnxruntime
CPU (one thread, median of ``--runs``, through ``edgebnn.Session``). Each sampled float export is also drawn
with seed 1: its deltas against seed 0 are the Monte Carlo floor of the comparison. The summary names the
smallest self-contained export within dNLL <= 0.05, dECE <= 0.01, accuracy >= -0.015 (issue 20's goal) among
the rows whose float export's floor is itself within the goal (elsewhere a row passes or fails by its draws:
those references are listed), and the baked int4 S = 16 ratio.

Prints one JSON line, then a table per model. Run from the repository root:

    .venv/bin/python bench/deployed_size.py [--models digits,resnet20] [--samples 16] [--runs 20]
        [--cache DIR] [--resnet-blocks 3] [--resnet-epochs 8] [--resnet-rows 0] [--resnet-lowering JSON ...]
        [--rng graph] [--export-opt KEY=VALUE ...] [--json out.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import edgebnn
from edgebnn._io import atomic_write_json
from edgebnn.errors import EdgeBNNError
from edgebnn.exporters import MODES, STORE_CHOICES, WEIGHT_FORMATS
from edgebnn.passes import LowerConfig

GOAL = {"nll": 0.05, "ece": 0.01, "accuracy": -0.015}  # issue 20: within these of the float export
BUDGET = "nll=+0.05,ece=+0.01,accuracy=-0.005"
# the ResNet's default lowerings (one σ per layer: on the trained ResNet-20 the σ code's width changed no analytic
# metric in the 4th decimal): 4-bit fixed point with the means rounded against 256 digits train inputs (GPTQ,
# ``lower --calibrate``); the same grid rounded to nearest; 5-bit fixed point; a 16-entry (μ, σ) codebook (a 4-bit
# index carries both moments) without outliers or blends
RESNET_LOWERINGS = ('{"scheme": "fixed", "bits": 4, "options": {"sigma_bits": 0}, "calibrate": 256}',
                    '{"scheme": "fixed", "bits": 4, "options": {"sigma_bits": 0}}',
                    '{"scheme": "fixed", "bits": 5, "options": {"sigma_bits": 0}}',
                    '{"scheme": "codebook", "options": {"clusters": 16, "max_outlier_fraction": 0.0, "blend_max": 0}}')


# -- models ------------------------------------------------------------------------------------------------


def digits_model(budget: str, epochs: int) -> dict[str, Any]:
    """The bayesian-torch digits CNN, its budget lowering, a shared-codebook lowering, and the test split."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from budget import bayesian_torch_cnn

    from edgebnn.api import lower_within_budget
    from edgebnn.data import digits

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


@dataclass(frozen=True)
class Lowering:
    """A ``--resnet-lowering``: the config, and how many digits train inputs ``fixed`` rounds against (GPTQ,
    ``edgebnn lower --calibrate``; 0: nearest rounding)."""

    config: LowerConfig
    calibrate: int = 0

    def label(self) -> str:
        """``fixed bits=4 sigma_bits=0``: the scheme, forced bits and options of a lowering, for row labels."""
        config = self.config
        parts = [config.scheme] + ([] if config.bits == "auto" else [f"bits={config.bits}"])
        parts += [f"{k}={v}" for k, v in sorted(config.options.items())]
        parts += [f"{o.pattern}:{o.bits if o.scheme is None else f'{o.scheme}/{o.bits}'}" for o in config.overrides]
        return " ".join(parts + ([f"calibrate={self.calibrate}"] if self.calibrate else []))

    def lower(self, bnn: Any, calibration: np.ndarray) -> Any:
        """The lowered IR (the first ``calibrate`` rows of ``calibration`` measure the layer inputs)."""
        if not self.calibrate:
            return edgebnn.lower(bnn, self.config)
        grams = edgebnn.api.calibration_grams(bnn, calibration[:self.calibrate], limit=self.calibrate)
        return edgebnn.lower(bnn, self.config, grams=grams)


def parse_lowering(text: str) -> Lowering:
    """``--resnet-lowering``: a scheme name (``fixed``) or a JSON ``LowerConfig`` (``{"scheme": "fixed", ...}``),
    which may also hold ``"calibrate": N``."""
    if text.strip().startswith("{"):
        raw = json.loads(text)
        calibrate = raw.pop("calibrate", 0) if isinstance(raw, dict) else 0
        return Lowering(LowerConfig.from_dict(raw, "--resnet-lowering"), int(calibrate))
    return Lowering(LowerConfig(scheme=text))


def trained_resnet(blocks: int, epochs: int, cache: Path | None) -> Any:
    """The float IR of bayesian-torch's ResNet trained ``epochs`` on digits upsampled to 3x32x32, from ``cache`` when
    there. ELBO (cross-entropy + KL / n, as the example), Adam from 1e-2 annealed to 0 by a cosine over every step
    (at a constant 1e-2 the test accuracy after the last epoch swung between 48% and 96%), batch 64, seed 0;
    8 epochs of ResNet-20 take about 2 minutes here."""
    path = None if cache is None else cache / f"resnet{6 * blocks + 2}-digits32-cosine-e{epochs}.ebnn"
    if path is not None and path.exists():
        return edgebnn.load(path)
    import torch
    from bayesian_torch.models.bayesian import resnet_variational as lib

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from deploy_bayesian_torch import forward

    from edgebnn.data import digits

    torch.manual_seed(0)
    model = lib.ResNet(lib.BasicBlock, [blocks] * 3)
    data = digits(0)
    x, y = torch.from_numpy(digits32(data.x_train)), torch.from_numpy(data.y_train)
    generator = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * -(-len(x) // 64))
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=generator).split(64):
            out, kl = forward(model, x[idx])
            loss = torch.nn.functional.cross_entropy(out, y[idx]) + kl / len(x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
    model.eval()
    bnn = edgebnn.from_torch(model, (1, 3, 32, 32), name=f"ResNet-{6 * blocks + 2} (bayesian-torch)")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        edgebnn.save(bnn, path)
    return bnn


def resnet_model(blocks: int, scheme: str | Lowering | list[str | Lowering], rows: int, epochs: int = 0,
                 cache: Path | None = None) -> dict[str, Any]:
    """bayesian-torch's ResNet (3 blocks per stage: ResNet-20), lowered with ``scheme`` (several: the first gets
    every row, the others the rows of their own encoding): at the zoo test's recipe (``epochs`` 0, ``rows``
    random inputs), or trained for ``epochs`` on digits upsampled to 3x32x32 (the first ``rows`` of the test
    split; 0: all of it)."""
    import torch
    from bayesian_torch.models.bayesian import resnet_variational as lib

    configs = [parse_lowering(c) if isinstance(c, str) else c for c in (scheme if isinstance(scheme, list)
                                                                        else [scheme])]
    want = max(c.calibrate for c in configs)
    name = f"ResNet-{6 * blocks + 2} (bayesian-torch"
    lowerings = []
    if epochs > 0:
        from edgebnn.data import digits

        bnn = trained_resnet(blocks, epochs, cache)
        data = digits(0)
        n = rows or len(data.y_test)
        calibration = digits32(data.x_train[:want])  # the train split: neither the test rows nor val
        lowerings = [(c.label(), c.lower(bnn, calibration)) for c in configs]
        return {"name": f"{name}, {epochs} epochs on digits 3x32x32)", "float": bnn, "lowerings": lowerings,
                "lowered": lowerings[0][1], "lowering": f"lower {lowerings[0][0]}",
                "data": (digits32(data.x_test[:n]), data.y_test[:n])}
    torch.manual_seed(0)
    model = lib.ResNet(lib.BasicBlock, [blocks] * 3)
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
        for pname, param in own.items():
            if pname.startswith("rho"):
                sigma = scale * (0.1 + 0.5 * torch.rand(param.shape, generator=gen))
                param.data.copy_(torch.log(torch.expm1(sigma)))
    name += ", zoo recipe)"
    bnn = edgebnn.from_torch(model, (1, 3, 32, 32), name=name)
    calibration = np.random.default_rng(3).standard_normal((want, 3, 32, 32)).astype(np.float32)
    lowerings = [(c.label(), c.lower(bnn, calibration)) for c in configs]
    x = np.random.default_rng(1).standard_normal((rows, 3, 32, 32)).astype(np.float32)
    return {"name": name, "float": bnn, "lowerings": lowerings, "lowered": lowerings[0][1],
            "lowering": f"lower {lowerings[0][0]}", "data": (x, None)}


# -- one export ----------------------------------------------------------------------------------------------


DRAWS_AT_RUN_TIME = ("noise", "shared")  # the modes that take --rng


def rows_to_export(rngs: tuple[str, ...] = ("graph",)) -> list[dict[str, Any]]:
    """Every export the exporter names: ``baked`` x fp32/int8/int4 (int8/int4 at ``form=auto`` and ``qdq``; its
    ``ir`` is fp32 draws, the fp32 row); ``noise``/``shared``/``analytic`` x ``ir``/fp32/int8/int4 (the stores),
    ``noise`` and ``shared`` once per ``rngs`` (``graph``: the data is the only input)."""
    return [{"mode": mode, "weights": weights, "form": form, "rng": rng}
            for mode in MODES for weights in (WEIGHT_FORMATS if mode == "baked" else STORE_CHOICES)
            for form in (("auto", "qdq") if mode == "baked" and weights != "fp32" else ("auto",))
            for rng in (rngs if mode in DRAWS_AT_RUN_TIME else ("host",))]


def label(row: dict[str, Any]) -> str:
    form = f" ({row['form']})" if row["mode"] == "baked" and row["weights"] != "fp32" else ""
    rng = f" rng={row['rng']}" if row["mode"] in DRAWS_AT_RUN_TIME else ""
    lowering = f" [{row['lowering']}]" if row.get("lowering") else ""
    return f"{row['mode']} {row['weights']}{form}{rng}{lowering}"


def reference_of(row: dict[str, Any]) -> dict[str, Any]:
    """The float export a row is compared with: the float BNN in the row's mode, fp32, the same S, seed and rng
    (``shared`` draws need a codebook, so its float twin is ``noise``: independent draws of the float BNN)."""
    mode = "noise" if row["mode"] == "shared" else row["mode"]
    return {"mode": mode, "weights": "fp32", "form": "auto", "rng": row["rng"] if mode in DRAWS_AT_RUN_TIME
            else "host"}


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


def metrics(onnx_bytes: bytes, data: tuple[np.ndarray, np.ndarray], seed: int = 0) -> dict[str, float]:
    """Accuracy, NLL, ECE of the export on ``data`` (``seed``: the noise ``Session`` draws for noise inputs)."""
    from edgebnn.api import evaluate_artifact
    from edgebnn.runtime import Session

    ev = evaluate_artifact(Session(onnx_bytes, seed=seed, threads=1), data=data, seed=seed)
    return {k: float(ev[k]) for k in ("accuracy", "nll", "ece")}


def export_bytes(model: Any, row: dict[str, Any], samples: int, extra: dict[str, Any], seed: int = 0) -> bytes:
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model

    options = {"weights": row["weights"], "form": row["form"], "rng": row["rng"], "device": "cpu", **extra}
    proto = export_model(model, ExportConfig(samples, mode=row["mode"], seed=seed, **options)).proto
    return bytes(proto.SerializeToString(deterministic=True))


def measure_export(model: Any, row: dict[str, Any], samples: int, extra: dict[str, Any], data: Any,
                   reference: dict[str, Any], runs: int) -> dict[str, Any]:
    from edgebnn.exporters.sizes import deployed_bytes

    out: dict[str, Any] = {"export": label(row), **row, "samples": samples}
    try:
        onnx_bytes = export_bytes(model, row, samples, extra)
    except (EdgeBNNError, TypeError, ValueError) as e:  # refused, or an option this exporter does not take
        out["refused"] = str(e).strip().splitlines()[0]
        return out
    size = deployed_bytes(onnx_bytes)
    x1 = data[0][:1]
    alone, why = runs_on_data_alone(onnx_bytes, x1)
    m = metrics(onnx_bytes, data)
    ref = reference["metrics"]
    out.update(bytes=size.file_bytes, ratio=size.ratio_float_bnn, breakdown=size.breakdown, inputs=len(size.inputs),
               self_contained=size.self_contained, runs_on_data_alone=alone, data_alone_error=why,
               metrics=m, reference=reference["export"], delta={k: m[k] - ref[k] for k in m},
               latency_ms_b1=latency_ms(onnx_bytes, x1, runs))
    return out


def within_goal(r: dict[str, Any]) -> bool:
    d = r.get("delta")
    return bool(d) and d["nll"] <= GOAL["nll"] and d["ece"] <= GOAL["ece"] and d["accuracy"] >= GOAL["accuracy"]


def floor_within_goal(reference: dict[str, Any]) -> bool:
    """Whether the float export's own Monte Carlo floor (seed 1 against seed 0) is within the goal: where it is
    not, a row of that mode passes or fails the goal by its draws."""
    floor = reference.get("seed1_delta")
    return floor is None or within_goal({"delta": {k: abs(v) if k != "accuracy" else -abs(v)
                                                   for k, v in floor.items()}})


def bench_model(spec: dict[str, Any], samples: int, extra: dict[str, Any], runs: int,
                rngs: tuple[str, ...] = ("graph",)) -> dict[str, Any]:
    from edgebnn.exporters.sizes import deployed_bytes
    from edgebnn.passes import float_bnn_bytes

    bnn = spec["float"]
    lowerings = spec.get("lowerings") or [(spec["lowering"], spec["lowered"])]
    x, y = spec["data"]
    if y is None:  # no labels: the float baked export's argmax (accuracy = top-1 agreement with it)
        from edgebnn.runtime import Session

        float_baked = export_bytes(bnn, reference_of({"mode": "baked"}), samples, {})
        y = Session(float_baked, seed=0, threads=1).predict(x).probs.argmax(axis=-1)
    data = (x, y)
    references: dict[str, dict[str, Any]] = {}

    def reference(row: dict[str, Any]) -> dict[str, Any]:
        """The float export of the row's mode (exported and scored once per run)."""
        ref_row = reference_of(row)
        key = label(ref_row)
        if key not in references:
            onnx_bytes = export_bytes(bnn, ref_row, samples, {})
            ref = references[key] = {"export": f"{key} (float BNN)", "bytes": len(onnx_bytes),
                                     "inputs": len(deployed_bytes(onnx_bytes).inputs),
                                     "metrics": metrics(onnx_bytes, data)}
            if ref_row["mode"] != "analytic":  # Monte Carlo floor: the same float export drawn with seed 1
                again = metrics(export_bytes(bnn, ref_row, samples, {}, seed=1), data, seed=1)
                ref["seed1_delta"] = {k: again[k] - ref["metrics"][k] for k in again}
        return references[key]

    shared: Any = None
    report = lowerings[0][1].lowering_report
    result: dict[str, Any] = {
        "model": spec["name"], "lowering": spec["lowering"], "samples": samples, "n": len(y),
        "float_bnn_bytes": float_bnn_bytes(bnn), "ir_bytes": int(report["total_bytes"]),
        "ebnn_bytes": int(report["ebnn_bytes"]), "float_exports": references,
        "lowerings": [{"lowering": name, "ir_bytes": int(low.lowering_report["total_bytes"]),
                       "ebnn_bytes": int(low.lowering_report["ebnn_bytes"])} for name, low in lowerings],
        "exports": [],
    }
    todo: list[tuple[Any, dict[str, Any]]] = [(lowerings[0][1], row) for row in rows_to_export(rngs)]
    for name, low in lowerings[1:]:  # further lowerings: the rows that store their own encoding
        todo += [(low, {**row, "lowering": name}) for row in rows_to_export(rngs)
                 if row["weights"] == "ir" and row["mode"] in ("noise", "analytic")]
    for model, row in todo:
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
            row = {**row, "lowering": "codebook sampling=shared"}
        r = measure_export(model, row, samples, extra, data, reference(row), runs)
        result["exports"].append(r)
        print(f"  {spec['name']}: {label(row)}: " + (f"refused ({r['refused'][:80]})" if "refused" in r else
              f"{r['bytes']:,} bytes, {r['ratio']:.2f}x, dNLL {r['delta']['nll']:+.4f}, "
              f"dECE {r['delta']['ece']:+.4f}, dacc {r['delta']['accuracy']:+.4f}"), file=sys.stderr, flush=True)
    done = [r for r in result["exports"] if "bytes" in r]
    resolved = {ref["export"] for ref in references.values() if floor_within_goal(ref)}
    best = min((r for r in done if r["self_contained"] and r["runs_on_data_alone"] and within_goal(r)
                and r["reference"] in resolved), key=lambda r: r["bytes"], default=None)
    int4 = next((r for r in done if r["mode"] == "baked" and r["weights"] == "int4" and r["form"] == "qdq"), None)
    result["summary"] = {
        "references_below_their_floor": sorted(ref["export"] for ref in references.values()
                                               if ref["export"] not in resolved),
        "smallest_self_contained_within_goal": None if best is None else {
            "export": best["export"], "bytes": best["bytes"], "ratio": best["ratio"], "delta": best["delta"],
            "reference": best["reference"]},
        "baked_int4_qdq_file_over_fp32_bnn": None if int4 is None else int4["bytes"] / result["float_bnn_bytes"],
    }
    return result


# -- output --------------------------------------------------------------------------------------------------


def print_tables(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from edgebnn.tables import fmt_bytes, times_smaller

    console = Console(width=200)
    for m in result["models"]:
        title = (f"{m['model']} · {m['lowering']} · S={m['samples']} · fp32 BNN {fmt_bytes(m['float_bnn_bytes'])}, "
                 f".ebnn {fmt_bytes(m['ebnn_bytes'])}, IR tensors {fmt_bytes(m['ir_bytes'])} · n={m['n']}")
        table = Table(title=escape(title), title_justify="left")
        for col in ("export", "bytes", "ratio", "codes", "tables", "float w.", "graph", "inputs", "data alone",
                    "dNLL", "dECE", "d acc", "ms b1"):
            table.add_column(col, justify="left" if col == "export" else "right")
        refused = [r for r in m["exports"] if "refused" in r]
        for r in m["exports"]:
            if "refused" in r:
                continue
            b, d = r["breakdown"], r["delta"]
            table.add_row(escape(r["export"]), fmt_bytes(r["bytes"]), f"{r['ratio']:.2f}x",
                          *(fmt_bytes(b[k]) for k in ("codes", "tables", "float_weights", "graph")),
                          str(r["inputs"]), "yes" if r["runs_on_data_alone"] else "no",
                          f"{d['nll']:+.4f}", f"{d['ece']:+.4f}", f"{d['accuracy']:+.4f}", f"{r['latency_ms_b1']:.2f}")
        console.print(table)
        for r in refused:
            console.print(f"{r['export']}: refused: {r['refused']}", highlight=False, markup=False)
        for ref in m["float_exports"].values():
            mm = ref["metrics"]
            floor = ref.get("seed1_delta")
            console.print(f"reference {ref['export']}: {fmt_bytes(ref['bytes'])}, {ref['inputs']} inputs, NLL "
                          f"{mm['nll']:.4f}, ECE {mm['ece']:.4f}, accuracy {mm['accuracy']:.4f}"
                          + ("" if floor is None else f"; drawn with seed 1 instead of 0 (Monte Carlo floor): dNLL "
                             f"{floor['nll']:+.4f}, dECE {floor['ece']:+.4f}, d acc {floor['accuracy']:+.4f}"),
                          highlight=False, markup=False)
        s = m["summary"]
        for ref in s["references_below_their_floor"]:
            console.print(f"not judged against the goal: rows compared with {ref}, whose seed-1 draw alone moves "
                          "it by more than the goal", highlight=False, markup=False)
        best = s["smallest_self_contained_within_goal"]
        console.print("smallest self-contained within dNLL<=0.05, dECE<=0.01, dacc>=-0.015: "
                      + ("none" if best is None else f"{best['export']}: {fmt_bytes(best['bytes'])}, "
                         + times_smaller(m["float_bnn_bytes"], best["bytes"], "fp32 BNN")
                         + f" (against {best['reference']})"), highlight=False, markup=False)
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
    parser.add_argument("--resnet-rows", type=int, default=0,
                        help="ResNet test rows: the first N of the digits test split (0: all); untrained: N random "
                        "inputs (0: 64)")
    parser.add_argument("--resnet-lowering", action="append", default=None, metavar="SCHEME|JSON",
                        help=f"the ResNet's lowering (repeatable: the first gets every row, the others their own "
                        f"encoding's rows); default {' and '.join(RESNET_LOWERINGS)}")
    parser.add_argument("--resnet-epochs", type=int, default=8,
                        help="N: train N epochs on digits upsampled to 3x32x32; 0: the zoo recipe on random inputs")
    parser.add_argument("--cache", type=Path, default=None, help="keep / reuse the trained ResNet's float IR here")
    parser.add_argument("--rng", default="graph", help="noise and shared rows: graph, host or both (graph,host)")
    parser.add_argument("--export-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="extra ExportConfig field for every export (JSON value), repeatable")
    parser.add_argument("--json", type=Path, help="Also write the JSON here.")
    parser.add_argument("--plot", type=Path, help="Ratio against dNLL per export, a PNG.")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    extra = parse_opts(args.export_opt)
    rngs = tuple(args.rng.split(","))
    lowerings = [parse_lowering(text) for text in (args.resnet_lowering or RESNET_LOWERINGS)]
    models = []
    for name in args.models.split(","):
        if name == "digits":
            spec = digits_model(args.budget, args.epochs)
        elif name == "resnet20":
            rows = args.resnet_rows or (0 if args.resnet_epochs else 64)
            spec = resnet_model(args.resnet_blocks, lowerings, rows, args.resnet_epochs, args.cache)
        else:
            raise SystemExit(f"--models: unknown model {name!r} (digits, resnet20)")
        models.append(bench_model(spec, args.samples, extra, args.runs, rngs))
    result = {"bench": "deployed_size", "edgebnn_version": edgebnn.__version__, "samples": args.samples,
              "export_options": extra, "rngs": list(rngs), "goal": GOAL, "machine": platform.machine(),
              "models": models}
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
