"""Predictive summaries and calibration metrics against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from edgebnn.metrics import brier, ece, nll, predictive_from_logits


def test_identical_members_have_zero_mutual_information():
    logits = np.tile(np.array([[[2.0, 0.0, -1.0]]]), (8, 1, 1))
    pred = predictive_from_logits(logits)
    p = np.exp([2.0, 0.0, -1.0]) / np.exp([2.0, 0.0, -1.0]).sum()
    np.testing.assert_allclose(pred.probs[0], p, rtol=1e-6)
    np.testing.assert_allclose(pred.entropy[0], -(p * np.log(p)).sum(), rtol=1e-6)
    assert pred.mutual_info[0] == pytest.approx(0.0, abs=1e-6)


def test_disagreeing_confident_members_are_epistemic():
    # Two members, each certain of a different class: entropy ln 2, all of it epistemic.
    logits = np.array([[[30.0, -30.0]], [[-30.0, 30.0]]])
    pred = predictive_from_logits(logits)
    assert pred.entropy[0] == pytest.approx(np.log(2), abs=1e-6)
    assert pred.mutual_info[0] == pytest.approx(np.log(2), abs=1e-6)


def test_nll_and_brier_by_hand():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    y = np.array([0, 1])
    assert nll(probs, y) == pytest.approx(-(np.log(0.7) + np.log(0.1)) / 2)
    assert brier(probs, y) == pytest.approx(((0.09 + 0.04 + 0.01) + (0.01 + 0.81 + 0.64)) / 2)


def test_ece_by_hand():
    # Bin of conf 0.95 (2 points, 1 correct): |0.5 - 0.95| weighted 2/4; bin 0.65 (2 points, both right): 0.35.
    probs = np.array([[0.95, 0.05], [0.95, 0.05], [0.65, 0.35], [0.35, 0.65]])
    y = np.array([0, 1, 0, 1])
    assert ece(probs, y) == pytest.approx(0.5 * 0.45 + 0.5 * 0.35)


def test_perfectly_calibrated_is_zero():
    probs = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert ece(probs, np.array([0, 1])) == 0.0
