"""What stopping a run once its comparison is decided gives, and whether it stays valid
(issue 52): simulated sweeps of paired outcomes over BrowseComp-Plus's 830 queries, each run
against the reference with the anytime-valid paired test (`metrics/sequential.py`) looked at
after every judged query.

- Under the null (equal accuracies) at several discordance levels (the share of queries one
  run answers right and the other wrong): the share of runs wrongly decided, which must stay
  at or below alpha.
- Under alternatives (the other run 1 to 20 points better or worse): the share decided, in the
  right direction, the median query at which it decided, and the queries (and so the agent's
  cost, which is per query) saved against running all 830.

    python bench/sequential.py [--sweeps 10000 --alpha 0.05 --queries 830 --seed 1]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from _common import append_results, header

from piserini_ray.metrics.sequential import log_e_path

ACCURACY = 0.5  # the reference's
NULL_DISCORDANCE = (0.05, 0.1, 0.2, 0.4, 0.6)
ALTERNATIVES = (0.01, 0.02, 0.05, 0.10, 0.20, -0.05, -0.20)  # the other's accuracy - reference's
ALT_DISCORDANCE = 0.3


def simulate(
    delta: float, discordance: float, sweeps: int, queries: int, alpha: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """For each simulated run: the query (1-based) at which the test decided (0: never) and
    its direction (+1 better, -1 worse). Discordant pairs: the other run wins one with
    probability (d + delta) / 2 per query and loses one with (d - delta) / 2."""
    win, loss = (discordance + delta) / 2, (discordance - delta) / 2
    assert win >= 0 and loss >= 0, "discordance must be at least |delta|"
    rng = np.random.default_rng(seed)
    draw = rng.random((sweeps, queries))
    wins = np.cumsum(draw < win, axis=1)
    losses = np.cumsum((draw >= win) & (draw < win + loss), axis=1)
    crossed = log_e_path(wins, losses) >= math.log(1 / alpha)
    decided = crossed.any(axis=1)
    first = np.where(decided, crossed.argmax(axis=1), queries - 1)
    rows = np.arange(sweeps)
    direction = np.sign(wins[rows, first] - losses[rows, first]) * decided
    return np.where(decided, first + 1, 0), direction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=10_000)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--queries", type=int, default=830)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    n, alpha = args.queries, args.alpha
    lines = header(
        "Stopping a run once its comparison is decided: simulated sweeps",
        f"{args.sweeps:,} simulated runs per row, {n} paired queries each, the reference at "
        f"{ACCURACY:.0%} accuracy, alpha {alpha}; the test looked at after every query.",
    )
    lines += [
        "Under the null (equal accuracies):",
        "",
        "| discordance | wrongly decided | at most alpha |",
        "|---:|---:|---|",
    ]
    for d in NULL_DISCORDANCE:
        at, _ = simulate(0.0, d, args.sweeps, n, alpha, args.seed)
        wrong = float(np.mean(at > 0))
        se = math.sqrt(alpha * (1 - alpha) / args.sweeps)
        lines.append(
            f"| {d:.2f} | {wrong:.4f} | {'yes' if wrong <= alpha else 'no'}"
            f"{'' if wrong <= alpha else f' (alpha + {(wrong - alpha) / se:.1f} s.e.)'} |"
        )
    lines += [
        "",
        f"Under alternatives (discordance {ALT_DISCORDANCE}):",
        "",
        "| difference (points) | decided | in the right direction | median query decided | "
        "queries saved | cost saved |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for delta in ALTERNATIVES:
        at, direction = simulate(delta, ALT_DISCORDANCE, args.sweeps, n, alpha, args.seed)
        decided = at > 0
        right = float(np.mean(direction[decided] == np.sign(delta))) if decided.any() else 0.0
        median = int(np.median(at[decided])) if decided.any() else None
        saved = float(np.mean(np.where(decided, n - at, 0))) / n
        lines.append(
            f"| {delta * 100:+.0f} | {np.mean(decided):.3f} | {right:.4f} | "
            f"{median if median is not None else '-'} | {saved:.1%} | {saved:.1%} |"
        )
    lines += [
        "",
        "Cost saved equals queries saved: an agent's cost is per query (the judge's too). A "
        "run's wrong decisions under the null are bounded by alpha whatever the discordance; the "
        "exact bound over every path is in tests/metrics/test_sequential.py.",
    ]
    append_results(lines)


if __name__ == "__main__":
    main()
