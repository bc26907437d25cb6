"""What an export writes when no mode is given, and the smallest export a device runs.

The default keeps the lowering's compression. A device's profile names its default mode
(:attr:`edgebnn.devices.DeviceProfile.export_mode`): on onnxruntime (``cpu``, ``arm64``) it is ``noise`` with the
IR's own packed codes (``--weights ir``) and the noise drawn in the graph (``--rng auto``: graph), one
self-contained file about the size of the ``.ebnn``, where ``baked`` would store S fp32 members (on the digits CNN
lowered with ``fixed``: 18 KiB against 861 KiB, and the fp32 BNN's 107 KiB). A deep ensemble exports ``baked``
(its only exact mode, each member once); an IR ``--noise auto`` cannot draw (a codebook's mixture, SWAG's low-rank
part) tries ``--noise weight``, then ``baked``. TensorRT profiles keep ``baked``: exact, deterministic, the data its
only input (TensorRT ignores random ops' seeds; engine sizes per mode in docs/tensorrt.md).

:func:`smallest_export` tries, in memory, the sampling exports a device runs and returns the flags of the
smallest file: what ``edgebnn export`` names when the file it wrote is larger than the fp32 BNN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgebnn.devices import export_device
from edgebnn.errors import InvalidOptionError

if TYPE_CHECKING:
    import onnx

    from edgebnn.exporters.sizes import DeployedSize
    from edgebnn.ir import BNNModel

AUTO_MODE = "auto"


@dataclass(frozen=True)
class ExportChoice:
    """The mode an export ran in and why (``reason`` is None when the caller named the mode)."""

    mode: str
    noise: str
    reason: str | None = None

    def flags(self) -> list[str]:
        """The ``edgebnn export`` options that select this mode."""
        return ["--mode", self.mode, *(["--noise", self.noise] if self.noise != "auto" else [])]


def _candidates(model: BNNModel, device: str | None, noise: str) -> list[tuple[str, str]]:
    """(mode, noise variant) to try, in order, for ``--mode auto`` on ``device``."""
    from edgebnn.exporters.families import default_samples, ensemble_members, refusal

    profile = export_device(device or "cpu")
    if ensemble_members(model) is not None or profile.export_mode == "baked":
        return [("baked", noise)]
    samples = default_samples(model, 16)
    variants = [noise] if noise != "auto" else [  # a variant the family refuses (SWAG: only weight draws) is skipped
        v for v in ("auto", "weight") if v == "weight" or refusal(model, profile.export_mode, samples, v) is None]
    return [*((profile.export_mode, v) for v in variants), ("baked", noise)]


def _fixing_noun(model: BNNModel) -> str:
    from edgebnn.exporters.families import samples_fixed_by

    fixed = samples_fixed_by(model)
    return fixed[0] if fixed is not None else "model"


def export_auto(model: BNNModel, samples: int, *, mode: str = AUTO_MODE, noise: str = "auto",
                device: str | None = None, **options: Any) -> tuple[onnx.ModelProto, ExportChoice]:
    """:func:`edgebnn.exporters.ensemble.export_onnx` with ``mode="auto"`` resolved for ``device``
    (module docstring); another mode is exported as asked."""
    from edgebnn.exporters.ensemble import export_onnx

    if mode != AUTO_MODE:
        return export_onnx(model, samples, mode=mode, noise=noise, device=device, **options), ExportChoice(mode, noise)
    refused: list[str] = []
    candidates = _candidates(model, device, noise)
    for i, (m, variant) in enumerate(candidates):
        try:
            proto = export_onnx(model, samples, mode=m, noise=variant, device=device, **options)
        except InvalidOptionError as e:
            if i == len(candidates) - 1:
                raise
            refused.append(f"--mode {m}{f' --noise {variant}' if variant != 'auto' else ''}: {e}")
            continue
        where = device or "cpu"
        if not refused:
            why = (f"the default on {where}" + (": the IR's codes in one graph" if m == "noise" else "")
                   if len(candidates) > 1 or export_device(where).export_mode == "baked"
                   else f"a {_fixing_noun(model)}'s only exact mode: its M members")
        elif m == candidates[0][0]:  # the default mode, with another --noise variant
            why = f"the default on {where}, with --noise {variant}, because " + "; ".join(refused)
        else:
            why = f"the default on {where} is --mode {candidates[0][0]}, which cannot export it: " + "; ".join(refused)
        return proto, ExportChoice(m, variant, why)
    raise AssertionError("unreachable: the last candidate raises")


def smallest_export(model: BNNModel, samples: int, device: str | None, *, seed: int = 0,
                    progress: Callable[[int, int], None] | None = None) -> tuple[list[str], int] | None:
    """The ``edgebnn export`` flags of the smallest sampling export of ``model`` that ``device`` runs, and its
    bytes, tried in memory: ``noise`` and ``baked`` with the IR's own codes, and for an IR not lowered yet (whose
    export-time int8/int4 is its only quantization) ``noise`` with int8/int4 moments and ``baked`` with int8/int4
    Q/DQ members. A lowered IR is never re-quantized here: that would change the model its budget was kept for.
    None when the device runs none of them."""
    from edgebnn.exporters.ensemble import export_onnx
    from edgebnn.exporters.sizes import deployed_bytes

    profile = export_device(device or "cpu")
    lowered = model.manifest.scheme != "float"
    quantized = [] if lowered else [w for w in profile.weight_formats if w != "fp32"]
    tries: list[list[str]] = []
    if profile.export_mode != "baked":
        tries += [["--mode", "noise", "--weights", w] for w in ("ir", *quantized)]
    tries += [["--mode", "baked", "--weights", "ir"]]
    tries += [["--mode", "baked", "--weights", w, "--form", "qdq"] for w in quantized]
    best: tuple[list[str], int] | None = None
    for flags in tries:
        opts = dict(zip(flags[::2], flags[1::2], strict=True))
        for variant in ("auto", "weight"):
            try:
                proto = export_onnx(model, samples, mode=opts["--mode"], weights=opts["--weights"],
                                    form=opts.get("--form", "auto"), noise=variant, device=device, seed=seed,
                                    rng="auto", progress=progress)
            except InvalidOptionError:
                if opts["--mode"] != "noise":
                    break
                continue
            size = deployed_bytes(proto).file_bytes
            flags = flags + (["--noise", variant] if variant != "auto" else [])
            if best is None or size < best[1]:
                best = (flags, size)
            break
    return best


DEFAULT_EXPORT = {"samples": 16, "device": "cpu", "mode": "auto", "rng": "auto"}
"""What ``edgebnn export model.ebnn -o m.onnx`` writes unless told otherwise (mode ``auto``: the device's default,
:func:`export_auto`; weights, form: the exporter's)."""


def export_size(model: BNNModel, **export_options: Any) -> tuple[DeployedSize, dict[str, Any]]:
    """The deployed bytes of ``model`` exported (in memory) with ``export_options`` over :data:`DEFAULT_EXPORT`,
    and what was exported (mode, samples, weights, noise variant, device).

    Raises:
        EdgeBNNError: The export refuses the options (the caller may report the reason instead).
    """
    from edgebnn.exporters.sizes import deployed_bytes

    options = {**DEFAULT_EXPORT, **export_options}
    samples = int(options.pop("samples"))
    proto, choice = export_auto(model, samples, **options)
    what = {"mode": choice.mode, "samples": samples, "weights": options.get("weights", "ir"),
            "noise": choice.noise if choice.noise != "auto" else None, "device": options.get("device")}
    return deployed_bytes(proto), {k: v for k, v in what.items() if v is not None}
