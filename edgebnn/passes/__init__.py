"""Lowering passes: each takes an IR and returns ``PassResult(ir, modified, report)``.

:func:`lower` is the one entry point: it takes a scheme string (``"codebook"``, ``"prune+mcq"``...) and
options, or a :class:`LowerConfig` (:mod:`edgebnn.passes.config`, per-layer overrides included), builds
each pass's config, runs the passes in order, then :class:`~edgebnn.passes.shrink.ShrinkPass` (units that
are zero in every draw leave the graph; exact, so it is no scheme to choose and runs after every lowering)
and writes the lowering report (docs/design.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import DOMAIN, BNNModel, attrs_of, encoding_class, serialized_size
from edgebnn.passes.base import LayerPass, Pass, PassConfig, PassError, PassResult
from edgebnn.passes.binary import BinaryConfig
from edgebnn.passes.codebook import CodebookConfig
from edgebnn.passes.config import (
    DATA_OPTIONS,
    PASSES,
    SCHEMES,
    LayerOverride,
    LowerConfig,
    build_passes,
    data_fields,
    parse_scheme,
)
from edgebnn.passes.fixed import FixedConfig
from edgebnn.passes.float_ import FloatConfig
from edgebnn.passes.mcq import McqConfig
from edgebnn.passes.prune import PruneConfig
from edgebnn.passes.shrink import ShrinkConfig, ShrinkPass
from edgebnn.passes.ternary import TernaryConfig

_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)

__all__ = [
    "PASSES",
    "SCHEMES",
    "BinaryConfig",
    "CodebookConfig",
    "FixedConfig",
    "FloatConfig",
    "LayerOverride",
    "LayerPass",
    "LowerConfig",
    "McqConfig",
    "Pass",
    "PassConfig",
    "PassError",
    "PassResult",
    "PruneConfig",
    "ShrinkConfig",
    "ShrinkPass",
    "TernaryConfig",
    "ebnn_bytes",
    "float_bnn_bytes",
    "lower",
    "parse_scheme",
]


def float_bnn_bytes(model: BNNModel) -> int:
    """Bytes of the model as an fp32 BNN: μ and σ in fp32 per encoded weight, deterministic floats in fp32 (MC
    dropout: the plain fp32 network, μ only, no masks).

    Computed from shapes only (MC dropout: also which weights have σ = 0), so it is the same before and after
    lowering. Non-float initializers (shape
    constants) count their stored bytes.
    """
    nodes = [n for n in model.proto.graph.node if n.domain == DOMAIN]  # sizes from attributes, nothing decoded
    dims = {t.name: list(t.dims) for t in model.proto.graph.initializer}
    total, plain = 0, False
    for n in nodes:  # each encoding's own count (its class: μ and σ; a deep ensemble's M members; SWAG's K rows)
        cls = encoding_class(n.op_type)
        assert cls is not None  # the model was verified
        attrs = attrs_of(n)
        total += cls.fp32_bytes(attrs, {f: dims.get(i, []) for f, i in zip(cls.FIELDS, n.input, strict=False)})
        plain = plain or cls.PLAIN_REFERENCE
    if plain:  # MC dropout: the fp32 network it came from
        total -= _mc_dropout_excess(model)
    encoding_inputs = {i for n in nodes for i in n.input}
    for t in model.proto.graph.initializer:
        if t.name in encoding_inputs:
            continue
        count = int(np.prod(t.dims, dtype=np.int64))
        if t.data_type in _FLOAT_TYPES:
            total += 4 * count
        else:
            total += len(t.raw_data) if t.HasField("raw_data") else count * helper.tensor_dtype_to_np_dtype(
                t.data_type
            ).itemsize
    return int(total)


def _mc_dropout_excess(model: BNNModel) -> int:
    """What the μ-and-σ count above overstates for an IR whose reference is the plain fp32 network (MC dropout):
    the σ of its plain weights (imported as σ = 0 Gaussians; lowering keeps σ = 0), decoded one layer at a time."""
    excess = 0
    for w in model.iter_encoded_weights():
        if not w.encoding.PLAIN_REFERENCE and not np.any(w.encoding.stddev()):
            excess += 4 * w.encoding.size
    return excess


def ebnn_bytes(model: BNNModel) -> int:
    """Size of the ``.ebnn`` file ``model`` serialises to, without serialising it whole.

    Writes the manifest into ``metadata_props`` exactly as :func:`edgebnn.ir.save` does (so saving later
    writes the same bytes), then counts them (:func:`edgebnn.ir.serialized_size`).
    """
    return serialized_size(model)


def lower(model: BNNModel, scheme: str | LowerConfig, *, seed: int | None = None, bits: str | int | None = None,
          progress: Callable[[int, int], None] | None = None, consume: bool = False, **options: Any) -> PassResult:
    """Lower ``model`` with a scheme (or a whole :class:`LowerConfig`) and report what it cost.

    Args:
        model: A verified IR (not modified, unless ``consume``).
        scheme: ``float``, ``mcq``, ``fixed``, ``codebook``, ``ternary``, ``binary``, ``prune`` or
            ``prune+<scheme>``; or a :class:`LowerConfig` (then give no ``seed``, ``bits`` or settings here:
            the config holds them, per-layer overrides included).
        seed: Seeds every random choice; the same seed gives the same bytes (default 0).
        progress: Called as ``progress(done, total)`` after each weight each pass visits (a progress bar).
        consume: Lower ``model`` in place instead of a copy of it, for a caller that gives the model up: it
            saves a model-sized copy, and ``model`` must not be used afterwards (it is the result, or half
            lowered when ``lower`` raises). The result is the same either way.
        bits: ``"auto"`` (default: bits per layer from the posterior variance) or a forced width, given to the
            last scheme of the composition.
        **options: Fields of the schemes' configs (e.g. ``samples_per_weight=2`` for mcq, ``clusters=16``
            for codebook, ``log_alpha_threshold=3`` for prune); each goes to every pass whose config has it.
            Array-valued ones (``gradients``, ``group_scales``) are data: they go to the passes but not into
            the config the manifest stores.

    Returns:
        ``PassResult(model, modified, report)`` with report keys ``scheme``, ``seed``, ``config`` (the
        config's JSON object, also stored as ``manifest.lower_config``), ``layers`` (one row per weight from
        the last pass that lowered it, see :mod:`edgebnn.passes.base`, with its ``shape`` and the
        ``units_removed`` {``outputs``, ``inputs``} of the ``shrink`` pass), ``shrink`` (its ``edges`` and
        ``skipped`` layers, :mod:`edgebnn.passes.shrink`), ``passes`` (each pass's name, options
        and rows), ``total_bytes`` (``model.nbytes()`` after), ``float_bnn_bytes`` (the fp32 BNN, from the
        input) ``compression_ratio`` (float_bnn_bytes / total_bytes) and ``ebnn_bytes`` (the size of the file
        the model saves to: tensors plus graph, names and manifest).

    Raises:
        InvalidOptionError: Unknown scheme or option, or an option out of range.
        InvalidArtifactError: The input model fails verification.
        PassError: A pass failed unexpectedly.
    """
    config, data = _config_of(scheme, seed, bits, options)
    plans = config.plan(model, data)
    reference = float_bnn_bytes(model)
    previous = model.manifest.scheme
    current, modified, reports = model, False, []
    rows: dict[str, dict[str, Any]] = {}
    passes = [p for plan in plans for p in build_passes(plan, data, restrict=len(plans) > 1)]
    if progress is not None:  # each pass visits every weight once: one tick per (pass, weight)
        tick, done, total = progress, itertools.count(1), len(passes) * len(model.encoded_weight_names())
        for p in passes:
            p.progress = lambda: tick(next(done), total)
    for p in passes:  # the first pass copies the input unless told to consume it; later ones own theirs
        result = p(current, seed=config.seed, consume=consume or current is not model)
        current, modified = result.model, modified or result.modified
        reports.append(result.report)
        rows.update((row["name"], row) for row in result.report["layers"])
    shrunk = ShrinkPass()(current, seed=config.seed, consume=consume or current is not model)
    current, modified = shrunk.model, modified or shrunk.modified
    if shrunk.modified:
        reports.append(shrunk.report)
    _merge_shrink_rows(current, rows, shrunk.report["layers"])
    current.manifest.scheme = config.scheme if previous == "float" else f"{previous}+{config.scheme}"
    current.manifest.lower_config = config.to_dict()
    total = current.nbytes()
    report = {
        "scheme": config.scheme,
        "seed": config.seed,
        "config": config.to_dict(),
        "layers": [rows[name] for name in current.encoded_weight_names() if name in rows],
        "passes": reports,
        "total_bytes": total,
        "float_bnn_bytes": reference,
        "compression_ratio": reference / total if total else None,
        "ebnn_bytes": ebnn_bytes(current),
        "shrink": {"edges": shrunk.report["edges"], "skipped": shrunk.report["skipped"]},
    }
    return PassResult(current, modified, report)


def _merge_shrink_rows(model: BNNModel, rows: dict[str, dict[str, Any]], shrunk: list[dict[str, Any]]) -> None:
    """Give every layer row its ``shape`` and ``units_removed``; a shrunk weight's sizes are measured again."""
    changed = {row["name"]: row for row in shrunk}
    for node in model.proto.graph.node:
        if node.domain != DOMAIN or not node.output or node.output[0] not in rows:
            continue
        name = node.output[0]
        row = rows[name]
        row["shape"] = next(list(a.ints) for a in node.attribute if a.name == "shape")
        row["units_removed"] = changed[name]["units_removed"] if name in changed else {"outputs": 0, "inputs": 0}
        if name in changed:
            enc = model.encoded_weight(name).encoding
            row.update(n_weights=enc.size, bytes=enc.nbytes, bits_per_weight=round(8 * enc.nbytes / enc.size, 4),
                       sparsity=float(np.count_nonzero(enc.mean() == 0) / enc.size))


def _config_of(scheme: str | LowerConfig, seed: int | None, bits: str | int | None, options: dict[str, Any],
               ) -> tuple[LowerConfig, dict[str, Any]]:
    """(the config, the data options) of a ``lower`` call."""
    if "bits" in options:
        raise InvalidOptionError("pass bits as lower(..., bits=N), not as an option")
    data = {k: v for k, v in options.items() if k in DATA_OPTIONS}
    settings = {k: v for k, v in options.items() if k not in DATA_OPTIONS}
    if isinstance(scheme, LowerConfig):
        if seed is not None or bits is not None or settings:
            raise InvalidOptionError("lower(model, config): the config holds seed, bits and options; give them there")
        config = scheme
    else:
        config = LowerConfig(scheme=scheme, bits="auto" if bits is None else bits, seed=0 if seed is None else seed,
                             options=settings)
    unknown = sorted(set(data) - data_fields(config))
    if unknown:
        raise InvalidOptionError(f"--scheme {config.scheme}: unknown option(s) {unknown}; no pass of it takes them")
    return config, data
