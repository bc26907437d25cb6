"""``edgebnn.budget``: parsing ``--budget`` and checking lowered-vs-float metrics against it."""

from __future__ import annotations

import pytest

from edgebnn.budget import Budget, Violation
from edgebnn.errors import InvalidOptionError

FLOAT = {"accuracy": 0.95, "nll": 0.20, "ece": 0.020, "brier": 0.08, "ood": {"auroc_mutual_info": 0.90}}


def test_parse_keeps_signs_and_order() -> None:
    b = Budget.parse("nll=+0.02, ece=+0.01,auroc=-0.01")
    assert b.limits == {"nll": 0.02, "ece": 0.01, "auroc": -0.01}
    assert list(b.limits) == ["nll", "ece", "auroc"]
    assert b.needs_ood
    assert str(b) == "nll=+0.02,ece=+0.01,auroc=-0.01"
    assert Budget.parse(str(b)) == b


def test_unsigned_value_is_an_allowance_in_the_worse_direction() -> None:
    assert Budget.parse("acc=0.01,auroc=0.02,nll=0.05").limits == {"accuracy": -0.01, "auroc": -0.02, "nll": 0.05}
    # an explicit sign against the worse direction demands an improvement
    assert Budget.parse("nll=-0.01,accuracy=+0.01").limits == {"nll": -0.01, "accuracy": 0.01}


@pytest.mark.parametrize(("text", "needle"), [
    ("", "expected METRIC=CHANGE"),
    ("nll", "'nll': expected METRIC=CHANGE"),
    ("nll=", "'nll=': expected METRIC=CHANGE"),
    ("=0.1", "expected METRIC=CHANGE"),
    ("nll=+0.02,", "'': expected METRIC=CHANGE"),
    ("loss=0.1", "unknown metric 'loss'"),
    ("nll=abc", "nll='abc' is not a finite number"),
    ("ece=inf", "not a finite number"),
    ("ece=nan", "not a finite number"),
    ("nll=0.1,nll=0.2", "nll is given twice"),
])
def test_malformed_budget_is_one_line_naming_the_option(text: str, needle: str) -> None:
    with pytest.raises(InvalidOptionError) as e:
        Budget.parse(text)
    message = str(e.value)
    assert message.startswith("--budget ") and needle in message and "\n" not in message


def test_check_reports_each_broken_limit() -> None:
    b = Budget.parse("nll=+0.02,ece=+0.01,auroc=-0.01")
    kept = {**FLOAT, "nll": 0.215, "ece": 0.029, "ood": {"auroc_mutual_info": 0.895}}
    assert b.check(FLOAT, kept) == []
    broken = {**FLOAT, "nll": 0.23, "ece": 0.025, "ood": {"auroc_mutual_info": 0.88}}
    violations = b.check(FLOAT, broken)
    assert [v.metric for v in violations] == ["nll", "auroc"]
    assert violations[0].delta == pytest.approx(0.03) and violations[1].delta == pytest.approx(-0.02)
    assert str(Violation("ece", 0.012, 0.01)) == "ece +0.0120 > +0.0100"
    assert str(Violation("auroc", -0.02, -0.01)) == "auroc -0.0200 < -0.0100"
    # better than the float BNN uses negative budget; being outside it counts only what exceeds the limits
    assert b.usage({"nll": -0.02, "ece": 0.0, "auroc": 0.0}) == pytest.approx(-1.0)
    assert b.excess({"nll": 0.03, "ece": 0.0, "auroc": -0.03}) == pytest.approx(0.5 + 2.0)


def test_auroc_needs_ood_metrics() -> None:
    with pytest.raises(InvalidOptionError, match="auroc needs OOD data"):
        Budget.parse("auroc=-0.01").check({"nll": 0.1}, {"nll": 0.1})


def test_a_budget_names_known_metrics() -> None:
    with pytest.raises(InvalidOptionError, match="name at least one metric"):
        Budget({})
    with pytest.raises(InvalidOptionError, match="known metrics"):
        Budget({"loss": 0.1})


def test_costliest_is_the_metric_using_most_of_its_limit() -> None:
    b = Budget.parse("nll=+0.05,ece=+0.01")
    assert b.costliest({"nll": 0.02, "ece": 0.005}) == "ece"  # 0.4 of nll's budget, 0.5 of ece's
    assert b.costliest({"nll": 0.03, "ece": -0.01}) == "nll"
