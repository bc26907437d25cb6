"""Kernel choice for one dense layer's S members on onnxruntime CPU: fp32, int8 MatMulInteger, int4 MatMulNBits.

One Gemm layer (default: the bayesian-torch SCNN's fc1, in 9216, out 128, S=16 members: 75 MB of fp32) in the
three layouts the exporter writes (``edgebnn.exporters.layers``), each as a small hand-built ONNX graph:

- ``sampled``: the input differs per sample (a deeper layer), [B·S, in] sample-major -> [S, B, in] and back;
  fp32 batched MatMul [S, in, out]; int8 MatMulInteger on the DynamicQuantizeLinear'd input (one scale per
  member and output, or one per layer: MCQ counts); int4 as Split -> S MatMulNBits -> Concat;
- ``shared``: the first sampled layer, one input for every sample: the members side by side (N = S·out) in one
  Gemm / MatMulInteger / MatMulNBits;
- ``hoisted``: one 2-D weight [in, out] (a posterior-mean layer): MatMul, MatMulInteger with a per-output scale
  (int8 per channel) or one scale (MCQ counts: ``counts · s`` after the integer MAC), MatMulNBits.

MatMulNBits runs at ``accuracy_level`` 0 (fp32 activation: the folded form's arithmetic) and 4 (activation
rounded to int8 per block of 32 inside the op, int32 sums: what the ``integer`` form writes). Weights are the
exporter's own values (``quantize.rows``, ``nbits_weight``). Every graph's output is checked against numpy on the
same quantized weights first (max error relative to max |y|, in the JSON). Timing: every variant of a (size,
batch) cell interleaved in ``time_blocks`` (ensemble_latency.py's: warm-up, 3 passes), onnxruntime on 2 threads
without spinning; p50 and the ratio to the fp32 variant of the same layout. Run from the repository root:

    .venv/bin/python bench/layer_kernels.py [--sizes 9216x128,2304x128,400x120] [--batches 1,32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgebnn._io import atomic_write_json
from edgebnn.exporters._graph import CONTRIB
from edgebnn.exporters.quantize import INT4_BLOCK, blocks, dequantize_blocks, nbits_weight, rows
from edgebnn.targets.profiler import latency_stats
from edgebnn.targets.runners import OrtRunner

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ensemble_latency import THREADS, machine_info, time_blocks

SCHEMA = "edgebnn.bench.layer_kernels/1"
LAYOUTS = ("sampled", "shared", "hoisted")


class Graph:
    """Nodes and constants of one small graph x [rows, in] -> y [rows', out]."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits[name] = np.ascontiguousarray(value)
        return name

    def add(self, op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def model(self, n_in: int, n_out: int) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                       ["rows", n_in])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n_out])],
                                  [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(CONTRIB, 1)])

    def integer(self, x: str, w_oi: np.ndarray, per_layer: bool, p: str) -> str:
        """DynamicQuantizeLinear -> MatMulInteger(int8 w) -> Cast -> · (s_x · scale): the exporter's int8 form
        (onnxruntime fuses it into DynamicQuantizeMatMul). ``w_oi`` [..., out, in]; ``per_layer``: one scale (MCQ
        counts), else one per output."""
        flat = w_oi.reshape(-1, w_oi.shape[-1])
        q, scale = rows(flat, step=float(np.abs(flat).max() / 127) if per_layer else None)
        q = q.reshape(w_oi.shape).swapaxes(-1, -2)  # [..., in, out]
        scale = scale[:1] if per_layer else scale.reshape(*w_oi.shape[:-2], 1, w_oi.shape[-2])
        self.nodes.append(helper.make_node("DynamicQuantizeLinear", [x], [p + "xq", p + "xs", p + "xz"]))
        acc = self.add("MatMulInteger", [p + "xq", self.const(p + "Wq", q), p + "xz"], p + "acc")
        scales = self.add("Mul", [p + "xs", self.const(p + "ws", scale.astype(np.float32))], p + "scales")
        return self.add("Mul", [self.add("Cast", [acc], p + "accf", to=TensorProto.FLOAT), scales], p + "xw")

    def nbits(self, x: str, w_io: np.ndarray, level: int, p: str) -> str:
        packed, scales = nbits_weight(w_io)
        return self.add("MatMulNBits", [x, self.const(p + "B", packed), self.const(p + "s", scales)], p + "xw",
                        domain=CONTRIB, K=w_io.shape[0], N=w_io.shape[1], bits=4, block_size=INT4_BLOCK,
                        accuracy_level=level)


def _int8_values(w_oi: np.ndarray, per_layer: bool) -> np.ndarray:
    flat = w_oi.reshape(-1, w_oi.shape[-1])
    q, scale = rows(flat, step=float(np.abs(flat).max() / 127) if per_layer else None)
    return (q.astype(np.float32) * scale[:, None]).reshape(w_oi.shape)


def _integer_2d(g: Graph, w2: np.ndarray, per_layer: bool) -> str:
    return g.integer("x", w2.T, per_layer, "i/")


def _nbits_2d(g: Graph, w2: np.ndarray, level: int) -> str:
    return g.nbits("x", w2, level, "m/")


def layer_variants(w: np.ndarray) -> dict[str, tuple[onnx.ModelProto, str, np.ndarray]]:
    """name -> (graph, layout, the weights it computes with as [S, in, out] (hoisted: [1, in, out]))."""
    samples, n_in, n_out = w.shape
    w4 = np.stack([dequantize_blocks(*blocks(m)) for m in w])
    w_oi = w.transpose(0, 2, 1)
    out: dict[str, tuple[onnx.ModelProto, str, np.ndarray]] = {}

    def sampled(name: str, core: Callable[[Graph, str], str], values: np.ndarray) -> None:
        g = Graph()
        x = g.add("Reshape", ["x", g.const("in_shape", np.array([-1, samples, n_in]))], "x3")
        y = core(g, g.add("Transpose", [x], "xt", perm=[1, 0, 2]))  # [S, B, in]
        y = g.add("Transpose", [y], "y3", perm=[1, 0, 2])
        g.add("Reshape", [y, g.const("out_shape", np.array([-1, n_out]))], "y")
        out["sampled_" + name] = (g.model(n_in, n_out), "sampled", values)

    def split_nbits(level: int) -> Callable[[Graph, str], str]:
        def core(g: Graph, xt: str) -> str:
            xs = [f"x{s}_" for s in range(samples)]
            g.nodes.append(helper.make_node("Split", [xt, g.const("split", np.ones(samples, np.int64))], xs, axis=0))
            return g.add("Concat", [g.nbits(xs[s], w[s], level, f"m{s}/") for s in range(samples)], "yt", axis=0)
        return core

    sampled("fp32", lambda g, xt: g.add("MatMul", [xt, g.const("W", w)], "yt"), w)
    for per_layer, name in ((False, "int8_per_channel"), (True, "int8_per_layer")):
        sampled(name, partial(Graph.integer, w_oi=w_oi, per_layer=per_layer, p="i/"),
                _int8_values(w_oi, per_layer).transpose(0, 2, 1))
    for level in (0, 4):
        sampled(f"int4_nbits_level{level}", split_nbits(level), w4)

    def two_d(layout: str, name: str, w2: np.ndarray, build: Callable[[Graph, np.ndarray], str],
              values: np.ndarray) -> None:
        """A layer on the B input rows with one 2-D weight ``w2`` [in, n] (n = S·out side by side, or out)."""
        g = Graph()
        g.add("Reshape", [build(g, w2), g.const("out_shape", np.array([-1, n_out]))], "y")
        out[f"{layout}_{name}"] = (g.model(n_in, n_out), layout, values.reshape(n_in, -1, n_out).transpose(1, 0, 2))

    def fp32(g: Graph, w2: np.ndarray) -> str:
        return g.add("Gemm", ["x", g.const("W", w2.T)], "xw", transB=1)

    wide = w.transpose(1, 0, 2).reshape(n_in, samples * n_out)  # [in, S·out]: member s at columns s·out..
    for layout, w2 in (("shared", wide), ("hoisted", w[0])):
        two_d(layout, "fp32", w2, fp32, w2)
        for per_layer, name in ((False, "int8_per_channel"), (True, "int8_per_layer")):
            two_d(layout, name, w2, partial(_integer_2d, per_layer=per_layer), _int8_values(w2.T, per_layer).T)
        for level in (0, 4):
            two_d(layout, f"int4_nbits_level{level}", w2, partial(_nbits_2d, level=level),
                  dequantize_blocks(*blocks(w2)))
    return out


def reference(x: np.ndarray, layout: str, values: np.ndarray) -> np.ndarray:
    """What the layer computes, in float64, on the weights it stores."""
    if layout == "sampled":
        samples = values.shape[0]
        return np.einsum("bsk,skn->bsn", x.reshape(-1, samples, x.shape[1]), values).reshape(-1, values.shape[2])
    return np.einsum("bk,skn->bsn", x.astype(np.float64), values).reshape(-1, values.shape[2])


def bench_size(n_in: int, n_out: int, samples: int, batches: list[int], seed: int, budget_s: float,
               min_runs: int, max_runs: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    w = (rng.normal(size=(samples, n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
    variants = layer_variants(w)
    cells = []
    for batch in batches:
        print(f"layer {n_in}x{n_out} S={samples} batch {batch}", file=sys.stderr)
        x_shared = rng.normal(size=(batch, n_in)).astype(np.float32)
        feeds = {"sampled": rng.normal(size=(batch * samples, n_in)).astype(np.float32), "shared": x_shared,
                 "hoisted": x_shared}
        calls, error = {}, {}
        for name, (proto, layout, values) in variants.items():
            fn = OrtRunner(proto, threads=THREADS).bind(feeds[layout])
            ref = reference(feeds[layout], layout, values)
            error[name] = float(np.abs(fn()[0] - ref).max() / np.abs(ref).max())
            calls[name] = fn
        load = os.getloadavg()
        times = time_blocks(calls, budget_s=budget_s, min_runs=min_runs, max_runs=max_runs)
        p50 = {k: latency_stats(v, batch)[0]["p50"] for k, v in times.items()}
        cells.append({
            "in": n_in, "out": n_out, "samples": samples, "batch": batch,
            "fp32_member_mib": round(samples * n_in * n_out * 4 / 2**20, 2),
            "load_average": [round(load[0], 2), round(os.getloadavg()[0], 2)],
            "runs": {k: len(v) for k, v in times.items()},
            "p50_ms": {k: round(v, 4) for k, v in p50.items()},
            "vs_fp32": {k: round(v / p50[k.split("_")[0] + "_fp32"], 3) for k, v in p50.items()},
            "max_rel_error": {k: float(f"{v:.2e}") for k, v in error.items()},
        })
    return cells


def print_cells(cells: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, width=150)
    for cell in cells:
        table = Table(title=f"{cell['in']}x{cell['out']}, S={cell['samples']} ({cell['fp32_member_mib']} MiB fp32 "
                            f"members), batch {cell['batch']}, load {cell['load_average']}")
        for col in ("variant", "p50 ms", "/ fp32 (same layout)", "max rel. error", "runs"):
            table.add_column(col, justify="left" if col == "variant" else "right")
        for k, ms in cell["p50_ms"].items():
            table.add_row(k, f"{ms:.3f}", f"{cell['vs_fp32'][k]:.2f}", f"{cell['max_rel_error'][k]:.1e}",
                          str(cell["runs"][k]))
        console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="9216x128", help="comma-separated INxOUT layer sizes")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=8.0, help="seconds of timed runs per cell")
    parser.add_argument("--min-runs", type=int, default=30)
    parser.add_argument("--max-runs", type=int, default=3000)
    parser.add_argument("--json", default="", help="write the result here too")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    cells = []
    for size in args.sizes.split(","):
        n_in, n_out = (int(v) for v in size.lower().split("x"))
        cells += bench_size(n_in, n_out, args.samples, batches, args.seed, args.budget, args.min_runs,
                            args.max_runs)
    result = {"schema": SCHEMA, "machine": machine_info(), "threads": THREADS, "cells": cells}
    print_cells(cells)
    print(json.dumps(result))
    if args.json:
        atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
