"""Each training recipe's qualitative claim, checked on the JSON line its example prints.

``examples/train_<recipe>.py --seed N`` prints one JSON result; :data:`CLAIMS` says, per recipe, what its paper
claims and how that is read off the result. ``bench/recipe_seeds.py`` runs the examples over seeds and reports
how many seeds meet their claim (issue 38: at least 4 of 5, and the default seed); ``tests/integration/
test_recipes.py`` checks one seed per recipe with the same functions, so the bench, the tests and
docs/recipes.md state one claim each.

Accuracy differences are counted in test examples (digits' test split: 360 images, one image = 0.28 point;
breast cancer's: 228 examples), so a bound never falls between two attainable values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Result = Mapping[str, Any]


@dataclass(frozen=True)
class Claim:
    """A recipe's claim: the sentence, the paper's setting it comes from, and the check on an example's result.

    Attributes:
        recipe: The ``recipe`` key of the example's JSON line.
        text: What the paper claims, as the check reads it.
        check: ``check(result) -> (holds, figures)``: whether the claim holds, and the figures it was judged on.
    """

    recipe: str
    text: str
    check: Callable[[Result], tuple[bool, dict[str, float]]]


def _images(delta_accuracy: float, n: int) -> int:
    return round(delta_accuracy * n)


DIGITS_TEST = 360


def _vnq(r: Result) -> tuple[bool, dict[str, float]]:
    gap = int(r["gap_images"])
    return gap >= -1, {"gap_images": gap}


def _bc(r: Result) -> tuple[bool, dict[str, float]]:
    lost = -_images(r["after"]["accuracy"] - r["before"]["accuracy"], DIGITS_TEST)
    bits = max(int(b) for b in r["bits"].values())
    pruned = float(r["weights_pruned"])
    holds = lost <= 3 and pruned >= 0.5 and bits <= 8
    return holds, {"images_lost": lost, "weights_pruned": pruned, "max_bits": bits}


def _dgbnn(r: Result) -> tuple[bool, dict[str, float]]:
    after, plain = r["after"], r["plain_bnn"]
    lost = -_images(after["accuracy"] - plain["accuracy"], DIGITS_TEST)
    d_nll = after["nll"] - plain["nll"]
    d_ece = after["ece"] - plain["ece"]
    holds = lost <= 3 and d_nll <= 0.05 and d_ece <= 0.02
    return holds, {"images_lost": lost, "d_nll": round(d_nll, 4), "d_ece": round(d_ece, 4)}


def _ebp(r: Result) -> tuple[bool, dict[str, float]]:
    cv = r["cv"]  # the paper's measurement: 8-fold cross-validation (one 228-example split is too noisy)
    p, d = cv["ebp_p"], cv["ebp_d"]
    holds = p["error"] <= d["error"] and p["nll"] < d["nll"]
    return holds, {"error_p_minus_d": round(p["error"] - d["error"], 4), "nll_p_minus_d": round(p["nll"] - d["nll"], 4)}


def _bbb(r: Result) -> tuple[bool, dict[str, float]]:
    pred, mean = r["before"], r["posterior_mean"]
    predictive = _images(pred["accuracy"] - mean["accuracy"], DIGITS_TEST)
    pruned = _images(r["snr_pruned"]["0.5"]["accuracy"] - mean["accuracy"], DIGITS_TEST)
    return predictive >= -3 and pruned >= -3, {"predictive_images": predictive, "snr_half_pruned_images": pruned}


CLAIMS: dict[str, Claim] = {c.recipe: c for c in (
    Claim("vnq", "the ternary ensemble, no fine-tuning, is at most one test image below the posterior-mean "
                 "network (issue 23: within 0.5 point)", _vnq),
    Claim("bc", "pruning + bits from the posterior variance keep the accuracy (at most 3 test images, 0.8 "
                "point, lost) while pruning at least half of the weights at 8 bits or fewer", _bc),
    Claim("2dgbnn", "the deployed stage-3 codebook model keeps the plain BNN's accuracy (at most 3 test images "
                    "lost) and its uncertainty (NLL at most +0.05, ECE at most +0.02)", _dgbnn),
    Claim("ebp", "EBP-P (the Bayes output) beats EBP-D (the MAP binary network) in 8-fold cross-validation, as "
                 "the paper measures it: test error at most EBP-D's, NLL lower", _ebp),
    Claim("bbb", "Blundell et al.: the half of the weights with the lowest signal-to-noise ratio |mu|/sigma "
                 "can be removed (posterior-mean network at most 3 test images worse), and the 16-sample "
                 "predictive is as accurate as the posterior-mean network (within 3 test images)", _bbb),
)}


def check(result: Result) -> tuple[bool, dict[str, float]]:
    """Whether ``result`` (an example's JSON line) meets its recipe's claim, and the figures judged."""
    return CLAIMS[str(result["recipe"])].check(result)
