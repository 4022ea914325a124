"""Kappa, the exact McNemar test and paired intervals, checked against their definitions and
against SciPy directly."""

import numpy as np
import pytest
from scipy.stats import binomtest, bootstrap

from piserini_ray.metrics.intervals import RESAMPLES, paired_interval
from piserini_ray.metrics.paired import cohens_kappa, mcnemar_exact


def _raters() -> tuple[list[bool], list[bool]]:
    """The textbook table: 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no (kappa = 0.4)."""
    a = [True] * 25 + [False] * 25
    b = [True] * 20 + [False] * 5 + [True] * 10 + [False] * 15
    return a, b


def test_kappa_of_the_textbook_table() -> None:
    a, b = _raters()
    # p_o = 35/50 = 0.7; p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5; kappa = 0.2 / 0.5
    assert cohens_kappa(a, b) == pytest.approx(0.4)
    assert cohens_kappa(a, a) == pytest.approx(1.0)
    assert cohens_kappa([True, False], [False, True]) == pytest.approx(-1.0)
    assert cohens_kappa([True] * 5, [True] * 5) is None  # chance agreement is already 1
    assert cohens_kappa([], []) is None


def test_mcnemar_is_scipys_exact_binomial_test_of_the_discordant_pairs() -> None:
    a, b = _raters()  # 5 right only in a, 10 right only in b
    result = mcnemar_exact(a, b)
    assert (result.only_reference, result.only_other) == (5, 10)
    assert result.p_value == pytest.approx(binomtest(10, 15, 0.5).pvalue)
    assert result.p_value == pytest.approx(0.301757812)  # 2 * P(X <= 5), X ~ Bin(15, 1/2)
    assert mcnemar_exact(a, a).p_value == 1.0


def test_the_paired_interval_is_scipys_paired_bootstrap() -> None:
    rng = np.random.default_rng(7)
    a = rng.integers(0, 2, 80).astype(float)
    b = np.clip(a + rng.integers(-1, 2, 80), 0, 1)

    def diff(x: np.ndarray, y: np.ndarray) -> float:
        return float(np.mean(y) - np.mean(x))

    ours = paired_interval(a, b, diff, seed=3)
    theirs = bootstrap(
        (a, b), diff, paired=True, vectorized=False, n_resamples=RESAMPLES,
        method="percentile", random_state=np.random.default_rng(3),
    ).confidence_interval  # fmt: skip
    assert ours == pytest.approx((theirs.low, theirs.high))
    assert ours[0] < diff(a, b) < ours[1]


def test_undefined_resamples_are_left_out_of_a_kappa_interval() -> None:
    a = [False] * 97 + [True] * 3
    b = [False] * 94 + [True] * 6
    low, high = paired_interval(a, b, cohens_kappa)
    assert low <= cohens_kappa(a, b) <= high and low >= 0 and high <= 1
    assert paired_interval([True] * 4, [True] * 4, cohens_kappa) is None  # never defined
    assert paired_interval([1.0], [0.0], cohens_kappa) is None


def test_a_vectorized_statistic_gives_the_interval_of_one_call_per_resample() -> None:
    # ratio_interval takes every resample at once (a report computes a dozen): the same
    # resamples, so the same interval as a statistic called once per resample.
    import numpy as np

    from piserini_ray.metrics.intervals import paired_interval, ratio_interval

    rng = np.random.default_rng(7)
    for n in (3, 40, 830):
        den = rng.integers(1, 6, n).astype(float)
        num = np.minimum(den, rng.integers(0, 6, n)).astype(float)
        one_by_one = paired_interval(num, den, lambda a, b: float(a.sum() / b.sum()), seed=n)
        assert one_by_one is not None and ratio_interval(num, den, seed=n) == one_by_one
