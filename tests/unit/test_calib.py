"""INT8 calibration (edgebnn.calib): readers, Q/DQ rules TensorRT needs, and what INT8 costs on digits."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from synthetic import INPUT_SHAPE, synthetic_cnn

from edgebnn import ir
from edgebnn.calib.int8 import METHODS, QUANTIZED_OPS, Int8Config, calibrate_ensemble, qdq_summary, quantize_int8
from edgebnn.calib.readers import BatchReader, load_inputs
from edgebnn.cli import main
from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import save_onnx
from edgebnn.exporters.export import export_model
from edgebnn.exporters.trt_compat import check_trt_compat
from edgebnn.runtime import Session
from edgebnn.runtime.session import read_export

HEAD_OPS = {"Softmax", "LogSoftmax", "ReduceMean", "ReduceSum", "Log", "Max", "Neg", "Sub"}


def _inputs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, *INPUT_SHAPE[1:]), dtype=np.float32)


@pytest.fixture(scope="module")
def baked(tmp_path_factory):
    """The synthetic CNN's baked S=4 ensemble on disk, and a folder of .npy calibration inputs."""
    root = tmp_path_factory.mktemp("calib")
    path = root / "syn.onnx"
    save_onnx(export_model(synthetic_cnn(), ExportConfig(4, mode="baked")).proto, path)
    data = root / "npy"
    data.mkdir()
    x = _inputs(96, seed=1)
    np.save(data / "a.npy", x[:64])  # a stack
    for i in range(32):  # and single inputs
        np.save(data / f"b{i:02d}.npy", x[64 + i])
    return path, data


@pytest.fixture(scope="module", params=METHODS)
def calibrated(request, baked, tmp_path_factory):
    path, data = baked
    out = tmp_path_factory.mktemp(request.param) / "int8.onnx"
    report = calibrate_ensemble(path, out, data=str(data), config=Int8Config(method=request.param, batch=16))
    return request.param, out, report


def test_each_method_writes_a_model_session_runs(calibrated, baked):
    method, out, report = calibrated
    sess = Session(out)
    pred = sess.predict(_inputs(5, seed=7))
    assert pred.probs.shape == (5, 3) and np.allclose(pred.probs.sum(-1), 1, atol=1e-5)
    meta = read_export(out)[1]
    assert meta.mode == "baked" and meta.samples == 4 and meta.precision == "int8"
    assert meta.calibration is not None and meta.calibration["method"] == method
    assert meta.calibration["samples_used"] == 96 == report["calibration"]["samples_used"]
    assert report["evaluation"] is None and "digits" in report["evaluation_reason"]


def test_qdq_is_symmetric_int8_on_every_conv_and_matmul(calibrated):
    _, out, report = calibrated
    model = onnx.load(str(out))
    summary = qdq_summary(model)
    assert summary == report["qdq"]
    assert summary["types"] == ["int8"] and summary["nonzero_zero_points"] == []
    assert summary["layers"] and all(summary["layers"].values()), summary["layers"]  # both inputs quantized
    assert {n.op_type for n in model.graph.node if n.op_type in QUANTIZED_OPS} == {"Conv", "MatMul"}
    # the predictive head reads float tensors: no DequantizeLinear feeds it
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type in HEAD_OPS:
            assert all(producers.get(i) is None or producers[i].op_type != "DequantizeLinear" for i in node.input)
    # biases stay float (TensorRT takes no INT32 DequantizeLinear)
    ints = {t.name: t.data_type for t in model.graph.initializer}
    assert onnx.TensorProto.INT32 not in ints.values()


@pytest.mark.parametrize("tensorrt", ["10.3", "11"])
def test_tensorrt_compat_is_clean(calibrated, tensorrt):
    _, out, report = calibrated
    assert check_trt_compat(onnx.load(str(out)), tensorrt=tensorrt) == []
    assert report["tensorrt_compat"]["errors"] == report["tensorrt_compat"]["warnings"] == 0


def test_int8_stays_close_to_fp32(calibrated, baked):
    # Bound: each quantized tensor is rounded to steps of range/254; on this 2-layer net with activation
    # ranges set from the calibration data (same distribution as x), per-logit errors stay a few steps of the
    # logit range, which moves softmax probabilities by at most ~0.05 (measured: <= 0.02).
    _, out, _ = calibrated
    x = _inputs(64, seed=3)
    ref = Session(baked[0]).predict(x)
    got = Session(out).predict(x)
    assert np.abs(ref.probs - got.probs).max() < 0.05
    assert np.abs(ref.entropy - got.entropy).max() < 0.1


def test_entropy_search_is_not_minmax(baked):
    # onnxruntime's quantize_static leaves its entropy calibrator at 128 bins = 128 quantized bins, where the
    # KL search has one candidate: the min-max range. We pass 2048 bins, so entropy picks its own ranges.
    path, data = baked
    proto = onnx.load(str(path))
    reader = BatchReader(load_inputs(data, INPUT_SHAPE[1:])[0], "input", batch=16)

    def scales(method: str) -> dict[str, float]:
        q = quantize_int8(proto, reader, Int8Config(method=method))
        return {t.name: float(onnx.numpy_helper.to_array(t)) for t in q.graph.initializer
                if t.name.endswith("_scale") and not t.dims}

    minmax, entropy = scales("minmax"), scales("entropy")
    assert minmax.keys() == entropy.keys()
    assert any(entropy[k] < minmax[k] * 0.99 for k in minmax), (minmax, entropy)


def test_only_baked_float_exports_are_calibrated(tmp_path, baked):
    model = synthetic_cnn()
    for mode in ("noise", "analytic"):
        path = tmp_path / f"{mode}.onnx"
        save_onnx(export_model(model, ExportConfig(4, mode=mode, rng="host")).proto, path)
        with pytest.raises(InvalidOptionError, match=f"a {mode} export cannot be INT8-calibrated"):
            calibrate_ensemble(path, tmp_path / "o.onnx", data=str(baked[1]))
    # the CPU default (noise drawn in the graph): the true reason, and the command that works, naming the .ebnn
    default = tmp_path / "model.onnx"
    save_onnx(export_model(model, ExportConfig(4, mode="noise", rng="graph")).proto, default)
    ir.save(model, tmp_path / "model.ebnn")
    with pytest.raises(InvalidOptionError, match=(
            r"it draws its weights on every call, in the graph: there are no stored weights to quantize.*"
            rf"edgebnn calibrate {re.escape(str(tmp_path / 'model.ebnn'))} -o ")):
        calibrate_ensemble(default, tmp_path / "o.onnx", data=str(baked[1]))
    int8w = tmp_path / "w8.onnx"
    save_onnx(export_model(model, ExportConfig(4, mode="baked", weights="int8")).proto, int8w)
    with pytest.raises(InvalidOptionError, match=r"its members are stored as int8 \(export --weights int8\)"):
        calibrate_ensemble(int8w, tmp_path / "o.onnx", data=str(baked[1]))
    plain = tmp_path / "plain.onnx"
    stripped = onnx.load(str(baked[0]))
    del stripped.metadata_props[:]
    onnx.save(stripped, str(plain))
    with pytest.raises(InvalidArtifactError, match="not exported by edgebnn"):
        calibrate_ensemble(plain, tmp_path / "o.onnx", data=str(baked[1]))
    assert not (tmp_path / "o.onnx").exists()


def test_calibrated_model_is_not_calibrated_twice(calibrated, baked, tmp_path):
    _, out, _ = calibrated
    with pytest.raises(InvalidOptionError, match="already INT8-calibrated"):
        calibrate_ensemble(out, tmp_path / "again.onnx", data=str(baked[1]))


def test_digits_data_refused_for_other_input_shapes(baked, tmp_path):
    with pytest.raises(InvalidOptionError, match=r"takes inputs \(1, 6, 6\), digits are \(1, 8, 8\)"):
        calibrate_ensemble(baked[0], tmp_path / "o.onnx", data="digits")


# -- readers ----------------------------------------------------------------------------------------------


def test_batch_reader_drops_the_ragged_tail_and_rewinds():
    reader = BatchReader(_inputs(70), "input", batch=32)
    batches = list(iter(reader.get_next, None))
    assert [len(b["input"]) for b in batches] == [32, 32] and reader.samples_used == 64 and len(reader) == 2
    reader.rewind()
    assert reader.get_next()["input"].shape == (32, 1, 6, 6)
    assert BatchReader(_inputs(5), "input", batch=32).samples_used == 5  # a small set is one batch
    assert BatchReader(_inputs(70), "input", batch=8, limit=20).samples_used == 20  # 4 batches of 5: all used


def test_batch_reader_uses_every_input_when_an_equal_batch_near_the_asked_one_divides_them():
    reader = BatchReader(_inputs(360), "input", batch=32)  # the digits val split: 12 batches of 30, none left out
    assert reader.batch == 30 and reader.samples_used == reader.inputs == 360 and len(reader) == 12
    assert [len(b["input"]) for b in iter(reader.get_next, None)] == [30] * 12
    odd = BatchReader(_inputs(359), "input", batch=32)  # a prime: no equal batch in 16..32, the tail is left out
    assert (odd.batch, odd.samples_used, odd.inputs) == (32, 352, 359)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (np.zeros((2, 1, 6, 6), np.int32), "dtype int32 is not floating point"),
        (np.zeros((2, 1, 8, 8), np.float32), r"shape \(2, 1, 8, 8\), the model takes \(N, 1, 6, 6\)"),
        (np.full((1, 6, 6), np.nan, np.float32), "NaN or infinite"),
        (np.array([{"a": 1}], dtype=object), "not a plain numeric array"),
        (b"not an npy file", "not a .npy array"),
        (b"\x93NUMPY\x01\x00trunc", "unreadable .npy header"),
        (b"", "empty file"),
    ],
)
def test_npy_reader_names_the_bad_file(tmp_path, content, message):
    np.save(tmp_path / "good.npy", _inputs(2))
    bad = tmp_path / "bad.npy"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        np.save(bad, content, allow_pickle=True)
    with pytest.raises(InvalidOptionError, match=message) as err:
        load_inputs(tmp_path, INPUT_SHAPE[1:])
    assert str(bad) in str(err.value)


def test_npy_reader_folder_errors(tmp_path):
    with pytest.raises(InvalidOptionError, match="no such file or directory"):
        load_inputs(tmp_path / "nope", (1, 6, 6))
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(InvalidOptionError, match=r"no \.npy or \.npz files"):
        load_inputs(tmp_path, (1, 6, 6))


def test_config_validation():
    with pytest.raises(InvalidOptionError, match="--method kl"):
        Int8Config(method="kl")
    with pytest.raises(InvalidOptionError, match="at least twice num_quantized_bins"):
        Int8Config(num_bins=128, num_quantized_bins=128)


def test_cli_bad_data_is_one_line_exit_2(baked, tmp_path):
    (tmp_path / "bad").mkdir()
    np.save(tmp_path / "bad" / "x.npy", np.zeros((1, 6, 6), np.uint8))
    out = tmp_path / "o.onnx"
    r = CliRunner().invoke(main, ["calibrate", str(baked[0]), "--data", str(tmp_path / "bad"), "-o", str(out)])
    assert r.exit_code == 2, r.output
    assert r.output.strip().startswith("error:") and "x.npy: dtype uint8" in r.output and not out.exists()


def test_an_ebnn_is_exported_baked_fp32_then_calibrated(tmp_path, baked):
    """calibrate takes the .ebnn too (the CPU default export is a noise graph it cannot take): the same Q/DQ
    model as calibrating the baked fp32 export of the same S and seed."""
    model = synthetic_cnn()
    ir.save(model, tmp_path / "m.ebnn")
    save_onnx(export_model(model, ExportConfig(4, mode="baked", weights="fp32", seed=3)).proto, tmp_path / "b.onnx")
    config = Int8Config(method="minmax", batch=16)
    report = calibrate_ensemble(tmp_path / "m.ebnn", tmp_path / "a.onnx", data=str(baked[1]), config=config,
                                export=ExportConfig(4, mode="baked", weights="fp32", seed=3))
    assert report["exported"] == {"from": str(tmp_path / "m.ebnn"), "mode": "baked", "weights": "fp32", "samples": 4,
                                  "seed": 3}
    calibrate_ensemble(tmp_path / "b.onnx", tmp_path / "b8.onnx", data=str(baked[1]), config=config)
    a, b = (onnx.load(str(tmp_path / n)) for n in ("a.onnx", "b8.onnx"))
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    for ta, tb in zip(a.graph.initializer, b.graph.initializer, strict=True):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(ta), onnx.numpy_helper.to_array(tb))
    with pytest.raises(InvalidOptionError, match="an export has its S built in"):
        calibrate_ensemble(tmp_path / "b.onnx", tmp_path / "c.onnx", data=str(baked[1]), export=ExportConfig(4))
