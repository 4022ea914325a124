"""Epoch statistics against direct computations: pass@k and pass^k by enumerating every way
to draw j of the n attempts, mean ± sd by hand, the interval by resampling queries."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from piserini_ray.metrics.epochs import epoch_stats, pass_all, pass_at


def _by_enumeration(results: list[bool], j: int) -> tuple[float, float]:
    """(P(at least one of j drawn attempts is correct), P(all j are)), over every subset."""
    subsets = list(itertools.combinations(results, j))
    return (
        sum(any(s) for s in subsets) / len(subsets),
        sum(all(s) for s in subsets) / len(subsets),
    )


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_pass_at_and_pass_all_equal_the_chance_over_every_draw(n: int) -> None:
    for c in range(n + 1):
        results = [True] * c + [False] * (n - c)
        for j in range(1, n + 1):
            at_least_one, every = _by_enumeration(results, j)
            assert pass_at(n, c, j) == pytest.approx(at_least_one)
            assert pass_all(n, c, j) == pytest.approx(every)


def test_epoch_stats_equal_an_independent_computation() -> None:
    rng = random.Random(7)
    queries = [f"q{i}" for i in range(40)]
    skill = {q: rng.random() for q in queries}
    outcomes = [{q: rng.random() < skill[q] for q in queries} for _ in range(3)]
    del outcomes[1]["q5"]  # a query without a verdict in one epoch is left out everywhere
    stats = epoch_stats(outcomes, seed=3)

    kept = [q for q in queries if q != "q5"]
    assert stats.queries == 39 and stats.incomplete == ["q5"] and stats.epochs == 3
    per_epoch = [sum(o[q] for q in kept) / len(kept) for o in outcomes]
    assert stats.accuracy_per_epoch == pytest.approx(per_epoch)
    assert stats.accuracy_mean == pytest.approx(sum(per_epoch) / 3)
    assert stats.accuracy_sd == pytest.approx(statistics.stdev(per_epoch))
    solved = {q: [o[q] for o in outcomes] for q in kept}
    assert stats.pass_at[3] == pytest.approx(sum(any(r) for r in solved.values()) / len(kept))
    assert stats.pass_all[3] == pytest.approx(sum(all(r) for r in solved.values()) / len(kept))
    assert stats.pass_at[1] == pytest.approx(stats.accuracy_mean)  # pass@1 is the mean
    for j in (1, 2):
        at_least_one = sum(_by_enumeration(r, j)[0] for r in solved.values()) / len(kept)
        every = sum(_by_enumeration(r, j)[1] for r in solved.values()) / len(kept)
        assert stats.pass_at[j] == pytest.approx(at_least_one)
        assert stats.pass_all[j] == pytest.approx(every)
    same = sum(len(set(r)) == 1 for r in solved.values())
    assert stats.consistency == pytest.approx(same / len(kept))
    assert stats.correct_counts == {c: sum(sum(r) == c for r in solved.values()) for c in range(4)}
    assert sum(stats.correct_counts.values()) == len(kept)


def test_the_interval_resamples_queries_with_all_their_epochs() -> None:
    """A query-clustered bootstrap (resampling queries, each with its epochs) is wider than one
    that treats the 3 x n records as independent when a query's epochs agree."""
    rng = random.Random(1)
    queries = [f"q{i}" for i in range(60)]
    solved = {q: rng.random() < 0.5 for q in queries}
    outcomes = [dict(solved) for _ in range(3)]  # every epoch agrees: clusters are perfect
    stats = epoch_stats(outcomes, seed=0)
    assert stats.accuracy_interval is not None
    low, high = stats.accuracy_interval
    assert low < stats.accuracy_mean < high
    # The same mean over 180 independent records: its bootstrap interval is narrower.
    from piserini_ray.metrics.intervals import mean_interval

    flat = mean_interval([float(solved[q]) for q in queries for _ in range(3)], seed=0)
    assert flat is not None and (flat[1] - flat[0]) < (high - low)
    # Directly: resampling queries by hand gives about the same width.
    draws = []
    r = random.Random(5)
    for _ in range(2000):
        sample = [solved[r.choice(queries)] for _ in queries]
        draws.append(sum(sample) / len(sample))
    draws.sort()
    width = draws[int(0.975 * 2000)] - draws[int(0.025 * 2000)]
    assert (high - low) == pytest.approx(width, rel=0.2)
    assert stats.consistency == 1.0 and stats.accuracy_sd == 0.0


def test_one_epoch_has_no_spread_and_no_epochs_is_an_error() -> None:
    stats = epoch_stats([{"a": True, "b": False}])
    assert stats.accuracy_sd is None and stats.pass_at == {1: 0.5} and stats.pass_all == {1: 0.5}
    with pytest.raises(ValueError):
        epoch_stats([])
