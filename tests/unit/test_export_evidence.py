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
