"""Pictures: of a lowered model (per layer the μ–σ plane, and the bits per layer), and of an evaluation
(reliability diagram, uncertainty histogram in vs out of distribution).

Matplotlib is driven through ``Figure`` objects (no pyplot, no global backend switch); PNG output goes
through the Agg renderer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from edgebnn._io import atomic_write
from edgebnn.ir import BNNModel, Encoding

_CHI2_95 = 5.991  # squared Mahalanobis radius of the 95% ellipse in 2-D


def _subsample(n: int, max_points: int, rng: np.random.Generator) -> np.ndarray:
    return np.arange(n) if n <= max_points else np.sort(rng.choice(n, max_points, replace=False))


def _payload_bits(enc: Encoding) -> int:
    return int(getattr(enc, "bits", 32))


def _draw_codebook(ax, enc: Any, ref: Encoding | None, rng: np.random.Generator, max_points: int) -> None:
    from matplotlib.patches import Ellipse

    sizes = enc.cluster_sizes()
    used = sizes > 0
    if ref is not None:  # each entry's 95% ellipse, from its members' posterior points
        mu, sigma = ref.mean().reshape(-1).astype(np.float64), ref.stddev().reshape(-1).astype(np.float64)
        own = np.ones(enc.size, bool)
        own[enc.outlier_index] = own[enc.blend_index] = False
        for k in np.flatnonzero(sizes > 1):
            members = own & (enc.indices == k)
            cov = np.cov(np.stack([mu[members], sigma[members]]))
            vals, vecs = np.linalg.eigh(cov)  # ascending: vecs[:, 1] is the major axis
            minor, major = 2 * np.sqrt(np.maximum(vals, 0) * _CHI2_95)
            angle = float(np.degrees(np.arctan2(vecs[1, 1], vecs[0, 1])))
            ax.add_patch(Ellipse((mu[members].mean(), sigma[members].mean()), major, minor, angle=angle,
                                 fill=False, lw=0.6, color="tab:blue", alpha=0.6))
    ax.scatter(enc.codebook[used, 0], enc.codebook[used, 1], s=8 + 60 * sizes[used] / max(sizes.max(), 1),
               c="tab:blue", marker="o", label=f"{int(used.sum())} entries", zorder=3)
    if enc.blend_index.size:
        mean, std = enc.mean().reshape(-1), enc.stddev().reshape(-1)
        pick = enc.blend_index[_subsample(enc.blend_index.size, max_points, rng)]
        ax.scatter(mean[pick], std[pick], s=4, c="gold", label=f"{enc.blend_index.size} blended", zorder=4)
    if enc.outlier_index.size:
        pick = _subsample(enc.outlier_index.size, max_points, rng)
        ax.scatter(enc.outlier_mu[pick], enc.outlier_sigma[pick], s=3, c="tab:red",
                   label=f"{enc.outlier_index.size} outliers", zorder=4)


def plot_layers(
    model: BNNModel,
    out_png: str | os.PathLike[str],
    *,
    reference: BNNModel | None = None,
    max_points: int = 4000,
    seed: int = 0,
) -> Path:
    """Draw every encoded weight's μ–σ scatter and a bits-per-layer bar chart into one PNG.

    Args:
        model: The (lowered) IR to draw.
        out_png: Where to write the PNG.
        reference: The model before lowering; its posterior points are drawn in grey under each panel, and
            codebook layers get each entry's 95% (Mahalanobis 5.991) ellipse from its members' points.
        max_points: Points drawn per panel at most (a seeded subsample of big layers).
        seed: Seed of the subsample.

    Returns:
        The path written.
    """
    from matplotlib.figure import Figure

    rng = np.random.default_rng(seed)
    weights = model.encoded_weights()
    refs = {w.name: w.encoding for w in reference.encoded_weights()} if reference is not None else {}
    cols = min(3, max(len(weights), 1))
    rows = -(-len(weights) // cols) + 1
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows), layout="constrained")
    grid = fig.add_gridspec(rows, cols)
    for i, w in enumerate(weights):
        ax = fig.add_subplot(grid[i // cols, i % cols])
        enc, ref = w.encoding, refs.get(w.name)
        if ref is not None:
            pick = _subsample(ref.size, max_points, rng)
            ax.scatter(ref.mean().reshape(-1)[pick], ref.stddev().reshape(-1)[pick], s=2, c="0.75",
                       label="posterior", zorder=1)
        if hasattr(enc, "codebook"):  # a codebook's K entries on the μ–σ plane
            _draw_codebook(ax, enc, ref, rng, max_points)
        else:
            pick = _subsample(enc.size, max_points, rng)
            ax.scatter(enc.mean().reshape(-1)[pick], enc.stddev().reshape(-1)[pick], s=2, c="tab:blue",
                       label=enc.op_type, zorder=2)
        ax.set_title(f"{w.name}: {enc.op_type}, {_payload_bits(enc)} bits", fontsize=9)
        ax.set_xlabel("mean μ", fontsize=8)
        ax.set_ylabel("std σ", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="upper right")
    bars = fig.add_subplot(grid[rows - 1, :])
    names = [w.name for w in weights]
    x = np.arange(len(weights))
    bars.bar(x - 0.2, [_payload_bits(w.encoding) for w in weights], 0.4, label="payload bits")
    bars.bar(x + 0.2, [8 * w.encoding.nbytes / w.encoding.size for w in weights], 0.4,
             label="stored bits per weight (all tensors)")
    bars.set_xticks(x, names, rotation=30, ha="right", fontsize=7)
    bars.set_ylabel("bits")
    bars.set_title(f"bits per layer · scheme {model.manifest.scheme}", fontsize=9)
    bars.legend(fontsize=7)
    return atomic_write(out_png, lambda f: fig.savefig(f, format="png", dpi=110))


def plot_evaluation(
    reliability: dict[str, list[float]],
    in_mutual_info: np.ndarray,
    ood_mutual_info: np.ndarray | None,
    out_png: str | os.PathLike[str],
    *,
    title: str = "",
) -> Path:
    """Draw a reliability diagram and a mutual-information histogram (in-distribution vs OOD) into one PNG.

    Args:
        reliability: Per confidence bin ``count``, ``confidence`` and ``accuracy``
            (:meth:`edgebnn.metrics.MetricSums.reliability`).
        in_mutual_info: Mutual information of each in-distribution input.
        ood_mutual_info: Mutual information of each out-of-distribution input, or None.
        out_png: Where to write the PNG.
        title: Figure title.

    Returns:
        The path written.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    if title:
        fig.suptitle(title, fontsize=10)
    rel, hist = fig.subplots(1, 2)
    _draw_reliability(rel, reliability, "confidence (max mean probability)", "accuracy")
    top = max(float(in_mutual_info.max(initial=0.0)),
              float(ood_mutual_info.max(initial=0.0)) if ood_mutual_info is not None else 0.0)
    hist_bins = np.linspace(0, max(top, 1e-6), 41)
    hist.hist(in_mutual_info, bins=hist_bins, alpha=0.6, density=True,
              label=f"in-distribution (n={len(in_mutual_info)})")
    if ood_mutual_info is not None:
        hist.hist(ood_mutual_info, bins=hist_bins, alpha=0.6, density=True,
                  label=f"out-of-distribution (n={len(ood_mutual_info)})")
    hist.set_xlabel("mutual information (nats)")
    hist.set_ylabel("density")
    hist.set_title("epistemic uncertainty", fontsize=9)
    hist.legend(fontsize=7)
    return atomic_write(out_png, lambda f: fig.savefig(f, format="png", dpi=110))


def plot_regression(coverage: dict[str, list[float]], in_epistemic: np.ndarray, ood_epistemic: np.ndarray | None,
                    out_png: str | os.PathLike[str], *, title: str = "") -> Path:
    """Interval coverage (observed vs nominal, :meth:`edgebnn.tasks.regression.RegressionSums.reliability`) beside the
    histogram of the mean epistemic variance per input (in-distribution vs OOD)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    if title:
        fig.suptitle(title, fontsize=10)
    cov, hist = fig.subplots(1, 2)
    cov.plot([0, 1], [0, 1], "--", color="0.5", lw=0.8, label="perfect calibration")
    cov.plot(coverage["nominal"], coverage["coverage"], "o-", ms=3, color="tab:red", label="observed")
    cov.set_xlim(0, 1)
    cov.set_ylim(0, 1)
    cov.set_xlabel("nominal coverage of the central interval")
    cov.set_ylabel("observed coverage")
    cov.set_title("interval calibration", fontsize=9)
    cov.legend(fontsize=7, loc="upper left")
    _epistemic_hist(hist, in_epistemic, ood_epistemic, "mean epistemic variance")
    return atomic_write(out_png, lambda f: fig.savefig(f, format="png", dpi=110))


def plot_segmentation(image: np.ndarray, mask: np.ndarray | None, predicted: np.ndarray, mutual_info: np.ndarray,
                      reliability: dict[str, list[float]], out_png: str | os.PathLike[str], *,
                      title: str = "") -> Path:
    """One input (its first channel, or its mean over channels), its label mask, the predicted mask and the
    mutual-information map, and the per-pixel reliability diagram. 1-D (``[C, L]``) outputs are drawn as rows."""
    from matplotlib.figure import Figure

    def as_image(a: np.ndarray) -> np.ndarray:
        a = np.asarray(a, np.float64)
        return a[None, :] if a.ndim == 1 else a

    picture = image.mean(0) if image.ndim >= 2 else image  # [C, H, W] -> [H, W]; [C, L] -> [L]
    fig = Figure(figsize=(15, 3.4), layout="constrained")
    if title:
        fig.suptitle(title, fontsize=10)
    axes = fig.subplots(1, 5)
    classes = max(int(predicted.max()), int(mask.max()) if mask is not None else 0) + 1
    panels = [(picture, "input", "gray", None), (mask, "label mask", "tab20", (0, max(classes - 1, 1))),
              (predicted, "predicted mask", "tab20", (0, max(classes - 1, 1))),
              (mutual_info, "mutual information (nats)", "magma", None)]
    for ax, (data, name, cmap, lim) in zip(axes[:4], panels, strict=True):
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        if data is None:
            ax.text(0.5, 0.5, "no labels", ha="center", va="center")
            continue
        shown = ax.imshow(as_image(data), cmap=cmap, interpolation="nearest",
                          **({"vmin": lim[0], "vmax": lim[1]} if lim else {}))
        if name.startswith("mutual"):
            fig.colorbar(shown, ax=ax, shrink=0.8)
    _draw_reliability(axes[4], reliability, "per-pixel confidence", "pixel accuracy")
    return atomic_write(out_png, lambda f: fig.savefig(f, format="png", dpi=110))


MIN_BIN_COUNT = 10
"""Reliability bins with fewer inputs than this are drawn hollow: the accuracy of 1-9 inputs moves by 10% or more
with one input, and such bins would otherwise dominate the picture."""


def reliability_bins(reliability: dict[str, list[float]], min_count: int = MIN_BIN_COUNT) -> dict[str, np.ndarray]:
    """What the reliability diagram draws, per non-empty bin: ``left`` edge, ``width``, ``count``, ``accuracy``
    (the bar's height), ``confidence`` (the bin's mean confidence: the dot's x, at the accuracy's y, so a calibrated
    bin's dot sits on the diagonal) and ``solid`` (at least ``min_count`` inputs; fewer: hollow, with the count).

    Args:
        reliability: Per confidence bin ``count``, ``confidence`` and ``accuracy`` over equal-width bins of [0, 1]
            (:meth:`edgebnn.metrics.MetricSums.reliability`).
        min_count: The fewest inputs a solid bar holds.
    """
    count = np.asarray(reliability["count"], dtype=np.float64)
    bins = len(count)
    edges = np.linspace(0, 1, bins + 1)
    used = count > 0
    return {"left": edges[:-1][used], "width": np.full(int(used.sum()), 1 / bins), "count": count[used].astype(int),
            "accuracy": np.asarray(reliability["accuracy"], dtype=np.float64)[used],
            "confidence": np.asarray(reliability["confidence"], dtype=np.float64)[used],
            "solid": count[used] >= min_count}


def _draw_reliability(ax: Any, reliability: dict[str, list[float]], xlabel: str, ylabel: str) -> None:
    """Bars of accuracy per confidence bin (hollow under :data:`MIN_BIN_COUNT` inputs), each bin's count above
    it, a dot per bin at (mean confidence, accuracy) and the diagonal of perfect calibration."""
    b = reliability_bins(reliability)
    solid = b["solid"]
    ax.bar(b["left"][solid], b["accuracy"][solid], width=b["width"][solid], align="edge", edgecolor="k", lw=0.4,
           color="tab:blue", label=f"accuracy, {MIN_BIN_COUNT}+ inputs")
    ax.bar(b["left"][~solid], b["accuracy"][~solid], width=b["width"][~solid], align="edge", edgecolor="tab:blue",
           lw=0.6, fill=False, hatch="//", label=f"accuracy, < {MIN_BIN_COUNT} inputs")
    ax.plot([0, 1], [0, 1], "--", color="0.5", lw=0.8, label="perfect calibration")
    ax.plot(b["confidence"], b["accuracy"], "o", ms=3, color="tab:red", label="at mean confidence")
    for left, width, n in zip(b["left"], b["width"], b["count"], strict=True):  # a row of counts over the bars
        ax.text(left + width / 2, 1.04, str(n), ha="center", va="center", fontsize=6, color="0.25")
    ax.axhline(1.0, color="0.8", lw=0.5)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.08)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"reliability diagram ({len(reliability['count'])} bins; the top row: inputs per bin)", fontsize=9)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0.0, 0.95))


def _epistemic_hist(hist: Any, inside: np.ndarray, ood: np.ndarray | None, label: str) -> None:
    top = max(float(inside.max(initial=0.0)), float(ood.max(initial=0.0)) if ood is not None else 0.0)
    edges = np.linspace(0, max(top, 1e-6), 41)
    hist.hist(inside, bins=edges, alpha=0.6, density=True, label=f"in-distribution (n={len(inside)})")
    if ood is not None:
        hist.hist(ood, bins=edges, alpha=0.6, density=True, label=f"out-of-distribution (n={len(ood)})")
    hist.set_xlabel(label)
    hist.set_ylabel("density")
    hist.set_title("epistemic uncertainty", fontsize=9)
    hist.legend(fontsize=7)


def plot_search_front(data: dict[str, Any], out_png: str | os.PathLike[str]) -> Path:
    """The search's trials on their first two objectives (:func:`edgebnn.search.report.front_data`): every trial in
    grey, the Pareto set as points (joined by a step line only when the search had two objectives: a set over
    three is no line in two dimensions), the best trial, the float BNN, and the budget's bound on the y metric as a
    dashed line. A bytes axis is logarithmic with KiB/MiB labels at powers of 2, the minor ticks unlabelled.

    Returns:
        The path written.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.8, 4.6), layout="constrained")
    ax = fig.add_subplot()
    if data["trials"]:
        tx, ty = zip(*data["trials"], strict=True)
        ax.scatter(tx, ty, s=18, color="#999", label="trial", zorder=2)
    if data["pareto"]:
        px, py = zip(*data["pareto"], strict=True)
        many = len(data["objectives"]) > 2
        label = (f"Pareto set over {', '.join(data['objectives'])}" if many else "Pareto front")
        ax.scatter(px, py, s=34, color="#c33", label=label, zorder=3)
        if data["step"]:
            ax.step(px, py, where="post", color="#c33", lw=1, zorder=3)
    if data["best"]:
        bx, by = data["best"][0]
        ax.scatter([bx], [by], marker="*", s=220, color="#e90", edgecolor="k", zorder=5,
                   label=data["best_label"])
    if data["baseline"] is not None:
        fx, fy = data["baseline"]
        ax.scatter([fx], [fy], marker="s", s=40, color="#36c", label="float BNN", zorder=4)
    if data["budget_y"] is not None:
        delta = data["budget"][data["y"]]
        ax.axhline(data["budget_y"], ls="--", color="#393", lw=1,
                   label=f"budget: {data['y']} {delta:+g} vs the float BNN")
        others = [f"{k} {v:+g}" for k, v in data["budget"].items() if k != data["y"]]
        if others:
            ax.plot([], [], " ", label=f"(budget also bounds {', '.join(others)})")
    if data["log_x"]:
        bytes_axis(ax)
    ax.set_xlabel(data["x"])
    ax.set_ylabel(data["y"])
    ax.set_title(data["title"], fontsize=10)
    ax.legend(fontsize=7)
    return atomic_write(out_png, lambda f: fig.savefig(f, format="png", dpi=120))


def bytes_axis(ax: Any) -> None:
    """A logarithmic x axis of bytes: at most 8 labels, at powers of 2, as KiB/MiB, slanted; minor ticks unlabelled
    (matplotlib's default labels every decade's minor ticks too, and they overlap)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from edgebnn.tables import fmt_bytes

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=8))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_bytes(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelrotation=30)
