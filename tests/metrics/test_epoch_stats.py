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


def test_a_query_without_a_verdict_is_left_out_and_listed_never_wrong() -> None:
    """Recorded in an epoch but not judged yet, or its judge failed: left out of every figure
    and listed (docs/guides/analyses.md), as a query missing from an epoch is."""
    from piserini_ray.records import Judgement
    from piserini_ray.reports.epochs import EpochsReport, epoch_outcomes, epochs_markdown

    def verdict(q: str, right: bool | None) -> Judgement:
        if right is None:
            return Judgement(query_id=q, judge_model="j", status="judge_failed", error="x")
        return Judgement(query_id=q, judge_model="j", status="judged", correct=right)

    recorded = ["q1", "q2", "q3", "q4"]
    first = {"q1": verdict("q1", True), "q2": verdict("q2", None), "q4": verdict("q4", False)}
    second = {q: verdict(q, q != "q4") for q in recorded}  # every query judged here
    outcomes = [epoch_outcomes(first, recorded), epoch_outcomes(second, recorded)]
    assert outcomes[0] == {"q1": True, "q2": None, "q3": None, "q4": False}
    stats = epoch_stats(outcomes)
    # q2 (judge failure) and q3 (no verdict) are out of both epochs, not wrong in the first.
    assert stats.queries == 2 and stats.incomplete == ["q2", "q3"]
    assert stats.accuracy_per_epoch == [0.5, 0.5] and stats.correct_counts == {0: 1, 1: 0, 2: 1}
    report = EpochsReport(
        run_dir="r", model="m", stats=stats, epoch_dirs=["a", "b"], seeds=[None, 1]
    )
    assert "2 queries without a verdict in every epoch, left out: q2, q3" in (
        epochs_markdown(report)
    )


def test_no_complete_query_is_n_a_never_zero() -> None:
    from piserini_ray.reports.epochs import EpochsReport, epochs_markdown

    stats = epoch_stats([{"q1": True, "q2": None}, {}])  # epoch 2 has no record yet
    assert stats.queries == 0 and stats.incomplete == ["q1", "q2"]
    assert stats.accuracy_mean is None and stats.accuracy_per_epoch == [None, None]
    assert stats.pass_at == {1: None, 2: None} and stats.consistency is None
    text = epochs_markdown(
        EpochsReport(run_dir="r", model="m", stats=stats, epoch_dirs=["a", "b"], seeds=[1, 2])
    )
    assert "Accuracy n/a" in text and "0.0 %" not in text
    assert "| 1 | n/a | 1 | `a` |" in text
