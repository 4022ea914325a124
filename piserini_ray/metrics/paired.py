"""Statistics of two verdict vectors over the same queries: Cohen's kappa (two judges of one
run) and the exact McNemar test (two runs under one judge). SciPy does the test; kappa is its
two-line definition."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel
from scipy.stats import binomtest


def cohens_kappa(a: ArrayLike, b: ArrayLike) -> float | None:
    """(p_o - p_e) / (1 - p_e) for two binary raters; None where undefined (no items, or both
    raters constant and equal, so chance agreement is already 1)."""
    x, y = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if len(x) == 0:
        return None
    observed = float(np.mean(x == y))
    pa, pb = float(np.mean(x)), float(np.mean(y))
    chance = pa * pb + (1 - pa) * (1 - pb)
    if chance >= 1.0:
        return None
    return (observed - chance) / (1 - chance)


class McNemar(BaseModel):
    """Discordant pairs and the exact two-sided McNemar p-value (a binomial test of the
    discordant counts at p = 1/2)."""

    only_reference: int  # right in the reference run, wrong in the other
    only_other: int
    p_value: float


def mcnemar_exact(reference: ArrayLike, other: ArrayLike) -> McNemar:
    x, y = np.asarray(reference, dtype=bool), np.asarray(other, dtype=bool)
    only_ref, only_other = int(np.sum(x & ~y)), int(np.sum(~x & y))
    discordant = only_ref + only_other
    p = 1.0 if discordant == 0 else float(binomtest(only_other, discordant, 0.5).pvalue)
    return McNemar(only_reference=only_ref, only_other=only_other, p_value=p)


def fleiss_kappa(ratings: ArrayLike) -> float | None:
    """Fleiss' kappa of binary ratings: `ratings[i][j]` is rater j's verdict (True/False) on
    item i, every item rated by the same n >= 2 raters. P_i = (sum_k n_ik^2 - n) / (n (n - 1)),
    P_bar their mean, P_e = sum_k p_k^2 with p_k the share of all ratings in category k;
    kappa = (P_bar - P_e) / (1 - P_e). None where undefined (no items, fewer than 2 raters, or
    every rating in one category)."""
    x = np.asarray(ratings, dtype=bool)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] < 2:
        return None
    n = x.shape[1]
    yes = x.sum(axis=1).astype(float)
    counts = np.stack([yes, n - yes], axis=1)  # items x {True, False}
    per_item = ((counts**2).sum(axis=1) - n) / (n * (n - 1))
    shares = counts.sum(axis=0) / counts.sum()
    chance = float((shares**2).sum())
    if chance >= 1.0:
        return None
    return (float(per_item.mean()) - chance) / (1 - chance)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error over the m tests), in the input
    order: with p ascending, adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j))."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
