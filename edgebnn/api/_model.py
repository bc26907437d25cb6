"""Import a torch BNN, lower it, export it: the compile steps as Python functions."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebnn.api._files import PathLike, load_ir
from edgebnn.errors import InvalidOptionError
from edgebnn.measure import Progress

if TYPE_CHECKING:
    from edgebnn._lowered import LoweredModel
    from edgebnn.exporters.config import ExportConfig, ResolvedExport
    from edgebnn.exporters.export import ExportResult
    from edgebnn.ir import BNNModel
    from edgebnn.passes import LowerConfig

def from_torch(model: Any, input_shape: Sequence[int], *, output_index: int = 0, name: str | None = None,
               mc_dropout: bool = False, task: str | None = None, noise_var: float | None = None,
               regression_head: str | None = None, **task_options: Any) -> BNNModel:
    """Import a trained PyTorch BNN into the IR (needs torch).

    Args:
        model: The trained ``torch.nn.Module``: edgebnn, bayesian-torch (reparameterization or flipout,
            hand-written or ``dnn_to_bnn``), torchbnn or blitz layers; plain Linear/Conv2d/BatchNorm layers are
            carried through as deterministic layers. Or a fitted laplace-torch posterior (``DiagLaplace``,
            ``KronLaplace``, ``DiagLLLaplace``, ``KronLLLaplace``, ``FullLLLaplace``), imported with its own structure:
            diagonal as mean-field Gaussians, Kronecker-factored and full covariance as the Laplace family's
            encodings (:mod:`edgebnn.importers.laplace`, :mod:`edgebnn.families.laplace`).
        input_shape: One example's shape with a leading batch dim, e.g. ``(1, 1, 28, 28)``.
        output_index: Which output to use when ``forward`` returns a tuple such as ``(logits, kl)``.
        name: How errors name the model (default: its class name).
        mc_dropout: MC dropout (Gal & Ghahramani): keep the model's ``nn.Dropout``/``Dropout1d/2d/3d`` on at
            prediction, each a dropout-mask posterior on its input (:mod:`edgebnn.families.dropout`), and its
            plain Linear/Conv weights as σ = 0 Gaussians (lowering schemes encode them; exports run them once). A
            plain torch model needs nothing else.
        task: What the output is: ``classification`` ([B, K] logits), ``regression`` ([B, D] means, or
            [B, 2D] / a tuple of means and log-variances), ``segmentation`` (``dense``: [B, C, H, W] or
            [B, C, L] logits), or a task a plug-in registered (:data:`edgebnn.tasks.TASKS`). None: [B, K >= 3]
            is classification, a >= 3-D output segmentation; a 1- or 2-wide head is refused with a hint (it could
            be either).
        noise_var: Regression, mean-only head: the observation noise variance σ² (aleatoric), or None.
        regression_head: ``mean`` or ``mean_logvar``; default ``mean_logvar`` for a (mean, log-variance) tuple
            or an even width without ``noise_var``, else ``mean``.
        **task_options: The options of the stated ``task`` (its :attr:`~edgebnn.tasks.Task.import_options`,
            handed to its :meth:`~edgebnn.tasks.Task.from_output`): a plug-in task's own; one it does not take
            is refused in one line.

    Returns:
        The IR, one mean-field Gaussian per Bayesian weight, or its family's encoding (and one dropout mask per
        dropout layer with ``mc_dropout``); lower it with :func:`lower`.

    A deep ensemble (a list, tuple or ``nn.ModuleList`` of M trained models of one architecture, or a wrapper
    module holding them in one ``nn.ModuleList`` whose forward is their mean softmax) imports as one IR of
    member-set layers (:mod:`edgebnn.families.ensemble`); export it with ``samples=M``.

    Raises:
        UnsupportedLayerError: No Bayesian layer (nor dropout, with ``mc_dropout``), a layer edgebnn cannot
            import, or dropout called outside an ``nn.Dropout*`` module with ``mc_dropout`` (named by its path);
            ensemble members of different architectures.
        InvalidOptionError: A list that holds something other than torch modules.
        MissingDependencyError: torch is not installed.
    """
    from edgebnn.importers import import_model
    from edgebnn.importers.ensemble import as_ensemble, import_ensemble
    from edgebnn.importers.laplace import import_laplace, is_laplace

    options = {"noise_var": noise_var, "regression_head": regression_head, **task_options}
    given = sorted(k for k, v in task_options.items() if v is not None)
    if is_laplace(model):  # a fitted laplace-torch posterior: its own structure per layer
        _no_task_options(given, name or type(model).__name__, "a laplace-torch posterior (a classifier)")
        return import_laplace(model, tuple(input_shape), where=name or type(model).__name__)

    where = name or ("deep ensemble" if isinstance(model, (list, tuple)) else type(model).__name__)
    members = as_ensemble(model, input_shape, where, wrappers=not mc_dropout)  # a deep ensemble: its own importer
    if members is not None:
        if mc_dropout:
            raise InvalidOptionError(f"{where}: --mc-dropout does not apply to a deep ensemble")
        _no_task_options(given, where, "a deep ensemble (a classifier)")
        return import_ensemble(members, input_shape, output_index=output_index, where=where)

    return import_model(model, tuple(input_shape), output_index=output_index, where=where, mc_dropout=mc_dropout,
                        task=task, task_options=options)


def _no_task_options(given: list[str], where: str, what: str) -> None:
    if given:
        raise InvalidOptionError(f"{where}: task options {given} do not apply to {what}")


def from_swag(model: Any, stats: Mapping[str, Any] | PathLike, input_shape: Sequence[int], *, scale: float = 0.5,
              var_clamp: float = 1e-30, output_index: int = 0, name: str | None = None) -> BNNModel:
    """Import SWAG (Maddox et al. 2019): the plain model SWAG ran on plus its statistics (needs torch).

    Args:
        model: The ``torch.nn.Module`` (its Linear/Conv/BatchNorm parameters are SWAG's; BatchNorm running
            statistics are used as they are).
        stats: Per parameter ``{name}_mean``, ``{name}_sq_mean`` and optionally ``{name}_covariance_sqrt``
            (or the reference code's ``{name}_cov_mat_sqrt``) [K, numel], as a mapping of tensors/arrays or a
            ``.safetensors``/``.pt`` file; one common key prefix (``base.``, ``model.swag_stats.``) is allowed.
        input_shape: One example's shape with a leading batch dim.
        scale: SWAG's ``scale`` as in the reference ``SWAG.sample(scale)``: w = mean + sqrt(scale) · (σ ⊙ z₁ +
            Dᵀ z₂ / sqrt(K − 1)); 0.5 is the paper's ½Σ_diag + ½DDᵀ/(K−1).
        var_clamp: Floor of the diagonal variance (the reference code's ``var_clamp``).
        output_index: Which output to use when ``forward`` returns a tuple.
        name: How errors name the model.

    Returns:
        The IR, one low-rank Gaussian per parameter (:mod:`edgebnn.families.swag`; mean-field for SWAG-diagonal stats);
        export it in ``baked`` mode (one z₂ per sample shared by every layer).
    """
    from edgebnn.importers.swag import import_swag

    return import_swag(model, stats, input_shape, scale=scale, var_clamp=var_clamp, output_index=output_index,
                       where=name or type(model).__name__)


def lower(model: BNNModel, scheme: str | LowerConfig = "float", *, seed: int | None = None,
          bits: str | int | None = None, progress: Progress | None = None, consume: bool = False,
          **options: Any) -> LoweredModel:
    """Lower an IR with a compression scheme; the lowering report is attached as ``result.lowering_report``.

    Args:
        model: The IR (not modified, unless ``consume``).
        scheme: ``float``, ``mcq``, ``fixed``, ``codebook``, ``ternary``, ``binary``, ``prune`` or
            ``prune+SCHEME``; or a :class:`edgebnn.passes.LowerConfig` (per-layer overrides; it holds the seed,
            bits and options, so give none of them here).
        seed: Seeds every random choice; the same seed gives the same bytes (default 0).
        bits: ``"auto"`` (default: bits per layer from the posterior variance) or a forced width.
        progress: Called as ``progress(done, total)`` while the passes run (one step per weight per pass).
        consume: Lower ``model`` in place rather than a copy (one model's memory less); give it up: do not use
            it afterwards. The result is the same.
        **options: Scheme options, e.g. ``clusters=16`` for codebook (see :func:`edgebnn.passes.lower`).

    Returns:
        The lowered IR (a ``LoweredModel``, which is a ``BNNModel``): ``.lowering_report`` holds ``scheme``, ``layers``,
        ``total_bytes``, ``float_bnn_bytes``, ``compression_ratio``, ...
    """
    from edgebnn._lowered import LoweredModel
    from edgebnn.passes import lower as run_passes

    result = run_passes(model, scheme, seed=seed, bits=bits, progress=progress, consume=consume, **options)
    return LoweredModel(result.model, result.report)


def export_result(model: BNNModel | PathLike, config: ExportConfig | ResolvedExport | None = None, *,
                  progress: Progress | None = None, **options: Any) -> ExportResult:
    """The ensemble :func:`export` writes, in memory: the ONNX proto, the config as resolved against the model, and
    the mode the export ran in with its reason (:class:`edgebnn.exporters.export.ExportResult`).

    Args:
        model: The IR, or the path of an ``.ebnn``.
        config: The export configuration (:class:`edgebnn.exporters.config.ExportConfig`; default its defaults), or
            one already resolved against ``model``.
        progress: Called as ``progress(done, total)`` while the graph is built.
        **options: :class:`~edgebnn.exporters.config.ExportConfig` fields, over ``config``'s (``samples``, ``rule``,
            ``mode``, ``noise``, ``weights``, ``rng``, ``hoist``, ``form``, ``seed``, ``device``, ``variance``): see
            :func:`export`.

    Raises:
        InvalidOptionError: An unknown option, or a choice the model or the device cannot take.
    """
    import dataclasses

    from edgebnn.exporters.config import ExportConfig, ResolvedExport
    from edgebnn.exporters.export import export_model

    ir_model = model if not isinstance(model, (str, os.PathLike)) else load_ir(model)
    if options:
        names = {f.name for f in dataclasses.fields(ExportConfig)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise InvalidOptionError(f"export: unknown option(s) {', '.join(unknown)}; the options are "
                                     f"{', '.join(sorted(names - {'version'}))}")
        if isinstance(config, ResolvedExport):
            raise InvalidOptionError("export: options with a resolved config: give an ExportConfig")
        config = dataclasses.replace(config or ExportConfig(), **options)
    return export_model(ir_model, config, progress=progress)


def export(model: BNNModel | PathLike, path: PathLike, config: ExportConfig | None = None, *,
           progress: Progress | None = None, **options: Any) -> Path:
    """Export an IR as an ONNX ensemble computing the S-sample predictive, and write it (atomically).

    The graph's first input is the data; its outputs are the task's (:attr:`edgebnn.tasks.Task.outputs`: a
    classifier's ``probs`` (mean over S), ``entropy`` and ``mutual_info``; a regression's mean and variances; a
    segmentation's per-pixel ones), and an anytime ensemble adds ``samples`` (the members each input used). A noise
    graph with ``rng="host"`` takes the standard noise as further inputs (``noise/<weight>``), which
    :class:`edgebnn.runtime.Session` fills; the export metadata lists them (``noise_inputs``) and records the
    configuration that reproduces the file (``config``).

    Args:
        model: The IR, or the path of an ``.ebnn``.
        path: The ``.onnx`` to write.
        config: Every export choice as one :class:`edgebnn.exporters.config.ExportConfig` (default: its defaults);
            or give them as ``options``.
        progress: Called as ``progress(done, total)`` while the graph is built.
        **options: ExportConfig's fields, over ``config``'s:

            - ``samples``: ensemble size S (default 16; a deep ensemble's M members: M, the only S it exports), or
              ``"auto"``: an anytime ensemble that draws samples in chunks until each input's predictive has
              settled (``rule``, :mod:`edgebnn.stopping`; docs/anytime.md).
            - ``rule``: ``samples="auto"``: the :class:`~edgebnn.stopping.StoppingRule` (default: its defaults; a
              deep ensemble's largest count is its M members).
            - ``mode``: ``auto`` (default: the device's default, which keeps the lowered compression; for ``cpu``,
              ``arm64`` and no device: ``noise`` with the IR's codes and the noise drawn in the graph, a deep
              ensemble ``baked``: :mod:`edgebnn.exporters.export`), ``baked`` (S samples stored as constants;
              TensorRT/DLA-safe), ``noise`` (μ and σ stored, noise drawn per call: ``rng``), ``shared`` (codebook
              models) or ``analytic``.
            - ``weights``: ``ir`` (default: noise/shared/analytic store μ, σ as the IR's own packed codes, decoded in
              the graph; baked members fp32), ``fp32``, ``int8`` or ``int4`` (baked: member weights; the other
              modes: μ and σ re-quantized at export).
            - ``seed``: seed of the baked samples.
            - ``noise``: noise mode variant: ``auto``, ``local``, ``weight``, ``mixed`` or ``flipout``.
            - ``hoist``: ``off``, ``auto`` or a σ threshold below which layers run once (``edgebnn export --help``).
            - ``form``: how int8/int4 weights are written: ``auto`` (chosen from ``device``), ``qdq``, ``folded`` or
              ``integer`` (see docs/speed.md).
            - ``device``: where the graph runs (``cpu``, ``arm64``, ``rtx``, ``jetson*``): picks the form, refuses a
              weight format the device cannot run.
            - ``rng``: noise/shared mode: ``host`` (noise inputs :class:`Session` fills: reproducible), ``graph``
              (seeded random ops inside: the data is the only input) or ``auto`` (default: graph where ``device``
              runs random ops, or no device is given).
            - ``variance``: analytic mode: ``exact`` (default) or ``separable`` (each k×k Conv's variance as a
              per-channel k×k filter and a 1×1 mix: faster, an approximation the export's ``approximations``
              state with the fit's error; docs/uncertainty.md).

    Returns:
        The path written. Run it with ``edgebnn.Session(path).predict(x)``.
    """
    from edgebnn.exporters.ensemble import save_onnx

    return save_onnx(export_result(model, config, progress=progress, **options).proto, path)
