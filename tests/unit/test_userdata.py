"""The user's own data: .npz files and shard folders through one loader, streamed metrics, OOD detection,
the top-level Python API, and tables that fit the terminal."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console
from synthetic import synthetic_cnn

import edgebnn
from edgebnn.cli import main
from edgebnn.data import digits, load_data
from edgebnn.errors import InvalidOptionError
from edgebnn.metrics import MetricSums, classification_report, ood_report
from edgebnn.runtime.reference import predict
from edgebnn.tables import print_inspect, print_lower_report

N = 300


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    return rng.normal(size=(N, 1, 6, 6)).astype(np.float32), rng.integers(0, 3, N)


@pytest.fixture(scope="module")
def files(tmp_path_factory, data):
    """The same 300 rows as one .npz, as .npy shard pairs, and as .npz shards; and the model."""
    d = tmp_path_factory.mktemp("userdata")
    x, y = data
    np.savez(d / "all.npz", x=x, y=y)
    (d / "npy").mkdir()
    (d / "npz").mkdir()
    for i, (lo, hi) in enumerate([(0, 100), (100, 250), (250, 300)]):
        np.save(d / "npy" / f"x_{i:03d}.npy", x[lo:hi])
        np.save(d / "npy" / f"y_{i:03d}.npy", y[lo:hi])
        np.savez(d / "npz" / f"part{i}.npz", x=x[lo:hi], y=y[lo:hi])
    edgebnn.save(synthetic_cnn(sigma=0.3), d / "m.ebnn")
    return d


def test_every_layout_streams_the_same_rows(files, data):
    x, y = data
    for source in (files / "all.npz", files / "npy", files / "npz", data):
        ds = load_data(source, input_shape=(1, 6, 6), num_classes=3)
        assert ds.n == N and ds.input_shape == (1, 6, 6)
        got = list(ds.batches(64))
        assert max(len(b[0]) for b in got) <= 64
        np.testing.assert_array_equal(np.concatenate([b[0] for b in got]), x)
        np.testing.assert_array_equal(np.concatenate([b[1] for b in got]), y)


def test_digits_through_the_loader_is_the_split():
    x, y = digits().split("val")
    ds = load_data("digits", split="val")
    got_x, got_y = ds.arrays()
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
    assert ds.describe() == {"data": "digits", "split": "val", "n": 360}


def test_streamed_metrics_equal_the_whole_batch(data):
    probs = predict(synthetic_cnn(sigma=0.3), data[0], 8).probs
    sums = MetricSums()
    for lo in range(0, N, 70):  # uneven batches
        sums.add(probs[lo : lo + 70], data[1][lo : lo + 70])
    whole = classification_report(probs, data[1])
    assert sums.report() == pytest.approx(whole, rel=1e-12)
    rel = sums.reliability()
    assert sum(rel["count"]) == N


def test_evaluate_is_the_same_on_every_layout(files, data):
    reports = [edgebnn.evaluate(files / "m.ebnn", data=src, samples=4) for src in
               (files / "all.npz", files / "npy", files / "npz", data)]
    probs = predict(edgebnn.load(files / "m.ebnn"), data[0], 4).probs
    for r in reports:
        assert r["n"] == N and r["split"] is None
        for k, v in classification_report(probs, data[1]).items():
            assert r[k] == pytest.approx(v, rel=1e-9), k


def test_ood_report_by_hand():
    in_mi, ood_mi = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.35, 0.5, 0.6])
    r = ood_report(in_mi, in_mi, ood_mi, ood_mi)
    # 12 (in, ood) pairs; the OOD score is higher in 11 of them (0.35 < 0.4 is the exception)
    assert r["auroc_mutual_info"] == pytest.approx(11 / 12)
    assert r["auroc_entropy"] == pytest.approx(11 / 12)
    # keeping 95% of in-distribution inputs needs all four (threshold 0.4): OOD 0.35 slips through
    assert r["fpr_at_95_tpr"] == pytest.approx(1 / 3)
    swapped = ood_report(ood_mi, ood_mi, in_mi, in_mi)
    assert swapped["auroc_mutual_info"] == pytest.approx(1 / 12)


def test_eval_ood_cli_writes_json_and_plot(files, data, tmp_path):
    x = data[0]
    np.savez(tmp_path / "ood.npz", x=x[:100] * 10)  # far outside the inputs' scale
    out, png = tmp_path / "e.json", tmp_path / "e.png"
    r = CliRunner().invoke(main, ["eval", str(files / "m.ebnn"), "--data", str(files / "npz"), "--ood-data",
                                  str(tmp_path / "ood.npz"), "-S", "8", "--json", str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    ood = report["ood"]
    assert set(ood) >= {"auroc_mutual_info", "auroc_entropy", "aupr_mutual_info", "fpr_at_95_tpr"}
    assert ood["n"] == 100 and report["n"] == N
    # 10x inputs spread the sampled logits: the mutual information separates them (0.5 = chance)
    assert ood["auroc_mutual_info"] > 0.7 and ood["mean_mutual_info_ood"] > ood["mean_mutual_info_in"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "OOD" in r.output


def test_single_input_npy_only_where_labels_are_not_needed(tmp_path, data):
    np.save(tmp_path / "one.npy", data[0][0])  # (1, 6, 6): one calibration input
    ds = load_data(tmp_path, input_shape=(1, 6, 6), labels=False)
    np.testing.assert_array_equal(ds.arrays()[0], data[0][:1])
    with pytest.raises(InvalidOptionError, match="no labels"):
        load_data(tmp_path, input_shape=(1, 6, 6))


def test_a_shard_folder_streams_in_bounded_memory(tmp_path):
    """Evaluating 4 shards needs no more working memory than 1, beyond two floats per extra row kept for
    the OOD metrics and plots: the inputs are never all in memory."""
    rows = 20_000
    shard_bytes = rows * 36 * 4
    model = edgebnn.save(synthetic_cnn(), tmp_path / "m.ebnn")
    rng = np.random.default_rng(0)
    for shards in (1, 4):
        folder = tmp_path / f"s{shards}"
        folder.mkdir()
        for i in range(shards):
            np.save(folder / f"x_{i}.npy", rng.normal(size=(rows, 1, 6, 6)).astype(np.float32))
            np.save(folder / f"y_{i}.npy", rng.integers(0, 3, rows))

    def peak(folder: str) -> int:
        tracemalloc.start()
        try:
            edgebnn.evaluate(model, data=tmp_path / folder, samples=2)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    extra = peak("s4") - peak("s1")
    assert extra < 0.25 * 3 * shard_bytes, extra / shard_bytes


def test_import_is_light_and_api_is_documented():
    code = ("import sys, edgebnn; heavy = [m for m in ('torch', 'onnxruntime', 'onnx', 'numpy') if m in sys.modules];"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    for name in edgebnn.__all__:
        obj = getattr(edgebnn, name)
        assert name == "__version__" or obj.__doc__, name
    assert "from_torch" in edgebnn.__doc__ and "evaluate" in edgebnn.__doc__


def test_api_lower_export_load_evaluate(tmp_path, data):
    model = synthetic_cnn(sigma=0.2)
    small = edgebnn.lower(model, "fixed")
    assert small.lowering_report["scheme"] == "fixed" and small.lowering_report["compression_ratio"] > 1
    path = edgebnn.export(small, tmp_path / "m.onnx", samples=4)
    edgebnn.save(small, tmp_path / "m.ebnn")
    assert edgebnn.load(tmp_path / "m.ebnn").manifest.scheme == "fixed"
    session = edgebnn.Session(path)
    by_session = edgebnn.evaluate(session, data=data)
    by_path = edgebnn.evaluate(path, data=data)
    assert by_session["accuracy"] == by_path["accuracy"] and by_path["samples"] == 4


def _lower_report(layers: int, note: str) -> dict:
    rows = [{"name": f"layer{i // 3}.block{i % 3}.conv{i % 2}.weight", "kind": "CodebookWeight", "n_weights": 4096,
             "bits": 4, "sparsity": 0.0, "bytes": 2100, "note": note} for i in range(layers)]
    return {"scheme": "codebook", "seed": 0, "layers": rows, "total_bytes": 2100 * layers,
            "float_bnn_bytes": 8 * 4096 * layers, "compression_ratio": 8 * 4096 / 2100}


@pytest.mark.parametrize(("layers", "verbose"), [(8, False), (53, False), (53, True)])
def test_lower_table_fits_80_columns(layers, verbose):
    note = "shared codebook of 16 entries refined by 3 k-means steps; 12 outliers kept in fp16 " * 2
    console = Console(width=80, record=True, color_system=None)
    manifest = {"source_library": "bayesian_torch", "input_shape": [1, 3, 32, 32], "num_classes": 10}
    print_lower_report(console, _lower_report(layers, note), "resnet.ebnn", model="zoo:resnet50 (w.pt)",
                       manifest=manifest, verbose=verbose)
    text = console.export_text()
    lines = text.splitlines()
    assert max(map(len, lines)) <= 80
    if verbose or layers <= 24:  # the note is printed once, as footnote [1], under the table
        assert " ".join(text.split()).count(" ".join(note.split())) == 1
        assert [line.startswith("[1] ") for line in lines].count(True) == 1
    body = [line for line in lines if line.startswith("│ ")]  # table rows (the heading row uses ┃)
    assert len(body) == (layers if verbose or layers <= 24 else 1)  # compact: one row per (encoding, bits)
    assert len(lines) < (layers + 20 if verbose else 40)


def test_inspect_header_and_table_fit_80_columns(files):
    from edgebnn.cli import _describe_ir

    console = Console(width=80, record=True, color_system=None)
    print_inspect(console, _describe_ir(edgebnn.load(files / "m.ebnn")))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80
    assert "synthetic · input (1, 1, 6, 6) · 3 classes" in text and "mean σ" in text and "{" not in text
