"""What a comparison's power figures cost (`metrics/power.py`): `power_curve`, the exact
McNemar power at every n of a range, summed over D's window n psi +- 4.5 sqrt(n) (Hoeffding:
beyond it lies less than 2 exp(-40) of D's mass), against the same recurrence over D's whole
support (the form it had before); their largest difference; and `queries_needed` for the
effects a comparison reports (1, 2 and 5 points) at several discordances, as `compare` and a
sweep's report call it once per run compared.

    python bench/power.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from _common import append_results, header
from scipy.stats import binom

from piserini_ray.metrics.power import (
    ALPHA,
    _rejection,
    _support,
    power_curve,
    queries_needed,
)

#: (discordance, effect, first n, last n): the ranges `queries_needed` scans for 1 to 5
#: points at typical discordances, and one past 100,000 queries.
CURVES = ((0.5, 0.01, 1, 40_000), (0.3, 0.02, 1, 12_000), (0.1, 0.01, 1, 30_000),
          (0.5, 0.005, 100_000, 160_000))  # fmt: skip
EFFECTS = (0.01, 0.02, 0.05)
DISCORDANCES = (0.05, 0.2, 0.5)


def full_support_curve(start: int, stop: int, psi: float, delta: float) -> np.ndarray:
    """The recurrence over D's whole support at every n (the reference for the window)."""
    low, high = _support(start, psi)[0], _support(stop, psi)[1]
    d = np.arange(low, high + 1, dtype=float)
    reject = _rejection(d, psi, delta, ALPHA)
    pmf = binom.pmf(d, start, psi)
    out = np.empty(stop - start + 1)
    for i in range(stop - start + 1):
        out[i] = float(pmf @ reject)
        pmf[1:] = (1.0 - psi) * pmf[1:] + psi * pmf[:-1]
        pmf[0] *= 1.0 - psi
    return out


def best_of(repeats: int, work: Callable[[], object]) -> tuple[float, object]:
    """The fastest of `repeats` calls, in seconds, and the last result."""
    times, result = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - began)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    lines = header("Power figures: the windowed recurrence", f"Best of {args.repeats}.")
    lines += [
        "| discordance | effect | n | whole support (s) | window (s) | speed-up "
        "| largest difference |",
        "|---|---|---|---|---|---|---|",
    ]
    for psi, delta, start, stop in CURVES:
        full_s, full = best_of(args.repeats, partial(full_support_curve, start, stop, psi, delta))
        window_s, window = best_of(args.repeats, partial(power_curve, start, stop, psi, delta))
        diff = float(np.max(np.abs(np.asarray(full) - np.asarray(window))))
        lines.append(
            f"| {psi} | {delta} | {start:,}-{stop:,} | {full_s:.2f} | {window_s:.2f} | "
            f"{full_s / window_s:.1f}x | {diff:.1e} |"
        )
    lines += ["", "| discordance | effect | queries needed | seconds |", "|---|---|---|---|"]
    for psi in DISCORDANCES:
        for effect in EFFECTS:
            seconds, needed = best_of(args.repeats, partial(queries_needed, effect, psi))
            shown = "out of reach" if needed is None else f"{needed:,}"
            lines.append(f"| {psi} | {effect} | {shown} | {seconds:.2f} |")
    append_results(lines)


if __name__ == "__main__":
    main()
