"""Schemes that keep only posteriors trained for them say so when applied to any other one (issue 13)."""

from __future__ import annotations

import pytest

from edgebnn.passes import lower

WARNING = "post-training"


@pytest.mark.parametrize(("scheme", "kind", "recipe"), [("ternary", "TernaryWeight", "edgebnn.train.vnq"),
                                                        ("binary", "BinaryWeight", "edgebnn.train.ebp")])
def test_ternary_and_binary_warn_on_a_posterior_not_trained_for_them(make_mlp, scheme, kind, recipe) -> None:
    model = make_mlp((16, 256, 32))
    rows = lower(model, scheme).report["layers"]
    encoded = [r for r in rows if r["kind"] == kind]
    assert encoded and all(WARNING in r["note"] and recipe in r["note"] for r in encoded)
    assert all(WARNING not in (r["note"] or "") for r in rows if r["kind"] != kind)  # fixed fallbacks keep quiet
    model.manifest.source_library = "edgebnn" + ("-vnq" if scheme == "ternary" else "-ebp")  # as its importer
    assert not any(WARNING in (r["note"] or "") for r in lower(model, scheme).report["layers"])


def test_codebook_warns_only_for_shared_draws_on_a_posterior_not_trained_with_them(make_mlp) -> None:
    model = make_mlp((16, 256, 32))
    assert not any("sampling='shared'" in (r["note"] or "") for r in lower(model, "codebook").report["layers"])
    rows = lower(model, "codebook", sampling="shared").report["layers"]
    assert all("sampling='shared'" in r["note"] for r in rows if r["kind"] == "CodebookWeight")
    model.manifest.source_library = "edgebnn-2dgbnn"
    rows = lower(model, "codebook", sampling="shared").report["layers"]
    assert not any("sampling='shared'" in (r["note"] or "") for r in rows)
