"""Lowering passes: each takes an IR and returns ``PassResult(ir, modified, report)``.

:func:`lower` is the one entry point: it parses a scheme string (``"codebook"``, ``"prune+mcq"``...),
builds each pass's config from the options, runs the passes in order and writes the lowering report
(docs/design.md).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import DOMAIN, MANIFEST_KEY, BNNModel
from edgebnn.passes.base import LayerPass, Pass, PassConfig, PassError, PassResult, check_int
from edgebnn.passes.binary import BinaryConfig, BinaryPass
from edgebnn.passes.codebook import CodebookConfig, CodebookPass
from edgebnn.passes.fixed import FixedConfig, FixedPass
from edgebnn.passes.float_ import FloatConfig, FloatPass
from edgebnn.passes.mcq import McqConfig, McqPass
from edgebnn.passes.prune import PruneConfig, PrunePass
from edgebnn.passes.ternary import TernaryConfig, TernaryPass

PASSES: dict[str, type[Pass]] = {
    p.name: p for p in (FloatPass, McqPass, FixedPass, CodebookPass, TernaryPass, BinaryPass, PrunePass)
}
_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)
SCHEMES = ("float", "mcq", "fixed", "codebook", "ternary", "binary", "prune")

__all__ = [
    "PASSES",
    "SCHEMES",
    "BinaryConfig",
    "CodebookConfig",
    "FixedConfig",
    "FloatConfig",
    "LayerPass",
    "McqConfig",
    "Pass",
    "PassConfig",
    "PassError",
    "PassResult",
    "PruneConfig",
    "TernaryConfig",
    "ebnn_bytes",
    "float_bnn_bytes",
    "lower",
    "parse_scheme",
]


def parse_scheme(scheme: str) -> list[str]:
    """Split ``"prune+codebook"`` into pass names, checking how they compose.

    ``prune`` may come first and compose with any scheme but ``binary``; at most one other scheme.

    Raises:
        InvalidOptionError: Unknown name, empty part, or a composition that makes no sense.
    """
    if not isinstance(scheme, str) or not scheme.strip():
        raise InvalidOptionError(f"--scheme {scheme!r}: give one of {', '.join(SCHEMES)} (prune composes: prune+X)")
    names = [p.strip() for p in scheme.split("+")]
    for name in names:
        if name not in PASSES:
            raise InvalidOptionError(f"--scheme {scheme}: unknown scheme {name!r}; known: {', '.join(SCHEMES)}")
    rest = [n for n in names if n != "prune"]
    if len(names) - len(rest) > 1 or ("prune" in names and names[0] != "prune"):
        raise InvalidOptionError(f"--scheme {scheme}: prune may appear once, first (prune+codebook)")
    if len(rest) > 1:
        raise InvalidOptionError(f"--scheme {scheme}: only prune composes; pick one of {', '.join(rest)}")
    if "prune" in names and rest == ["binary"]:
        raise InvalidOptionError(f"--scheme {scheme}: a binary weight cannot be 0, so pruning cannot carry over")
    return names


def _parse_bits(bits: str | int) -> int | None:
    if bits == "auto":
        return None
    if isinstance(bits, str):
        try:
            bits = int(bits)
        except ValueError as e:
            raise InvalidOptionError(f"--bits {bits!r}: give 'auto' or an integer") from e
    return check_int(bits, "bits", 1, 32)


def float_bnn_bytes(model: BNNModel) -> int:
    """Bytes of the model as an fp32 BNN: μ and σ in fp32 per encoded weight, deterministic floats in fp32.

    Computed from shapes only, so it is the same before and after lowering. Non-float initializers (shape
    constants) count their stored bytes.
    """
    nodes = [n for n in model.proto.graph.node if n.domain == DOMAIN]  # sizes from 'shape', nothing decoded
    total = sum(8 * math.prod(next(a.ints for a in n.attribute if a.name == "shape")) for n in nodes)
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


def ebnn_bytes(model: BNNModel) -> int:
    """Size of the ``.ebnn`` file ``model`` serialises to, without serialising it.

    Writes the manifest into ``metadata_props`` exactly as :func:`edgebnn.ir.to_bytes` does (so saving
    later writes the same bytes), then asks protobuf for the encoded size.
    """
    props = [p for p in model.proto.metadata_props if p.key != MANIFEST_KEY]
    del model.proto.metadata_props[:]
    model.proto.metadata_props.extend(props)
    entry = model.proto.metadata_props.add()
    entry.key, entry.value = MANIFEST_KEY, model.manifest.to_json()
    return int(model.proto.ByteSize())


def lower(model: BNNModel, scheme: str, *, seed: int = 0, bits: str | int = "auto", **options: Any) -> PassResult:
    """Lower ``model`` with ``scheme`` and report what it cost.

    Args:
        model: A verified IR (not modified).
        scheme: ``float``, ``mcq``, ``fixed``, ``codebook``, ``ternary``, ``binary``, ``prune`` or
            ``prune+<scheme>``.
        seed: Seeds every random choice; the same seed gives the same bytes.
        bits: ``"auto"`` (bits per layer from the posterior variance) or a forced width, given to the last
            scheme of the composition.
        **options: Fields of the schemes' configs (e.g. ``samples_per_weight=2`` for mcq, ``clusters=16``
            for codebook, ``log_alpha_threshold=3`` for prune); each goes to every pass whose config has it.

    Returns:
        ``PassResult(model, modified, report)`` with report keys ``scheme``, ``seed``, ``layers`` (the last
        pass's per-layer rows, see :mod:`edgebnn.passes.base`), ``passes`` (each pass's name, options and
        rows), ``total_bytes`` (``model.nbytes()`` after), ``float_bnn_bytes`` (the fp32 BNN, from the input)
        ``compression_ratio`` (float_bnn_bytes / total_bytes) and ``ebnn_bytes`` (the size of the file
        the model saves to: tensors plus graph, names and manifest).

    Raises:
        InvalidOptionError: Unknown scheme or option, or an option out of range.
        InvalidArtifactError: The input model fails verification.
        PassError: A pass failed unexpectedly.
    """
    names = parse_scheme(scheme)
    forced = _parse_bits(bits)
    fields = {n: {f.name for f in dataclasses.fields(PASSES[n].config_type)} for n in names}
    unknown = sorted(set(options) - set().union(*fields.values()))
    if unknown:
        known = sorted(set().union(*fields.values()) - {"bits"})
        raise InvalidOptionError(f"--scheme {scheme}: unknown option(s) {unknown}; this scheme takes {known}")
    if "bits" in options:
        raise InvalidOptionError("pass bits as lower(..., bits=N), not as an option")
    last = names[-1]
    if forced is not None and "bits" not in fields[last]:
        raise InvalidOptionError(f"--bits {bits}: the {last} scheme has no bit width to set")
    passes = []
    for name in names:
        kwargs = {k: v for k, v in options.items() if k in fields[name]}
        if name == last and forced is not None:
            kwargs["bits"] = forced
        passes.append(PASSES[name](PASSES[name].config_type(**kwargs)))

    reference = float_bnn_bytes(model)
    current, modified, reports = model, False, []
    for p in passes:
        result = p(current, seed=seed)
        current, modified = result.model, modified or result.modified
        reports.append(result.report)
    previous = model.manifest.scheme
    current.manifest.scheme = scheme if previous == "float" else f"{previous}+{scheme}"
    total = current.nbytes()
    report = {
        "scheme": scheme,
        "seed": seed,
        "layers": reports[-1]["layers"],
        "passes": reports,
        "total_bytes": total,
        "float_bnn_bytes": reference,
        "compression_ratio": reference / total if total else None,
        "ebnn_bytes": ebnn_bytes(current),
    }
    return PassResult(current, modified, report)
