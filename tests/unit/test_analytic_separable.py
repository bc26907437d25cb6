"""Analytic mode's ``variance="separable"`` (edgebnn/exporters/analytic.py): each k×k Conv's variance terms as a
depthwise k×k filter and a 1×1 mix, against the exact analytic graph (the rule's exact cases) and the fit itself."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from edgebnn.errors import InvalidOptionError
from edgebnn.exporters.analytic import separable_fit
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import read_metadata
from edgebnn.importers import import_model
from edgebnn.nn import BayesConv2d, BayesLinear


def test_the_fit_keeps_window_sums_and_is_exact_on_a_shared_profile():
    rng = np.random.default_rng(0)
    profile = rng.uniform(0.1, 1.0, (5, 3, 3))  # one spatial profile per input channel, any output-channel scale
    shared = rng.uniform(0.5, 2.0, (7, 5, 1, 1)) * profile[None]
    g, a, err = separable_fit(shared)
    assert err < 1e-6
    np.testing.assert_allclose(a * g.reshape(1, 5, 3, 3), shared, rtol=1e-5)
    w = rng.uniform(0.0, 1.0, (7, 5, 3, 3))
    g, a, err = separable_fit(w)
    assert g.shape == (5, 1, 3, 3) and a.shape == (7, 5, 1, 1) and 0 < err < 1
    assert (g >= 0).all()
    np.testing.assert_allclose(g.sum(axis=(1, 2, 3)), 1.0, rtol=1e-5)
    np.testing.assert_allclose(a[..., 0, 0], w.sum(axis=(2, 3)), rtol=1e-5)  # sums kept: exact on constant v


class _Net(nn.Module):
    def __init__(self, pad: int, rho: tuple[float, float] | None) -> None:
        super().__init__()
        self.c1 = BayesConv2d(2, 6, 3, padding=pad, init_rho=-1.5)
        self.c2 = BayesConv2d(6, 8, 3, padding=pad, init_rho=-1.5)
        self.fc = BayesLinear(8, 5, init_rho=-1.5)
        if rho is not None:  # sigma varying per weight: no shared profile in s² either
            gen = torch.Generator().manual_seed(1)
            for layer in (self.c1, self.c2):
                with torch.no_grad():
                    layer.weight_rho.uniform_(*rho, generator=gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c2(torch.relu(self.c1(x)))).mean((2, 3)))


def _both(net: nn.Module, x: np.ndarray) -> tuple[dict, dict, tuple[str, ...]]:
    torch.manual_seed(0)
    ir = import_model(net.eval(), (1, *x.shape[1:]), where="net")
    out = []
    for variance in ("exact", "separable"):
        proto = export_model(ir, ExportConfig(16, mode="analytic", variance=variance)).proto
        s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        out.append(dict(zip([o.name for o in s.get_outputs()], s.run(None, {s.get_inputs()[0].name: x}), strict=True)))
    return out[0], out[1], read_metadata(proto, "net").approximations or ()


def test_separable_equals_exact_where_the_input_is_constant_over_every_window():
    """No padding and a spatially constant image: m and v are constant over every window of both convs, where
    the kept window sums make the rule exact (fp32 round-off only), though the fitted weights err by 57% (measured)."""
    torch.manual_seed(0)
    x = np.broadcast_to(np.random.default_rng(0).standard_normal((3, 2, 1, 1)), (3, 2, 8, 8)).astype(np.float32)
    exact, fast, notes = _both(_Net(pad=0, rho=(-3.0, -1.0)), np.ascontiguousarray(x))
    np.testing.assert_allclose(fast["probs"], exact["probs"], atol=1e-6)
    np.testing.assert_allclose(fast["mutual_info"], exact["mutual_info"], rtol=1e-4, atol=1e-8)
    assert any(n.startswith("variance separable") and "over 2 layers" in n for n in notes), notes


def test_separable_is_close_to_exact_on_varying_inputs():
    """Random images (padding 1): the approximation's error, measured 0.25% of the MI and 2.4e-4 of a probability,
    bounded at 5% and 0.005 (the integration test sets it against Monte Carlo)."""
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((4, 2, 8, 8)).astype(np.float32)
    exact, fast, _ = _both(_Net(pad=1, rho=(-3.0, -1.0)), x)
    assert np.abs(fast["probs"] - exact["probs"]).max() < 0.005
    np.testing.assert_allclose(fast["mutual_info"], exact["mutual_info"], rtol=0.05)


def test_the_option_is_validated_and_recorded_only_when_set():
    with pytest.raises(InvalidOptionError, match="--variance sometimes: choose one of exact, separable"):
        ExportConfig(variance="sometimes")
    with pytest.raises(InvalidOptionError, match="only --mode analytic computes variances"):
        ExportConfig(mode="baked", variance="separable")
    assert "variance" not in ExportConfig(mode="analytic").to_dict()
    fast = ExportConfig(mode="analytic", variance="separable")
    assert ExportConfig.from_dict(fast.to_dict()) == fast and fast.to_dict()["variance"] == "separable"
