"""The budget and termination analysis on crafted per-query facts with known answers."""

import pytest

from piserini_ray.records import Usage
from piserini_ray.reports.budget import budget_analysis, budget_markdown
from piserini_ray.reports.facts import QueryFacts


def _f(
    i: int,
    status: str,
    correct: bool,
    seconds: float,
    turns: int,
    steered: bool = False,
    evidence: int = 2,
    hops: int | None = 2,
    first: float | None = 1.0,
) -> QueryFacts:
    return QueryFacts(
        query_id=f"q{i}", position=i, status=status, verdict="judged", correct=correct,
        agent_confidence=0.5, judge_confidence=None, recall={}, depth={}, usage=Usage(),
        tool_calls={}, turns=turns, charged_seconds=seconds, steered=steered,
        evidence_documents=evidence, hops=hops, first_search_recall=first,
    )  # fmt: skip


def test_budget_analysis_of_crafted_queries() -> None:
    facts = [
        _f(0, "completed", True, 10, 5),
        _f(1, "completed", True, 20, 10),
        _f(2, "completed", False, 30, 15),
        _f(3, "completed", False, 220, 40, steered=True, evidence=4, hops=4, first=0.0),
        _f(4, "completed", True, 230, 42, steered=True, evidence=5, hops=4, first=0.5),
        _f(5, "timeout", False, 300, 50, steered=True, evidence=3, hops=3, first=0.0),
        _f(6, "timeout", False, 300, 60, steered=True, evidence=4, hops=None, first=None),
    ]
    b = budget_analysis(facts)
    assert b.time_to_answer.queries == 5  # completed only
    assert b.time_to_answer.percentiles[50] == 30 and b.time_to_answer.percentiles[100] == 230
    assert b.turns_to_answer.mean == pytest.approx((5 + 10 + 15 + 40 + 42) / 5)
    assert (b.steered, b.timeouts) == (4, 2) and b.steered_share == pytest.approx(4 / 7)
    assert b.accuracy_steered == pytest.approx(1 / 2) and b.accuracy_natural == pytest.approx(2 / 3)
    groups = {g.label: g for g in b.by_difficulty["evidence documents"]}
    assert [g.label for g in b.by_difficulty["evidence documents"]] == ["2", "3", "4+"]
    assert (groups["4+"].queries, groups["4+"].timeouts, groups["4+"].accuracy) == (
        3, 1, pytest.approx(1 / 3)
    )  # fmt: skip
    hops = {g.label: g.queries for g in b.by_difficulty["hops"]}
    assert hops == {"2": 3, "3": 1, "4": 2}  # the query whose id names no hops is left out
    first = b.by_difficulty["evidence surfaced by the first search"]
    assert [(g.label, g.queries, g.timeouts) for g in first] == [
        ("all", 3, 0), ("some", 1, 0), ("none", 2, 1)
    ]  # fmt: skip
    text = budget_markdown(b, "time: 300 s")
    assert "Steered: 4 (57.1 %)" in text and "| hops | 4 | 2 | 0 | 2 | 50.0 |" in text


def test_no_completed_query_is_said_so() -> None:
    b = budget_analysis([_f(0, "timeout", False, 300, 9, steered=True)])
    assert b.time_to_answer.queries == 0 and b.accuracy_natural is None
    assert "no completed query" in budget_markdown(b, "time: 300 s")
