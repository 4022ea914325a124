"""Paired comparisons and judge agreement on crafted runs with known answers."""

import pytest
from scipy.stats import binomtest

from piserini_ray.data import Query
from piserini_ray.metrics.cost import Price
from piserini_ray.metrics.paired import cohens_kappa
from piserini_ray.records import Judgement, Usage
from piserini_ray.reports.agreement import agreement_markdown, judge_agreement
from piserini_ray.reports.comparison import RunFacts, compare_runs, paired_markdown
from piserini_ray.reports.facts import QueryFacts


def _facts(query_id: str, correct: bool | None, hits: int = 1, tokens: int = 1000) -> QueryFacts:
    return QueryFacts(
        query_id=query_id,
        position=int(query_id[1:]),
        status="completed",
        verdict=None if correct is None else "judged",
        correct=correct,
        agent_confidence=50,
        judge_confidence=None,
        recall={"surfaced": {"evidence": (hits, 2), "gold": None}},
        depth={},
        usage=Usage(input_tokens=tokens, output_tokens=0),
        tool_calls={},
    )


def _run(name: str, facts: list[QueryFacts], price: float | None = 1.0) -> RunFacts:
    return RunFacts(
        run_dir=name,
        model="m",
        judge="j",
        facts=facts,
        price=None if price is None else Price(input=price, output=0, cache_read=0),
    )


def test_a_paired_comparison_of_crafted_runs() -> None:
    # 12 shared queries: 4 right in both, 1 right only in A, 5 right only in B, 2 wrong in both;
    # q12 only in A, q13 only in B (not compared); q11 has no verdict in B (counted wrong).
    right_a = [True] * 4 + [True] + [False] * 5 + [False, True]
    right_b = [True] * 4 + [False] + [True] * 5 + [False, None]
    a = [_facts(f"q{i}", r, hits=1) for i, r in enumerate(right_a)] + [_facts("q12", True)]
    b = [_facts(f"q{i}", r, hits=2, tokens=3000) for i, r in enumerate(right_b)]
    b.append(_facts("q13", True))
    c = compare_runs(_run("A", a), _run("B", b, price=2.0), seed=1)
    assert c.queries == 12 and c.unjudged == 1
    assert (c.wins, c.losses, c.ties) == (5, 2, 5)  # q4 and q11 lost
    assert c.mcnemar.p_value == pytest.approx(binomtest(5, 7, 0.5).pvalue)
    assert c.accuracy.reference == pytest.approx(6 / 12) and c.accuracy.other == pytest.approx(
        9 / 12
    )
    assert c.accuracy.difference == pytest.approx(3 / 12)
    low, high = c.accuracy.ci95
    assert low <= 3 / 12 <= high
    assert c.surfaced_recall.difference == pytest.approx(0.5)  # 1/2 -> 2/2 on every query
    assert c.surfaced_recall.ci95 == (pytest.approx(0.5), pytest.approx(0.5))
    # $1 per million x 1,000 tokens against $2 per million x 3,000 tokens
    assert c.cost_per_query.difference == pytest.approx(0.006 - 0.001)
    assert {f.query_id for f in c.flips if f.other_correct} == {"q5", "q6", "q7", "q8", "q9"}
    assert {f.query_id for f in c.flips if not f.other_correct} == {"q4", "q11"}
    table = paired_markdown([c])
    assert "| B | 12 | 50.0 -> 75.0 | +25.0 [" in table and "5 / 2 / 5" in table
    assert "loses 2 (q4, q11)" in table and "1 shared queries lack a verdict" in table


def test_an_unpriced_run_has_no_cost_difference() -> None:
    a = [_facts("q0", True), _facts("q1", False)]
    c = compare_runs(_run("A", a), _run("B", a, price=None))
    assert c.cost_per_query is None and c.flips == [] and c.mcnemar.p_value == 1.0
    assert "| n/a |" in paired_markdown([c])


def _verdict(judge: str, query_id: str, correct: bool | None) -> Judgement:
    if correct is None:
        return Judgement(query_id=query_id, judge_model=judge, status="judge_failed", error="x")
    return Judgement(query_id=query_id, judge_model=judge, status="judged", correct=correct)


def test_judge_agreement_on_crafted_verdicts() -> None:
    queries = [
        Query(query_id=f"q{i}", query=f"question {i}?", answer=f"gold {i}") for i in range(52)
    ]
    # The textbook table on q0..q49 (kappa 0.4); q50 failed under one judge, q51 unjudged.
    first = [True] * 25 + [False] * 25
    second = [True] * 20 + [False] * 5 + [True] * 10 + [False] * 15
    verdicts = {
        "strict": {f"q{i}": _verdict("strict", f"q{i}", x) for i, x in enumerate(first)},
        "lenient": {f"q{i}": _verdict("lenient", f"q{i}", y) for i, y in enumerate(second)},
    }
    verdicts["strict"]["q50"] = _verdict("strict", "q50", True)
    verdicts["lenient"]["q50"] = _verdict("lenient", "q50", None)
    answers = {q.query_id: f"answer {q.query_id}" for q in queries}
    pair = judge_agreement("strict", "lenient", verdicts, queries, answers, seed=0)
    assert pair.queries == 50 and pair.raw_agreement == pytest.approx(0.7)
    assert pair.kappa == pytest.approx(0.4) == pytest.approx(cohens_kappa(first, second))
    assert pair.kappa_ci95[0] < 0.4 < pair.kappa_ci95[1]
    assert pair.accuracy == {"strict": pytest.approx(0.5), "lenient": pytest.approx(0.6)}
    assert len(pair.disagreements) == 15
    d = pair.disagreements[0]
    assert (d.query_id, d.question, d.answer, d.gold) == (
        "q20",
        "question 20?",
        "answer q20",
        "gold 20",
    )
    assert d.verdicts == {"strict": True, "lenient": False}
    text = agreement_markdown([pair])
    assert "| strict vs lenient | 50 | 70.0 | 0.400 [" in text
    assert "| q20 | question 20? | answer q20 | gold 20 | right | wrong |" in text


def test_compare_prints_the_power_of_the_comparison() -> None:
    """The MDE and queries-needed lines come from the observed discordance (7 of 12 pairs
    disagree in the crafted runs) through metrics.power."""
    from piserini_ray.metrics.power import minimum_detectable_difference, queries_needed

    right_a = [True] * 4 + [True] * 2 + [False] * 5 + [False]
    right_b = [True] * 4 + [False] * 2 + [True] * 5 + [False]
    c = compare_runs(
        _run("A", [_facts(f"q{i}", r) for i, r in enumerate(right_a)]),
        _run("B", [_facts(f"q{i}", r) for i, r in enumerate(right_b)]),
    )
    assert c.power is not None and c.power.discordance == pytest.approx(7 / 12)
    assert c.power.minimum_detectable == minimum_detectable_difference(12, 7 / 12)
    needed = dict(c.power.needed)
    assert needed[0.02] == queries_needed(0.02, 7 / 12)
    table = paired_markdown([c])
    line = next(t for t in table.splitlines() if t.startswith("B: power"))
    assert "α = 0.05, 80 % power" in line and "observed discordance 0.583" in line
    assert "12 queries detect" in line and "to detect 1 / 2 / 5 points: " in line
    assert f"{needed[0.01]:,} / {needed[0.02]:,} / {needed[0.05]:,} queries" in line


def test_pilot_power_assumes_independent_runs_unless_told() -> None:
    from piserini_ray.metrics.power import queries_needed
    from piserini_ray.reports.comparison import pilot_power, power_markdown

    facts = [_facts(f"q{i}", i % 4 != 0) for i in range(40)] + [_facts("q40", None)]
    pilot = pilot_power(_run("P", facts), [0.02, 0.05])
    p = 30 / 41
    assert pilot.accuracy == pytest.approx(p) and pilot.queries == 41
    assert pilot.figures.discordance == pytest.approx(2 * p * (1 - p))
    assert dict(pilot.figures.needed)[0.05] == queries_needed(0.05, 2 * p * (1 - p))
    text = power_markdown(pilot)
    assert "2p(1-p) = 0.393" in text and "| 5 | " in text and "| 2 | " in text
    given = pilot_power(_run("P", facts), [0.05], discordance=0.1)
    assert dict(given.figures.needed)[0.05] == queries_needed(0.05, 0.1)
    assert "as given (--discordance)" in power_markdown(given)
