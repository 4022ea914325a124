"""The map step of a run's figures: what one query contributes (`QueryFacts`), computed from
its record, rankings, verdict and the qrels. A leaf of `reports/`: the reducers (`metrics`,
`budget`, `paired`) all read facts, and none of them is read by it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pydantic import BaseModel

from piserini_ray.data import Benchmark, Qrels
from piserini_ray.metrics.recall import DEPTHS, DOC_SETS, best_ranks, per_query
from piserini_ray.records import Judgement, QueryRecord, RankingLog, Usage


class QueryFacts(BaseModel):
    """What one query contributes to the run's figures: the map step, computed per chunk of
    records (a Ray task each on a cluster) and combined by `aggregate`."""

    query_id: str
    position: int  # the query's place in the benchmark: fixes the calibration sort's ties
    status: str
    verdict: str | None  # judged | judge_failed | None (not judged)
    correct: bool | None
    agent_confidence: float
    #: The judge read a response (completed with a final answer); else it is wrong by rule,
    #: as BrowseComp-Plus's evaluator leaves it out of calibration.
    answered: bool = True
    #: The judge's confidence in its verdict (None under the browsecomp-plus template).
    judge_confidence: float | None
    #: The response's confidence as a browsecomp-plus-template judge extracted it (else None).
    extracted_confidence: float | None = None
    #: The prompt the verdict's judge read (`Judgement.template`); None without a verdict.
    verdict_template: str | None = None
    recall: dict[str, dict[str, tuple[int, int] | None]]  # set -> kind -> (hits, relevant)
    depth: dict[str, dict[int, tuple[int, int] | None]]  # kind -> k -> (hits, relevant)
    usage: Usage
    calls_without_usage: int = 0
    #: Calls cut at the budget or failed after sending: their prompts are estimated in `usage`.
    calls_usage_estimated: int = 0
    tool_calls: dict[str, int]
    # For the budget and termination analysis (`reports/budget.py`):
    turns: int = 0
    charged_seconds: float = 0.0
    steered: bool = False
    termination: str | None = None
    evidence_documents: int = 0
    #: Hops of a multi-hop id (MuSiQue's `3hop1__...`); None where the id does not say.
    hops: int | None = None
    #: Evidence in the first search's ranking / all evidence (None: no evidence or no search).
    first_search_recall: float | None = None
    #: The parts an imported record's format lacks (`records.UNAVAILABLE`): their figures are
    #: n/a, never 0 (`aggregate`); empty for a record of our own.
    unavailable: list[str] = []
    #: (format, folder) of an imported record; None for a record of our own.
    imported: tuple[str, str] | None = None


_HOPS = re.compile(r"^(\d+)hop")


def query_facts(
    record: QueryRecord,
    position: int,
    rankings: list[RankingLog],
    judgement: Judgement | None,
    qrels: dict[str, Qrels],
) -> QueryFacts:
    def hits(docs: set[str], table: Qrels) -> tuple[int, int] | None:
        rows = per_query({record.query_id: docs}, table)
        return (rows[0].hits, rows[0].relevant) if rows else None

    evidence = {d for d, rel in qrels["evidence"].get(record.query_id, {}).items() if rel > 0}
    hops = _HOPS.match(record.query_id)
    source = record.imported
    # Whose confidence the verdict carries: the judge's own, or the response's (their template).
    template = None if judgement is None else judgement.template
    confidence = None if judgement is None or judgement.confidence is None else judgement.confidence

    return QueryFacts(
        query_id=record.query_id,
        position=position,
        status=record.status,
        verdict=judgement.status if judgement else None,
        correct=judgement.correct if judgement else None,
        agent_confidence=min(100.0, max(0.0, record.confidence)) / 100,
        answered=record.status == "completed" and bool(record.final_answer),
        judge_confidence=None if confidence is None or template != "piserini" else confidence / 100,
        extracted_confidence=None
        if confidence is None or template != "browsecomp-plus"
        else confidence / 100,
        verdict_template=template,
        # A set the record's format lacks counts nowhere (None), as a query without evidence.
        recall={
            name: {
                kind: hits(set(getattr(record, name)), table) if record.has(name) else None
                for kind, table in qrels.items()
            }
            for name in DOC_SETS
        },
        depth={
            kind: depth_hits(record.query_id, rankings, table)
            if record.has("rankings")
            else dict.fromkeys(DEPTHS)
            for kind, table in qrels.items()
        },
        usage=record.usage,
        calls_without_usage=record.calls_without_usage,
        calls_usage_estimated=record.calls_usage_estimated,
        tool_calls=record.tool_call_counts,
        turns=record.turns if record.turns is not None else len(record.trajectory),
        charged_seconds=record.charged_seconds,
        steered=record.steered,
        termination=record.termination,
        evidence_documents=len(evidence),
        hops=int(hops.group(1)) if hops else None,
        first_search_recall=len(evidence & set(rankings[0].docids)) / len(evidence)
        if evidence and rankings
        else None,
        unavailable=list(source.unavailable) if source else [],
        imported=(source.format, source.directory) if source else None,
    )


def depth_hits(
    query_id: str, rankings: list[RankingLog], qrels: Qrels
) -> dict[int, tuple[int, int] | None]:
    """(relevant documents surfaced had every search stopped at k, relevant) for each depth;
    None at every depth for a query with no relevant documents."""
    relevant = [d for d, rel in qrels.get(query_id, {}).items() if rel > 0]
    if not relevant:
        return dict.fromkeys(DEPTHS)
    best = best_ranks(relevant, [s.docids for s in rankings])
    return {k: (sum(1 for rank in best.values() if rank <= k), len(relevant)) for k in DEPTHS}


def facts_for(
    records: Iterable[QueryRecord],
    benchmark: Benchmark,
    rankings: Mapping[str, list[RankingLog]] | None,
    judgements: Mapping[str, Judgement],
) -> list[QueryFacts]:
    """The map step over records (any iterable: a store streams them). `rankings`: each
    query's rankings, or None to take each record's own."""
    order = {q.query_id: i for i, q in enumerate(benchmark.queries)}
    qrels: dict[str, Qrels] = {"evidence": benchmark.evidence, "gold": benchmark.gold}
    return [
        query_facts(
            r,
            order.get(r.query_id, len(order)),
            r.rankings if rankings is None else rankings.get(r.query_id, []),
            judgements.get(r.query_id),
            qrels,
        )
        for r in records
    ]
