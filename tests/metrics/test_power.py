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


@cache
def _scipy_rejected(d: int) -> np.ndarray:
    """Which counts k = 0..d of d discordant pairs SciPy's exact two-sided binomial test at 1/2
    rejects at 0.05. Its p-value grows with k up to d / 2 and is symmetric, so the lower
    rejection region is found by bisection on binomtest and mirrored (the mirror is checked)."""
    reject = np.zeros(d + 1, dtype=bool)
    if d == 0:
        return reject

    def rejects(k: int) -> bool:
        return binomtest(k, d, 0.5).pvalue <= 0.05

    lo, hi = -1, d // 2 + 1  # rejects(lo) holds (or lo = -1), rejects(hi) does not
    if rejects(d // 2):
        raise AssertionError("the test rejects at the centre")
    hi = d // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if rejects(mid) else (lo, mid)
    if lo >= 0:
        assert rejects(d - lo) and not rejects(d - lo - 1)  # the upper region mirrors it
        reject[: lo + 1] = True
        reject[d - lo :] = True
    return reject


def enumerated_power(n: int, discordance: float, effect: float) -> float:
    """The power by exact enumeration of every (D, K): D ~ Bin(n, psi) discordant pairs, K ~
    Bin(D, pi) of them won by the other run, each outcome tested by SciPy's binomtest."""
    from scipy.stats import binom

    pi = 0.5 * (1 + effect / discordance)
    ds = [n] if discordance == 1.0 else range(n + 1)
    total = 0.0
    for d in ds:
        weight = 1.0 if discordance == 1.0 else binom.pmf(d, n, discordance)
        total += weight * float(binom.pmf(np.arange(d + 1), d, pi)[_scipy_rejected(d)].sum())
    return total


@pytest.mark.parametrize(
    ("discordance", "effect", "first_crossing", "expected"),
    [(1.0, 0.2, 199, 210), (1.0, 0.3, 90, 97), (0.3, 0.2, 61, 61), (0.6, 0.25, 79, 79)],
)
def test_queries_needed_is_where_the_power_stays_at_the_target(
    discordance: float, effect: float, first_crossing: int, expected: int
) -> None:
    """Exact McNemar power is a saw-tooth in n: at discordance 1 and 20 points it first reaches
    80 % at 199 queries and dips below again up to 209. The queries needed are the smallest n
    from which it stays at or above 80 % up to the search bound, by exact enumeration."""
    from piserini_ray.metrics.power import power_curve, search_bound

    bound = search_bound(effect, discordance)
    assert bound is not None
    powers = [enumerated_power(n, discordance, effect) for n in range(1, bound + 1)]
    assert power_curve(1, bound, discordance, effect) == pytest.approx(powers, abs=1e-12)
    below = [n for n, p in enumerate(powers, 1) if p < 0.8]
    assert min(n for n, p in enumerate(powers, 1) if p >= 0.8) == first_crossing
    assert max(below) + 1 == expected
    assert queries_needed(effect, discordance) == expected
