"""``edgebnn.budget.export_evidence``: the evidence of an export as onnxruntime runs it, never silently another."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import synthetic_linear

from edgebnn.budget import export_evidence
from edgebnn.errors import InvalidOptionError


def _model():
    model = synthetic_linear()
    model.manifest.input_range = [0.0, 1.0]  # what lower --eval records
    return model


def test_in_range_inputs_are_judged_by_the_export() -> None:
    rng = np.random.default_rng(0)
    x, ood = rng.uniform(0, 1, (20, 5)).astype(np.float32), rng.uniform(-0.5, 1.5, (10, 5)).astype(np.float32)
    evidence, what = export_evidence(_model(), x, ood, seed=0)
    assert what["runtime"].startswith("onnxruntime") and evidence.rows == 20
    assert evidence.ood_scores is not None and len(evidence.ood_scores) == 10 * evidence.draws


@pytest.mark.parametrize("where", ["ood", "x"])
def test_inputs_an_export_refuses_are_refused_in_one_line_not_run_elsewhere(where: str) -> None:
    # OOD inputs on another scale (0..255 for a model lowered on 0..1): the export refuses them; the evidence must
    # not quietly come from the reference runtime instead (which takes any input)
    rng = np.random.default_rng(0)
    x, ood = rng.uniform(0, 1, (20, 5)).astype(np.float32), rng.uniform(0, 1, (10, 5)).astype(np.float32)
    if where == "ood":
        ood = ood * 255
    else:
        x = x * 255
    with pytest.raises(InvalidOptionError) as e:
        export_evidence(_model(), x, ood, seed=0)
    message = str(e.value)
    assert "\n" not in message and "far outside [0, 1]" in message
    assert message.startswith("--ood-data" if where == "ood" else "--eval"), message


def test_the_latency_order_certifies_the_float_bnns_own_export_first() -> None:
    # a failing first test ends fixed-sequence testing: the float BNN's own export (noise, S = 16, no
    # deterministic layer: every change 0) goes first, whatever the selection rows say of the faster ones
    from edgebnn.budget import Budget, Rows
    from edgebnn.budget._greedy import default_export
    from edgebnn.budget._latency import LatencySpace, _options, _order
    from edgebnn.data import load_data

    model = _model()
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (120, 5)).astype(np.float32)
    y = rng.integers(0, 4, 120)
    ood = rng.uniform(0, 1, (60, 5)).astype(np.float32)
    rows = Rows(load_data((x, y)), load_data(ood, labels=False), 4000, 0.3, 0)
    options = _options(model, LatencySpace(modes=("baked", "noise"), samples=(4, 16)), 0, None)
    for i, option in enumerate(sorted(options, key=lambda o: (o.mode == "noise" and o.samples == 16, o.samples))):
        option.latency_ms = 1.0 + 0.01 * i  # the float BNN's own export the slowest, within a step of the rest
    reference, mode = default_export(model, 16, 0)
    order = _order(options, Budget.parse("nll=+1,auroc=-1"), rows, reference, 0, 2, (mode, 16))
    assert (order[0].mode, order[0].samples, order[0].prefix) == ("noise", 16, ()) and mode == "noise"
    assert len({id(o) for o in order}) == len(order)
