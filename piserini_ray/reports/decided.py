"""What a run of a `stop_when_decided` sweep reports (`analysis/stopping.py`): where its
comparison with the reference was decided, on what evidence, what stopping there saved, and
its accuracy with an interval that stays valid after a data-dependent stop (the confidence
sequence's; the bootstrap interval beside it assumes a fixed number of queries)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from piserini_ray.analysis.stopping import read_decision
from piserini_ray.metrics.sequential import accuracy_confidence_sequence


class DecisionFigures(BaseModel):
    """`summary.json`'s `decision`: the run's part in a `stop_when_decided` sweep."""

    role: Literal["reference", "compared"]
    reference: str  # the reference run's directory
    alpha: float
    metric: str
    paired: int  # paired queries the test read (up to its decision)
    wins: int  # discordant pairs this run got right
    losses: int  # discordant pairs the reference got right
    e_value: float
    decided_at: int | None
    direction: Literal["better", "worse"] | None
    extended: bool  # went on past its decision (`sweep --extend`)
    queries_in_slice: int
    queries_run: int  # queries with a record
    queries_saved: int  # of the slice, never run
    #: The agent's mean cost per query run x the queries saved (None: not priced).
    cost_saved_usd: float | None
    #: The (1 - alpha) confidence sequence of the accuracy over the judged queries: valid at
    #: the stop, which the bootstrap interval is not.
    accuracy_interval: tuple[float, float] | None
    method: str


def decision_figures(
    run_dir: Path,
    queries_in_slice: int,
    queries_run: int,
    judged: tuple[int, int],
    cost_usd: float | None,
) -> DecisionFigures | None:
    """The run's `DecisionFigures` from its `decision.json` (None when it has none);
    `judged`: its correct answers and its queries with a verdict."""
    decision = read_decision(run_dir)
    if decision is None:
        return None
    correct, total = judged
    interval = accuracy_confidence_sequence(correct, total, decision.alpha) if total else None
    saved = max(0, queries_in_slice - queries_run)
    per_query = cost_usd / queries_run if cost_usd is not None and queries_run else None
    return DecisionFigures(
        role=decision.role,
        reference=decision.reference,
        alpha=decision.alpha,
        metric=decision.metric,
        paired=decision.paired,
        wins=decision.wins,
        losses=decision.losses,
        e_value=decision.e_value,
        decided_at=decision.decided_at,
        direction=decision.direction,
        extended=decision.extended,
        queries_in_slice=queries_in_slice,
        queries_run=queries_run,
        queries_saved=saved,
        cost_saved_usd=None if per_query is None else per_query * saved,
        accuracy_interval=interval,
        method=decision.method,
    )


def decision_text(d: DecisionFigures) -> str:
    """The decision in one sentence, for a run's report and the leaderboard's notes."""
    if d.role == "reference":
        return (
            f"the reference of stop_when_decided (alpha {d.alpha:g}); ran {d.queries_run} of "
            f"{d.queries_in_slice}"
        )
    interval = _interval(d)
    if d.decided_at is None:
        return (
            f"undecided against the reference after {d.paired} paired queries "
            f"(E = {d.e_value:.2f} < {1 / d.alpha:g}); accuracy {interval}"
        )
    saved = f"{d.queries_saved} queries saved" + (
        f" (about ${d.cost_saved_usd:,.2f})" if d.cost_saved_usd is not None else ""
    )
    return (
        f"decided {d.direction} than the reference at {d.decided_at} paired queries "
        f"({d.wins} won, {d.losses} lost of the discordant, E = {d.e_value:.1f} >= "
        f"{1 / d.alpha:g}); ran {d.queries_run} of {d.queries_in_slice}, {saved}"
        + ("; went on past the decision (--extend)" if d.extended else "")
        + f"; accuracy {interval}"
    )


def _interval(d: DecisionFigures) -> str:
    if d.accuracy_interval is None:
        return "n/a"
    low, high = d.accuracy_interval
    level = round(100 * (1 - d.alpha))
    return f"{level} % confidence sequence [{100 * low:.1f}, {100 * high:.1f}] (valid at the stop)"


def decisions_markdown(runs: Sequence[tuple[str, DecisionFigures]]) -> list[str]:
    """The combined report's section: each run's decision and what it saved."""
    if not runs:
        return []
    lines = [
        "## Stopped when decided",
        "",
        f"Method: {runs[0][1].method}. Each comparison's chance of a wrong decision is at most "
        "its alpha.",
        "",
        "| run | role | decided at | direction | E | ran / slice | saved queries | saved cost | "
        "accuracy % (confidence sequence) |",
        "|---|---|---:|---|---:|---|---:|---:|---|",
    ]
    for run_dir, d in runs:
        interval = (
            "n/a"
            if d.accuracy_interval is None
            else f"[{100 * d.accuracy_interval[0]:.1f}, {100 * d.accuracy_interval[1]:.1f}]"
        )
        compared = d.role == "compared"
        lines.append(
            f"| {run_dir} | {d.role} | "
            f"{(d.decided_at or 'undecided') if compared else ''} | {d.direction or ''} | "
            f"{f'{d.e_value:.1f}' if compared else ''} | {d.queries_run} / {d.queries_in_slice} | "
            f"{d.queries_saved} | "
            f"{'n/a' if d.cost_saved_usd is None else f'${d.cost_saved_usd:,.2f}'} | {interval} |"
        )
    return lines
