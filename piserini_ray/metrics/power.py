"""Power of the paired comparison of two runs (the exact two-sided McNemar test): how small an
accuracy difference a run of n queries can detect, and how many queries a difference needs.

The model. Each of n queries is a pair (reference right?, other right?). A pair is discordant
(the runs disagree) with probability psi (the discordance); the accuracy difference is
delta = p01 - p10 (other right and reference wrong, minus the converse), so p01 = (psi + delta) / 2
and p10 = (psi - delta) / 2, and |delta| <= psi. The number of discordant pairs is
D ~ Binomial(n, psi); given D = d, the pairs the other run wins are K ~ Binomial(d, pi) with
pi = p01 / psi = (1 + delta / psi) / 2.

The test. The exact McNemar test is the two-sided binomial test of K at 1/2 (what
`metrics.paired.mcnemar_exact` computes): it rejects at level alpha when
2 * F(min(K, d - K); d, 1/2) <= alpha, F the binomial CDF. So given d it rejects when
K <= c_d or K >= d - c_d, with c_d the largest c such that 2 F(c; d, 1/2) <= alpha (-1 if none).

Exact power (no normal approximation anywhere, so small runs and small discordant counts get
the exact binomial figure):

    power(n, psi, delta) = sum_d Binom(d; n, psi) * [F(c_d; d, pi) + S(d - c_d - 1; d, pi)]

with S = 1 - F. The minimum detectable difference (MDE) of n queries is the delta at which
this power reaches the target (80 %), found by root-finding in delta (power grows with |delta|).

The exact power of a discrete test is not monotone in n (a saw-tooth: at discordance 1 and a
difference of 0.2 it first reaches 80 % at 199 queries and falls below again up to 209), so
"the queries needed" is the smallest n from which the power stays at or above the target: the
smallest n with power(n') >= target for every n' from n up to the search bound B
(`search_bound`): twice Connor's normal approximation (1987)

    n ~ (z_{1-alpha/2} sqrt(psi) + z_{power} sqrt(psi - delta^2))^2 / delta^2,

at least 100, doubled while the power there is below the target. Every n of [lo, B] is
evaluated (lo: a bisection point below the target, so every later dip is seen), by the
recurrence of D's distribution in n, over the window that holds its mass (O(sqrt n) per n,
`bench/power.py`); beyond SCAN_LIMIT queries, where D spreads over hundreds
of counts and averages the saw-tooth away, the bisection's crossing is returned instead.

Without a second run, the discordance is assumed: two runs that are right independently of
each other at the pilot's accuracy p disagree with probability 2 p (1 - p)
(`independent_discordance`). Runs of similar agents agree more often than that on the same
queries, so this assumption overstates the queries needed: it is the cautious side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel
from scipy.optimize import brentq
from scipy.stats import binom, norm

ALPHA = 0.05
POWER = 0.80
#: The most queries `queries_needed` considers before calling a difference out of reach.
MAX_QUERIES = 10_000_000
#: Up to this search bound `queries_needed` checks every n for a dip below the target.
SCAN_LIMIT = 200_000


def independent_discordance(accuracy: float) -> float:
    """2 p (1 - p): the chance two runs each right with probability p, independently of each
    other, disagree on a query."""
    return 2.0 * accuracy * (1.0 - accuracy)


def _check(discordance: float, effect: float) -> tuple[float, float]:
    if not 0.0 <= discordance <= 1.0:
        raise ValueError(f"discordance must be in [0, 1], got {discordance}")
    delta = abs(effect)
    if delta > discordance + 1e-12:
        raise ValueError(f"an effect of {effect} needs a discordance of at least {delta}")
    return discordance, min(delta, discordance)


def _critical(d: np.ndarray, alpha: float) -> np.ndarray:
    """c_d: the largest c with 2 F(c; d, 1/2) <= alpha, -1 where no count rejects."""
    c = binom.ppf(alpha / 2.0, d, 0.5)  # smallest c with F(c) >= alpha / 2
    c = np.where(binom.cdf(c, d, 0.5) * 2.0 <= alpha, c, c - 1)
    return np.asarray(c, dtype=float)


def _rejection(d: np.ndarray, psi: float, delta: float, alpha: float) -> np.ndarray:
    """P(the test rejects | D = d) for each d: F(c_d; d, pi) + S(d - c_d - 1; d, pi)."""
    pi = 0.5 * (1.0 + delta / psi)
    c = _critical(d, alpha)
    reject = binom.cdf(c, d, pi) + binom.sf(d - c - 1, d, pi)
    return np.asarray(np.where(c >= 0, reject, 0.0), dtype=float)


def _support(n: int, psi: float) -> tuple[int, int]:
    """D's support for n pairs, trimmed to where its mass is (beyond 1e-15 on either side)."""
    low = int(binom.ppf(1e-15, n, psi)) if n > 2000 else 0
    high = int(binom.isf(1e-15, n, psi)) + 1 if n > 2000 else n
    return max(low, 0), min(high, n)


def mcnemar_power(n: int, discordance: float, effect: float, alpha: float = ALPHA) -> float:
    """The exact power of the two-sided McNemar test at level `alpha` over `n` pairs with the
    given discordance psi and accuracy difference delta (formula in the module docstring)."""
    psi, delta = _check(discordance, effect)
    if n <= 0 or psi == 0.0:
        return 0.0
    low, high = _support(n, psi)
    d = np.arange(low, high + 1, dtype=float)
    return float(np.sum(binom.pmf(d, n, psi) * _rejection(d, psi, delta, alpha)))


def power_curve(
    start: int, stop: int, discordance: float, effect: float, alpha: float = ALPHA
) -> np.ndarray:
    """`mcnemar_power(n, ...)` for every n from `start` to `stop` (inclusive, start >= 1), at
    the cost of one pass: D's distribution for n + 1 is (1 - psi) P_n(d) + psi P_n(d - 1)."""
    psi, delta = _check(discordance, effect)
    if psi == 0.0:
        return np.zeros(stop - start + 1)
    low = _support(start, psi)[0]
    high = _support(stop, psi)[1]
    d = np.arange(low, high + 1, dtype=float)
    reject = _rejection(d, psi, delta, alpha)
    pmf = binom.pmf(d, start, psi)
    out = np.empty(stop - start + 1)
    for i, n in enumerate(range(start, stop + 1)):
        # Only D's window n psi +- 4.5 sqrt(n) is summed and stepped: beyond it lies less than
        # 2 exp(-40) of its mass (Hoeffding), so a pass costs O(sqrt n), not O(n), per n.
        half = math.ceil(4.5 * math.sqrt(n)) + 1
        first = max(math.floor(n * psi) - half - low, 0)
        end = min(math.ceil(n * psi) + half + 1 - low, len(d))
        out[i] = float(pmf[first:end] @ reject[first:end])
        step_from, step_end = max(first, 1), min(end + 1, len(d))
        pmf[step_from:step_end] = (1.0 - psi) * pmf[step_from:step_end] + psi * pmf[
            step_from - 1 : step_end - 1
        ]
        if first == 0:
            pmf[0] *= 1.0 - psi  # the mass below `low` it would gain is below 1e-15
    return out


def normal_queries_needed(
    effect: float, discordance: float, alpha: float = ALPHA, power: float = POWER
) -> float:
    """Connor's normal approximation to the queries a McNemar test needs:
    (z_{1-alpha/2} sqrt(psi) + z_power sqrt(psi - delta^2))^2 / delta^2."""
    psi, delta = _check(discordance, effect)
    if delta == 0.0:
        return math.inf
    za, zb = norm.ppf(1.0 - alpha / 2.0), norm.ppf(power)
    return float((za * math.sqrt(psi) + zb * math.sqrt(psi - delta**2)) ** 2 / delta**2)


def search_bound(
    effect: float, discordance: float, alpha: float = ALPHA, power: float = POWER
) -> int | None:
    """B of `queries_needed`: twice Connor's normal approximation, at least 100, doubled while
    the exact power there is below the target; None when that passes MAX_QUERIES."""
    psi, delta = _check(discordance, effect)
    if delta == 0.0 or psi == 0.0:
        return None
    bound = max(100, 2 * math.ceil(normal_queries_needed(delta, psi, alpha, power)))
    while mcnemar_power(bound, psi, delta, alpha) < power:
        if bound >= MAX_QUERIES:
            return None
        bound = min(bound * 2, MAX_QUERIES)
    return bound


def queries_needed(
    effect: float, discordance: float, alpha: float = ALPHA, power: float = POWER
) -> int | None:
    """The smallest n from which the McNemar test detects an accuracy difference `effect` with
    probability `power` at every n' up to the search bound (`search_bound`; the saw-tooth of
    the exact power can dip below the target after first reaching it); None when the target
    is out of reach below MAX_QUERIES (no difference, or no discordance)."""
    psi, delta = _check(discordance, effect)
    bound = search_bound(delta, psi, alpha, power)
    if bound is None:
        return None
    lo, hi = 0, bound  # power(0) = 0 < target <= power(bound)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mcnemar_power(mid, psi, delta, alpha) >= power:
            hi = mid
        else:
            lo = mid
    if bound > SCAN_LIMIT:
        return hi
    # The last n below the target is at or after `lo` (itself below it): scan [lo + 1, bound].
    below = np.flatnonzero(power_curve(lo + 1, bound, psi, delta, alpha) < power)
    return lo + 1 if below.size == 0 else lo + 1 + int(below[-1]) + 1


def minimum_detectable_difference(
    n: int, discordance: float, alpha: float = ALPHA, power: float = POWER
) -> float | None:
    """The accuracy difference (a fraction, 0.02 = 2 points) that `n` pairs with discordance
    psi detect with probability `power`: the root in delta of power(n, psi, delta) = target.
    None when even delta = psi (every discordant pair won by one run) falls short."""
    if n <= 0 or discordance <= 0.0:
        return None
    if mcnemar_power(n, discordance, discordance, alpha) < power:
        return None
    return float(
        brentq(
            lambda delta: mcnemar_power(n, discordance, delta, alpha) - power,
            0.0,
            discordance,
            xtol=1e-7,
        )
    )


class PowerFigures(BaseModel):
    """What a run size buys: the MDE of `queries` pairs and the queries each effect needs, at
    one discordance (None when it is unknown or zero: nothing is computable)."""

    queries: int
    discordance: float | None
    alpha: float = ALPHA
    power: float = POWER
    #: The smallest detectable accuracy difference (a fraction); None when out of reach.
    minimum_detectable: float | None
    #: (effect, queries needed): None when out of reach (an effect above the discordance, or
    #: more than MAX_QUERIES).
    needed: list[tuple[float, int | None]]


def power_figures(
    queries: int,
    discordance: float | None,
    effects: Sequence[float],
    alpha: float = ALPHA,
    power: float = POWER,
) -> PowerFigures:
    """The MDE of `queries` pairs and the queries needed for each effect, at `discordance`."""
    usable = discordance is not None and discordance > 0.0
    psi = discordance if discordance is not None else 0.0
    return PowerFigures(
        queries=queries,
        discordance=discordance,
        alpha=alpha,
        power=power,
        minimum_detectable=minimum_detectable_difference(queries, psi, alpha, power)
        if usable
        else None,
        needed=[
            (e, queries_needed(e, psi, alpha, power) if usable and abs(e) <= psi else None)
            for e in effects
        ],
    )
