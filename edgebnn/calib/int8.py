"""INT8 post-training quantization of an exported ensemble: calibrated Q/DQ scales TensorRT can build.

``calibrate_ensemble(model.onnx, out.onnx, method=...)`` runs the float ensemble on calibration data,
picks an activation range per quantized tensor (min-max, percentile or entropy), writes an explicit
Q/DQ model, and reports accuracy/NLL/ECE/Brier (and how far entropy and mutual information moved)
before and after on a held-out split, plus the TensorRT compatibility findings of the result.

Why onnxruntime's quantizer instead of our own calibration: ``onnxruntime.quantization`` already
implements the three calibrators (histogram collection, percentile clipping, the KL-divergence search
of TensorRT's entropy calibrator), the Q/DQ insertion rules (weights stored as INT8 + DequantizeLinear,
shared Q/DQ pairs, per-channel axes) and ONNX shape handling, and it is tested against many models; a
hand-written copy would be more code to get wrong for no gain. We use it in two calls:

1. ``create_calibrator(...)`` → ``collect_data`` → ``compute_data``: the tensor ranges. Called directly,
   not through ``quantize_static``, because ``quantize_static`` does not forward ``num_bins`` to the
   calibrator: its entropy calibrator then has 128 histogram bins for 128 quantized bins, so the KL search
   has exactly one candidate (the full range) and "entropy" silently equals min-max. We pass
   TensorRT's entropy-calibrator setting (2048 bins, 128 quantized bins) and 2048 bins for percentile.
2. ``quantize_static(..., calibration_cache_path=ranges)``: Q/DQ insertion from those ranges.

Settings, from what TensorRT accepts (docs/design.md) and what a BNN ensemble needs:

* ``QuantFormat.QDQ``, INT8 activations and weights, ``ActivationSymmetric`` and ``WeightSymmetric``:
  every zero point is 0 (TensorRT supports symmetric quantization only).
* Only Conv, MatMul and Gemm are quantized, on all their data inputs (activation and weight), so
  TensorRT fuses INT8 kernels; their outputs are not re-quantized (``OpTypesToExcludeOutputQuantization``):
  the next quantized layer quantizes its own input, as TensorRT's Q/DQ placement guide recommends, and
  the logits reach the predictive head in float.
* Biases stay float (``QuantizeBias=False``): onnxruntime would store them as INT32 + DequantizeLinear,
  which TensorRT's Q/DQ layers do not take; TensorRT fuses a float bias into the INT8 kernel anyway.
* The predictive head (Softmax, LogSoftmax, ReduceMean, Log and the entropy / mutual-information
  arithmetic) stays float: it is not in the quantized op types. Averaging S probability vectors and
  taking logs of small probabilities is exactly where 8 bits would distort the uncertainty.
* Per-tensor weight scales: one scale for all S samples of a layer (the samples come from one posterior,
  so their ranges agree; on digits per-tensor INT8 keeps the float accuracy). Per-channel scales were
  tried: onnxruntime's CPU kernel for the fused 3-D baked MatMul (``MatMulIntegerToFloat``) rejects them,
  so the model would no longer run on the host.
* ``quant_pre_process`` with ``skip_optimization=True, skip_symbolic_shape=True``: ONNX shape inference
  only, so the quantizer knows every tensor's type. onnxruntime's graph optimizer is kept out (it may emit
  contrib ops TensorRT cannot parse), and so is its symbolic shape inference, which crashes on the
  ``Constant(value_ints)`` nodes torch.onnx writes (``numpy_helper.to_array(None)`` in onnxruntime 1.31).

Only ``baked`` ensembles are calibrated: the TensorRT mode (no random ops, no noise inputs), whose members are
stored weights. A ``noise`` graph (the CPU default export) draws its weights on every call, in the graph
(``--rng graph``) or from host-drawn noise inputs (``--rng host``): there is no stored weight to quantize, and an
activation range measured on one call's draws need not hold for the next. An ``analytic`` graph carries variances
whose dynamic range spans orders of magnitude. Given the ``.ebnn`` instead of an export, :func:`calibrate_ensemble`
exports its baked fp32 ensemble first (S and seed as ``edgebnn export --mode baked`` takes them), so the CPU
default path calibrates without a second export command.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from edgebnn._version import __version__
from edgebnn.calib import METHODS
from edgebnn.calib.readers import DEFAULT_BATCH, BatchReader, digits_inputs, load_inputs
from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.metadata import ExportMetadata, write_metadata

QUANTIZED_OPS = ("Conv", "MatMul", "Gemm")
DIGITS_SHAPE = (1, 8, 8)
BAKED_FP32 = ExportConfig(mode="baked", weights="fp32")  # what an .ebnn is exported as to be calibrated

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Int8Config:
    """How to calibrate.

    Attributes:
        method: ``minmax`` (observed range), ``percentile`` (clip the ``percentile`` of |x|) or ``entropy``
            (the range minimising the KL divergence between float and quantized histograms, TensorRT's
            default calibrator).
        batch: Calibration batch size (equal batches; a last partial batch is dropped).
        max_samples: Use at most this many calibration inputs (None: all).
        percentile: Percentile of |x| kept by the percentile method.
        num_bins: Histogram bins of the percentile and entropy methods.
        num_quantized_bins: Quantized bins of the entropy search (128 for INT8, as in TensorRT).
        version: Format of this config, recorded in the artifact.
    """

    method: str = "entropy"
    batch: int = DEFAULT_BATCH
    max_samples: int | None = None
    percentile: float = 99.999
    num_bins: int = 2048
    num_quantized_bins: int = 128
    version: int = 1

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InvalidOptionError(f"--method {self.method}: choose one of {', '.join(METHODS)}")
        if self.batch < 1:
            raise InvalidOptionError(f"--batch {self.batch}: must be at least 1")
        if self.max_samples is not None and self.max_samples < 1:
            raise InvalidOptionError(f"--max-samples {self.max_samples}: must be at least 1")
        if not 50.0 < self.percentile <= 100.0:
            raise InvalidOptionError(f"percentile {self.percentile}: must be in (50, 100]")
        if self.num_quantized_bins < 2 or self.num_bins < 2 * self.num_quantized_bins:
            raise InvalidOptionError(
                f"num_bins {self.num_bins} must be at least twice num_quantized_bins {self.num_quantized_bins} "
                "(otherwise the entropy search has a single candidate, the min-max range)"
            )


def quantize_int8(model: onnx.ModelProto, reader: BatchReader, config: Int8Config) -> onnx.ModelProto:
    """Calibrate ``model`` on ``reader`` and return its INT8 Q/DQ version (metadata left as it was).

    Raises:
        EdgeBNNError: onnxruntime's calibration or quantization failed (the message carries its error).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quant_pre_process, quantize_static
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

    method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
              "entropy": CalibrationMethod.Entropy}[config.method]
    calib_options: dict[str, Any] = {"symmetric": True}
    if config.method == "percentile":
        calib_options.update(num_bins=config.num_bins, percentile=config.percentile)
    elif config.method == "entropy":
        calib_options.update(num_bins=config.num_bins, num_quantized_bins=config.num_quantized_bins)
    with tempfile.TemporaryDirectory(prefix="edgebnn-calib-") as tmp:
        src, pre, out = Path(tmp, "float.onnx"), Path(tmp, "pre.onnx"), Path(tmp, "int8.onnx")
        cache = Path(tmp, "ranges.json")
        onnx.save(model, str(src))
        # onnxruntime's quantization tools print progress to stdout and log warnings; keep both quiet.
        with contextlib.redirect_stdout(io.StringIO()), _quiet_logging():
            try:
                quant_pre_process(str(src), str(pre), skip_optimization=True, skip_symbolic_shape=True)
                calibrator = create_calibrator(
                    pre, list(QUANTIZED_OPS), augmented_model_path=str(Path(tmp, "augmented.onnx")),
                    calibrate_method=method, extra_options=calib_options,
                )
                reader.rewind()
                calibrator.collect_data(reader)
                save_tensors_data(calibrator.compute_data(), cache)
                del calibrator
                quantize_static(
                    str(pre), str(out), None, quant_format=QuantFormat.QDQ, op_types_to_quantize=list(QUANTIZED_OPS),
                    per_channel=False, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=method, calibration_cache_path=str(cache),
                    extra_options={
                        "ActivationSymmetric": True,
                        "WeightSymmetric": True,
                        "QuantizeBias": False,
                        "OpTypesToExcludeOutputQuantization": list(QUANTIZED_OPS),
                    },
                )
            except (ValueError, RuntimeError, AssertionError, KeyError, onnx.checker.ValidationError) as e:
                raise EdgeBNNError(f"onnxruntime INT8 quantization ({config.method}) failed: {e}") from e
        quantized = onnx.load(str(out))
    quantized.ir_version = min(quantized.ir_version, 10)  # onnxruntime 1.31 loads IR <= 13; the IR writes 10
    return quantized


@contextlib.contextmanager
def _quiet_logging() -> Any:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def qdq_summary(model: onnx.ModelProto) -> dict[str, Any]:
    """What the Q/DQ model quantizes: node counts, element types, zero points, fully quantized layers.

    ``layers`` maps each Conv/MatMul/Gemm to whether both its data inputs come from a DequantizeLinear.
    """
    consts = {t.name: t for t in model.graph.initializer}
    producers = {out: n for n in model.graph.node for out in n.output}
    types: set[str] = set()
    nonzero: list[str] = []
    count = {"QuantizeLinear": 0, "DequantizeLinear": 0}
    for node in model.graph.node:
        if node.op_type not in count:
            continue
        count[node.op_type] += 1
        zp = node.input[2] if len(node.input) > 2 else ""
        if zp in consts:
            types.add(TensorProto.DataType.Name(consts[zp].data_type).lower())
            if np.any(numpy_helper.to_array(consts[zp]) != 0):
                nonzero.append(node.name or node.output[0])
        elif not zp:
            types.add("uint8 (no zero point)")
    layers = {}
    for node in model.graph.node:
        if node.op_type in QUANTIZED_OPS:
            fed = [producers.get(i) for i in node.input[:2]]
            layers[node.name or node.output[0]] = all(p is not None and p.op_type == "DequantizeLinear" for p in fed)
    return {"quantize_nodes": count["QuantizeLinear"], "dequantize_nodes": count["DequantizeLinear"],
            "types": sorted(types), "nonzero_zero_points": nonzero, "layers": layers}


def _from_ir(where: str) -> str:
    """The command that works: calibrate the .ebnn (named when it sits beside the export)."""
    beside = Path(where).with_suffix(".ebnn")
    ebnn = str(beside) if beside.is_file() else "MODEL.ebnn"
    out = Path(where).with_name(f"{Path(where).stem}_int8.onnx")
    return (f"calibrate the .ebnn it was exported from: edgebnn calibrate {ebnn} -o {out} (it exports the baked fp32 "
            "ensemble first), or an export written with --mode baked --weights fp32")


def _check_calibratable(meta: ExportMetadata, where: str) -> None:
    mode = meta.mode
    task = meta.task_spec(where)
    if not task.softmax_classifier:
        raise InvalidOptionError(f"{where}: a {task.name} export: INT8 calibration measures a softmax classifier "
                                 "(accuracy, NLL, ECE before and after); export it fp32 or --weights int8")
    if meta.calibration:
        raise InvalidOptionError(f"{where}: already INT8-calibrated ({meta.calibration['method']}); "
                                 "calibrate the float export")
    if mode == "baked" and (meta.weights or "fp32") != "fp32":
        raise InvalidOptionError(f"{where}: its members are stored as {meta.weights} (export --weights "
                                 f"{meta.weights}), and INT8 calibration quantizes fp32 weights and activations "
                                 f"together; {_from_ir(where)}")
    if mode != "baked":
        drawn = "in the graph" if meta.rng == "graph" else "from noise inputs the host fills"
        why = {
            "noise": f"it draws its weights on every call, {drawn}: there are no stored weights to quantize, and "
                     "activation ranges measured on one call's draws need not hold for the next",
            "shared": f"it draws its codebook entries on every call, {drawn}: there are no stored weights to "
                      "quantize",
            "analytic": "it propagates variances whose range spans orders of magnitude; INT8 would clip them",
            "float_deterministic": "it is a float baseline, not an ensemble",
            "float_bnn": "it is a float baseline with random ops, not an ensemble",
        }.get(str(mode), "unknown export mode")
        raise InvalidOptionError(f"{where}: a {mode} export cannot be INT8-calibrated ({why}); {_from_ir(where)}")


def _evaluate(proto: onnx.ModelProto, x: np.ndarray, y: np.ndarray) -> tuple[dict[str, float], Any]:
    from edgebnn.metrics import Predictive, classification_report
    from edgebnn.runtime import Session

    pred = Session(proto, threads=0).predict(x)
    assert isinstance(pred, Predictive)  # _check_calibratable: softmax classifiers only
    return classification_report(pred.probs, y), pred


def _float_ensemble(model_path: str | os.PathLike[str], export: ExportConfig | None,
                    ) -> tuple[onnx.ModelProto, ExportMetadata, str, dict[str, Any] | None]:
    """(the fp32 baked ensemble, its metadata, its name, how it was exported): read from an export, or exported
    from an ``.ebnn`` as ``export`` says (default :data:`BAKED_FP32`: S the family's default, a deep ensemble's M)."""
    from edgebnn.exporters.metadata import read_metadata
    from edgebnn.runtime.session import Session, read_export

    if Path(model_path).suffix.lower() == ".ebnn":
        from edgebnn import ir
        from edgebnn.exporters.export import export_model

        model = ir.load(model_path)
        result = export_model(model, export or BAKED_FP32)
        proto, config = result.proto, result.config
        where = str(model_path)
        exported = {"from": where, "mode": config.mode, "weights": config.weights, "samples": config.samples,
                    "seed": config.seed}
        meta = read_metadata(proto, where)
    else:
        if export is not None and export.samples is not None:
            raise InvalidOptionError(f"--samples {export.samples}: an export has its S built in; --samples is for an "
                                     ".ebnn")
        proto, meta, where = read_export(model_path)
        exported = None
    _check_calibratable(meta, where)
    Session(proto)  # onnxruntime refuses a broken graph here, in one line, before the quantizer sees it
    return proto, meta, where, exported


def calibrate_ensemble(
    model_path: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    data: str = "digits",
    config: Int8Config | None = None,
    calib_split: str = "val",
    eval_split: str = "test",
    device: str = "jetson",
    export: ExportConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """INT8-calibrate a baked ensemble, write it, and report what it cost.

    Args:
        model_path: An ensemble written by ``edgebnn export --mode baked`` (fp32 members), or an ``.ebnn`` whose
            baked fp32 ensemble is exported first (``export``).
        output: Where to write the INT8 Q/DQ ONNX (atomically). Its ``edgebnn.export`` metadata is the
            input's plus ``precision: int8`` and a ``calibration`` entry (method, samples used, data, ...),
            so ``edgebnn eval``/``edgebnn.runtime.Session`` run it like any export.
        data: ``digits`` (split ``calib_split``), an ``.npz`` with ``x`` or a folder of shards (``load_inputs``).
        config: Calibration settings (default: entropy, batch 32).
        calib_split: Digits split to calibrate on.
        eval_split: Digits split for the before/after metrics; must differ from ``calib_split`` when
            calibrating on digits. Skipped (with the reason) for models that do not take 8x8 digits.
        device: TensorRT device profile whose TensorRT version the compatibility check targets.
        export: How an ``.ebnn`` is exported first (default :data:`BAKED_FP32`: baked fp32 members, S 16 or a deep
            ensemble's M, seed 0); for an export only ``samples`` None (an export has its S built in).
        progress: Called as ``progress(batches, batches per pass)`` while the float graph runs on the data.

    Returns:
        The ``edgebnn.calibrate/1`` report (without ``schema``/``edgebnn_version``, which the CLI adds).

    Raises:
        InvalidArtifactError: ``model_path`` is not an edgebnn export.
        InvalidOptionError: A non-baked or already calibrated export, bad data, or calibrating on the
            evaluation split.
    """
    from edgebnn.devices import get_device
    from edgebnn.exporters.ensemble import save_onnx
    from edgebnn.exporters.trt_compat import check_trt_compat

    config = config or Int8Config()
    profile = get_device(device)
    if profile.tensorrt is None:
        raise InvalidOptionError(f"--device {device}: the compatibility check needs a TensorRT device (rtx, jetson)")
    proto, meta, where, exported = _float_ensemble(model_path, export)
    if Path(output).resolve() == Path(model_path).resolve():
        raise InvalidOptionError(f"-o {output}: would overwrite the float model it is calibrated from")
    input_shape = tuple(meta.input_shape[1:])
    x_cal, data_desc = _calibration_inputs(data, input_shape, where, (calib_split, eval_split), config)
    reader = BatchReader(x_cal, meta.input_name, batch=config.batch, limit=config.max_samples, progress=progress)
    quantized = quantize_int8(proto, reader, config)
    calibration = {**asdict(config), **data_desc, "samples_used": reader.samples_used, "inputs": reader.inputs,
                   "batch_used": reader.batch,
                   "onnxruntime": _ort_version(), "edgebnn_version": __version__}
    write_metadata(quantized, replace(meta, precision="int8", calibration=calibration))
    onnx.checker.check_model(quantized)
    evaluation, evaluation_reason = _before_after(proto, quantized, input_shape, eval_split)
    findings = check_trt_compat(quantized, tensorrt=profile.tensorrt)
    save_onnx(quantized, output)
    return {
        "model": str(model_path),
        "exported": exported,
        "output": str(output),
        "mode": meta.mode,
        "samples": meta.samples,
        "method": config.method,
        "calibration": calibration,
        "qdq": qdq_summary(quantized),
        "evaluation": evaluation,
        "evaluation_reason": evaluation_reason,
        "bytes": {"before": len(proto.SerializeToString()), "after": len(quantized.SerializeToString())},
        "tensorrt_compat": {
            "device": profile.name, "tensorrt": profile.tensorrt,
            "errors": sum(f.severity == "error" for f in findings),
            "warnings": sum(f.severity == "warning" for f in findings),
            "findings": [asdict(f) for f in findings],
        },
    }


def _calibration_inputs(data: str, input_shape: tuple[int, ...], where: str, splits: tuple[str, str],
                        config: Int8Config) -> tuple[np.ndarray, dict[str, Any]]:
    """The calibration inputs and how the report names them: ``digits`` (split ``splits[0]``, never the evaluation
    split ``splits[1]``), or a file or folder of inputs of the model's shape."""
    calib_split, eval_split = splits
    if data != "digits":
        return load_inputs(data, input_shape, limit=config.max_samples)
    if input_shape != DIGITS_SHAPE:
        raise InvalidOptionError(f"{where}: takes inputs {input_shape}, digits are {DIGITS_SHAPE}; "
                                 "pass --data DIR with .npy inputs of the model's shape")
    if calib_split == eval_split:
        raise InvalidOptionError(f"--calib-split {calib_split}: calibrating on the evaluation split would "
                                 "overstate the INT8 accuracy; pick another split")
    return digits_inputs(calib_split)[0], {"data": "digits", "split": calib_split}


def _before_after(proto: onnx.ModelProto, quantized: onnx.ModelProto, input_shape: tuple[int, ...],
                  eval_split: str) -> tuple[dict[str, Any] | None, str | None]:
    """The float and INT8 models' metrics on the digits split ``eval_split`` and how they agree, or None and why
    not (a model that takes no 8x8 digits)."""
    if input_shape != DIGITS_SHAPE:
        return None, f"the model takes {input_shape} inputs; only digits (1, 8, 8) ships with labels offline"
    x_ev, y_ev = digits_inputs(eval_split)
    before, p_f = _evaluate(proto, x_ev, y_ev)
    after, p_q = _evaluate(quantized, x_ev, y_ev)
    return {
        "data": "digits", "split": eval_split, "n": len(y_ev), "before": before, "after": after,
        "delta": {k: after[k] - before[k] for k in before},
        "agreement": {
            "top1": float((p_f.probs.argmax(-1) == p_q.probs.argmax(-1)).mean()),
            "max_abs_probs": float(np.abs(p_f.probs - p_q.probs).max()),
            "mean_abs_entropy": float(np.abs(p_f.entropy - p_q.entropy).mean()),
            "mean_abs_mutual_info": float(np.abs(p_f.mutual_info - p_q.mutual_info).mean()),
        },
    }, None


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)
