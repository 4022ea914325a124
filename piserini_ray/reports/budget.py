"""Budget and termination analysis (seed §6.6): how long queries take to answer, how often the
70 % steer fires and what it costs in accuracy, and whether timeouts fall on the hard queries
(by three difficulty proxies: evidence documents, hops, evidence the first search surfaced)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel

from piserini_ray.reports._format import percent
from piserini_ray.reports.facts import QueryFacts

PERCENTILES = (10, 25, 50, 75, 90, 100)


class Distribution(BaseModel):
    queries: int
    mean: float | None
    #: percentile -> value (100: the maximum)
    percentiles: dict[int, float]


class Group(BaseModel):
    """Queries sharing a value of a difficulty proxy."""

    label: str
    queries: int
    timeouts: int
    steered: int
    accuracy: float | None  # correct / queries of the group


class BudgetAnalysis(BaseModel):
    #: Charged seconds and model turns of the completed queries (the time the budget counts).
    time_to_answer: Distribution
    turns_to_answer: Distribution
    steered: int
    steered_share: float | None
    #: correct / completed, for answers given after the steer and for the others.
    accuracy_steered: float | None
    accuracy_natural: float | None
    timeouts: int
    #: proxy -> groups, easiest first
    by_difficulty: dict[str, list[Group]]
    #: For the answer-time plot: all queries, and the sorted charged seconds of the answers.
    queries: int = 0
    answer_times: list[float] = []


def _distribution(values: Sequence[float]) -> Distribution:
    if not values:
        return Distribution(queries=0, mean=None, percentiles={})
    data = np.asarray(values, dtype=float)
    return Distribution(
        queries=len(values),
        mean=float(data.mean()),
        percentiles={p: float(np.percentile(data, p)) for p in PERCENTILES},
    )


def _correct(f: QueryFacts) -> bool:
    return f.verdict == "judged" and bool(f.correct)


def _share(facts: Sequence[QueryFacts], test: Callable[[QueryFacts], bool]) -> float | None:
    return sum(1 for f in facts if test(f)) / len(facts) if facts else None


def _groups(
    facts: Sequence[QueryFacts], key: Callable[[QueryFacts], tuple[float, str] | None]
) -> list[Group]:
    """Groups by `key` (an order, easiest first, and a label); None leaves a query out."""
    buckets: dict[tuple[float, str], list[QueryFacts]] = {}
    for f in facts:
        k = key(f)
        if k is not None:
            buckets.setdefault(k, []).append(f)
    return [
        Group(
            label=k[1],
            queries=len(members),
            timeouts=sum(1 for f in members if f.status == "timeout"),
            steered=sum(1 for f in members if f.steered),
            accuracy=_share(members, _correct),
        )
        for k, members in sorted(buckets.items())
    ]


def _evidence(f: QueryFacts) -> tuple[float, str] | None:
    n = f.evidence_documents
    return None if n == 0 else (min(n, 4), f"{n}" if n < 4 else "4+")


def _hops(f: QueryFacts) -> tuple[float, str] | None:
    return None if f.hops is None else (f.hops, str(f.hops))


def _first_search(f: QueryFacts) -> tuple[float, str] | None:
    """Easiest first: the first search already surfaced all the evidence."""
    r = f.first_search_recall
    if r is None:
        return None
    return (0, "all") if r == 1 else (2, "none") if r == 0 else (1, "some")


def budget_analysis(facts: Sequence[QueryFacts]) -> BudgetAnalysis:
    completed = [f for f in facts if f.status == "completed"]
    steered = [f for f in completed if f.steered]
    natural = [f for f in completed if not f.steered]
    return BudgetAnalysis(
        time_to_answer=_distribution([f.charged_seconds for f in completed]),
        turns_to_answer=_distribution([float(f.turns) for f in completed]),
        steered=sum(1 for f in facts if f.steered),
        steered_share=_share(facts, lambda f: f.steered),
        accuracy_steered=_share(steered, _correct),
        accuracy_natural=_share(natural, _correct),
        timeouts=sum(1 for f in facts if f.status == "timeout"),
        queries=len(facts),
        answer_times=sorted(round(f.charged_seconds, 3) for f in completed),
        by_difficulty={
            "evidence documents": _groups(facts, _evidence),
            "hops": _groups(facts, _hops),
            "evidence surfaced by the first search": _groups(facts, _first_search),
        },
    )


def _dist(d: Distribution, unit: str) -> str:
    if not d.queries:
        return "no completed query"
    p = d.percentiles
    return (
        f"median {p[50]:.1f}{unit}, p10 {p[10]:.1f}, p90 {p[90]:.1f}, max {p[100]:.1f} "
        f"(mean {d.mean:.1f}, {d.queries} completed)"
    )


def budget_markdown(b: BudgetAnalysis, policy: str) -> str:
    lines = [
        "### Budget and termination",
        "",
        f"Policy: {policy}. Time to answer (charged): "
        f"{_dist(b.time_to_answer, ' s')}. Turns to answer: {_dist(b.turns_to_answer, '')}. "
        f"Steered: {b.steered} ({percent(b.steered_share)} %); accuracy of steered answers "
        f"{percent(b.accuracy_steered)} % against {percent(b.accuracy_natural)} % for answers "
        f"given before the steer. Timeouts: {b.timeouts}.",
        "",
        "| difficulty proxy | group | queries | timeouts | steered | accuracy % |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for proxy, groups in b.by_difficulty.items():
        for g in groups:
            lines.append(
                f"| {proxy} | {g.label} | {g.queries} | {g.timeouts} | {g.steered} | "
                f"{percent(g.accuracy)} |"
            )
    return "\n".join(lines) + "\n"
