"""Reducers on hand-computed fixtures."""

import math

import pytest

from piserini_ray.metrics.calibration import calibration_error
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.metrics.intervals import mean_interval, ratio_interval
from piserini_ray.metrics.recall import macro, micro, per_query, surfaced_at_depth
from piserini_ray.records import Usage


def _bins_830() -> tuple[list[float], list[bool]]:
    # Record i has confidence (i // 100) / 10: bins of 100 at 0.0 ... 0.7, then 30 at 0.8;
    # every answer wrong, so each bin's gap is its confidence.
    return [(i // 100) / 10 for i in range(830)], [False] * 830


def test_calibration_830_both_conventions() -> None:
    conf, correct = _bins_830()
    # piserini: 8 bins of 100 and one of 30, all summed: (100 * 1.40 + 30 * 0.64) / 830.
    assert calibration_error(conf, correct, "piserini") == pytest.approx(
        100 * math.sqrt((100 * 1.40 + 30 * 0.64) / 830)
    )
    # browsecomp-plus: bins 0..6 of 100 (the stretched last bin, 130 records, is left out).
    assert calibration_error(conf, correct, "browsecomp-plus") == pytest.approx(
        100 * math.sqrt(100 * 0.91 / 830)
    )
    assert calibration_error(conf, correct, "piserini") == pytest.approx(43.7958, abs=1e-4)
    assert calibration_error(conf, correct, "browsecomp-plus") == pytest.approx(33.1118, abs=1e-4)


def test_calibration_small_n() -> None:
    assert calibration_error([0.8], [True], "piserini") == pytest.approx(20.0)
    assert calibration_error([0.8], [True], "browsecomp-plus") is None
    assert calibration_error([0.9] * 99, [True] * 99, "piserini") == pytest.approx(10.0)
    assert calibration_error([0.9] * 99, [True] * 99, "browsecomp-plus") is None
    # N = 100 is one bin: a mean confidence of 0.5 against an accuracy of 0.5 is calibrated.
    conf = [0.3] * 50 + [0.7] * 50
    correct = [False] * 50 + [True] * 50
    assert calibration_error(conf, correct, "piserini") == pytest.approx(0.0, abs=1e-6)
    assert calibration_error(conf, correct, "browsecomp-plus") is None  # N = 100 < 200
    assert calibration_error([], [], "piserini") is None


def test_calibration_sort_is_stable() -> None:
    # Equal confidences: bins follow record order. 100 right then 50 wrong at 0.5.
    conf, correct = [0.5] * 150, [True] * 100 + [False] * 50
    assert calibration_error(conf, correct, "piserini") == pytest.approx(50.0)


def test_calibration_rejects_mixups() -> None:
    with pytest.raises(ValueError, match="unknown calibration convention"):
        calibration_error([0.5], [True], "mixed")  # type: ignore[arg-type]


def test_recall_macro_micro_and_empty_gold() -> None:
    qrels = {"q1": {"a": 1, "b": 1}, "q2": {"c": 1, "d": 1, "e": 1, "f": 1}, "q3": {}}
    rows = per_query({"q1": ["a", "x"], "q2": ["c"], "q3": ["z"]}, qrels)
    assert [r.query_id for r in rows] == ["q1", "q2"]  # an empty gold set is left out
    assert macro(rows) == pytest.approx((1 / 2 + 1 / 4) / 2)
    assert micro(rows) == pytest.approx(2 / 6)
    assert macro([]) is None and micro([]) is None


def test_depth_cut() -> None:
    rankings = [["a", "b", "c"], ["d", "a"]]
    assert surfaced_at_depth(rankings, 1) == {"a", "d"}
    assert surfaced_at_depth(rankings, 1000) == {"a", "b", "c", "d"}


def test_cost_with_cached_tokens_for_two_models() -> None:
    table = load_pricing()
    usage = Usage(input_tokens=2_000_000, cached_tokens=1_500_000, output_tokens=100_000)
    # gpt-5: 0.5M uncached x 1.25 + 1.5M cached x 0.125 + 0.1M out x 10
    assert table.price("gpt-5").cost(usage) == pytest.approx(0.625 + 0.1875 + 1.0)
    # claude-opus-4.7: 0.5M x 5 + 1.5M x 0.5 + 0.1M x 25
    assert table.price("claude-opus-4.7").cost(usage) == pytest.approx(2.5 + 0.75 + 2.5)
    assert table.price("not-a-model") is None


def test_bootstrap_intervals_are_seeded_and_bracket_the_estimate() -> None:
    values = [1.0] * 30 + [0.0] * 70
    low, high = mean_interval(values, seed=3)
    assert low < 0.3 < high and (low, high) == mean_interval(values, seed=3)
    assert mean_interval([1.0, 1.0]) == (1.0, 1.0) and mean_interval([]) is None
    low, high = ratio_interval([1, 0, 2, 1], [2, 4, 2, 1], seed=1)
    assert low <= 4 / 9 <= high


def _browsecomp_plus_reference(conf: list[float], correct: list[bool], kind: str) -> float:
    """Their script's binning, with the sort a parameter (theirs: numpy's default)."""
    import numpy as np

    order = np.argsort(np.asarray(conf), kind=kind)
    c, a = np.asarray(conf)[order], np.asarray(correct, dtype=float)[order]
    n, total = len(c), 0.0
    bins = [(i * 100, (i + 1) * 100) for i in range(n // 100)]
    bins[-1] = (bins[-1][0], n)
    for start, end in bins[:-1]:
        total += (end - start) / n * (c[start:end].mean() - a[start:end].mean()) ** 2
    return 100 * float(np.sqrt(total))


def test_ties_are_where_browsecomp_plus_and_a_stable_sort_may_differ() -> None:
    import random

    rng = random.Random(5)
    distinct = [rng.random() for _ in range(250)]
    right = [rng.random() < 0.4 for _ in range(250)]
    ours = calibration_error(distinct, right, "browsecomp-plus")
    assert ours == pytest.approx(_browsecomp_plus_reference(distinct, right, "quicksort"))
    # Three tied confidences over 300 records, the right answers first in run order: a bin
    # boundary falls inside a tie, and numpy's quicksort fills it with other records.
    tied = [rng.choice([0.2, 0.5, 0.8]) for _ in range(300)]
    right = [i < 150 for i in range(300)]
    stable = calibration_error(tied, right, "browsecomp-plus")
    assert stable == pytest.approx(_browsecomp_plus_reference(tied, right, "stable"))
    assert stable != pytest.approx(_browsecomp_plus_reference(tied, right, "quicksort"))
