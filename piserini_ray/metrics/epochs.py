"""Repeated runs of the same queries (epochs): how much accuracy moves with the seed, and how
often a query is solved at least once (pass@k) or every time (pass^k).

Every figure is over the queries with a verdict in every epoch (a query missing from an epoch,
or recorded there without a verdict: not judged yet, or a judge failure, is listed, not counted;
never scored as wrong). With no such query every figure is None (n/a), never 0. A query's k
results are one cluster: the interval resamples queries, each with all of its epochs, never
single records (records of one query are not independent).

- pass@j (Chen et al., 2021, the unbiased estimator from n = k samples with c correct):
  1 - C(n - c, j) / C(n, j), averaged over queries; pass@1 is the mean accuracy.
- pass^j (Yao et al., 2024, tau-bench: all of j attempts correct): C(c, j) / C(n, j).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from math import comb

from pydantic import BaseModel

from piserini_ray.metrics.intervals import mean_interval


class EpochStats(BaseModel):
    """Accuracy over k epochs of the same queries."""

    epochs: int
    #: Queries with a verdict in every epoch: the base of every figure below.
    queries: int
    #: Queries missing a record or verdict in some epoch (left out).
    incomplete: list[str]
    #: None (n/a) for every epoch when no query is complete.
    accuracy_per_epoch: list[float | None]
    accuracy_mean: float | None
    #: Sample standard deviation of the epochs' accuracies (None for one epoch).
    accuracy_sd: float | None
    #: 95 % bootstrap interval of the mean accuracy, resampling queries with all their epochs.
    accuracy_interval: tuple[float, float] | None
    #: pass@j and pass^j for j = 1..k (keys are j); None when no query is complete.
    pass_at: dict[int, float | None]
    pass_all: dict[int, float | None]
    #: Share of queries whose k verdicts agree (all correct or all wrong).
    consistency: float | None
    #: How many queries were correct in exactly c epochs, c = 0..k.
    correct_counts: dict[int, int]


def pass_at(n: int, c: int, j: int) -> float:
    """The chance that at least one of j attempts drawn from n (c of them correct) is."""
    return 1.0 - comb(n - c, j) / comb(n, j)


def pass_all(n: int, c: int, j: int) -> float:
    """The chance that all of j attempts drawn from n (c of them correct) are."""
    return comb(c, j) / comb(n, j)


def epoch_stats(outcomes: Sequence[Mapping[str, bool | None]], seed: int = 0) -> EpochStats:
    """`outcomes[e][query]`: whether epoch e's answer to the query was judged correct; None
    for a query recorded in that epoch without a verdict (not judged, or a judge failure); a
    query without a record in an epoch is absent from its mapping. Both are left out of every
    figure and listed in `incomplete`."""
    k = len(outcomes)
    if k == 0:
        raise ValueError("epoch_stats needs at least one epoch")
    judged = [{q for q, right in o.items() if right is not None} for o in outcomes]
    every = judged[0].intersection(*judged[1:])
    seen = set().union(*outcomes)
    queries = sorted(every)
    counts = {q: sum(bool(outcomes[e][q]) for e in range(k)) for q in queries}
    histogram = {c: 0 for c in range(k + 1)}
    for c in counts.values():
        histogram[c] += 1
    n = len(queries)
    if n == 0:  # nothing complete: every figure is n/a, never a 0 that reads as measured
        return EpochStats(
            epochs=k, queries=0, incomplete=sorted(seen), accuracy_per_epoch=[None] * k,
            accuracy_mean=None, accuracy_sd=None, accuracy_interval=None,
            pass_at=dict.fromkeys(range(1, k + 1)), pass_all=dict.fromkeys(range(1, k + 1)),
            consistency=None, correct_counts=histogram,
        )  # fmt: skip
    per_epoch = [sum(bool(outcomes[e][q]) for q in queries) / n for e in range(k)]
    return EpochStats(
        epochs=k,
        queries=n,
        incomplete=sorted(seen - every),
        accuracy_per_epoch=list(per_epoch),
        accuracy_mean=statistics.fmean(per_epoch),
        accuracy_sd=statistics.stdev(per_epoch) if k > 1 else None,
        accuracy_interval=mean_interval([counts[q] / k for q in queries], seed),
        pass_at={j: sum(pass_at(k, c, j) for c in counts.values()) / n for j in range(1, k + 1)},
        pass_all={j: sum(pass_all(k, c, j) for c in counts.values()) / n for j in range(1, k + 1)},
        consistency=(histogram[0] + histogram[k]) / n,
        correct_counts=histogram,
    )
