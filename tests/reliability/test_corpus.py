"""The bad-input corpus, through the real command line (``edgebnn.cli:main``).

Every case builds one broken or hostile input in ``tmp_path`` and runs one command on it. The contract
(README, "Commands"): exit status 2; exactly one line, ``error: ...``, naming the file, layer or option at
fault; no traceback; and the directory is left exactly as it was: no output, no temp file, and a previous
artifact at the output path byte-for-byte intact. Pickle payloads must never run: each drops a marker file
if it does.

Cases are grouped as ``ebnn-*`` (a broken .ebnn IR, mostly through ``export``), ``run-*`` (runtime
options and inputs: S, input shapes, exported .onnx files), ``write-*`` (the output cannot be written),
``weights-*`` and ``model-*`` (``lower``: checkpoint files and model factories; need torch).
``tests/integration/test_cli.py`` covers the bad-weight cases that need a trained model; this corpus runs
in seconds from synthetic models.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from hostile import (
    break_writer,
    codebook_cnn,
    digits_shaped,
    edit_export_metadata,
    edit_manifest,
    initializer,
    proto_of,
    set_attribute,
    set_initializer,
    set_manifest_text,
    snapshot,
    varint,
    write,
    zero_byte_codebook,
)
from synthetic import synthetic_cnn, synthetic_linear

from edgebnn import _io, ir
from edgebnn.cli import main
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import float_deterministic, save_onnx
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import EXPORT_KEY
from edgebnn.passes import lower


@dataclass
class Ctx:
    """What a case builder gets: the directory, monkeypatch, and (for lower) a valid weights file."""

    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    request: pytest.FixtureRequest

    @property
    def weights(self) -> Path:
        return self.request.getfixturevalue("digits_weights")

    @property
    def out(self) -> Path:
        return self.tmp / "out.onnx"


@dataclass
class Bad:
    argv: list[str]
    needles: tuple[str, ...]  # each must appear in the one error line
    marker: Path | None = None  # a pickle payload creates it if it ever runs


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Ctx], Bad]
    torch: bool = False
    marks: tuple[Any, ...] = field(default=())


CASES: list[Case] = []


def export_argv(ctx: Ctx, src: Path, *extra: str) -> list[str]:
    return ["export", str(src), "-S", "4", *extra, "-o", str(ctx.out)]


# -- ebnn-*: a broken .ebnn IR, exported ---------------------------------------------------------------

Mutation = Callable[[onnx.ModelProto], "onnx.ModelProto | bytes"]


def ebnn(case_id: str, mutate: Mutation, *needles: str, model: Callable[[], ir.BNNModel] = synthetic_cnn) -> None:
    def build(ctx: Ctx) -> Bad:
        path = write(ctx.tmp / "bad.ebnn", mutate(proto_of(model())))
        return Bad(export_argv(ctx, path), (str(path), *needles))

    CASES.append(Case(case_id, build))


def swap_weight(name: str, shape: tuple[int, ...]) -> Mutation:
    """Replace a GaussianWeight's tensors and ``shape`` attribute consistently, with the wrong shape."""

    def mutate(p: onnx.ModelProto) -> onnx.ModelProto:
        set_initializer(p, f"{name}.mu", np.zeros(shape, np.float32))
        set_initializer(p, f"{name}.sigma", np.full(shape, 0.1, np.float32))
        return set_attribute(p, name, "shape", list(shape))

    return mutate


def poke(name: str, index: tuple[int, ...], value: float) -> Mutation:
    """Set one element of a stored tensor."""

    def mutate(p: onnx.ModelProto) -> onnx.ModelProto:
        arr = onnx.numpy_helper.to_array(initializer(p, name)).copy()
        arr[index] = value
        return set_initializer(p, name, arr)

    return mutate


def dims(name: str, new: list[int]) -> Mutation:
    def mutate(p: onnx.ModelProto) -> onnx.ModelProto:
        t = initializer(p, name)
        del t.dims[:]
        t.dims.extend(new)
        return p

    return mutate


def external(p: onnx.ModelProto) -> onnx.ModelProto:
    t = initializer(p, "fc.weight.mu")
    t.ClearField("raw_data")
    t.data_location = onnx.TensorProto.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", "/etc/passwd"
    return p


def op(i: int, **fields: Any) -> Mutation:
    def mutate(p: onnx.ModelProto) -> onnx.ModelProto:
        for k, v in fields.items():
            setattr(p.graph.node[i], k, v)
        return p

    return mutate


def proto_field(**fields: Any) -> Mutation:
    def mutate(p: onnx.ModelProto) -> onnx.ModelProto:
        for k, v in fields.items():
            setattr(p, k, v)
        return p

    return mutate


def opset(version: int) -> Mutation:
    def mutate(p: onnx.ModelProto) -> onnx.ModelProto:
        next(o for o in p.opset_import if o.domain == "").version = version
        return p

    return mutate


def not_topological(p: onnx.ModelProto) -> onnx.ModelProto:
    first = onnx.NodeProto()
    first.CopyFrom(p.graph.node[0])
    del p.graph.node[0]
    p.graph.node.append(first)
    return p


def weight_feeds_einsum(p: onnx.ModelProto) -> onnx.ModelProto:
    g = p.graph
    g.node[-1].CopyFrom(onnx.helper.make_node("Einsum", ["input", "fc.weight"], ["mm"], equation="bi,oi->bo"))
    g.node.append(onnx.helper.make_node("Add", ["mm", "fc.bias"], ["logits"]))
    return p


def manifest(**changes: Any) -> Mutation:
    return lambda p: edit_manifest(p, lambda m: m.update(changes))


def lowered(scheme: str) -> Callable[[], ir.BNNModel]:
    return lambda: lower(synthetic_cnn(), scheme).model


def packed(values: np.ndarray, bits: int) -> np.ndarray:
    from edgebnn.ir.encodings.packing import pack_uint

    return pack_uint(values, bits)


def bad_sigma_codes(p: onnx.ModelProto) -> onnx.ModelProto:
    """fc.weight's σ code: 3 levels but every 2-bit code says 3."""
    levels = onnx.numpy_helper.to_array(initializer(p, "fc.weight.sigma_levels"))
    set_initializer(p, "fc.weight.sigma_levels", np.resize(levels, 3).astype(np.float32))
    return set_initializer(p, "fc.weight.sigma_codes", packed(np.full(108, 3), 2))


def empty_fixed_with_shape(shape: list[int]) -> Mutation:
    def mutate(p: onnx.ModelProto) -> onnx.ModelProto:
        set_initializer(p, "fc.weight.q", np.zeros(0, np.uint8))
        set_initializer(p, "fc.weight.sigma_codes", np.zeros(0, np.uint8))
        return set_attribute(p, "fc.weight", "shape", shape)

    return mutate


ebnn("ebnn-empty", lambda p: b"", "file is empty")
ebnn("ebnn-truncated", lambda p: p.SerializeToString()[:-700], "not an .ebnn/ONNX file (protobuf parse failed)")
ebnn("ebnn-random-bytes", lambda p: np.random.default_rng(7).bytes(4096), "protobuf parse failed")
ebnn("ebnn-length-prefix-1TiB", lambda p: b"\x3a" + varint(1 << 40) + bytes(64), "protobuf parse failed")
ebnn("ebnn-plain-onnx-no-manifest", lambda p: (p.ClearField("metadata_props"), p)[1], "no edgebnn manifest")
ebnn("ebnn-future-format", manifest(format_version=ir.FORMAT_VERSION + 1, edgebnn_version="9.0"),
     "written by a newer edgebnn (format 2, edgebnn 9.0)")
ebnn("ebnn-manifest-not-json", lambda p: set_manifest_text(p, "{oops"), "manifest is not valid JSON")
ebnn("ebnn-manifest-nested-100k", lambda p: set_manifest_text(p, "[" * 100_000 + "]" * 100_000),
     "manifest is not valid JSON")
ebnn("ebnn-manifest-5000-digit-int", lambda p: set_manifest_text(p, '{"format_version": ' + "9" * 5000 + "}"),
     "manifest is not valid JSON")
ebnn("ebnn-manifest-scheme-null", manifest(scheme=None), "manifest scheme None")
ebnn("ebnn-manifest-classes-bool", manifest(num_classes=True), "manifest num_classes True")
ebnn("ebnn-manifest-lower-config-list", manifest(lower_config=[1]), "manifest lower_config [1] is not an object")
ebnn("ebnn-manifest-classes-vs-graph", manifest(num_classes=7),
     "graph output 'logits' has 3 classes, the manifest says 7")
ebnn("ebnn-manifest-input-vs-graph", manifest(input_shape=[1, 1, 8, 8]), "differs from manifest [1, 8, 8]")
ebnn("ebnn-tensor-vs-shape-attribute", lambda p: set_attribute(p, "conv.weight", "shape", [4, 1, 3, 4]),
     "layer 'conv'", "mu has shape (4, 1, 3, 3), expected (4, 1, 3, 4)")
ebnn("ebnn-sigma-vs-mu-shape", lambda p: set_initializer(p, "fc.weight.sigma", np.ones((3, 6, 6), np.float32)),
     "layer 'fc'", "sigma has shape (3, 6, 6), expected (3, 36)")
ebnn("ebnn-gemm-weight-vs-input", swap_weight("fc.weight", (3, 35)), "layer 'fc'", "its input has 36 features")
ebnn("ebnn-conv-weight-vs-channels", swap_weight("conv.weight", (4, 2, 3, 3)), "layer 'conv'", "input has 1 channels")
ebnn("ebnn-conv-weight-rank", swap_weight("conv.weight", (4, 1, 3)), "layer 'conv'", "rank 3 but its input has rank 4")
ebnn("ebnn-conv-bias-length", swap_weight("conv.bias", (5,)), "layer 'conv'", "does not match 4 output channels")
ebnn("ebnn-nan-sigma", poke("conv.weight.sigma", (0, 0, 1, 1), np.nan), "layer 'conv'", "sigma has NaN or inf")
ebnn("ebnn-inf-sigma", poke("conv.bias.sigma", (2,), np.inf), "layer 'conv'", "sigma has NaN or inf")
ebnn("ebnn-inf-mu", poke("fc.weight.mu", (2, 3), np.inf), "layer 'fc'", "mu has NaN or inf")
ebnn("ebnn-negative-sigma", poke("fc.weight.sigma", (1, 1), -0.1), "layer 'fc'", "sigma has negative values")
ebnn("ebnn-float64-mu", lambda p: set_initializer(p, "fc.weight.mu", np.zeros((3, 36))),
     "layer 'fc'", "mu must be float32, got float64")
ebnn("ebnn-negative-dims", dims("fc.weight.mu", [-3, 36]), "layer 'fc'", "negative dims [-3, 36]")
ebnn("ebnn-declared-size-4TiB", dims("fc.weight.mu", [1 << 20, 1 << 20]), "layer 'fc'",
     "declares [1048576, 1048576] (4398046511104 bytes) but stores 432")
ebnn("ebnn-declared-size-wraps-int64", dims("fc.weight.mu", [4, (1 << 62) + 27]), "layer 'fc'", "but stores 432")
ebnn("ebnn-declared-size-deterministic", dims("bn.scale", [1 << 20, 1 << 20]), "bn.scale",
     "too small for the declared shape")
ebnn("ebnn-shape-attribute-1T-weights", lambda p: set_attribute(p, "fc.weight", "shape", [1 << 20, 1 << 20]),
     "layer 'fc'", "declares 1099511627776 weights", model=zero_byte_codebook)
ebnn("ebnn-shape-attribute-wraps-int64", empty_fixed_with_shape([1 << 32, 1 << 32]), "layer 'fc'",
     "declares 18446744073709551616 weights", model=lowered("fixed"))
ebnn("ebnn-external-data", external, "layer 'fc'", "uses external data")
ebnn("ebnn-unknown-encoding", op(0, op_type="MysteryWeight"), "layer 'conv'", "unknown encoding 'MysteryWeight'")
ebnn("ebnn-unknown-onnx-op", op(-1, op_type="FancyGemm"), "No Op registered for FancyGemm")
ebnn("ebnn-unknown-op-domain", op(-1, domain="com.evil"), "No opset import for domain 'com.evil'")
ebnn("ebnn-weight-feeds-einsum", weight_feeds_einsum, "layer 'fc'", "a sampled weight feeds Einsum",
     model=synthetic_linear)
ebnn("ebnn-ir-version-14", proto_field(ir_version=14), "ir_version 14 > 10")
ebnn("ebnn-opset-12", opset(12), "default opset 12 outside 17-20")
ebnn("ebnn-not-topological", not_topological, "topologically sorted")
ebnn("ebnn-codebook-index-past-k", lambda p: set_initializer(p, "fc.weight.indices", packed(np.full(108, 3), 2)),
     "layer 'fc'", "an index points past the 3 codebook entries", model=codebook_cnn)
ebnn("ebnn-codebook-blend-past-k",
     lambda p: set_initializer(p, "fc.weight.blend_components", np.array([[0, 5]], np.uint8)),
     "layer 'fc'", "a blend component points past the 3 codebook entries", model=codebook_cnn)
ebnn("ebnn-codebook-negative-std", poke("fc.weight.codebook", (1, 1), -1.0), "layer 'fc'", "negative std",
     model=codebook_cnn)
ebnn("ebnn-codebook-outlier-index-past-end",
     lambda p: set_initializer(p, "fc.weight.outlier_index", np.array([500], np.uint16)),
     "layer 'fc'", "outlier_index must be strictly increasing and < 108", model=codebook_cnn)
ebnn("ebnn-codebook-bits-17", lambda p: set_attribute(p, "fc.weight", "bits", 17), "layer 'fc'",
     "attribute 'bits' must be an int in 0..16, got 17", model=codebook_cnn)
ebnn("ebnn-fixed-bits-17", lambda p: set_attribute(p, "fc.weight", "bits", 17), "layer 'fc'",
     "attribute 'bits' must be an int in 2..16, got 17", model=lowered("fixed"))
ebnn("ebnn-fixed-bits-1", lambda p: set_attribute(p, "fc.weight", "bits", 1), "layer 'fc'",
     "attribute 'bits' must be an int in 2..16, got 1", model=lowered("fixed"))
ebnn("ebnn-fixed-scale-nan", lambda p: set_attribute(p, "fc.weight", "scale", float("nan")), "layer 'fc'",
     "attribute 'scale' must be a finite number", model=lowered("fixed"))
ebnn("ebnn-fixed-sigma-code-past-levels", bad_sigma_codes, "layer 'fc'", "sigma codes point past its 3 levels",
     model=lowered("fixed"))
ebnn("ebnn-ternary-code-0b10", lambda p: set_initializer(p, "fc.weight.codes", packed(np.full(108, 2), 2)),
     "layer 'fc'", "codes holds a value outside ±1", model=lowered("ternary"))
ebnn("ebnn-binary-flip-over-half",
     lambda p: set_initializer(p, "fc.weight.flip_levels", np.full(
         initializer(p, "fc.weight.flip_levels").dims[0], 0.9, np.float32)),
     "layer 'fc'", "flip probabilities must be <= 0.5", model=lowered("binary"))
ebnn("ebnn-mcq-samples-per-weight-0", lambda p: set_attribute(p, "fc.weight", "samples_per_weight", 0.0),
     "layer 'fc'", "'samples_per_weight' must be > 0", model=lowered("mcq"))


# -- run-*: runtime options and inputs -----------------------------------------------------------------


def case(case_id: str, *, torch: bool = False, marks: tuple[Any, ...] = ()) -> Callable[[Callable], Callable]:
    def deco(fn: Callable[[Ctx], Bad]) -> Callable[[Ctx], Bad]:
        CASES.append(Case(case_id, fn, torch, marks))
        return fn

    return deco


def saved(ctx: Ctx, model: ir.BNNModel, name: str = "model.ebnn") -> Path:
    return ir.save(model, ctx.tmp / name)


def exported(ctx: Ctx, model: ir.BNNModel, name: str = "model.onnx", samples: int = 4) -> Path:
    return save_onnx(export_model(model, ExportConfig(samples, mode="baked")).proto, ctx.tmp / name)


for samples in ("0", "-3"):
    case(f"run-export-samples-{samples}")(
        lambda ctx, s=samples: Bad(["export", str(saved(ctx, synthetic_cnn())), "-S", s, "-o", str(ctx.out)],
                                   (f"--samples {s}: must be a positive integer",)))


@case("run-export-samples-5000")
def _(ctx: Ctx) -> Bad:
    return Bad(["export", str(saved(ctx, synthetic_cnn())), "-S", "5000", "-o", str(ctx.out)],
               ("--samples 5000: more than 4096",))


@case("run-export-an-onnx-file")
def _(ctx: Ctx) -> Bad:
    src = exported(ctx, synthetic_cnn())
    return Bad(["export", str(src), "-o", str(ctx.tmp / "again.onnx")],
               (str(src), "already an ONNX export; export takes the .ebnn IR"))


@case("run-eval-ebnn-samples-0")
def _(ctx: Ctx) -> Bad:
    return Bad(["eval", str(saved(ctx, digits_shaped())), "-S", "0", "--json", str(ctx.tmp / "e.json")],
               ("--samples 0",))


@case("run-profile-samples-0")
def _(ctx: Ctx) -> Bad:
    return Bad(["profile", str(saved(ctx, synthetic_cnn())), "-S", "0", "--power-meter", "none"], ("--samples 0",))


@case("run-profile-onnx-samples-mismatch")
def _(ctx: Ctx) -> Bad:
    src, onnx_path = saved(ctx, synthetic_cnn()), exported(ctx, synthetic_cnn(), samples=4)
    return Bad(["profile", str(src), "-S", "8", "--onnx", str(onnx_path), "--power-meter", "none"],
               (str(onnx_path), "was exported with S=4"))


@case("run-eval-onnx-wrong-input-shape")
def _(ctx: Ctx) -> Bad:
    src = exported(ctx, synthetic_cnn())
    return Bad(["eval", str(src)], (str(src), "takes inputs (1, 6, 6), digits has (1, 8, 8)"))


@case("run-eval-ebnn-wrong-input-shape")
def _(ctx: Ctx) -> Bad:
    src = saved(ctx, synthetic_cnn())
    return Bad(["eval", str(src), "-S", "2"], (str(src), "takes inputs (1, 6, 6), digits has (1, 8, 8)"))


@case("run-eval-random-bytes-onnx")
def _(ctx: Ctx) -> Bad:
    src = write(ctx.tmp / "random.onnx", np.random.default_rng(3).bytes(2048))
    return Bad(["eval", str(src)], (str(src), "not an ONNX file"))


@case("run-eval-plain-onnx")
def _(ctx: Ctx) -> Bad:
    src = write(ctx.tmp / "plain.onnx", digits_shaped().float_model())
    return Bad(["eval", str(src)], (str(src), "not exported by edgebnn"))


@case("run-eval-float-baseline-onnx")
def _(ctx: Ctx) -> Bad:
    src = save_onnx(float_deterministic(digits_shaped()), ctx.tmp / "float.onnx")
    return Bad(["eval", str(src)], (str(src), "a float baseline graph, not an ensemble"))


@case("run-path-with-markup")
def _(ctx: Ctx) -> Bad:
    path = ctx.tmp / "x[/]y.ebnn"
    return Bad(["inspect", str(path)], (str(path), "no such file"))


@case("run-path-with-emoji-code")
def _(ctx: Ctx) -> Bad:
    path = ctx.tmp / "[bold]model:smile:.ebnn"
    return Bad(["inspect", str(path)], (str(path), "no such file"))


@case("run-eval-missing-file")
def _(ctx: Ctx) -> Bad:
    return Bad(["eval", str(ctx.tmp / "nowhere.onnx")], (str(ctx.tmp / "nowhere.onnx"), "no such file"))


# -- meta-*: an export whose edgebnn.export metadata was tampered with, through every command that reads one --


def _json_edit(edit: Callable[[dict[str, Any]], object]) -> Callable[[str], str]:
    def apply(text: str) -> str:
        meta = json.loads(text)
        out = edit(meta)
        return json.dumps(meta if out is None else out)

    return apply


def _without(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda m: m.pop(key) and None


def _two_entries(p: onnx.ModelProto) -> onnx.ModelProto:
    entry = p.metadata_props.add()
    entry.key, entry.value = EXPORT_KEY, p.metadata_props[0].value
    return p


def _renamed_entry(p: onnx.ModelProto) -> onnx.ModelProto:
    p.metadata_props[0].key = "edgebnn.exprt"
    return p


TAMPERED: dict[str, tuple[Callable[[onnx.ModelProto], onnx.ModelProto], str]] = {
    "list": (lambda p: edit_export_metadata(p, _json_edit(lambda m: [m])), "must be a JSON object, got a list"),
    "no-input-shape": (lambda p: edit_export_metadata(p, _json_edit(_without("input_shape"))), "has no input_shape"),
    "no-mode": (lambda p: edit_export_metadata(p, _json_edit(_without("mode"))), "has no mode"),
    "samples-string": (lambda p: edit_export_metadata(p, _json_edit(lambda m: m.update(samples="4"))),
                       'samples "4" is not a positive integer'),
    "input-shape-strings": (lambda p: edit_export_metadata(p, _json_edit(lambda m: m.update(input_shape=[1, "a"]))),
                            "input_shape [1, \"a\"] is not a list of at least 2 positive integers"),
    "input-shape-vs-graph": (lambda p: edit_export_metadata(p, _json_edit(lambda m: m.update(input_shape=[1, 64]))),
                             "input_shape [1, 64] does not fit the graph input 'input'"),
    "input-name-vs-graph": (lambda p: edit_export_metadata(p, _json_edit(lambda m: m.update(input_name="x"))),
                            "input_name 'x' is not a graph input"),
    "noise-inputs-vs-graph": (lambda p: edit_export_metadata(p, _json_edit(lambda m: m.update(
        noise_inputs=[{"name": "eps", "shape": [-1, 3], "per": "row"}]))), "noise_inputs do not match"),
    "mode-unknown": (lambda p: edit_export_metadata(p, _json_edit(lambda m: m.update(mode="quantum"))),
                     'mode "quantum" is not one of baked'),
    "unknown-field": (lambda p: edit_export_metadata(p, _json_edit(lambda m: m.update(colour="red"))),
                      "unknown field(s) ['colour']"),
    "not-json": (lambda p: edit_export_metadata(p, lambda t: t[:-5]), "metadata is not valid JSON"),
    "nested-100k": (lambda p: edit_export_metadata(p, lambda t: "[" * 100_000 + "]" * 100_000),
                    "metadata is not valid JSON"),
    "duplicate-key": (lambda p: edit_export_metadata(p, lambda t: t[:-1] + ', "mode": "noise"}'),
                      "has the key 'mode' twice"),
    "two-entries": (_two_entries, "2 edgebnn.export metadata entries"),
    "missing-entry": (_renamed_entry, "not exported by edgebnn (no edgebnn.export metadata)"),
}


def tampered_export(ctx: Ctx, kind: str) -> tuple[Path, str]:
    mutate, needle = TAMPERED[kind]
    proto = export_model(digits_shaped(), ExportConfig(4, mode="baked")).proto
    return write(ctx.tmp / "tampered.onnx", mutate(proto)), needle


META_COMMANDS: dict[str, Callable[[Ctx, Path], list[str]]] = {
    "eval": lambda ctx, src: ["eval", str(src), "--json", str(ctx.tmp / "e.json")],
    "inspect": lambda ctx, src: ["inspect", str(src), "--json"],
    "compare": lambda ctx, src: ["compare", str(src), str(saved(ctx, digits_shaped())), "--json",
                                 str(ctx.tmp / "c.json")],
    "calibrate": lambda ctx, src: ["calibrate", str(src), "-o", str(ctx.tmp / "int8.onnx"), "--json",
                                   str(ctx.tmp / "r.json")],
    "profile": lambda ctx, src: ["profile", str(saved(ctx, digits_shaped())), "--onnx", str(src), "-S", "4",
                                 "--power-meter", "none", "--json", str(ctx.tmp / "p.json")],
}
for _command in META_COMMANDS:
    for _kind in TAMPERED:
        @case(f"meta-{_command}-{_kind}")
        def _(ctx: Ctx, command: str = _command, kind: str = _kind) -> Bad:
            src, needle = tampered_export(ctx, kind)
            return Bad(META_COMMANDS[command](ctx, src), (str(src), needle))


# -- data-*: the user's data files (eval, compare, calibrate, lower --eval share one loader) -------------


def data_case(case_id: str, arrays: dict[str, Any] | bytes, *needles: str, command: str = "eval",
              option: str = "--data") -> None:
    """``edgebnn COMMAND model --data bad.npz`` (or ``--ood-data``) on a model that takes digits (1, 8, 8), 10
    classes; ``--json`` and ``--plot`` outputs are requested so that writing any of them would show."""

    def build(ctx: Ctx) -> Bad:
        bad = ctx.tmp / "bad.npz"
        if isinstance(arrays, bytes):
            bad.write_bytes(arrays)
        else:
            np.savez(bad, **arrays, allow_pickle=True)
        model = saved(ctx, digits_shaped())
        if command == "compare":
            argv = ["compare", str(model), str(model), "--null-runs", "19", "--alpha", "0.05", "--data", str(bad)]
        else:
            data = ["--data", "digits", "--ood-data", str(bad)] if option == "--ood-data" else ["--data", str(bad)]
            argv = ["eval", str(model), "-S", "2", *data, "--json", str(ctx.tmp / "e.json"),
                    "--plot", str(ctx.tmp / "e.png")]
        return Bad(argv, (str(bad), *needles))

    CASES.append(Case(case_id, build))


X8 = np.zeros((4, 1, 8, 8), np.float32)
Y4 = np.array([0, 1, 2, 3])
data_case("data-npz-without-x", {"y": Y4}, "no key 'x'")
data_case("data-npz-without-y", {"x": X8}, "no key 'y'")
data_case("data-labels-out-of-range", {"x": X8, "y": np.array([0, 1, 10, 3])}, "['y']",
          "label 10 at row 2 is outside the model's 10 classes")
data_case("data-labels-negative", {"x": X8, "y": np.array([0, -1, 2, 3])}, "label -1 at row 1")
data_case("data-labels-float", {"x": X8, "y": Y4.astype(np.float32)}, "['y']", "must be integer")
data_case("data-labels-count", {"x": X8, "y": Y4[:3]}, "['y']", "expected (4,)")
data_case("data-x-wrong-shape", {"x": np.zeros((4, 8, 8), np.float32), "y": Y4}, "['x']",
          "the model takes (N, 1, 8, 8)")
data_case("data-x-uint8", {"x": X8.astype(np.uint8), "y": Y4}, "['x']", "dtype uint8 is not floating point")
data_case("data-x-nan-pixel", {"x": np.where(np.arange(256).reshape(4, 1, 8, 8) == 77, np.nan, X8), "y": Y4},
          "['x']", "NaN or infinite input at row 1")
data_case("data-x-no-rows", {"x": X8[:0], "y": Y4[:0]}, "['x']", "N >= 1 rows")
data_case("data-empty-file", b"", "empty file")
data_case("data-not-a-zip", b"just some text", "not an .npz file")
data_case("data-pickled-object-array", {"x": np.array([{"a": 1}], dtype=object), "y": Y4[:1]}, "['x']",
          "object arrays need pickle")
data_case("data-compare-labels-out-of-range", {"x": X8, "y": np.array([0, 1, 99, 3])}, "label 99",
          command="compare")
data_case("data-ood-without-x", {"y": Y4}, "no key 'x'", option="--ood-data")
data_case("data-ood-wrong-shape", {"x": np.zeros((4, 1, 6, 6), np.float32)}, "the model takes (N, 1, 8, 8)",
          option="--ood-data")


@case("data-pickle-payload-never-runs")
def _(ctx: Ctx) -> Bad:
    """An .npz whose x.npy member is a pickle (object array) that would drop a marker file if loaded."""
    marker = ctx.tmp / "pwned"
    bad = ctx.tmp / "evil.npz"
    payload = pickle.dumps(OpenMarker(marker), protocol=2)
    header = b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    header += b" " * (63 - len(header)) + b"\n"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("x.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + payload)
        zf.writestr("y.npy", _npy_bytes(Y4[:1]))
    return Bad(["eval", str(saved(ctx, digits_shaped())), "-S", "2", "--data", str(bad)],
               (str(bad), "object arrays need pickle"), marker=marker)


@case("data-npy-shards-missing-labels")
def _(ctx: Ctx) -> Bad:
    folder = ctx.tmp / "shards"
    folder.mkdir()
    np.save(folder / "x_000.npy", X8)
    np.save(folder / "y_000.npy", Y4)
    np.save(folder / "x_001.npy", X8)
    return Bad(["eval", str(saved(ctx, digits_shaped())), "-S", "2", "--data", str(folder)],
               (str(folder / "x_001.npy"), "no labels", "y_001.npy"))


@case("data-split-with-a-file")
def _(ctx: Ctx) -> Bad:
    data = ctx.tmp / "d.npz"
    np.savez(data, x=X8, y=Y4)
    return Bad(["eval", str(saved(ctx, digits_shaped())), "--data", str(data), "--split", "val"],
               ("--split val", "digits only", str(data)))


def _npy_claiming(shape: tuple[int, ...], rows: np.ndarray) -> bytes:
    """A .npy whose header declares ``shape`` but whose data is ``rows`` (fewer bytes): numpy would allocate
    the declared size before finding out."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue() + rows.astype("<f4").tobytes()


@case("data-npy-shard-header-declares-2^40-rows")
def _(ctx: Ctx) -> Bad:
    folder = ctx.tmp / "shards"
    folder.mkdir()
    (folder / "x_000.npy").write_bytes(_npy_claiming((1 << 40, 1, 8, 8), X8))
    np.save(folder / "y_000.npy", Y4)
    return Bad(["eval", str(saved(ctx, digits_shaped())), "-S", "2", "--data", str(folder)],
               (str(folder / "x_000.npy"), "corrupt .npy: the header declares float32", "but 1024 bytes follow it"))


@case("data-npz-member-header-declares-2^40-rows")
def _(ctx: Ctx) -> Bad:
    bad = ctx.tmp / "bad.npz"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("x.npy", _npy_claiming((1 << 40, 1, 8, 8), X8))
        zf.writestr("y.npy", _npy_bytes(Y4))
    return Bad(["eval", str(saved(ctx, digits_shaped())), "-S", "2", "--data", str(bad)],
               (f"{bad}['x']", "corrupt .npy: the header declares float32", "but 1024 bytes follow it"))


@case("data-calibrate-folder-nan")
def _(ctx: Ctx) -> Bad:
    folder = ctx.tmp / "calib"
    folder.mkdir()
    np.save(folder / "a.npy", np.full((2, 1, 8, 8), np.inf, np.float32))
    src = save_onnx(export_model(digits_shaped(), ExportConfig(2, mode="baked")).proto, ctx.tmp / "m.onnx")
    return Bad(["calibrate", str(src), "--data", str(folder), "-o", str(ctx.tmp / "q.onnx")],
               (str(folder / "a.npy"), "NaN or infinite input at row 0"))


def _npy_bytes(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


# -- write-*: the output cannot be written (the previous artifact survives) -----------------------------


def previous(path: Path) -> Path:
    path.write_bytes(b"the previous artifact, which must survive")
    return path


@case("write-export-unwritable-directory")
def _(ctx: Ctx) -> Bad:
    src = saved(ctx, synthetic_cnn())
    previous(ctx.out)

    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    ctx.monkeypatch.setattr(_io.tempfile, "mkstemp", denied)  # root ignores chmod, so deny like the kernel would
    return Bad(export_argv(ctx, src), (str(ctx.out), "cannot write to", "Permission denied"))


@case("write-export-into-proc", marks=(pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="Linux /proc"),))
def _(ctx: Ctx) -> Bad:
    """A directory no one can create files in, for real (root included): the kernel refuses."""
    return Bad(["export", str(saved(ctx, synthetic_cnn())), "-o", "/proc/edgebnn-out.onnx"],
               ("/proc/edgebnn-out.onnx", "cannot write to /proc"))


@case("write-export-parent-is-a-file")
def _(ctx: Ctx) -> Bad:
    src = saved(ctx, synthetic_cnn())
    blocker = write(ctx.tmp / "file.txt", b"not a directory")
    return Bad(["export", str(src), "-o", str(blocker / "out.onnx")],
               (f"-o {blocker / 'out.onnx'}", f"directory {blocker} does not exist"))


@case("write-export-disk-full")
def _(ctx: Ctx) -> Bad:
    src = saved(ctx, synthetic_cnn())
    previous(ctx.out)
    break_writer(ctx.monkeypatch, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    return Bad(export_argv(ctx, src), (str(ctx.out), "write failed: No space left on device"))


@case("write-eval-json-disk-full")
def _(ctx: Ctx) -> Bad:
    src = saved(ctx, digits_shaped())
    report = previous(ctx.tmp / "eval.json")
    break_writer(ctx.monkeypatch, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    return Bad(["eval", str(src), "-S", "2", "--json", str(report)], (str(report), "No space left on device"))


@case("write-eval-json-missing-directory")
def _(ctx: Ctx) -> Bad:
    src = saved(ctx, digits_shaped())
    report = ctx.tmp / "nodir" / "eval.json"
    return Bad(["eval", str(src), "-S", "2", "--json", str(report)], (str(report), "does not exist"))


@case("write-inspect-plot-missing-directory")
def _(ctx: Ctx) -> Bad:
    src = saved(ctx, synthetic_cnn())
    plot = ctx.tmp / "nodir" / "layers.png"
    return Bad(["inspect", str(src), "--plot", str(plot)], (str(plot),))


# -- weights-* and model-*: lower (torch) --------------------------------------------------------------


@pytest.fixture(scope="session")
def digits_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained digits_cnn state_dict (seed 0) as .safetensors: valid, so only the broken part fails."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from edgebnn.models import digits_cnn

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "digits_cnn.safetensors"
    save_file({k: v.contiguous() for k, v in digits_cnn().state_dict().items()}, str(path))
    return path


def lower_argv(ctx: Ctx, weights: Path | str, *extra: str, model: str = "edgebnn.models:digits_cnn") -> list[str]:
    return ["lower", "--model", model, "--weights", str(weights), "--input-shape", "1,1,8,8", *extra,
            "-o", str(ctx.tmp / "out.ebnn")]


def weights_case(case_id: str, make: Callable[[Ctx, Path], None], *needles: str, name: str = "w.pt",
                 marker: bool = False) -> None:
    """``make(ctx, path)`` writes the weights file; the line names it (and, for bad values, the parameter by its
    state_dict key)."""

    def build(ctx: Ctx) -> Bad:
        path = ctx.tmp / name
        make(ctx, path)
        return Bad(lower_argv(ctx, path), (str(path), *needles),
                   ctx.tmp / "PWNED" if marker else None)

    CASES.append(Case(case_id, build, torch=True))


def state(ctx: Ctx) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(ctx.weights))


def safetensors_parts(ctx: Ctx) -> tuple[dict[str, Any], bytes]:
    data = ctx.weights.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def safetensors_with_header(header: dict[str, Any], body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def huge_offsets(ctx: Ctx, path: Path) -> None:
    header, body = safetensors_parts(ctx)
    entry = header["fc1.weight_mu"]
    entry["shape"] = [1 << 20, 1 << 20]
    entry["data_offsets"][1] = entry["data_offsets"][0] + 4 * (1 << 40)
    path.write_bytes(safetensors_with_header(header, body))


def torch_save(obj: Any, path: Path) -> None:
    import torch

    torch.save(obj, str(path))


def truncated_pt(ctx: Ctx, path: Path) -> None:
    torch_save(state(ctx), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def storage_declares_256gib(ctx: Ctx, path: Path) -> None:
    """A zip checkpoint whose pickle declares a 2**38-byte storage while the file holds 12 bytes."""
    import torch

    small = ctx.tmp / "small.pt"
    torch.save({"fc1.weight_mu": torch.arange(3, dtype=torch.float32)}, str(small))
    n = (1 << 38).to_bytes(5, "little")
    with zipfile.ZipFile(small) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                fixed = data.replace(b"cpuq\x06K\x03t", b"cpuq\x06\x8a\x05" + n + b"t")
                assert fixed != data, "torch changed its pickle layout; update this builder"
                data = fixed.replace(b"K\x00K\x03\x85", b"K\x00\x8a\x05" + n + b"\x85")
            dst.writestr(info, data)
    small.unlink()


class OpenMarker:
    """Unpickling this opens (creates) the marker file: the side effect that must never happen."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


class ExecMarker(OpenMarker):
    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def nan_rho(ctx: Ctx, path: Path) -> None:
    s = state(ctx)
    s["conv1.weight_rho"][0, 0, 0, 0] = float("nan")
    torch_save(s, path)


def inf_mu(ctx: Ctx, path: Path) -> None:
    from safetensors.torch import save_file

    s = state(ctx)
    s["fc1.weight_mu"][3, 3] = float("inf")
    save_file(s, str(path))


def missing_key(ctx: Ctx, path: Path) -> None:
    s = state(ctx)
    del s["fc2.bias_rho"]
    torch_save(s, path)


weights_case("weights-empty-pth", lambda ctx, p: p.write_bytes(b""), "file is empty", name="w.pth")
weights_case("weights-random-safetensors", lambda ctx, p: p.write_bytes(np.random.default_rng(5).bytes(512)),
             "not a valid safetensors file", name="w.safetensors")
weights_case("weights-safetensors-header-2^60-bytes",
             lambda ctx, p: p.write_bytes(struct.pack("<Q", 1 << 60) + ctx.weights.read_bytes()[8:]),
             "not a valid safetensors file", "header too large", name="w.safetensors")
weights_case("weights-safetensors-tensor-past-eof", huge_offsets, "not a valid safetensors file",
             "invalid offset", name="w.safetensors")
weights_case("weights-safetensors-header-not-json",
             lambda ctx, p: p.write_bytes(safetensors_with_header({}, b"")[:8] + b"{not json"),
             "not a valid safetensors file", name="w.safetensors")
weights_case("weights-truncated-pt", truncated_pt, "not a readable torch checkpoint")
weights_case("weights-pt-storage-declares-256GiB", storage_declares_256gib, "not a readable torch checkpoint")
weights_case("weights-pickle-payload-zip",
             lambda ctx, p: torch_save({"state_dict": {"fc1.weight_mu": OpenMarker(ctx.tmp / "PWNED")}}, p),
             "refused: the checkpoint holds pickled objects", marker=True)
weights_case("weights-pickle-payload-raw",
             lambda ctx, p: p.write_bytes(pickle.dumps(ExecMarker(ctx.tmp / "PWNED"), protocol=4)),
             "weights_only load", name="w.pth", marker=True)
weights_case("weights-not-a-state-dict", lambda ctx, p: torch_save([1, 2, 3], p),
             "expected a state_dict of tensors, got list")
weights_case("weights-nan-rho", nan_rho, "parameter conv1.weight_rho has 1 NaN or infinite value(s)")
weights_case("weights-inf-mu", inf_mu, "parameter fc1.weight_mu has 1 NaN or infinite value(s)", name="w.safetensors")
weights_case("weights-missing-key", missing_key, "does not match the model: missing fc2.bias_rho")




def factory_weights(ctx: Ctx, factory: str) -> Path:
    import hostile_factories
    from safetensors.torch import save_file

    path = ctx.tmp / f"{factory}.safetensors"
    model = getattr(hostile_factories, factory)()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@case("model-unknown-bayesian-layer", torch=True)
def _(ctx: Ctx) -> Bad:
    w = factory_weights(ctx, "unknown_bayes")
    return Bad(lower_argv(ctx, w, model="hostile_factories:unknown_bayes"),
               ("layer '1'", "MysteryBayesLinear", "Bayesian-looking parameters"))


@case("model-no-bayesian-layers", torch=True)
def _(ctx: Ctx) -> Bad:
    w = factory_weights(ctx, "no_bayes")
    return Bad(lower_argv(ctx, w, model="hostile_factories:no_bayes"),
               ("hostile_factories:no_bayes", "no Bayesian layers found"))


@case("model-factory-calls-sys-exit", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, model="hostile_factories:calls_exit"),
               ("--model hostile_factories:calls_exit", "the factory raised SystemExit"))


@case("model-module-raises-on-import", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, model="hostile_broken_module:build"),
               ("--model hostile_broken_module:build", "raised RuntimeError: this module is broken on purpose"))


@case("model-unknown-scheme", torch=True, marks=(pytest.mark.slow,))  # the whole import runs first
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--scheme", "nope"), ("--scheme nope", "unknown scheme 'nope'"))


@case("model-bits-99", torch=True, marks=(pytest.mark.slow,))  # the whole import runs first
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--scheme", "fixed", "--bits", "99"), ("bits=99",))


@case("model-set-without-value", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--set", "noise_fraction"),
               ("--set noise_fraction: expected KEY=VALUE",))


@case("model-set-option-of-another-scheme", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--scheme", "fixed", "--set", "options.clusters=4"),
               ("--set options.clusters=4", "unknown option(s) ['clusters']"))


@case("model-set-overrides-not-json", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--set", "overrides=[{pattern: fc*}]"),
               ("--set overrides=[{pattern: fc*}]", "must be a list of objects"))


@case("model-budget-malformed", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--eval", "digits", "--budget", "nll"),
               ("--budget nll", "expected METRIC=CHANGE"))


@case("model-budget-unknown-metric", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--eval", "digits", "--budget", "nll=+0.02,loss=0.1"),
               ("--budget nll=+0.02,loss=0.1", "unknown metric 'loss'"))


@case("model-budget-not-a-number", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--eval", "digits", "--budget", "ece=nan"),
               ("--budget ece=nan", "not a finite number"))


@case("model-budget-without-eval", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--budget", "nll=+0.02"), ("--budget nll=+0.02", "add --eval DATA"))


@case("model-budget-auroc-without-ood", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--eval", "digits", "--budget", "auroc=-0.01"),
               ("--budget auroc=-0.01", "add --ood-data"))


@case("model-config-missing-file", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--config", str(ctx.tmp / "cfg.json")),
               (str(ctx.tmp / "cfg.json"), "no such file"))


@case("model-config-not-json", torch=True)
def _(ctx: Ctx) -> Bad:
    cfg = write(ctx.tmp / "cfg.json", b"{oops")
    return Bad(lower_argv(ctx, ctx.weights, "--config", str(cfg)), (str(cfg), "not a JSON lowering config"))


@case("model-config-unknown-key", torch=True)
def _(ctx: Ctx) -> Bad:
    cfg = write(ctx.tmp / "cfg.json", b'{"scheme": "fixed", "bitz": 3}')
    return Bad(lower_argv(ctx, ctx.weights, "--config", str(cfg)), (str(cfg), "unknown key(s) ['bitz']"))


@case("model-config-ebnn-without-config", torch=True)
def _(ctx: Ctx) -> Bad:
    src = saved(ctx, digits_shaped())
    return Bad(lower_argv(ctx, ctx.weights, "--config", str(src)), (str(src), "stores no lowering config"))


@case("model-config-ebnn-tampered-config", torch=True)
def _(ctx: Ctx) -> Bad:
    src = write(ctx.tmp / "lowered.ebnn", edit_manifest(proto_of(lower(digits_shaped(), "fixed").model),
                                                        lambda m: m["lower_config"].update(seed="zero")))
    return Bad(lower_argv(ctx, ctx.weights, "--config", str(src)), (str(src), "lower_config", "seed='zero'"))


@case("model-config-ebnn-lowered-with-arrays", torch=True)
def _(ctx: Ctx) -> Bad:
    scales = {"fc.weight": (np.ones(64, np.float32), np.full(64, 0.01, np.float32))}
    src = saved(ctx, lower(digits_shaped(), "prune+fixed", group_scales=scales).model)
    return Bad(lower_argv(ctx, ctx.weights, "--config", str(src)), (str(src), "group_scales arrays"))


@case("model-input-shape-zero", torch=True)
def _(ctx: Ctx) -> Bad:
    return Bad(lower_argv(ctx, ctx.weights, "--input-shape", "0,1,8,8"), ("--input-shape 0,1,8,8",))


@case("write-lower-disk-full", torch=True, marks=(pytest.mark.slow,))
def _(ctx: Ctx) -> Bad:
    out = previous(ctx.tmp / "out.ebnn")
    break_writer(ctx.monkeypatch, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    return Bad(lower_argv(ctx, ctx.weights), (str(out), "write failed: No space left on device"))


# -- the test --------------------------------------------------------------------------------------------


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``edgebnn ARGV`` in this process."""
    result = CliRunner().invoke(main, argv)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # an escaped exception is a traceback for a user: show it here
    return result.exit_code, result.stdout, result.stderr


def test_corpus_is_large_and_ids_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 30


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(case: Case, tmp_path, monkeypatch, request):
    if case.torch:
        pytest.importorskip("torch")
    bad = case.build(Ctx(tmp_path, monkeypatch, request))
    before = snapshot(tmp_path)
    code, stdout, stderr = run_cli(bad.argv)
    lines = stderr.strip().splitlines()
    assert code == 2, stdout + stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stdout + stderr
    for needle in bad.needles:
        assert needle in lines[0], (needle, lines[0])
    assert snapshot(tmp_path) == before, "a file was written, left behind or changed"
    if bad.marker is not None:
        assert not bad.marker.exists(), "the pickle payload ran"


def test_session_refuses_wrong_input_shape_and_dtype(tmp_path):
    """The same contract in Python: Session.predict names the file and the shape it wants."""
    from edgebnn.runtime import Session

    path = save_onnx(export_model(synthetic_cnn(), ExportConfig(2, mode="baked")).proto, tmp_path / "m.onnx")
    sess = Session(path)
    for x, needle in [(np.zeros((2, 1, 8, 8), np.float32), "takes (batch, 1, 6, 6)"),
                      (np.zeros((1, 6, 6), np.float32), "input has shape (1, 6, 6)"),
                      (np.zeros((2, 1, 6, 6), np.int64), "not floating point"),
                      (np.zeros((0, 1, 6, 6), np.float32), "empty batch")]:
        with pytest.raises(InvalidOptionError, match=re.escape(needle)) as e:
            sess.predict(x)
        assert str(path) in str(e.value)
