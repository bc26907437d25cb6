"""The one export function: an IR and an :class:`~edgebnn.exporters.config.ExportConfig` in, an ONNX ensemble out.

:func:`export_model` resolves the config against the model once (:meth:`ExportConfig.resolve`) and hands each graph
to the handler of its mode (:data:`HANDLERS`): ``baked`` (:mod:`.ensemble`), ``noise`` and ``shared``
(:mod:`.noise`), ``analytic`` (:mod:`.analytic`, and on a last-layer posterior the GLM predictive, :mod:`.glm`).
An anytime ensemble (``samples="auto"``) wraps them: its first chunk is exported as a fixed S would be, the next
chunks in the mode that chose, and :mod:`.anytime` rewrites them into one graph. The export's metadata records
the config that reproduces it (:meth:`~edgebnn.exporters.config.ResolvedExport.record`).

**mode auto.** The default keeps the lowering's compression. A device's profile names its default mode
(:attr:`edgebnn.devices.DeviceProfile.export_mode`): on onnxruntime (``cpu``, ``arm64``; and without a device) it is
``noise`` with the IR's own packed codes (``weights="ir"``) and the noise drawn in the graph (``rng="auto"``:
graph), one self-contained file about the size of the ``.ebnn``, where ``baked`` would store S fp32 members (on the
digits CNN lowered with ``fixed``: 18 KiB against 861 KiB, and the fp32 BNN's 107 KiB). A deep ensemble exports
``baked`` (its only exact mode, each member once); an IR ``--noise auto`` cannot draw (a codebook's mixture, SWAG's
low-rank part) tries ``--noise weight``, then ``baked``. TensorRT profiles keep ``baked``: exact, deterministic,
the data its only input (TensorRT ignores random ops' seeds; engine sizes per mode in docs/tensorrt.md). The
handlers are tried in that order; the first that does not refuse writes the file, and the reason says why.

:func:`smallest_export` tries, in memory, the sampling exports a device runs and returns the flags of the smallest
file: what ``edgebnn export`` names when the file it wrote is larger than the fp32 BNN.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import onnx

from edgebnn.devices import export_device
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters import WEIGHT_FORMATS
from edgebnn.exporters._graph import check_export
from edgebnn.exporters.config import AUTO, ExportConfig, GraphSpec, Progress, ResolvedExport
from edgebnn.exporters.families import check_family
from edgebnn.exporters.forms import choose_form
from edgebnn.exporters.metadata import read_metadata, write_metadata
from edgebnn.ir import BNNModel

__all__ = ["HANDLERS", "ExportChoice", "ExportResult", "build_graph", "export_model", "smallest_export"]


@dataclass(frozen=True)
class ExportChoice:
    """The mode an export ran in and why (``reason`` is None when the caller named the mode)."""

    mode: str
    noise: str
    reason: str | None = None

    def flags(self) -> list[str]:
        """The ``edgebnn export`` options that select this mode."""
        return ["--mode", self.mode, *(["--noise", self.noise] if self.noise != "auto" else [])]


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_model` returns.

    Attributes:
        proto: The ONNX ensemble (its metadata records :attr:`config`).
        resolved: The config as resolved against the model (S, the anytime rule, the device profile).
        choice: The mode and noise variant the export ran in, and why (``mode="auto"``).
    """

    proto: onnx.ModelProto
    resolved: ResolvedExport
    choice: ExportChoice

    @property
    def config(self) -> ExportConfig:
        """The config that reproduces this export (the one its metadata records)."""
        return self.resolved.record(self.choice.mode, self.choice.noise)


def export_model(model: BNNModel, config: ExportConfig | ResolvedExport | None = None, *,
                 progress: Progress | None = None) -> ExportResult:
    """The ensemble of ``model`` exported as ``config`` says (default :class:`ExportConfig`'s defaults).

    Args:
        model: The IR.
        config: The export configuration, or one already resolved against ``model``.
        progress: Called as ``progress(done, total)`` while the graph is built (a progress bar).

    Raises:
        InvalidOptionError: A choice the model or the device cannot take (one line naming it); with
            ``mode="auto"``, only when every handler refuses (the last one's reason).
        UnsupportedLayerError: A layer the mode cannot rewrite.
    """
    resolved = config if isinstance(config, ResolvedExport) else (config or ExportConfig()).resolve(model)
    if resolved.rule is not None:
        proto, choice = _anytime(model, resolved, progress)
    else:
        proto, choice = _first_exporting(model, resolved, progress=progress)
    meta = read_metadata(proto, model.where)
    write_metadata(proto, dataclasses.replace(meta, config=resolved.record(choice.mode, choice.noise).to_dict()))
    return ExportResult(proto, resolved, choice)


Handler = Callable[[BNNModel, GraphSpec], onnx.ModelProto]


def _baked(model: BNNModel, spec: GraphSpec) -> onnx.ModelProto:
    from edgebnn.exporters.ensemble import export_baked

    return export_baked(model, spec)


def _sampling(model: BNNModel, spec: GraphSpec) -> onnx.ModelProto:
    """``noise`` (the variant ``spec.noise``) and ``shared`` (the codebook draws)."""
    from edgebnn.exporters.noise import export_noise

    variant = "shared" if spec.mode == "shared" else spec.noise
    return export_noise(model, dataclasses.replace(spec, noise=variant, weights=_moment_weights(model, spec)))


def _analytic(model: BNNModel, spec: GraphSpec) -> onnx.ModelProto:
    """One pass on means and variances; on a last-layer posterior the GLM predictive with the probit link."""
    from edgebnn.exporters.analytic import export_analytic
    from edgebnn.exporters.glm import check_analytic, export_glm, uses_glm

    weights = _moment_weights(model, spec)
    glm = uses_glm(model)  # a last-layer posterior: the exact GLM logit variance and the probit link (glm.py)
    approximations = check_analytic(model, glm)  # a family that refuses analytic ends here, in one line
    out = export_glm(model, spec) if glm else export_analytic(model, dataclasses.replace(spec, weights=weights))
    if approximations:  # what the moments drop, in the file: eval, inspect and Session report it (with the ops')
        meta = read_metadata(out, model.where)
        write_metadata(out, dataclasses.replace(meta, approximations=(*approximations, *(meta.approximations or ()))))
    return out


HANDLERS: dict[str, Handler] = {"baked": _baked, "noise": _sampling, "shared": _sampling, "analytic": _analytic}
"""Mode -> the handler that builds its graph from a :class:`~edgebnn.exporters.config.GraphSpec`."""


def _moment_weights(model: BNNModel, spec: GraphSpec) -> str:
    """The store of a moment mode's μ and σ on the device: ``spec.weights``, or fp32 where the device's runtime does
    not run its decode (refusing a weight format the device does not run)."""
    weights, profile = spec.weights, spec.profile
    if weights in WEIGHT_FORMATS:
        choose_form(spec.device, weights, spec.form)  # refuses a format the device does not run
    if profile is not None and (not profile.decodes or (profile.on_tensorrt and weights == "ir"
                                                         and _unrolled_recurrent(model))):
        # a runtime whose decode of the stores is unverified (Jetson) gets float moments; so does an unrolled
        # recurrent layer on TensorRT: TensorRT-RTX 1.7's compiler fails an internal check (Myelin
        # "desired_so.size() == t->dim_count()") on a fixed-lowered bayesian-torch LSTM's packed-code decode
        return "fp32"
    return weights


def _unrolled_recurrent(model: BNNModel) -> bool:
    """Whether the graph holds per-step copies of an unrolled recurrent layer's weights (``name@t``)."""
    from edgebnn.exporters.recurrent import USE_SEPARATOR

    return any(USE_SEPARATOR in name for n in model.proto.graph.node if n.op_type == "Gemm" for name in n.input)


def build_graph(model: BNNModel, spec: GraphSpec) -> onnx.ModelProto:
    """The graph of one :class:`~edgebnn.exporters.config.GraphSpec`, by its mode's handler, checked by onnx.

    Raises:
        InvalidOptionError: A mode, S or noise variant the posterior family cannot export exactly, or a choice the
            handler refuses.
    """
    check_family(model, spec.mode, spec.total, spec.noise)
    out = HANDLERS[spec.mode](model, spec)
    check_export(out)
    return out


def _first_exporting(model: BNNModel, resolved: ResolvedExport, *, samples: int | None = None,
                     window: tuple[int, int] | None = None,
                     progress: Progress | None = None) -> tuple[onnx.ModelProto, ExportChoice]:
    """The graph of the first candidate mode that does not refuse (``mode="auto"``: the module docstring), and the
    choice with its reason."""
    refused: list[str] = []
    candidates = resolved.candidates
    for i, (mode, variant) in enumerate(candidates):
        try:
            proto = build_graph(model, resolved.spec(mode, variant, samples=samples, window=window,
                                                     progress=progress))
        except InvalidOptionError as e:
            if i == len(candidates) - 1:
                raise
            refused.append(f"--mode {mode}{f' --noise {variant}' if variant != 'auto' else ''}: {e}")
            continue
        auto = resolved.config.mode == AUTO
        return proto, ExportChoice(mode, variant, _why(model, resolved, mode, variant, refused) if auto else None)
    raise AssertionError("unreachable: the last candidate raises")


def _why(model: BNNModel, resolved: ResolvedExport, mode: str, variant: str, refused: list[str]) -> str:
    """Why ``mode="auto"`` exported in ``mode``: the device's default, or what the earlier candidates refused."""
    where, candidates = resolved.where, resolved.candidates
    if not refused:
        if len(candidates) > 1 or export_device(where).export_mode == "baked":
            return f"the default on {where}" + (": the IR's codes in one graph" if mode == "noise" else "")
        return f"a {_fixing_noun(model)}'s only exact mode: its M members"
    if mode == candidates[0][0]:  # the default mode, with another --noise variant
        return f"the default on {where}, with --noise {variant}, because " + "; ".join(refused)
    return f"the default on {where} is --mode {candidates[0][0]}, which cannot export it: " + "; ".join(refused)


def _fixing_noun(model: BNNModel) -> str:
    from edgebnn.exporters.families import samples_fixed_by

    fixed = samples_fixed_by(model)
    return fixed[0] if fixed is not None else "model"


def _anytime(model: BNNModel, resolved: ResolvedExport,
             progress: Progress | None) -> tuple[onnx.ModelProto, ExportChoice]:
    """The anytime ensemble (:mod:`.anytime`): the first chunk as a fixed export of S = chunk (every handler's
    rules hold in it), the next chunks in the mode that chose, one graph."""
    from edgebnn.exporters.anytime import Kind, anytime_graph, anytime_metadata, differs

    rule = resolved.rule
    assert rule is not None
    total, c = rule.max_samples, rule.chunk
    first, choice = _first_exporting(model, resolved, samples=c, window=(0, total), progress=progress)
    if choice.mode == "analytic":
        raise InvalidOptionError("--samples auto: analytic mode has no samples to save; give --samples N")
    meta = read_metadata(first, model.where)

    def chunk(i: int) -> onnx.ModelProto:
        return build_graph(model, resolved.spec(choice.mode, choice.noise, samples=c, window=(i * c, total)))

    chunks = [first]
    if rule.chunks > 1:
        second = chunk(1)
        if differs(first, second):  # baked members: one graph per chunk, their constants stacked
            chunks += [second] + [chunk(i) for i in range(2, rule.chunks)]
    kind = Kind.of(model.manifest.task_spec(model.where), model.manifest.num_classes)
    proto = anytime_graph(chunks, rule, kind,
                          {str(r["name"]) for r in meta.noise_inputs or () if r["per"] == "row"},
                          compress=resolved.profile is None or resolved.profile.tensorrt is None)
    write_metadata(proto, anytime_metadata(meta, rule))
    check_export(proto)
    return proto, choice


def smallest_export(model: BNNModel, samples: int, device: str | None, *, seed: int = 0,
                    progress: Progress | None = None) -> tuple[list[str], int] | None:
    """The ``edgebnn export`` flags of the smallest sampling export of ``model`` that ``device`` runs, and its
    bytes, tried in memory: ``noise`` and ``baked`` with the IR's own codes, and for an IR not lowered yet (whose
    export-time int8/int4 is its only quantization) ``noise`` with int8/int4 moments and ``baked`` with int8/int4
    Q/DQ members. A lowered IR is never re-quantized here: that would change the model its budget was kept for.
    None when the device runs none of them."""
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
            config = ExportConfig(samples, mode=opts["--mode"], weights=opts["--weights"],
                                  form=opts.get("--form", "auto"), noise=variant, device=device, seed=seed)
            try:
                proto = export_model(model, config, progress=progress).proto
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
