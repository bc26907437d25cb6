"""Reproducibility: the same inputs and seed give byte-identical .ebnn and ONNX files (across processes and
hash seeds too); a different seed gives different baked samples; every artifact records the edgebnn
version (and a lowered IR every pass with its options and seed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from hostile import digits_shaped
from onnx import numpy_helper
from synthetic import synthetic_cnn

from edgebnn import __version__, ir
from edgebnn.cli import main
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.ensemble import float_bnn, float_deterministic
from edgebnn.exporters.export import export_model
from edgebnn.passes import SCHEMES, lower

HERE = Path(__file__).parent
ALL_SCHEMES = (*SCHEMES, "prune+mcq")


def baked_weights(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The baked per-sample weight constants of an ensemble (``ens/<weight>/W`` and ``/b``)."""
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer
            if t.name.startswith("ens/") and t.name.endswith(("/W", "/b"))}


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_lowering_is_byte_reproducible_and_records_itself(scheme):
    a = lower(synthetic_cnn(), scheme, seed=3).model
    b = lower(synthetic_cnn(), scheme, seed=3).model
    assert ir.to_bytes(a) == ir.to_bytes(b)
    again = ir.from_bytes(ir.to_bytes(a), "again")  # and the bytes load back to the same bytes
    assert ir.to_bytes(again) == ir.to_bytes(a)
    man = again.manifest
    assert man.edgebnn_version == __version__ and man.format_version == ir.FORMAT_VERSION
    assert [p["name"] for p in man.passes] == scheme.split("+")
    assert all(p["seed"] == 3 and p["options"]["version"] >= 1 for p in man.passes)


def test_baked_export_same_seed_same_bytes_other_seed_other_samples():
    model = synthetic_cnn()
    a = export_model(model, ExportConfig(4, mode="baked", seed=0)).proto.SerializeToString(deterministic=True)
    b = export_model(model, ExportConfig(4, mode="baked", seed=0)).proto.SerializeToString(deterministic=True)
    assert a == b
    w0 = baked_weights(onnx.load_from_string(a))
    w1 = baked_weights(export_model(model, ExportConfig(4, mode="baked", seed=1)).proto)
    assert sorted(w0) == sorted(w1) and w0
    for name in w0:
        if name.endswith("/W"):  # every sampled weight: no sample of seed 0 reappears under seed 1
            assert w0[name].shape == w1[name].shape
            assert not np.any(np.all(w0[name] == w1[name], axis=tuple(range(1, w0[name].ndim)))), name


def test_cli_export_reproducible_and_seeded(tmp_path):
    src = ir.save(synthetic_cnn(), tmp_path / "m.ebnn")

    def export(name: str, seed: int) -> bytes:
        r = CliRunner().invoke(main, ["export", str(src), "-S", "4", "--seed", str(seed), "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        return (tmp_path / name).read_bytes()

    first, second, other = export("a.onnx", 7), export("b.onnx", 7), export("c.onnx", 8)
    assert first == second
    assert first != other
    meta = json.loads({p.key: p.value for p in onnx.load_from_string(other).metadata_props}["edgebnn.export"])
    assert meta["seed"] == 8 and meta["samples"] == 4 and meta["edgebnn_version"] == __version__


_CHILD = r"""
import hashlib, json, sys
sys.path[:0] = sys.argv[1:3]
from synthetic import synthetic_cnn
from edgebnn import ir
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.passes import SCHEMES, lower
out = {}
for scheme in SCHEMES:
    model = lower(synthetic_cnn(), scheme, seed=0).model
    out[scheme + ".ebnn"] = hashlib.sha256(ir.to_bytes(model)).hexdigest()
    for mode in ("baked", "noise", "analytic"):
        try:
            proto = export_model(model, ExportConfig(4, mode=mode, seed=0, rng="host")).proto
        except InvalidOptionError:  # noise and analytic draw Gaussian weights only
            out[f"{scheme}.{mode}.onnx"] = "refused"
            continue
        out[f"{scheme}.{mode}.onnx"] = hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()
print(json.dumps(out, sort_keys=True))
"""


def test_bytes_do_not_depend_on_the_process_or_hash_seed():
    """Set/dict iteration order must not leak into artifacts: two processes, two PYTHONHASHSEEDs, same bytes."""
    digests = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        r = subprocess.run([sys.executable, "-c", _CHILD, str(HERE.parent), str(HERE)], capture_output=True,
                           text=True, env=env, timeout=300, check=False)
        assert r.returncode == 0, r.stderr
        digests.append(json.loads(r.stdout))
    assert digests[0] == digests[1]
    assert len(digests[0]) == 4 * len(SCHEMES)
    assert all(digests[0][f"{s}.baked.onnx"] != "refused" for s in SCHEMES)


def test_every_artifact_records_the_edgebnn_version(tmp_path):
    model = digits_shaped()
    path = ir.save(model, tmp_path / "m.ebnn")
    manifest = json.loads({p.key: p.value for p in onnx.load(str(path)).metadata_props}[ir.MANIFEST_KEY])
    assert manifest["edgebnn_version"] == __version__ and manifest["format_version"] == ir.FORMAT_VERSION
    exports = [export_model(model, ExportConfig(2, mode=m, rng="host")).proto for m in ("baked", "noise", "analytic")]
    exports += [float_deterministic(model), float_bnn(model)]
    for proto in exports:
        meta = json.loads({p.key: p.value for p in proto.metadata_props}["edgebnn.export"])
        assert meta["edgebnn_version"] == __version__, meta["mode"]
    r = CliRunner().invoke(main, ["eval", str(path), "-S", "2", "--json", str(tmp_path / "e.json")])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["edgebnn_version"] == __version__ and report["schema"] == "edgebnn.eval/1"


@pytest.mark.slow
def test_cli_lower_from_torch_is_byte_reproducible(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from edgebnn.models import digits_cnn

    torch.manual_seed(1)
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in digits_cnn().state_dict().items()}, str(weights))
    outs = []
    for name in ("a.ebnn", "b.ebnn"):
        r = CliRunner().invoke(main, ["lower", "--model", "edgebnn.models:digits_cnn", "--weights", str(weights),
                                      "--input-shape", "1,1,8,8", "--scheme", "mcq", "--seed", "5",
                                      "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]
    man = ir.load(tmp_path / "a.ebnn").manifest
    assert man.source_library == "edgebnn" and man.passes[0]["name"] == "mcq" and man.passes[0]["seed"] == 5
