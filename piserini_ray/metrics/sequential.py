"""Anytime-valid comparison of two runs on paired binary outcomes (issue 52): a test that may
be looked at after every judged query, and a run stopped as soon as it decides, with the chance
of a wrong decision still at most `alpha`. Looking at a p-value as it goes is not valid (every
look adds to the error rate); these are.

**The test.** Only discordant pairs carry information about a difference in accuracy (a query
one run answers right and the other wrong; McNemar's conditioning). Under the null (equal
accuracies) each discordant pair is a fair coin: the other run wins it with probability 1/2,
whatever the discordance. With `W` pairs won by the other run and `L` by the reference, the
beta-binomial mixture likelihood ratio

    E = B(a + W, a + L) / B(a, a) / 2^-(W + L)

(a Beta(a, a) mixture over the win probability of the alternative; `a` = `CONCENTRATION`) is
a nonnegative martingale with expectation 1 under the null: each new discordant pair
multiplies it by `2 (a + W) / (2a + W + L)` or `2 (a + L) / (2a + W + L)`, whose average is 1.
By Ville's inequality the probability that it ever reaches `1 / alpha` is at most `alpha`, so
"decided at the first query where E >= 1 / alpha" is a level-alpha test at any stopping time.
Its direction is the sign of `W - L`. Concordant pairs leave it as it is.

**The interval after a stop.** One run's accuracy gets the beta-binomial mixture confidence
sequence: the accuracies `p` whose mixture likelihood ratio `B(a + S, b + F) / B(a, b) /
(p^S (1 - p)^F)` stays below `1 / alpha` (`S` right, `F` wrong so far). It covers the true
accuracy at every n at once with probability at least `1 - alpha`, so it stays valid at a
data-dependent stop, where a fixed-n interval does not.

References: H. Robbins (1970), "Statistical methods related to the law of the iterated
logarithm", Ann. Math. Statist. 41(5); S. R. Howard, A. Ramdas, J. McAuliffe, J. Sekhon
(2021), "Time-uniform, nonparametric, nonasymptotic confidence sequences", Ann. Statist.
49(2); A. Ramdas, P. Grünwald, V. Vovk, G. Shafer (2023), "Game-theoretic statistics and safe
anytime-valid inference", Statist. Sci. 38(4). The derivation is in docs/guides/analyses.md;
tests/metrics/test_sequential.py checks the closed forms against numerical integration and the
error rate exactly (every path of the null, by dynamic programming); bench/sequential.py
measures the error rate and the savings over simulated sweeps.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel
from scipy.optimize import brentq
from scipy.special import betaln

#: The mixture's Beta(a, a) over the discordant win probability: 1 is uniform.
CONCENTRATION = 1.0


def log_e_value(wins: int, losses: int, concentration: float = CONCENTRATION) -> float:
    """log E after `wins` discordant pairs won by the other run and `losses` by the reference
    (0 before any discordant pair)."""
    a = concentration
    return float(betaln(a + wins, a + losses) - betaln(a, a) + (wins + losses) * math.log(2))


def log_e_path(
    wins: ArrayLike, losses: ArrayLike, concentration: float = CONCENTRATION
) -> np.ndarray:
    """`log_e_value` of running counts (arrays of any shape, elementwise)."""
    w, lo = np.asarray(wins, dtype=float), np.asarray(losses, dtype=float)
    a = concentration
    return np.asarray(betaln(a + w, a + lo) - betaln(a, a) + (w + lo) * math.log(2))


class SequentialDecision(BaseModel):
    """Where the anytime-valid paired test stands after the outcomes seen so far."""

    alpha: float
    #: Paired queries seen, and the discordant pairs among them.
    queries: int
    wins: int  # right in the other run only
    losses: int  # right in the reference only
    e_value: float
    #: The first paired query (1-based) at which E reached 1 / alpha, if it did.
    decided_at: int | None = None
    #: better: the other run is more accurate than the reference; worse: less.
    direction: Literal["better", "worse"] | None = None

    @property
    def decided(self) -> bool:
        return self.decided_at is not None


def paired_sequential_test(
    reference: ArrayLike,
    other: ArrayLike,
    alpha: float = 0.05,
    min_queries: int = 0,
    concentration: float = CONCENTRATION,
) -> SequentialDecision:
    """The test over paired verdicts in the order they were judged (`reference[i]` and
    `other[i]` are one query's: right or wrong); it decides at the first query, from
    `min_queries` on, where E >= 1 / alpha, and stays decided. Its counts are of the
    outcomes up to the decision (or all of them when undecided)."""
    if not 0 < alpha <= 0.5:
        raise ValueError(f"alpha {alpha} is outside (0, 0.5]")
    x, y = np.asarray(reference, dtype=bool), np.asarray(other, dtype=bool)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("reference and other must be paired: one outcome each per query")
    wins, losses = np.cumsum(~x & y), np.cumsum(x & ~y)
    log_e = log_e_path(wins, losses, concentration)
    crossed = np.flatnonzero(
        (log_e >= math.log(1 / alpha)) & (np.arange(1, len(x) + 1) >= min_queries)
    )
    end = int(crossed[0]) if len(crossed) else len(x) - 1
    w, lo = (int(wins[end]), int(losses[end])) if len(x) else (0, 0)
    decision = SequentialDecision(
        alpha=alpha,
        queries=end + 1 if len(x) else 0,
        wins=w,
        losses=lo,
        e_value=math.exp(log_e_value(w, lo, concentration)),
    )
    if len(crossed):
        decision.decided_at = end + 1
        decision.direction = "better" if w > lo else "worse"
    return decision


def accuracy_confidence_sequence(
    correct: int, total: int, alpha: float = 0.05, prior: tuple[float, float] = (1.0, 1.0)
) -> tuple[float, float]:
    """The (1 - alpha) beta-binomial confidence sequence for an accuracy after `correct` of
    `total`: valid at every n at once, hence after a data-dependent stop."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha} is outside (0, 1)")
    if not 0 <= correct <= total:
        raise ValueError(f"correct {correct} is not between 0 and total {total}")
    a, b = prior
    wrong = total - correct
    mixture = float(betaln(a + correct, b + wrong) - betaln(a, b))
    bound = math.log(1 / alpha)

    def excess(p: float) -> float:  # log LR(p) - log(1/alpha): below 0 inside the set
        return mixture - correct * math.log(p) - wrong * math.log1p(-p) - bound

    if total == 0:
        return 0.0, 1.0
    tiny = 1e-12
    # The observed accuracy is always inside: there the mixture is at most the likelihood.
    centre = min(max(correct / total, tiny), 1 - tiny)
    low = 0.0 if excess(tiny) < 0 else brentq(excess, tiny, centre)
    high = 1.0 if excess(1 - tiny) < 0 else brentq(excess, centre, 1 - tiny)
    return float(low), float(high)
