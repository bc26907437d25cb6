"""Analytic mode's ``variance="separable"`` on a small CNN with per-weight σ, against torch's own Monte Carlo
predictive: its departure from the exact analytic predictive is below what 2000 draws resolve."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.importers import import_model
from edgebnn.nn import BayesConv2d, BayesLinear

DRAWS = 2000


class CNN(nn.Module):
    """Three 3×3 Bayesian convs (one strided), ReLUs, a max pool, the spatial mean and a Bayesian head; σ drawn
    per weight (softplus of rho ~ U(-2.5, -1): 0.08-0.31), so neither variance term has a shared profile."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = BayesConv2d(1, 8, 3, padding=1), BayesConv2d(8, 8, 3, padding=1)
        self.c3, self.fc = BayesConv2d(8, 16, 3, stride=2, padding=1), BayesLinear(16, 10)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for layer in (self.c1, self.c2, self.c3, self.fc):
                layer.weight_rho.uniform_(-2.5, -1.0, generator=gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.c2(torch.relu(self.c1(x)))), 2)
        return self.fc(torch.relu(self.c3(x)).mean((2, 3)))


def test_separable_variance_stays_within_monte_carlo_error_of_the_exact_analytic_predictive():
    """Measured: separable vs exact differ by at most 0.0008 in a probability and 1.7% in the MI, while 2000
    torch draws have standard errors up to about 0.004 (0.0029 at 4000) and both analytic predictives sit 0.050
    from torch's (the diagonal ReLU network's own error): the approximation is below one Monte Carlo standard
    error."""
    torch.manual_seed(0)
    model = CNN().eval()
    ir = import_model(model, (1, 1, 12, 12), where="cnn")
    x = np.random.default_rng(0).standard_normal((6, 1, 12, 12)).astype(np.float32)
    out = {}
    for variance in ("exact", "separable"):
        proto = export_model(ir, ExportConfig(16, mode="analytic", variance=variance)).proto
        s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        out[variance] = dict(zip([o.name for o in s.get_outputs()], s.run(None, {"input": x}), strict=True))
    with torch.no_grad():
        draws = torch.stack([torch.softmax(model(torch.from_numpy(x)), 1) for _ in range(DRAWS)]).numpy()
    se = float((draws.std(0) / np.sqrt(DRAWS)).max())
    exact, fast = out["exact"], out["separable"]
    gap = float(np.abs(fast["probs"] - exact["probs"]).max())
    assert gap < se, (gap, se)
    mc = draws.mean(0)
    assert np.abs(fast["probs"] - mc).max() < np.abs(exact["probs"] - mc).max() + se
    np.testing.assert_allclose(fast["mutual_info"], exact["mutual_info"], rtol=0.05)
