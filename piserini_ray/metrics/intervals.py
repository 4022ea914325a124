"""95 % bootstrap intervals (seeded) with SciPy's `bootstrap`: over queries, percentile method."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import bootstrap

RESAMPLES = 2000


def mean_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float] | None:
    """95 % interval of a mean (accuracy, macro recall)."""
    data = np.asarray(values, dtype=float)
    if len(data) < 2 or np.all(data == data[0]):
        return (float(data[0]), float(data[0])) if len(data) else None
    result = bootstrap(
        (data,),
        np.mean,
        n_resamples=RESAMPLES,
        confidence_level=0.95,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def ratio_interval(
    numerators: Sequence[float], denominators: Sequence[float], seed: int = 0
) -> tuple[float, float] | None:
    """95 % interval of sum(numerators) / sum(denominators), resampling queries (micro recall)."""
    num, den = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if len(num) < 2:
        return None

    if np.allclose(num / den, num[0] / den[0]):
        value = float(num.sum() / den.sum())
        return value, value
    return paired_interval(num, den, _ratio_of_sums, seed, vectorized=True)


def _ratio_of_sums(n: np.ndarray, d: np.ndarray, axis: int = -1) -> np.ndarray:
    # Every resample at once (SciPy's `vectorized`): a report computes a dozen of these.
    return np.asarray(n.sum(axis=axis) / d.sum(axis=axis))


def paired_interval(
    a: ArrayLike,
    b: ArrayLike,
    statistic: Callable[..., Any],
    seed: int = 0,
    vectorized: bool = False,
) -> tuple[float, float] | None:
    """95 % interval of `statistic(a, b)`, resampling the pairs (queries) together: a paired
    difference of two runs, or Cohen's kappa of two judges. Resamples where the statistic is
    undefined (kappa of a resample in which both judges say the same constant) are left out of
    the percentiles; None with fewer than two pairs or when most resamples are undefined.
    `vectorized`: `statistic(a, b, axis=-1)` takes every resample at once, as SciPy's own
    option (same resamples, same interval, without a Python call per resample)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2:
        return None

    def defined(u: np.ndarray, v: np.ndarray) -> float:
        value = statistic(u, v)
        return np.nan if value is None else float(value)

    if np.all(x == x[0]) and np.all(y == y[0]):  # every resample is the sample itself
        point = float(statistic(x, y)) if vectorized else defined(x, y)
        return None if np.isnan(point) else (point, point)
    with warnings.catch_warnings():
        # The interval is taken from the distribution below (undefined replicates skipped);
        # SciPy's own percentile of it would be NaN and warns about that.
        warnings.simplefilter("ignore")
        result = bootstrap(
            (x, y),
            statistic if vectorized else defined,
            paired=True,
            vectorized=vectorized,
            n_resamples=RESAMPLES,
            confidence_level=0.95,
            method="percentile",
            random_state=np.random.default_rng(seed),
        )
    replicates = np.asarray(result.bootstrap_distribution, dtype=float)
    replicates = replicates[~np.isnan(replicates)]
    if len(replicates) < RESAMPLES // 2:
        return None
    low, high = np.percentile(replicates, [2.5, 97.5])
    return float(low), float(high)
