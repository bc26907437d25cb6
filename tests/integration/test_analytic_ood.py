"""``--mode analytic`` keeps the OOD signal (issue 23): on the trained digits CNN (the session's ``trained_digits``,
seed 0, the model ``bench/analytic_ood.py`` trains), the 16-point analytic head ranks in- and out-of-distribution
inputs as the converged quadrature does, and its MI-AUROC is at least the float ensemble's - 0.02 on every OOD
set of the bench (mirrored digits, noise blobs, pixel-permuted digits).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
from scripts import script_module

from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model

pytestmark = pytest.mark.slow
S = 16


def _bench() -> ModuleType:
    return script_module("bench/analytic_ood.py")


def test_analytic_mutual_information_keeps_the_ood_ranking(digits_ir, digits_data):
    bench = _bench()
    x = digits_data.split("test")[0]
    ood = bench.ood_sets(x, 0)
    analytic = bench.aurocs(export_model(digits_ir, ExportConfig(S, mode="analytic")).proto, 0, x, ood)
    # the same moments integrated with 1024 points: the quadrature's own error is below 0.003 there
    converged = bench.aurocs(export_model(digits_ir, ExportConfig(1024, mode="analytic")).proto, 0, x, ood)
    runs = [bench.aurocs(export_model(digits_ir, ExportConfig(S, mode="baked", seed=s)).proto, s, x,
                         ood) for s in bench.SAMPLING_SEEDS]
    ensemble = {k: float(np.mean([r[k] for r in runs])) for k in ood}
    for name in ood:
        # 16 raw Sobol points were 0.015 off on the mirrored digits (0.810 vs 0.826); matched points, 0.006 at most
        assert abs(analytic[name] - converged[name]) <= 0.01, (name, analytic[name], converged[name])
        assert analytic[name] >= ensemble[name] - bench.GOAL, (name, analytic[name], ensemble[name])
