"""95 % bootstrap intervals (seeded) with SciPy's `bootstrap`: over queries, percentile method."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
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

    def ratio(n: np.ndarray, d: np.ndarray, axis: int = -1) -> np.ndarray:
        return n.sum(axis=axis) / d.sum(axis=axis)

    if np.allclose(num / den, num[0] / den[0]):
        value = float(num.sum() / den.sum())
        return value, value
    result = bootstrap(
        (num, den),
        ratio,
        paired=True,
        vectorized=True,
        n_resamples=RESAMPLES,
        confidence_level=0.95,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)
