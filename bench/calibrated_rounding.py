"""Calibrated rounding (``edgebnn lower --scheme fixed --bits B --calibrate DATA``, GPTQ) against nearest rounding,
judged on the predictive and its OOD separation, each against the float BNN in the same mode and the same run.

Models:

- **digits CNN** (``edgebnn.models.digits_cnn`` trained as ``bench/uncertainty_fidelity.py`` trains it, seed 0,
  one torch thread), ``fixed`` at 2, 3 and 4 bits; ``baked`` (S = 16, sampling seeds 0, 1, 2 averaged, float and
  lowered sharing each seed) and ``analytic``;
- **ResNet-20** (bayesian-torch, trained 8 epochs on digits upsampled to 3x32x32 as ``bench/deployed_size.py``
  does; ``--cache DIR`` keeps it), ``fixed`` at 3 and 4 bits with one σ per layer (``sigma_bits=0``);
  ``analytic`` only (its S = 16 baked predictive moves by more than the goal between sampling seeds).

Calibration: the first 256 inputs of the digits train split (neither the test split nor the validation split
``--eval`` and ``--budget`` use). Metrics on the digits test split (n = 360): accuracy, NLL, ECE (15 bins), and
the mutual-information AUROC against two OOD sets of 360 images (``flipped``: the test digits mirrored;
``blobs``: smooth Gaussian bumps, no strokes; ``bench/uncertainty_fidelity.py``), upsampled like the inputs for
the ResNet. ``ir_bytes``: the lowered IR's tensor bytes (equal for both roundings: the same grid).

Prints one JSON line (schema ``edgebnn.bench.calibrated_rounding/1``), then a markdown table. Run from the
repository root (about 6 minutes on 2 cores with the ResNet cached, 8 more to train it):

    .venv/bin/python bench/calibrated_rounding.py [--models digits,resnet20] [--cache DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import deployed_size  # bench scripts import each other from this folder
import uncertainty_fidelity as fidelity

import edgebnn
from edgebnn._io import atomic_write_json
from edgebnn.data import digits
from edgebnn.passes import LowerConfig

SCHEMA = "edgebnn.bench.calibrated_rounding/1"
CALIBRATION_INPUTS = 256
METRICS = ("accuracy", "nll", "ece", "auroc_flipped", "auroc_blobs")


def model_specs(names: list[str], cache: Path | None) -> list[dict[str, Any]]:
    """Each model: its float IR, input transform, lowerings (bits, options) and modes."""
    specs = []
    if "digits" in names:
        specs.append({"name": "digits CNN (edgebnn)", "float": fidelity.train_digits(0), "inputs": lambda x: x,
                      "bits": (2, 3, 4), "options": {}, "modes": ("baked", "analytic")})
    if "resnet20" in names:
        specs.append({"name": "ResNet-20 (bayesian-torch, 8 epochs on digits 3x32x32)",
                      "float": deployed_size.trained_resnet(3, 8, cache), "inputs": deployed_size.digits32,
                      "bits": (3, 4), "options": {"sigma_bits": 0}, "modes": ("analytic",)})
    return specs


def run_model(spec: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    """Float, nearest and calibrated rows of one model, every mode, deltas against the float row of the mode."""
    data = digits(0)
    prep = spec["inputs"]
    x, y = prep(data.split("test")[0]), data.split("test")[1]
    ood = {"flipped": prep(np.ascontiguousarray(data.split("test")[0][..., ::-1])),
           "blobs": prep(fidelity.noise_blobs(len(y), 0))}
    bnn = spec["float"]
    grams = edgebnn.api.calibration_grams(bnn, prep(data.split("train")[0][:CALIBRATION_INPUTS]),
                                          limit=CALIBRATION_INPUTS)
    floats = {mode: fidelity.run_mode(bnn, mode, samples, x, y, ood) for mode in spec["modes"]}
    rows = [{"model": spec["name"], "bits": 32, "rounding": "float", "mode": mode, "ir_bytes": None, **m}
            for mode, m in floats.items()]
    for bits in spec["bits"]:
        config = LowerConfig(scheme="fixed", bits=bits, options=spec["options"])
        for rounding, extra in (("nearest", {}), ("gptq", {"grams": grams})):
            lowered = edgebnn.lower(bnn, config, **extra)
            for mode in spec["modes"]:
                m = fidelity.run_mode(lowered, mode, samples, x, y, ood)
                assert isinstance(m, dict), m
                rows.append({"model": spec["name"], "bits": bits, "rounding": rounding, "mode": mode,
                             "ir_bytes": lowered.lowering_report["total_bytes"], **m,
                             "delta": {k: m[k] - floats[mode][k] for k in METRICS}})
            print(f"  {spec['name']}: {bits} bits {rounding}: "
                  + ", ".join(f"{r['mode']} dNLL {r['delta']['nll']:+.4f} dECE {r['delta']['ece']:+.4f}"
                              for r in rows[-len(spec['modes']):]), file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | bits | rounding | mode | IR bytes | acc | NLL | ECE | MI-AUROC flipped / blobs | dNLL | dECE "
             "| d AUROC flipped / blobs |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r.get("delta")
        tail = ("| | | |" if d is None else f"| {d['nll']:+.4f} | {d['ece']:+.4f} | {d['auroc_flipped']:+.3f} / "
                f"{d['auroc_blobs']:+.3f} |")
        lines.append(f"| {r['model'].split(' (')[0]} | {r['bits']} | {r['rounding']} | {r['mode']} | "
                     f"{r['ir_bytes'] or ''} | {r['accuracy']:.4f} | {r['nll']:.4f} | {r['ece']:.4f} | "
                     f"{r['auroc_flipped']:.3f} / {r['auroc_blobs']:.3f} " + tail)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits,resnet20", help="digits, resnet20 (comma-separated)")
    parser.add_argument("--samples", type=int, default=16, help="S of the baked exports")
    parser.add_argument("--cache", type=Path, default=None, help="keep / reuse the trained ResNet's float IR here")
    parser.add_argument("--json", type=Path, help="Also write the JSON here.")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = [r for spec in model_specs(args.models.split(","), args.cache) for r in run_model(spec, args.samples)]
    result = {"schema": SCHEMA, "calibration_inputs": CALIBRATION_INPUTS, "samples": args.samples, "rows": rows,
              "wall_s": round(time.perf_counter() - start, 1)}
    print(json.dumps(result))
    print(markdown(rows))
    if args.json:
        atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
