"""Every figure of a run, from its records, rankings and one judge's verdicts (SPEC §7).

Each figure carries what it needs to be read right: the judge that produced it, the
calibration convention, the config hash and the number of queries it covers. Plain functions:
the Ray runtime can map them over chunks of records, and tests call them directly.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from pydantic import BaseModel

from piserini_ray.config import RunConfig
from piserini_ray.data import Benchmark, Qrels
from piserini_ray.llm.usage import Usage
from piserini_ray.metrics.calibration import CONVENTIONS, calibration_error
from piserini_ray.metrics.cost import PricingTable
from piserini_ray.metrics.intervals import mean_interval, ratio_interval
from piserini_ray.metrics.recall import DEPTHS, DOC_SETS, macro, micro, per_query, surfaced_at_depth
from piserini_ray.store import Judgement, QueryRecord, RankingLog


class Estimate(BaseModel):
    value: float | None
    ci95: tuple[float, float] | None = None
    queries: int


class RecallFigures(BaseModel):
    macro: Estimate
    micro: Estimate


class RunMetrics(BaseModel):
    run_dir: str
    config_hash: str
    benchmark: str
    model: str
    judge: str
    queries: int
    statuses: dict[str, int]
    judge_failed: int
    accuracy: Estimate
    accuracy_completed: Estimate
    #: CE x 100 by convention; None where undefined (browsecomp-plus needs N >= 200).
    calibration_error: dict[str, float | None]
    calibration_default: str = "piserini"
    recall: dict[str, dict[str, RecallFigures]]  # set -> qrels kind -> figures
    depth_curve: dict[str, dict[int, float | None]]  # qrels kind -> k -> macro surfaced recall
    tool_calls_per_query: dict[str, float]
    tokens_total: Usage
    tokens_median_per_query: float
    cached_token_ratio: float
    cost_usd: float | None
    judge_cost_usd: float | None
    #: model -> where its prices came from (the table, or litellm's map when allowed)
    pricing_source: dict[str, str]
    budget_seconds: float
    bm25: dict[str, float]


def _estimate(values: list[float], seed: int) -> Estimate:
    value = sum(values) / len(values) if values else None
    return Estimate(value=value, ci95=mean_interval(values, seed), queries=len(values))


def compute_metrics(
    config: RunConfig,
    run_dir: Path,
    benchmark: Benchmark,
    records: list[QueryRecord],
    rankings: dict[str, list[RankingLog]],
    judgements: dict[str, Judgement],
    pricing: PricingTable,
) -> RunMetrics:
    seed = config.judge.seed
    judge = config.judge_model().name
    order = {q.query_id: i for i, q in enumerate(benchmark.queries)}
    records = sorted(records, key=lambda r: order.get(r.query_id, len(order)))
    judged = [
        (r, judgements[r.query_id])
        for r in records
        if r.query_id in judgements and judgements[r.query_id].status == "judged"
    ]
    correct = [1.0 if j.correct else 0.0 for _, j in judged]
    completed = [1.0 if j.correct else 0.0 for r, j in judged if r.status == "completed"]
    calibration = {
        "piserini": calibration_error(
            [min(100.0, max(0.0, r.confidence)) / 100 for r, _ in judged],
            [bool(j.correct) for _, j in judged],
            "piserini",
        ),
        "browsecomp-plus": calibration_error(
            [(j.confidence if j.confidence is not None else 100.0) / 100 for _, j in judged],
            [bool(j.correct) for _, j in judged],
            "browsecomp-plus",
        ),
    }
    assert set(calibration) == set(CONVENTIONS)
    qrels: dict[str, Qrels] = {"evidence": benchmark.evidence, "gold": benchmark.gold}
    recall: dict[str, dict[str, RecallFigures]] = {}
    for name in DOC_SETS:
        docs = {r.query_id: getattr(r, name) for r in records}
        recall[name] = {}
        for kind, table in qrels.items():
            rows = per_query(docs, table)
            recall[name][kind] = RecallFigures(
                macro=Estimate(
                    value=macro(rows),
                    queries=len(rows),
                    ci95=mean_interval([r.recall for r in rows], seed),
                ),
                micro=Estimate(
                    value=micro(rows),
                    queries=len(rows),
                    ci95=ratio_interval([r.hits for r in rows], [r.relevant for r in rows], seed),
                ),
            )
    depth: dict[str, dict[int, float | None]] = {}
    for kind, table in qrels.items():
        depth[kind] = {}
        for k in DEPTHS:
            docs = {
                r.query_id: surfaced_at_depth([s.docids for s in rankings.get(r.query_id, [])], k)
                for r in records
            }
            depth[kind][k] = macro(per_query(docs, table))
    n = max(1, len(records))
    tools: Counter[str] = Counter()
    for r in records:
        tools.update(r.tool_call_counts)
    total = sum((r.usage for r in records), Usage())
    price = pricing.price(config.model.name)
    judge_price = pricing.price(judge)
    judge_usage = sum((j.usage for j in judgements.values()), Usage())
    return RunMetrics(
        run_dir=str(run_dir),
        config_hash=config.config_hash(),
        benchmark=config.benchmark.display_name(),
        model=config.model.name,
        judge=judge,
        queries=len(records),
        statuses=dict(Counter(r.status for r in records)),
        judge_failed=sum(
            1
            for r in records
            if r.query_id in judgements and judgements[r.query_id].status == "judge_failed"
        ),
        accuracy=_estimate(correct, seed),
        accuracy_completed=_estimate(completed, seed),
        calibration_error=calibration,
        recall=recall,
        depth_curve=depth,
        tool_calls_per_query={k: round(v / n, 3) for k, v in sorted(tools.items())}
        | {"total": round(sum(tools.values()) / n, 3)},
        tokens_total=total,
        tokens_median_per_query=statistics.median(
            [r.usage.input_tokens + r.usage.output_tokens for r in records] or [0]
        ),
        cached_token_ratio=round(total.cached_tokens / max(1, total.input_tokens), 4),
        cost_usd=round(sum(price.cost(r.usage) for r in records), 4) if price else None,
        judge_cost_usd=round(judge_price.cost(judge_usage), 4) if judge_price else None,
        pricing_source={name: pricing.source(name) for name in (config.model.name, judge)},
        budget_seconds=config.agent.budget_seconds,
        bm25={"k1": config.retrieval.bm25.k1, "b": config.retrieval.bm25.b},
    )
