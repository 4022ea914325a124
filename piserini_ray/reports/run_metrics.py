"""Every figure of a run, from its records, rankings and one judge's verdicts (docs/spec.md §7).

Each figure carries what it needs to be read right: the judge that produced it, the
calibration convention, the config hash and the number of queries it covers. Plain functions:
a map step (`query_facts`, over records streamed from the store) and a reduce (`aggregate`).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from piserini_ray.config import ModelConfig, RunConfig
from piserini_ray.data import Benchmark
from piserini_ray.formats.imported import ImportedRun, read_imported
from piserini_ray.metrics.calibration import CONVENTIONS, calibration_error
from piserini_ray.metrics.cost import PricingTable
from piserini_ray.metrics.intervals import mean_interval, ratio_interval
from piserini_ray.metrics.recall import (
    DEPTHS,
    DOC_SETS,
    PerQueryRecall,
    macro,
    micro,
)
from piserini_ray.records import Judgement, QueryRecord, RankingLog, ServedTime, Usage
from piserini_ray.reports.agreement import JudgeAgreement
from piserini_ray.reports.budget import BudgetAnalysis, budget_analysis
from piserini_ray.reports.decided import DecisionFigures
from piserini_ray.reports.facts import QueryFacts, facts_for
from piserini_ray.reports.panel import PanelSummary


class Estimate(BaseModel):
    """A figure with its 95 % bootstrap interval and the count of queries it covers."""

    value: float | None  # a fraction (0.75 = 75 %); None where undefined (n/a)
    ci95: tuple[float, float] | None = None  # the 95 % bootstrap interval, when computed
    queries: int  # the queries the figure covers


class RecallFigures(BaseModel):
    """A document set's recall against one kind of qrels."""

    macro: Estimate  # the mean over queries with non-empty qrels
    micro: Estimate  # all hits over all qrels


CONVENTION_NOTES = {
    "accuracy": "correct / all queries (timeouts and failures are wrong); a judge failure is "
    "neither right nor wrong: accuracy_final is false and accuracy_judged = correct / judged "
    "stands beside it (docs/spec.md §7)",
    "calibration.piserini": "completed queries with a verdict; the agent's last 'Confidence:' "
    "line, sign kept, clamped to 0-100 (100 when missing); stable sort; consecutive bins of "
    "100, the last holding the rest; every bin summed (docs/spec.md §7)",
    "calibration.browsecomp-plus": "the queries their evaluator judges (completed, with a "
    "response) that have a verdict; the agent's stated confidence, as their grader's "
    "`confidence` field extracts it from the response (our parsed 'Confidence:' value, 100 when "
    "missing; under judge.template browsecomp-plus the judge's extracted value, as their "
    "evaluate_run.py); bins of 100, the last stretched to the end and left out of the sum; "
    "undefined under 200; stable sort (their numpy sort is not: with tied confidences the two "
    "may differ) (docs/spec.md §7)",
    "judge_calibration": "not a peer's convention: the judge's confidence in its own verdict "
    "against agreement with a second judge (or with the panel's majority), over the answers "
    "both judged by reading them; RMS over consecutive bins of 100, every bin; n/a without a "
    "second judge or panel, and under judge.template browsecomp-plus (its `confidence` is the "
    "response's, not the judge's)",
}


#: The figures each part an imported record may lack (`records.UNAVAILABLE`) feeds: shown n/a.
UNAVAILABLE_FIGURES: dict[str, tuple[str, ...]] = {
    "usage": ("tokens", "cost"),
    "previewed": ("recall.previewed",),
    "opened": ("recall.opened",),
    "behavior": ("recall.behavior",),
    "rankings": ("depth_curve",),
    "trajectory": ("budget",),
    "timing": ("budget",),
}


class ServedCost(BaseModel):
    """What a model the run serves cost it: its servers' hours (`served.jsonl`) times their
    price (`serve.price_per_replica_hour`), shared with the runs it served at once by tokens."""

    engine: str
    replica_hours: float
    price_per_replica_hour: float
    cost_usd: float


def served_cost(served: Sequence[ServedTime]) -> ServedCost | None:
    """The run's served cost over every execution (None: it served no model)."""
    if not served:
        return None
    seconds = sum(s.seconds for s in served)
    return ServedCost(
        engine=served[-1].engine,
        replica_hours=round(seconds / 3600, 6),
        price_per_replica_hour=served[-1].price_per_replica_hour,
        cost_usd=round(sum(s.cost_usd for s in served), 6),
    )


def served_source(model: ModelConfig) -> str:
    """Where a served model's price comes from, for the report."""
    assert model.serve is not None
    return (
        f"served by the run ({model.serve.engine}): ${model.serve.price_per_replica_hour:g} "
        "per server-hour (serve.price_per_replica_hour), its tokens free"
    )


class RunMetrics(BaseModel):
    """A run's figures: its `summary.json` (accuracy with its 95 % interval, calibration
    error, recalls, tool calls, tokens, cost), what `judge` and `report` return per run.
    Every field is on the record files' reference page.

    Args:
        **fields: the figures (the reports make them from the records and verdicts).

    Returns:
        A validated summary.

    Example:
        ```python
        from pathlib import Path

        from piserini_ray import RunMetrics

        summary = RunMetrics.model_validate_json((Path(run_dir) / "summary.json").read_text())
        print(summary.accuracy.value, summary.accuracy.ci95, summary.cost_usd)
        ```
    """

    run_dir: str  # the run directory
    config_hash: str  # the hash of the run config's identity
    benchmark: str  # the benchmark's name
    model: str  # the agent model
    judge: str  # the judge (or panel) whose verdicts the figures count
    queries: int  # the run's queries (its slice)
    statuses: dict[str, int]  # queries by status: completed, timeout, failed
    judge_failed: int  # queries whose judge failed (judged again by the next `judge`)
    #: correct / all queries of the run (timeouts and failures are wrong; docs/spec.md §7).
    accuracy: Estimate
    #: correct / the queries with a verdict: beside `accuracy` while verdicts are missing.
    accuracy_judged: Estimate | None = None
    #: False while any query has no verdict (a judge failure, or not judged yet).
    accuracy_final: bool = True
    pending_verdicts: int = 0  # queries without a verdict yet (judge failures included)
    #: correct / completed queries.
    accuracy_completed: Estimate
    #: CE x 100 by convention; None where undefined (browsecomp-plus needs N >= 200).
    calibration_error: dict[str, float | None]
    calibration_default: str = "piserini"  # the convention the report shows first
    #: The queries the piserini convention covers: the completed ones with a verdict.
    calibration_queries: int = 0
    #: The queries the browsecomp-plus convention covers: those the judge read (completed,
    #: with a response) that have a verdict (and, under their template, a confidence).
    calibration_queries_browsecomp_plus: int = 0
    #: `judge.template`: which prompt the judge read, so which confidence it returned.
    judge_template: str = "piserini"
    #: How each convention-bearing figure was computed, in words, so summary.json says it.
    conventions: dict[str, str] = Field(default_factory=lambda: dict(CONVENTION_NOTES))
    recall: dict[str, dict[str, RecallFigures]]  # set -> qrels kind -> figures
    depth_curve: dict[str, dict[int, float | None]]  # qrels kind -> k -> macro surfaced recall
    tool_calls_per_query: dict[str, float]  # mean calls per query by tool, and `total`
    #: The token figures; None when a record's format does not report usage (`unavailable`).
    tokens_total: Usage | None
    tokens_median_per_query: float | None  # input + output tokens, median over queries
    cached_token_ratio: float | None  # cached input tokens / input tokens
    #: USD of the agent's calls, the estimated prompts of calls no provider reported included.
    cost_usd: float | None
    #: Of `cost_usd`, the estimate for the calls cut at the budget or failed after sending
    #: (`calls_usage_estimated`): their prompts, counted locally and priced as input.
    cost_estimated_usd: float | None = None
    #: Model calls cut at the budget or failed after they were sent (the provider received them
    #: and may bill them; no usage came back): their prompt tokens are estimated.
    calls_usage_estimated: int = 0
    #: Model calls whose reply had no usage block: while above 0, cost is a lower bound.
    calls_without_usage: int = 0
    judge_cost_usd: float | None  # USD of the judge's calls; None when it is not priced
    #: model -> where its prices came from (the table, or litellm's map when allowed)
    pricing_source: dict[str, str]
    budget_seconds: float  # the time budget T per query (`agent.budget_seconds`)
    #: The termination policy in words ("time: 300 s", "iterations: 100", "both: ...").
    termination: str = "time"
    bm25: dict[str, float]  # k1 and b
    backend: str = "bm25"  # `retrieval.backend`
    depth: int = 1000  # `retrieval.depth`: hits per search
    retrieval: str = ""  # the retriever in words
    budget: BudgetAnalysis | None = None  # how queries used the time budget
    #: A model the run serves (`model.serve`): its servers' hours and their cost, which
    #: `cost_usd` includes (its tokens cost nothing more).
    served: ServedCost | None = None
    #: A judge the run serves: its servers' hours charged to this run and their cost, which
    #: `judge_cost_usd` includes.
    judge_served: ServedCost | None = None
    #: Its part in a `stop_when_decided` sweep: where its comparison was decided, what that
    #: saved, its accuracy's confidence sequence (`reports/decided.py`).
    decision: DecisionFigures | None = None
    #: Per pair of judges with verdicts in the run (the primary first): agreement and kappa.
    judge_agreement: list[JudgeAgreement] = Field(default_factory=list)
    #: A judge panel's figures (`judge.models`): the run's verdicts are its majority.
    panel: PanelSummary | None = None
    #: Judge calibration (`conventions["judge_calibration"]`): "<judge> vs <other>" -> CE x 100
    #: of the judge's own confidence against agreeing with the other; empty when there is no
    #: second judge or panel (n/a).
    judge_calibration: dict[str, float | None] = Field(default_factory=dict)
    #: Figures an imported run's format cannot give (`UNAVAILABLE_FIGURES`) -> why: they are
    #: None (n/a), never 0. Empty for a run of our own.
    unavailable: dict[str, str] = Field(default_factory=dict)
    #: Where an imported run's records came from: "<format> (<folder>)", one per source.
    imported_from: list[str] = Field(default_factory=list)
    #: What an imported run's own files state (model, retriever, settings), the files skipped
    #: and why, and how its cost was priced (`imported.json`); None for a run of our own.
    imported_run: ImportedRun | None = None


def judge_calibration(
    judge: str, pairs: list[JudgeAgreement], panel: PanelSummary | None
) -> dict[str, float | None]:
    """`RunMetrics.judge_calibration`: the run's judge's (each panel judge's) confidence in its
    own verdict against agreeing with the panel's majority or a second judge; empty (n/a)
    when there is neither."""
    figures: dict[str, float | None] = {}
    if panel is not None:
        for name, value in panel.calibration.items():
            figures[f"{name} vs the panel's majority"] = value
    for p in pairs:
        if p.first == judge:
            figures[f"{p.first} vs {p.second}"] = p.calibration.get(p.first)
    return figures


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
    """Map and reduce over records already in memory (tests; `pipeline.finish` streams)."""
    facts = facts_for(records, benchmark, rankings, judgements)
    return aggregate(config, run_dir, facts, judgements, pricing)


def _recall(rows: list[tuple[int, int] | None], seed: int) -> RecallFigures:
    present = [r for r in rows if r is not None]
    table = [
        PerQueryRecall(query_id=str(i), hits=h, relevant=n) for i, (h, n) in enumerate(present)
    ]
    return RecallFigures(
        macro=Estimate(
            value=macro(table),
            queries=len(table),
            ci95=mean_interval([r.recall for r in table], seed),
        ),
        micro=Estimate(
            value=micro(table),
            queries=len(table),
            ci95=ratio_interval([r.hits for r in table], [r.relevant for r in table], seed),
        ),
    )


_NONE = Estimate(value=None, queries=0)


def _unavailable(facts: list[QueryFacts]) -> dict[str, str]:
    """Each figure that some imported record's format cannot give -> why. One record without
    a part is enough: a figure over the others would pass for the run's."""
    formats: dict[str, set[str]] = {}
    for f in facts:
        if f.imported is not None:
            for part in f.unavailable:
                formats.setdefault(part, set()).add(f.imported[0])
    why: dict[str, str] = {}
    for part, names in formats.items():
        for figure in UNAVAILABLE_FIGURES.get(part, ()):
            why.setdefault(figure, f"not in the {' and '.join(sorted(names))} format")
    return why


def _policy(config: RunConfig) -> str:
    agent = config.agent
    time = (
        f"{agent.budget_seconds:g} s ({agent.budget_clock} clock, steer at "
        f"{agent.steer_fraction:g})"
    )
    turns = f"{agent.max_iterations} model turns"
    return {"time": f"time: {time}", "iterations": f"iterations: {turns}"}.get(
        agent.termination, f"both: {time} or {turns}"
    )


def _browsecomp_plus_calibrated(judged: list[QueryFacts]) -> list[tuple[float, bool]]:
    """(confidence, correct) of BrowseComp-Plus's calibration, as their evaluate_run.py picks
    them: only the answers its judge reads (a query that did not complete or gave no response
    is a parse error there: wrong, but out of calibration), with the confidence their grader
    extracts from the *response*, never the judge's own: ours parsed from its `Confidence:`
    line (100 when missing), or, for a verdict under their template, the judge's extracted
    value (a reply without one is left out, as theirs is)."""
    pairs = []
    for f in judged:
        if f.status != "completed" or not f.answered:
            continue
        if f.verdict_template == "browsecomp-plus":
            if f.extracted_confidence is not None:
                pairs.append((f.extracted_confidence, bool(f.correct)))
        else:
            pairs.append((f.agent_confidence, bool(f.correct)))
    return pairs


def aggregate(
    config: RunConfig,
    run_dir: Path,
    facts: list[QueryFacts],
    judgements: dict[str, Judgement],
    pricing: PricingTable,
    served: Sequence[ServedTime] = (),
) -> RunMetrics:
    """The reduce step: every figure of the run from its queries' facts (and, for a model the
    run serves, the server-seconds charged to it: `served`)."""
    seed = config.judge.seed
    facts = sorted(facts, key=lambda f: f.position)
    unavailable = _unavailable(facts)
    return RunMetrics(
        run_dir=str(run_dir),
        config_hash=config.config_hash(),
        benchmark=config.benchmark.display_name(),
        model=config.model.name,
        judge=config.judge_model().name,
        queries=len(facts),
        statuses=dict(Counter(f.status for f in facts)),
        judge_failed=sum(1 for f in facts if f.verdict == "judge_failed"),
        judge_template=config.judge.template,
        **_accuracy_fields(facts, seed),
        **_recall_fields(facts, unavailable, seed),
        **_usage_fields(config, facts, judgements, pricing, served, unavailable),
        budget_seconds=config.agent.budget_seconds,
        termination=_policy(config),
        budget=None if "budget" in unavailable else budget_analysis(facts),
        bm25={"k1": config.retrieval.bm25.k1, "b": config.retrieval.bm25.b},
        backend=config.retrieval.backend,
        depth=config.retrieval.depth,
        retrieval=config.retrieval.describe(),
        unavailable=unavailable,
        imported_from=sorted({f"{f.imported[0]} ({f.imported[1]})" for f in facts if f.imported}),
        imported_run=read_imported(run_dir),
    )


def _accuracy_fields(facts: list[QueryFacts], seed: int) -> dict[str, Any]:
    """Accuracy (of all queries, of those judged, of the completed ones) and the calibration
    error under both conventions, with the queries each covers."""
    judged = [f for f in facts if f.verdict == "judged"]
    right = [bool(f.correct) for f in judged]
    scored = [1.0 if f.verdict == "judged" and f.correct else 0.0 for f in facts]
    # piserini: completed queries with a verdict, as Pi-Serini's evaluator (timeouts and
    # failures count as wrong in accuracy but stay out of calibration).
    calibrated = [f for f in judged if f.status == "completed"]
    bcp = _browsecomp_plus_calibrated(judged)
    calibration = {
        "piserini": calibration_error(
            [f.agent_confidence for f in calibrated], [bool(f.correct) for f in calibrated]
        ),
        "browsecomp-plus": calibration_error(
            [c for c, _ in bcp], [r for _, r in bcp], "browsecomp-plus"
        ),
    }
    assert set(calibration) == set(CONVENTIONS)
    return {
        "accuracy": _estimate(scored, seed),
        "accuracy_judged": _estimate([1.0 if c else 0.0 for c in right], seed)
        if len(judged) < len(facts)
        else None,
        "accuracy_final": len(judged) == len(facts),
        "pending_verdicts": len(facts) - len(judged),
        "accuracy_completed": _estimate(
            [x for x, f in zip(scored, facts, strict=True) if f.status == "completed"], seed
        ),
        "calibration_queries": len(calibrated),
        "calibration_queries_browsecomp_plus": len(bcp),
        "calibration_error": calibration,
    }


def _recall_fields(
    facts: list[QueryFacts], unavailable: dict[str, str], seed: int
) -> dict[str, Any]:
    """Recall of each document set (evidence and gold) and the surfaced depth curve; n/a
    where the run's format does not record them."""
    kinds = ("evidence", "gold")
    recall = {
        name: {
            kind: RecallFigures(macro=_NONE, micro=_NONE)
            if f"recall.{name}" in unavailable
            else _recall([f.recall[name][kind] for f in facts], seed)
            for kind in kinds
        }
        for name in DOC_SETS
    }
    depth = {
        kind: {
            k: None
            if "depth_curve" in unavailable
            else _recall([f.depth[kind][k] for f in facts], seed).macro.value
            for k in DEPTHS
        }
        for kind in kinds
    }
    return {"recall": recall, "depth_curve": depth}


def _usage_fields(
    config: RunConfig,
    facts: list[QueryFacts],
    judgements: dict[str, Judgement],
    pricing: PricingTable,
    served: Sequence[ServedTime],
    unavailable: dict[str, str],
) -> dict[str, Any]:
    """Tool calls, tokens and cost (the run's, served hours included, and its judge's), and
    where each model's prices came from."""
    n = max(1, len(facts))
    tools: Counter[str] = Counter()
    for f in facts:
        tools.update(f.tool_calls)
    total = sum((f.usage for f in facts), Usage())
    # Usage a format does not report is unknown, not zero: no tokens, no cost.
    usage = "tokens" not in unavailable
    price = pricing.model_price(config.model) if usage else None
    judge_price = pricing.model_price(config.judge_model())
    judge_usage = sum((j.usage for j in judgements.values()), Usage())
    hours = served_cost([s for s in served if s.role == "agent"])
    served_usd = hours.cost_usd if hours is not None else 0.0
    judge_hours = served_cost([s for s in served if s.role == "judge"])
    tokens_cost = sum(price.cost(f.usage) for f in facts) if price else None
    return {
        "tool_calls_per_query": {k: round(v / n, 3) for k, v in sorted(tools.items())}
        | {"total": round(sum(tools.values()) / n, 3)},
        "tokens_total": total if usage else None,
        "tokens_median_per_query": statistics.median(
            [f.usage.input_tokens + f.usage.output_tokens for f in facts] or [0]
        )
        if usage
        else None,
        "cached_token_ratio": round(total.cached_tokens / max(1, total.input_tokens), 4)
        if usage
        else None,
        "cost_usd": None if tokens_cost is None else round(tokens_cost + served_usd, 4),
        "served": hours,
        "cost_estimated_usd": round(sum(price.estimated_cost(f.usage) for f in facts), 4)
        if price
        else None,
        "calls_usage_estimated": sum(f.calls_usage_estimated for f in facts),
        "calls_without_usage": sum(f.calls_without_usage for f in facts),
        # A served judge's tokens are free (its price is zero): its hours are its cost.
        "judge_cost_usd": round(
            judge_price.cost(judge_usage) + (judge_hours.cost_usd if judge_hours else 0.0), 4
        )
        if judge_price
        else None,
        "judge_served": judge_hours,
        "pricing_source": {
            m.name: served_source(m) if m.serve else pricing.source(m.name, m.service_tier)
            for m in (config.model, config.judge_model())
        },
    }
