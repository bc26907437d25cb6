"""The posterior families' deployed bytes: fp32 BNN, the IR, the lowered IR and the exported ONNX, with dNLL.

Models (digits, every seed fixed; training is full-batch and takes seconds):

- deep ensemble: 3 MLPs 64-32-10 (Adam, 60 full-batch steps, seeds 0-2), ``edgebnn.from_torch(members)``;
  exported ``baked`` with S = M = 3;
- SWAG: one MLP 64-32-10 trained with SGD (momentum 0.9, 60 full-batch steps), then K = 5 more steps collecting
  the reference code's running moments and deviations, ``edgebnn.from_swag(scale=0.5)``; exported
  ``noise --noise weight`` with S = 32;
- Laplace: the ensemble's first MLP with laplace-torch's last-layer Kronecker Laplace (prior precision 1, fitted on
  400 training images), ``edgebnn.from_torch(la)``; exported ``noise`` with S = 32 and ``analytic`` (GLM/probit).

Each IR is lowered with ``fixed`` (defaults: the variance rule at f = DEFAULT_NOISE_FRACTION) and exported with the
IR's own stores (``--weights ir``: the lowered codes decoded in the graph). "float" is the same export of the
unlowered IR. Then ``--weights int8|int4`` on the unlowered IRs (re-quantized at export: the baked members per output
channel, SWAG's and Kron's means per channel with their factors fp32) against their ``--weights fp32`` export.
dNLL / dacc: the lowered export against the float export on the digits test split (360 images),
both run by ``Session(seed=0)``: the same host noise for both, so the difference is the lowering's alone.

One JSON line on stdout (schema ``edgebnn.bench.family_stores/1``), a table on stderr. Run from the repo root:

    PYTHONPATH=$PWD .venv/bin/python bench/family_stores.py
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import torch
from torch import nn

import edgebnn
from edgebnn.data import digits
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.sizes import deployed_bytes
from edgebnn.metrics import accuracy, nll
from edgebnn.passes import ebnn_bytes, float_bnn_bytes, lower
from edgebnn.runtime import Session

SAMPLES = 32
K = 5


def mlp(seed: int) -> Any:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def train(net: Any, x: Any, y: Any, opt: Any, steps: int = 60) -> Any:
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net.eval()


def ensemble_ir(x: Any, y: Any, members: int = 3) -> tuple[Any, list[Any]]:
    nets = []
    for seed in range(members):
        net = mlp(seed)
        nets.append(train(net, x, y, torch.optim.Adam(net.parameters(), 1e-2)))
    return edgebnn.from_torch(nets, (1, 1, 8, 8)), nets


def swag_ir(x: Any, y: Any, rank: int = K) -> Any:
    """SGD, then ``rank`` steps collecting the SWAG reference code's running mean, squared mean and deviations."""
    net = mlp(0)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    train(net, x, y, opt)
    net.train()
    params = dict(net.named_parameters())
    mean = {n: torch.zeros_like(p) for n, p in params.items()}
    sq = {n: torch.zeros_like(p) for n, p in params.items()}
    dev: dict[str, list[Any]] = {n: [] for n in params}
    for i in range(rank):
        train(net, x, y, opt, steps=1)
        for n, p in params.items():
            w = p.detach()
            mean[n] = mean[n] * i / (i + 1) + w / (i + 1)
            sq[n] = sq[n] * i / (i + 1) + w**2 / (i + 1)
            dev[n].append((w - mean[n]).reshape(-1))
    stats = {}
    for n in params:
        stats[f"{n}_mean"], stats[f"{n}_sq_mean"] = mean[n], sq[n]
        stats[f"{n}_covariance_sqrt"] = torch.stack(dev[n])
    return edgebnn.from_swag(net.eval(), stats, (1, 1, 8, 8), scale=0.5)


def kron_ir(net: Any, x: Any, y: Any) -> Any:
    import laplace

    la = laplace.Laplace(net, "classification", subset_of_weights="last_layer", hessian_structure="kron",
                         prior_precision=1.0)
    data = torch.utils.data.TensorDataset(x[:400], y[:400])
    la.fit(torch.utils.data.DataLoader(data, batch_size=512))
    return edgebnn.from_torch(la, (1, 1, 8, 8))


def row(family: str, ir: Any, samples: int, mode: str, xt: np.ndarray, yt: np.ndarray, **opts: Any) -> dict[str, Any]:
    low = lower(ir, "fixed", seed=0).model
    out: dict[str, Any] = {"family": family, "mode": mode, "samples": samples, **opts,
                           "fp32_bnn_bytes": float_bnn_bytes(ir), "ir_bytes": ebnn_bytes(ir),
                           "lowered_bytes": ebnn_bytes(low),
                           "kinds": sorted({w.encoding.op_type for w in low.encoded_weights()})}
    preds = {}
    for name, model in (("float", ir), ("lowered", low)):
        proto = export_model(model, ExportConfig(samples, mode=mode, **{"rng": "host", **opts})).proto
        size = deployed_bytes(proto)
        out[f"{name}_onnx_bytes"] = size.file_bytes
        out[f"{name}_breakdown"] = size.breakdown
        preds[name] = Session(proto, seed=0).predict(xt).probs
    out["x_smaller_fp32_bnn"] = out["fp32_bnn_bytes"] / out["lowered_onnx_bytes"]
    out["x_smaller_float_onnx"] = out["float_onnx_bytes"] / out["lowered_onnx_bytes"]
    out["nll_float"] = nll(preds["float"], yt)
    out["dnll"] = nll(preds["lowered"], yt) - out["nll_float"]
    out["dacc"] = accuracy(preds["lowered"], yt) - accuracy(preds["float"], yt)
    out["max_abs_dprobs"] = float(np.abs(preds["lowered"] - preds["float"]).max())
    return out


def requant_row(family: str, ir: Any, samples: int, mode: str, weights: str, xt: np.ndarray, yt: np.ndarray,
                **opts: Any) -> dict[str, Any]:
    """``--weights int8|int4`` on the unlowered IR against its ``--weights fp32`` export (same mode, same noise)."""
    out: dict[str, Any] = {"family": family, "mode": mode, "samples": samples, "weights": weights, **opts,
                           "fp32_bnn_bytes": float_bnn_bytes(ir), "ir_bytes": ebnn_bytes(ir)}
    preds = {}
    for name, w in (("float", "fp32"), ("lowered", weights)):
        proto = export_model(ir, ExportConfig(samples, mode=mode, weights=w, **{"rng": "host", **opts})).proto
        out[f"{name}_onnx_bytes"] = deployed_bytes(proto).file_bytes
        preds[name] = Session(proto, seed=0).predict(xt).probs
    out["lowered_bytes"] = out["ir_bytes"]
    out["x_smaller_fp32_bnn"] = out["fp32_bnn_bytes"] / out["lowered_onnx_bytes"]
    out["dnll"] = nll(preds["lowered"], yt) - nll(preds["float"], yt)
    out["dacc"] = accuracy(preds["lowered"], yt) - accuracy(preds["float"], yt)
    return out


def main() -> None:
    torch.set_num_threads(1)
    data = digits(0)
    x, y = (torch.from_numpy(a) for a in data.split("train"))
    xt, yt = data.split("test")
    ens, nets = ensemble_ir(x, y)
    rows = [row("deep ensemble (M=3)", ens, 3, "baked", xt, yt),
            row(f"SWAG (K={K})", swag_ir(x, y), SAMPLES, "noise", xt, yt, noise="weight")]
    kron = kron_ir(nets[0], x, y)
    rows += [row("Laplace last-layer Kron", kron, SAMPLES, "noise", xt, yt),
             row("Laplace last-layer Kron", kron, SAMPLES, "analytic", xt, yt)]
    swag = swag_ir(x, y)
    for weights in ("int8", "int4"):  # re-quantized at export (no lowering): baked members / noise means
        rows += [requant_row("deep ensemble (M=3)", ens, 3, "baked", weights, xt, yt),
                 requant_row(f"SWAG (K={K})", swag, SAMPLES, "noise", weights, xt, yt, noise="weight"),
                 requant_row("Laplace last-layer Kron", kron, SAMPLES, "noise", weights, xt, yt)]
    print(json.dumps({"schema": "edgebnn.bench.family_stores/1", "rows": rows}))
    head = ("family", "mode", "weights", "fp32 BNN", "IR float", "lowered", "ONNX float", "ONNX lowered", "x fp32",
            "dNLL", "dacc")
    print(" | ".join(head), file=sys.stderr)
    for r in rows:
        cells = (r["family"], r["mode"], r.get("weights", "ir (fixed)"), r["fp32_bnn_bytes"], r["ir_bytes"],
                 r["lowered_bytes"], r["float_onnx_bytes"], r["lowered_onnx_bytes"], f"{r['x_smaller_fp32_bnn']:.2f}",
                 f"{r['dnll']:+.4f}", f"{r['dacc']:+.4f}")
        print(" | ".join(str(v) for v in cells), file=sys.stderr)


if __name__ == "__main__":
    main()
