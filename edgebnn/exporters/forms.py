"""Graph forms of low-bit weights: which one a runtime runs fast, chosen from the device (a pure function).

The same int8 / int4 member weights (identical values) can be written three ways:

``qdq``
    int8/int4 constants + DequantizeLinear (TensorRT's explicit quantization: it fuses them into integer
    kernels). The compact form, for storage and TensorRT. onnxruntime CPU does not constant-fold a
    DequantizeLinear on a constant: it dequantizes every member's weights on every inference.
``folded``
    the quantized values stored dequantized, as fp32 constants (``float32(q) · scale``): the fp32 kernels, no
    dequantization at run time, 4x (int8) / 8x (int4) the file size of ``qdq``. Same predictive as ``qdq``.
``integer``
    Gemm weights in integer kernels. int8: MatMulInteger (u8 x s8 with int32 accumulation) on the activation
    quantized per call (DynamicQuantizeLinear, uint8 per tensor), dequantized by one multiply per output
    channel. int4: onnxruntime's block-quantized ``MatMulNBits`` (com.microsoft) on the same blocks and scales
    as ``qdq`` (:func:`~edgebnn.exporters.quantize.nbits_weight`), one op per member (a 2-D weight each: Split,
    S ops, Concat), or one op on the members side by side where the input is shared; at ``accuracy_level`` 4 it
    quantizes the activation to int8 per block of 32 inputs of each row and accumulates int8 x int4 products in
    int32. The other weights (Conv: onnxruntime's ConvInteger is slower than its fp32 Conv) are folded.

``auto`` picks by device (:func:`choose_form`, measured in docs/speed.md): onnxruntime CPU devices take
``integer`` kernels only for dense layers whose S fp32 members exceed :data:`INTEGER_MIN_BYTES` (beyond the
caches: streamed from memory on every call, where int8 is 4x and int4 about 6x less traffic) and ``folded``
weights everywhere else; TensorRT devices ``qdq``; without a device, ``qdq`` (the portable form).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgebnn.devices import export_device, export_device_names
from edgebnn.errors import InvalidOptionError

FORMS = ("auto", "qdq", "folded", "integer")
# auto on onnxruntime CPU: a dense layer's S members run in integer kernels above this many fp32 bytes (the
# bayesian-torch SCNN's fc1, 75 MB at S=16: 0.56x the fp32 time at batch 1; LeNet-5's fc1, 2 MB: 1.1x, so folded)
INTEGER_MIN_BYTES = 8 * 2**20
# MatMulNBits' accuracy_level: 4 = the activation quantized to int8 per block inside the op (int8 x int4 kernel,
# int32 sums); 0 keeps it fp32 (the folded form's arithmetic) and ran 2.3x (members) to 4x (side by side) slower
# at batch 1 on the SCNN-fc1-sized layer (bench/layer_kernels.py)
NBITS_ACCURACY_LEVEL = 4


@dataclass(frozen=True)
class FormChoice:
    """A graph form, why, and (``integer``) the fp32 size from which a dense layer's weights run as integers."""

    form: str
    reason: str
    integer_min_bytes: int = 0

# device -> (runtime, weight formats it runs): a view of the one device table, edgebnn.devices (its
# ``runtime`` and ``weight_formats``: TensorRT 10.3 on Jetson does not parse the opset-21 int4 DequantizeLinear)
DEVICE_FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    name: (export_device(name).runtime, export_device(name).weight_formats) for name in export_device_names()
}

_REASONS = {
    "cpu": "onnxruntime CPU: dense layers whose fp32 members exceed 8 MiB (streamed from memory every call) run "
           "int8 MatMulInteger; the other weights are fp32 constants folded from the quantized values, because "
           "onnxruntime runs a DequantizeLinear on constants every inference and its ConvInteger and small integer "
           "GEMMs measured slower than fp32 (docs/speed.md)",
    "cpu_int4": "onnxruntime CPU: dense layers whose fp32 members exceed 8 MiB run int4 MatMulNBits (int8 "
                "activations per block, one op per member); the other weights are fp32 constants folded from the "
                "quantized values (onnxruntime runs a DequantizeLinear on constants every inference; MatMulNBits "
                "measured slower than fp32 on small layers, docs/speed.md)",
    "tensorrt": "TensorRT fuses explicit Q/DQ into integer kernels (its explicit-quantization rules)",
    "none": "no device given: the compact Q/DQ form, portable to every runtime",
    "fp32": "fp32 weights have one form",
}


def choose_form(device: str | None, weights: str = "int8", form: str = "auto") -> FormChoice:
    """The graph form for ``weights`` on ``device``, and why.

    Args:
        device: a key of :data:`DEVICE_FORMATS` (``cpu``, ``arm64``: onnxruntime CPU; ``rtx``, ``jetson*``:
            TensorRT), or None.
        weights: the weight format asked for (``fp32``, ``int8``, ``int4``).
        form: ``auto`` (pick), or a form of :data:`FORMS` to keep (``integer``: every int8 dense layer).

    Raises:
        InvalidOptionError: an unknown form or device, or a weight format the device cannot run (one line
            naming the device and the formats it takes).
    """
    if form not in FORMS:
        raise InvalidOptionError(f"--form {form}: choose one of {', '.join(FORMS)}")
    if device is not None:
        if device not in DEVICE_FORMATS:
            raise InvalidOptionError(f"--device {device}: choose one of {', '.join(DEVICE_FORMATS)}")
        runtime, formats = DEVICE_FORMATS[device]
        if weights not in formats:
            raise InvalidOptionError(f"--weights {weights}: {device} ({runtime}) takes --weights "
                                     f"{' or '.join(formats)}")
    if form != "auto":
        return FormChoice(form, "asked for (--form)")
    if weights == "fp32":
        return FormChoice("fp32", _REASONS["fp32"])
    if device is None:
        return FormChoice("qdq", _REASONS["none"])
    if DEVICE_FORMATS[device][0].startswith("TensorRT"):
        return FormChoice("qdq", _REASONS["tensorrt"])
    return FormChoice("integer", _REASONS["cpu_int4" if weights == "int4" else "cpu"], INTEGER_MIN_BYTES)


def fold_constant_dequantize(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The ``folded`` form of any graph: every DequantizeLinear whose inputs are all constants (quantized
    weights, e.g. of an ``edgebnn calibrate`` Q/DQ artifact) replaced by its fp32 output, computed once by
    onnxruntime itself (the values the graph computed on every inference). Activation Q/DQ pairs stay, so the
    predictive is unchanged; the file grows to fp32 weights."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    kept, folded = [], []
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx") and all(
                x in inits for x in node.input if x):
            folded.append(numpy_helper.from_array(_evaluate(node, inits, proto), node.output[0]))
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    used = {x for node in kept for x in node.input} | {o.name for o in graph.output}
    live = [t for t in graph.initializer if t.name in used] + folded
    del graph.initializer[:]
    graph.initializer.extend(live)
    return out


def _evaluate(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], proto: onnx.ModelProto) -> np.ndarray:
    import onnxruntime as ort

    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT,
                                                                               None)],
                              [inits[x] for x in node.input if x])
    model = helper.make_model(graph, opset_imports=list(proto.opset_import))
    model.ir_version = proto.ir_version
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {})[0]
