"""The posterior families lowered with ``fixed`` and exported with their stores, on digits (issues 20 and 21.4).

Models (the session's, tests/integration/conftest.py): a deep ensemble of 3 MLPs 64-32-10 (Adam, full batch),
SWAG K = 10 on one such MLP (SGD, then 10 epochs collecting the reference code's moments and deviations),
laplace-torch's last-layer Kronecker Laplace of the ensemble's first member. Every comparison runs both exports
through ``Session(seed=0)``: the same host noise, so a difference is the lowering's alone (``bench/family_stores.py``
prints the same table).
Moved from tests/unit/test_family_stores.py (it trains models); the stores' own codes are tested without training
in tests/unit/stores/test_store_families.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import edgebnn
from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.sizes import deployed_bytes
from edgebnn.ir import from_bytes, to_bytes
from edgebnn.metrics import nll
from edgebnn.passes import ebnn_bytes, float_bnn_bytes, lower
from edgebnn.runtime import Session

torch = pytest.importorskip("torch")
nn = torch.nn
S = 32
ROUNDOFF = 1e-5  # the same members in float32, in another op order
# dNLL bound of a lowering against the float posterior on the digits test split (360 images): the mean's rounding is
# within a tenth of the posterior's own variance (SWAG) or a thousandth of it along every posterior direction
# (Laplace, whitened), the factors' codes within a few percent of each value; measured +0.0002 (SWAG) and +0.0013 /
# -0.0003 (Kron noise / analytic). 0.01 is a tenth of the uncertainty budget's nll=+0.05 default margin, twice over.
DNLL = 0.01


@pytest.fixture(scope="module")
def data(digits_data) -> Any:
    """The digits test split (360 images): x, y."""
    return digits_data.split("test")


@pytest.fixture(scope="module")
def members(digits_mlps) -> list[Any]:
    return digits_mlps


@pytest.fixture(scope="module")
def swag_ir(swag_digits) -> Any:
    model, stats = swag_digits
    return edgebnn.from_swag(model, stats, (1, 1, 8, 8), scale=0.5)


@pytest.fixture(scope="module")
def kron_ir(laplace_kron_ll) -> Any:
    return edgebnn.from_torch(laplace_kron_ll, (1, 1, 8, 8))


def _probs(proto: Any, x: np.ndarray) -> np.ndarray:
    return Session(proto, seed=0).predict(x).probs


def test_deep_ensemble_member_codes_are_exact(members, data):
    """Baked S = M: the lowered members as their codes (the store) give the float-store export's predictive to
    round-off, in a smaller file whose bulk deployed_bytes counts as codes."""
    xt = data[0]
    ir = edgebnn.from_torch(members, (1, 1, 8, 8))
    low = lower(ir, "fixed", seed=0).model
    assert {w.encoding.op_type for w in low.encoded_weights()} == {"MemberSetFixedWeight"}
    coded, floats = (export_model(low, ExportConfig(3, mode="baked", weights=w)).proto for w in ("ir", "fp32"))
    np.testing.assert_allclose(_probs(coded, xt), _probs(floats, xt), atol=ROUNDOFF)
    size, float_size = deployed_bytes(coded), deployed_bytes(floats)
    assert size.file_bytes < 0.4 * float_size.file_bytes  # <= 8-bit codes for 32-bit members, plus the decode
    assert size.codes > size.float_weights  # the members are codes; biases stay fp32
    assert size.file_bytes < float_bnn_bytes(ir) / 3  # measured 3.4x smaller than the M fp32 members


def _lowered(ir: Any) -> Any:
    out = lower(ir, "fixed", seed=0).model
    again = from_bytes(to_bytes(out), "again")  # the codes round-trip
    for w, v in zip(out.encoded_weights(), again.encoded_weights(), strict=True):
        for name, arr in w.encoding.fields().items():
            np.testing.assert_array_equal(arr, v.encoding.fields()[name])
    return out


def test_swag_lowered_with_fixed_stays_within_the_variance_rule(swag_ir, data):
    xt, yt = data
    low = _lowered(swag_ir)
    assert {w.encoding.op_type for w in low.encoded_weights()} == {"LowRankFixedWeight"}
    assert ebnn_bytes(low) < ebnn_bytes(swag_ir) / 3  # the deviations are most of it: 8 bits for 32
    assert float_bnn_bytes(low) == float_bnn_bytes(swag_ir)  # the fp32 reference is the same before and after
    coded, floats = (export_model(m, ExportConfig(S, mode="noise", noise="weight",
                                                  rng="host")).proto for m in (low, swag_ir))
    assert abs(nll(_probs(coded, xt), yt) - nll(_probs(floats, xt), yt)) <= DNLL
    size = deployed_bytes(coded)
    assert size.file_bytes < deployed_bytes(floats).file_bytes / 2.5  # measured 2.8x
    assert size.codes > 10 * size.float_weights
    # --weights int8 on the float posterior: the same codes fitted at export (measured dNLL +0.0000, 2.6x)
    int8, fp32 = (export_model(swag_ir, ExportConfig(S, mode="noise", noise="weight", weights=w,
                                                     rng="host")).proto for w in ("int8", "fp32"))
    assert abs(nll(_probs(int8, xt), yt) - nll(_probs(fp32, xt), yt)) <= DNLL
    assert deployed_bytes(int8).file_bytes < deployed_bytes(fp32).file_bytes / 2.5
    with pytest.raises(InvalidOptionError, match="analytic") as e:  # the family's refusals hold for the lowered kind
        export_model(low, ExportConfig(S, mode="analytic"))
    assert "\n" not in str(e.value)


def test_laplace_kron_lowered_with_fixed_stays_within_the_variance_rule(kron_ir, data):
    xt, yt = data
    result = lower(kron_ir, "fixed", seed=0)
    low = _lowered(kron_ir)
    assert [w.encoding.op_type for w in low.encoded_weights()] == ["KronFixedWeight", "DenseFixedWeight"]
    for row in result.report["layers"]:  # the whitened rule: mean_j (L⁻¹ e)_j² <= f / 100
        assert row["whitened_error"] <= 0.1 * 0.01
    for mode in ("noise", "analytic"):
        coded, floats = (export_model(m, ExportConfig(S, mode=mode, rng="host")).proto for m in (low, kron_ir))
        assert abs(nll(_probs(coded, xt), yt) - nll(_probs(floats, xt), yt)) <= DNLL, mode
    size, float_size = (deployed_bytes(export_model(m, ExportConfig(S, mode="noise", rng="host")).proto)
                        for m in (low, kron_ir))
    assert size.file_bytes < float_size.file_bytes and size.codes > 0
    with pytest.raises(InvalidOptionError, match="KronGaussianWeight, which codebook cannot lower") as e:
        lower(kron_ir, "codebook")
    assert "\n" not in str(e.value)
