"""What a TensorRT target loads: the engine TensorRT for RTX builds from each export, next to the ONNX it compiled.

LeNet-5 and ResNet-20 with a synthetic posterior shaped like the trained digits CNN's (``edgebnn.models``), lowered
``fixed``, exported for ``--device rtx`` at S = 16 in every mode and weight format, each compiled by
:func:`edgebnn.exporters.tensorrt.compile_engine` (no GPU needed). Prints one JSON object and a table: ONNX bytes,
engine bytes, their ratio to the fp32 BNN (μ and σ as float32), build seconds, and what the parsed network holds
(int8/int4 weights behind DequantizeLinear, random fills).

    PYTHONPATH=. .venv/bin/python bench/tensorrt_engines.py [--models lenet5,resnet20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

EXPORTS = [("baked", "fp32", "auto"), ("baked", "int8", "auto"), ("baked", "int4", "auto"),
           ("noise", "fp32", "host"), ("noise", "ir", "host"), ("noise", "ir", "graph"),
           ("analytic", "fp32", "auto"), ("analytic", "ir", "auto")]
SHAPES = {"lenet5": (1, 1, 28, 28), "resnet20": (1, 3, 32, 32)}


def model(name: str) -> Any:
    import torch

    import edgebnn
    from edgebnn.models import FACTORIES, synthetic_posterior

    torch.manual_seed(0)
    return edgebnn.lower(edgebnn.from_torch(synthetic_posterior(FACTORIES[name]()), SHAPES[name]), "fixed")


def run(names: list[str], samples: int) -> dict[str, Any]:
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model
    from edgebnn.exporters.tensorrt import compile_engine, engine_onnx_path
    from edgebnn.passes import float_bnn_bytes

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            ir = model(name)
            fp32_bnn = float_bnn_bytes(ir)
            for mode, weights, rng in EXPORTS:
                engine = Path(tmp) / f"{name}-{mode}-{weights}-{rng}.engine"
                proto = export_model(ir, ExportConfig(samples, mode=mode, weights=weights, device="rtx", rng=rng)).proto
                manifest = compile_engine(proto, engine, "rtx")
                onnx_bytes = engine_onnx_path(engine).stat().st_size
                rows.append({"model": name, "mode": mode, "weights": weights, "rng": rng, "samples": samples,
                             "fp32_bnn_bytes": fp32_bnn, "onnx_bytes": onnx_bytes,
                             "engine_bytes": manifest["engine_bytes"], "build_seconds": manifest["build_seconds"],
                             "self_contained": len(proto.graph.input) == 1,
                             "quantized_weights": manifest["network"]["quantized_weights"],
                             "random_fills": manifest["network"]["random_fills"]})
    import tensorrt_rtx

    return {"builder": f"tensorrt_rtx {tensorrt_rtx.__version__}", "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lenet5,resnet20")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    result = run(args.models.split(","), args.samples)
    print(json.dumps(result))
    print(f"\n{'model':9} {'mode':8} {'weights':7} {'rng':5} {'ONNX':>10} {'engine':>10} {'eng/BNN':>7} "
          f"{'build s':>7}  self-contained")
    for r in result["rows"]:
        print(f"{r['model']:9} {r['mode']:8} {r['weights']:7} {r['rng']:5} {r['onnx_bytes']:>10,} "
              f"{r['engine_bytes']:>10,} {r['engine_bytes'] / r['fp32_bnn_bytes']:>7.2f} {r['build_seconds']:>7.2f}  "
              f"{'yes' if r['self_contained'] else 'no (host noise)'}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
