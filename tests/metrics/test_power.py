"""The power of the paired McNemar comparison against a direct simulation: seeded paired binary
outcomes with a given discordance and accuracy difference, the exact McNemar test at
alpha = 0.05 (SciPy's binomial test of the discordant pairs), and the rejection rate. The
formula's MDE and queries-needed figures must reach 80 % in the simulation within its
Monte-Carlo error."""

import math
from functools import cache

import numpy as np
import pytest
from scipy.stats import binomtest

from piserini_ray.metrics.power import (
    independent_discordance,
    mcnemar_power,
    minimum_detectable_difference,
    normal_queries_needed,
    power_figures,
    queries_needed,
)

REPLICATES = 4000
# 3.5 standard errors of a rejection rate near 0.8 over REPLICATES runs.
TOLERANCE = 3.5 * math.sqrt(0.8 * 0.2 / REPLICATES)


@cache
def _rejects(other_only: int, discordant: int) -> bool:
    if discordant == 0:
        return False
    return binomtest(other_only, discordant, 0.5).pvalue <= 0.05


def simulated_power(n: int, discordance: float, effect: float, seed: int) -> float:
    """REPLICATES comparisons of n queries: each query's pair of outcomes drawn from the four
    cells (both right, only reference, only other, neither) with p10 = (psi - delta) / 2,
    p01 = (psi + delta) / 2 and the reference right half the time; the share McNemar rejects."""
    p10, p01 = (discordance - effect) / 2, (discordance + effect) / 2
    p11 = 0.5 - p10
    cells = np.cumsum([p11, p10, p01])  # the rest: neither right
    rng = np.random.default_rng(seed)
    cell = np.searchsorted(cells, rng.random((REPLICATES, n)), side="right")
    reference = (cell == 0) | (cell == 1)
    other = (cell == 0) | (cell == 2)
    only_ref = np.sum(reference & ~other, axis=1)
    only_other = np.sum(other & ~reference, axis=1)
    return float(
        np.mean([_rejects(int(b), int(b + c)) for c, b in zip(only_ref, only_other, strict=True)])
    )


@pytest.mark.parametrize(
    ("discordance", "effect", "expected_n"),
    [(0.3, 0.05, 975), (0.3, 0.2, 61), (0.1, 0.04, 517)],
)
def test_the_queries_needed_reach_80_percent_in_a_simulation(
    discordance: float, effect: float, expected_n: int
) -> None:
    n = queries_needed(effect, discordance)
    assert n == expected_n  # pinned: the figures the reply quotes
    assert mcnemar_power(n, discordance, effect) >= 0.8 > mcnemar_power(n - 1, discordance, effect)
    simulated = simulated_power(n, discordance, effect, seed=n)
    assert simulated == pytest.approx(0.8, abs=TOLERANCE)
    # The exact test needs more than Connor's normal approximation says.
    assert n >= normal_queries_needed(effect, discordance)


@pytest.mark.parametrize(("n", "discordance"), [(200, 0.25), (40, 0.4)])
def test_the_minimum_detectable_difference_reaches_80_percent_in_a_simulation(
    n: int, discordance: float
) -> None:
    mde = minimum_detectable_difference(n, discordance)
    assert mde is not None and 0 < mde <= discordance
    assert mcnemar_power(n, discordance, mde) == pytest.approx(0.8, abs=1e-6)
    assert simulated_power(n, discordance, mde, seed=n) == pytest.approx(0.8, abs=TOLERANCE)


def test_the_exact_power_equals_a_simulation_away_from_the_target() -> None:
    # Small runs, where the exact binomial matters: 25 and 120 queries.
    for n, psi, delta in ((25, 0.5, 0.3), (120, 0.3, 0.1)):
        expected = mcnemar_power(n, psi, delta)
        se = math.sqrt(expected * (1 - expected) / REPLICATES)
        assert simulated_power(n, psi, delta, seed=7) == pytest.approx(expected, abs=3.5 * se)


def test_edges() -> None:
    assert independent_discordance(0.5) == 0.5 and independent_discordance(0.0) == 0.0
    assert mcnemar_power(0, 0.3, 0.1) == 0.0 and mcnemar_power(50, 0.0, 0.0) == 0.0
    # With no difference the power is the test's size, at most alpha.
    assert 0 < mcnemar_power(500, 0.3, 0.0) <= 0.05
    assert minimum_detectable_difference(5, 0.5) is None  # too few pairs for any difference
    assert queries_needed(0.0, 0.3) is None
    with pytest.raises(ValueError):
        queries_needed(0.2, 0.1)  # one run can gain at most the discordance
    figures = power_figures(200, 0.03, (0.01, 0.02, 0.05))
    assert [n is None for _, n in figures.needed] == [False, False, True]
    assert power_figures(30, 0.0, (0.01,)).minimum_detectable is None
