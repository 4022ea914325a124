"""Calibration error (docs/spec.md §7), RMS over bins of about 100 records, in two named conventions
that are never mixed: every reported number says which one it used.

Written by hand because the conventions are the point: the `browsecomp-plus` one reproduces
that project's binning, including its loop that skips the last bin, which no library function
does. One difference is deliberate: both conventions sort stably (records in run order within a
tied confidence), while BrowseComp-Plus sorts with numpy's default `argsort` (quicksort, not
stable). Without ties the two are identical; with ties straddling a bin boundary, which records
share a bin can differ, and so can the figure (`tests/metrics/test_metrics.py::
test_ties_are_where_browsecomp_plus_and_a_stable_sort_may_differ`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

Convention = Literal["piserini", "browsecomp-plus"]
CONVENTIONS: tuple[Convention, ...] = ("piserini", "browsecomp-plus")
BIN_SIZE = 100


def calibration_error(
    confidences: Sequence[float], correct: Sequence[bool], convention: Convention = "piserini"
) -> float | None:
    """CE x 100 for confidences in [0, 1] (in record order; the sort is stable).

    `piserini`: consecutive bins of 100 after sorting, the final bin holding the rest (830 ->
    8 x 100 + 30), all bins summed; defined for any N >= 1.
    `browsecomp-plus`: bins [i*100, (i+1)*100) for i < N // 100, the last stretched to the end,
    and the sum runs over every bin but the last; None (undefined) for N < 200.
    """
    if len(confidences) != len(correct):
        raise ValueError("confidences and correct must have the same length")
    n = len(confidences)
    order = sorted(range(n), key=lambda i: confidences[i])  # Python's sort is stable
    conf = [confidences[i] for i in order]
    acc = [1.0 if correct[i] else 0.0 for i in order]
    if convention == "piserini":
        if n == 0:
            return None
        bins = [(start, min(start + BIN_SIZE, n)) for start in range(0, n, BIN_SIZE)]
    elif convention == "browsecomp-plus":
        if n < 2 * BIN_SIZE:
            return None
        bins = [(i * BIN_SIZE, (i + 1) * BIN_SIZE) for i in range(n // BIN_SIZE)]
        bins[-1] = (bins[-1][0], n)
        bins = bins[:-1]  # their loop stops one short
    else:
        raise ValueError(f"unknown calibration convention {convention!r}")
    total = 0.0
    for start, end in bins:
        size = end - start
        gap = sum(conf[start:end]) / size - sum(acc[start:end]) / size
        total += size / n * gap * gap
    return 100 * math.sqrt(total)
