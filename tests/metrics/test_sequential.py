"""The anytime-valid paired test and confidence sequence (`metrics/sequential.py`), checked
against independent computations: the closed form against numerical integration of the
mixture, the martingale step exactly, and the error rate under the null exactly, over every
path of discordant pairs (dynamic programming, no simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import beta as beta_distribution

from piserini_ray.metrics.sequential import (
    accuracy_confidence_sequence,
    log_e_value,
    paired_sequential_test,
)


@pytest.mark.parametrize(("wins", "losses"), [(0, 0), (3, 1), (10, 2), (0, 9), (25, 25)])
@pytest.mark.parametrize("concentration", [0.5, 1.0, 4.0])
def test_the_e_value_is_the_mixture_likelihood_ratio(
    wins: int, losses: int, concentration: float
) -> None:
    prior = beta_distribution(concentration, concentration)
    mixture, _ = quad(lambda p: p**wins * (1 - p) ** losses * prior.pdf(p), 0, 1)
    null = 0.5 ** (wins + losses)
    assert log_e_value(wins, losses, concentration) == pytest.approx(
        math.log(mixture / null), rel=1e-7, abs=1e-9
    )


def test_under_the_null_each_step_keeps_the_expectation() -> None:
    for wins in range(12):
        for losses in range(12):
            now = math.exp(log_e_value(wins, losses))
            after = (
                math.exp(log_e_value(wins + 1, losses)) + math.exp(log_e_value(wins, losses + 1))
            ) / 2
            assert after == pytest.approx(now, rel=1e-12)


def _null_crossing_probability(pairs: int, alpha: float) -> float:
    """P(E ever reaches 1/alpha within `pairs` fair-coin discordant pairs), exactly: the mass of
    every path, absorbed where it crosses."""
    bound = math.log(1 / alpha)
    alive = np.zeros(pairs + 1)  # alive[w]: paths at w wins (n - w losses) not yet crossed
    alive[0] = 1.0
    crossed = 0.0
    for n in range(1, pairs + 1):
        step = np.zeros(pairs + 1)
        step[1 : n + 1] += alive[:n] / 2  # a win
        step[:n] += alive[:n] / 2  # a loss
        hit = np.array([log_e_value(w, n - w) >= bound for w in range(n + 1)])
        crossed += float(step[: n + 1][hit].sum())
        step[: n + 1][hit] = 0.0
        alive = step
    return crossed


@pytest.mark.parametrize("alpha", [0.05, 0.1])
def test_the_chance_of_a_wrong_decision_under_the_null_is_at_most_alpha(alpha: float) -> None:
    # 830 queries have at most 830 discordant pairs: every look at every one of them.
    wrong = _null_crossing_probability(830, alpha)
    assert 0 < wrong <= alpha


def test_a_clearly_worse_run_is_decided_early_and_an_equal_one_is_not() -> None:
    rng = np.random.default_rng(7)
    reference = rng.random(830) < 0.6
    worse = reference & (rng.random(830) < 0.6)  # loses 40 % of the reference's right answers
    decision = paired_sequential_test(reference, worse)
    assert decision.decided and decision.direction == "worse"
    assert decision.decided_at is not None and decision.decided_at < 200
    assert decision.wins == 0 and decision.losses > 0 and decision.e_value >= 20
    same = paired_sequential_test(reference, reference)
    assert not same.decided and same.queries == 830 and same.e_value == 1.0
    late = paired_sequential_test(reference, worse, min_queries=300)
    assert late.decided_at == 300  # decided already, said from the first allowed look


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match=r"alpha 0\.6"):
        paired_sequential_test([True], [False], alpha=0.6)
    with pytest.raises(ValueError, match="paired"):
        paired_sequential_test([True, False], [False])


def _cs_miss_probability(p: float, total: int, alpha: float) -> float:
    """P(the sequence misses p at some n <= total), exactly, over every path of right/wrong."""
    alive = np.zeros(total + 1)
    alive[0] = 1.0
    missed = 0.0
    for n in range(1, total + 1):
        step = np.zeros(total + 1)
        step[1 : n + 1] += alive[:n] * p
        step[:n] += alive[:n] * (1 - p)
        for s in range(n + 1):
            low, high = accuracy_confidence_sequence(s, n, alpha)
            if not low <= p <= high:
                missed += step[s]
                step[s] = 0.0
        alive = step
    return missed


@pytest.mark.parametrize("p", [0.1, 0.5, 0.83])
def test_the_confidence_sequence_covers_at_every_n_at_once(p: float) -> None:
    assert _cs_miss_probability(p, 200, 0.05) <= 0.05


def test_the_confidence_sequence_holds_the_observed_accuracy_and_narrows() -> None:
    wide = accuracy_confidence_sequence(30, 50)
    narrow = accuracy_confidence_sequence(300, 500)
    assert wide[0] < 0.6 < wide[1] and narrow[0] < 0.6 < narrow[1]
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert accuracy_confidence_sequence(0, 0) == (0.0, 1.0)
    assert accuracy_confidence_sequence(0, 40)[0] == 0.0
    assert accuracy_confidence_sequence(40, 40)[1] == 1.0
