"""Would entropy coding make the ``.ebnn`` smaller? zlib, LZMA and the order-0 entropy of the stored codes.

The ``.ebnn`` stores each code tensor bit-packed at its width (``edgebnn.ir.encodings.packing``); a device
never parses it (the ONNX export does, and ONNX has no entropy-coded tensors), so only the IR file could be
entropy-coded. This measures what that would buy, per lowered ``.ebnn``:

    file        the .ebnn bytes (``ir.to_bytes``)
    zlib, lzma  the whole file compressed (zlib level 9; LZMA preset 9 | extreme): the gain of compressing the file
    codes       bytes of the integer tensors (packed codes, indices, σ codes, counts) in the file
    codes zlib / codes lzma   the same tensors compressed one by one (what ``_serde`` would do per tensor)
    codes H0    the order-0 entropy bound of the unpacked symbols (Σ -log2 p(symbol) / 8 over each tensor's
                values: what an ideal rANS coder with a per-tensor frequency table reaches, table not counted)

Models: edgebnn's digits CNN trained on sklearn digits (seed 0, ``edgebnn.train.train_bnn``, as the tests train
it), lowered with each scheme (variance-rule bits, seed 0), and ``--resnet`` adds bayesian-torch's ResNet-20 at
the zoo recipe (``bench/deployed_size.py``) lowered with ``fixed``.

Prints one JSON line, then a table. Run from the repository root:

    .venv/bin/python bench/ebnn_entropy.py [--schemes fixed,prune+fixed,codebook,mcq,ternary,binary] [--resnet]
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np

import edgebnn
from edgebnn import ir
from edgebnn.ir.encodings.packing import unpack_uint

SCHEMES = "fixed,prune+fixed,codebook,mcq,ternary,binary"


def lzma_size(data: bytes) -> int:
    return len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))


def entropy_bytes(values: np.ndarray) -> float:
    """Order-0 entropy of ``values`` in bytes: Σ over symbols of -log2 p / 8."""
    if values.size == 0:
        return 0.0
    _, counts = np.unique(values, return_counts=True)
    p = counts / values.size
    return float(-(counts * np.log2(p)).sum() / 8)


def symbols(encoding: Any) -> list[np.ndarray]:
    """The integer symbols an encoding stores packed: mean codes (q / counts / indices) and σ codes."""
    out = []
    for attr in ("q", "counts", "indices", "positive"):  # fixed/ternary, mcq, codebook, binary signs
        value = getattr(encoding, attr, None)
        if isinstance(value, np.ndarray) and value.dtype.kind in "iub":
            out.append(value.reshape(-1).astype(np.int64))
            break
    for attr in ("sigma", "flip"):  # σ codes; binary: flip-probability codes
        code = getattr(encoding, attr, None)
        if code is not None and getattr(code, "bits", 0):
            out.append(unpack_uint(code.codes, code.bits, code.n))
    return out


def measure(name: str, model: Any) -> dict[str, Any]:
    data = ir.to_bytes(model)
    proto = model.proto
    codes = [t for t in proto.graph.initializer if t.data_type not in (1, 10, 11, 16)]  # not float/half/double/bf16
    raw = [t.raw_data if t.HasField("raw_data") else t.SerializeToString() for t in codes]
    h0 = sum(entropy_bytes(s) for w in model.encoded_weights() for s in symbols(w.encoding))
    code_bytes = sum(len(r) for r in raw)
    return {"model": name, "file": len(data), "zlib": len(zlib.compress(data, 9)), "lzma": lzma_size(data),
            "codes": code_bytes, "codes_zlib": sum(len(zlib.compress(r, 9)) for r in raw),
            "codes_lzma": sum(lzma_size(r) for r in raw), "codes_h0": round(h0, 1)}


def digits_cnn() -> Any:
    import torch

    from edgebnn.data import digits
    from edgebnn.models import digits_cnn as build
    from edgebnn.train import train_bnn

    torch.manual_seed(0)
    model = build()
    train_bnn(model, digits(0), seed=0, progress=False)
    return edgebnn.from_torch(model, (1, 1, 8, 8), name="digits_cnn")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemes", default=SCHEMES)
    parser.add_argument("--resnet", action="store_true", help="also bayesian-torch ResNet-20 (zoo recipe), fixed")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    rows = []
    bnn = digits_cnn()
    rows.append(measure("digits_cnn float", bnn))
    rows.extend(measure(f"digits_cnn {scheme}", edgebnn.lower(bnn, scheme)) for scheme in args.schemes.split(","))
    if args.resnet:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from deployed_size import resnet_model

        spec = resnet_model(3, "fixed", 1)
        rows.append(measure("ResNet-20 fixed", spec["lowered"]))
    print(json.dumps({"bench": "ebnn_entropy", "edgebnn_version": edgebnn.__version__, "rows": rows}))
    from rich.console import Console
    from rich.table import Table

    table = Table(title=".ebnn entropy coding (bytes; %: change against the uncompressed bytes)", title_justify="left")
    for col in ("model", "file", "zlib", "lzma", "codes", "codes zlib", "codes lzma", "codes H0"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        def pct(n: float, of: float) -> str:
            return f"{n:,.0f} ({n / of - 1:+.0%})" if of else "-"

        table.add_row(r["model"], f"{r['file']:,}", pct(r["zlib"], r["file"]), pct(r["lzma"], r["file"]),
                      f"{r['codes']:,}", pct(r["codes_zlib"], r["codes"]), pct(r["codes_lzma"], r["codes"]),
                      pct(r["codes_h0"], r["codes"]))
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
