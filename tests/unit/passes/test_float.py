"""``float``: a no-op pass that still writes the full per-layer report."""

from __future__ import annotations

import pytest

from edgebnn.errors import InvalidOptionError
from edgebnn.ir import to_bytes, verify
from edgebnn.passes import lower


def test_float_keeps_every_weight_and_reports(mlp, report_keys, roundtrip) -> None:
    result = lower(mlp, "float")
    verify(result.model)
    assert not result.modified
    for row in result.report["layers"]:
        assert report_keys <= set(row)
        assert row["kind"] == "GaussianWeight" and row["bits"] == 32 and row["bits_per_weight"] == 64
        assert row["distortion"] == 0 and row["noise_ratio"] == 0 and row["skipped"] is None
    assert result.report["total_bytes"] == result.report["float_bnn_bytes"] == mlp.nbytes()
    assert result.report["compression_ratio"] == 1.0
    roundtrip(result.model)
    # only the manifest changed: the pass and the config are recorded
    assert [p["name"] for p in result.model.manifest.passes] == ["float"]
    assert result.model.manifest.lower_config == result.report["config"]
    mlp.manifest.passes.append(result.model.manifest.passes[0])
    mlp.manifest.lower_config = result.model.manifest.lower_config
    assert to_bytes(result.model) == to_bytes(mlp)


def test_float_bits(mlp) -> None:
    assert lower(mlp, "float", bits=32).report["compression_ratio"] == 1.0
    with pytest.raises(InvalidOptionError, match="the float scheme stores 32 bits"):
        lower(mlp, "float", bits=16)
