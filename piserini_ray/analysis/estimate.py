"""What a whole run will cost and take, projected from a pilot of N seeded queries of its slice
(`piserini-ray estimate CONFIG --pilot N`). The pilot runs in the run's own directory, so its
queries are paid for once: the full run resumes after it.

Cost: the pilot's mean cost per query times the slice, with a 95 % bootstrap interval over the
pilot's queries. Makespan: the slowest of three bounds, each from the pilot's per-query means:
the agent loops (queries x mean wall seconds / loops at once), the token quota (tokens /
tokens per minute) and the request quota (model calls / requests per minute).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import BaseModel

from piserini_ray.config import RunConfig
from piserini_ray.metrics.cost import Price
from piserini_ray.metrics.intervals import mean_interval
from piserini_ray.records import QueryRecord


class Projection(BaseModel):
    value: float
    ci95: tuple[float, float] | None


class Estimate(BaseModel):
    pilot_queries: int
    slice_queries: int
    cost_usd: Projection | None  # None: the model is not priced
    tokens: Projection
    model_calls: Projection
    #: Seconds, and which bound sets it: "agent loops", "tokens per minute", "requests per minute".
    makespan_seconds: Projection
    makespan_bound: str
    concurrency: int


def pilot_ids(ids: Sequence[str], n: int, seed: int) -> list[str]:
    """N queries of the slice, drawn with the seed (all of them when N is larger)."""
    return sorted(random.Random(seed).sample(list(ids), min(n, len(ids))))


def _scaled(values: list[float], total: int, seed: int) -> Projection:
    mean = sum(values) / len(values)
    ci = mean_interval(values, seed)
    return Projection(
        value=mean * total, ci95=None if ci is None else (ci[0] * total, ci[1] * total)
    )


def project(
    pilot: Sequence[QueryRecord],
    slice_queries: int,
    config: RunConfig,
    price: Price | None,
    concurrency: int,
) -> Estimate:
    """The whole slice's cost, tokens, calls and makespan from the pilot's records."""
    if not pilot:
        raise ValueError("a projection needs at least one pilot query")
    seed = config.judge.seed
    tokens = [float(r.usage.input_tokens + r.usage.output_tokens) for r in pilot]
    calls = [float(r.turns if r.turns is not None else len(r.trajectory)) for r in pilot]
    walls = [r.wall_seconds for r in pilot]
    total_tokens, total_calls = (_scaled(x, slice_queries, seed) for x in (tokens, calls))
    bounds = {"agent loops": _times(_scaled(walls, slice_queries, seed), 1 / concurrency)}
    quota = config.model.rate_limit
    if quota.tokens_per_minute:
        bounds["tokens per minute"] = _times(total_tokens, 60 / quota.tokens_per_minute)
    if quota.requests_per_minute:
        bounds["requests per minute"] = _times(total_calls, 60 / quota.requests_per_minute)
    bound = max(bounds, key=lambda b: bounds[b].value)
    return Estimate(
        pilot_queries=len(pilot),
        slice_queries=slice_queries,
        cost_usd=None
        if price is None
        else _scaled([price.cost(r.usage) for r in pilot], slice_queries, seed),
        tokens=total_tokens,
        model_calls=total_calls,
        makespan_seconds=bounds[bound],
        makespan_bound=bound,
        concurrency=concurrency,
    )


def _times(p: Projection, factor: float) -> Projection:
    return Projection(
        value=p.value * factor,
        ci95=None if p.ci95 is None else (p.ci95[0] * factor, p.ci95[1] * factor),
    )


def describe(e: Estimate) -> str:
    def span(p: Projection, fmt: str) -> str:
        low, high = p.ci95 if p.ci95 is not None else (None, None)
        interval = "" if low is None else f" [{fmt.format(low)}, {fmt.format(high)}]"
        return fmt.format(p.value) + interval

    cost = "not priced" if e.cost_usd is None else span(e.cost_usd, "${:,.2f}")
    return (
        f"projected from a pilot of {e.pilot_queries} of {e.slice_queries} queries (95 % "
        f"intervals over the pilot's queries):\n"
        f"  cost      {cost}\n"
        f"  tokens    {span(e.tokens, '{:,.0f}')}\n"
        f"  calls     {span(e.model_calls, '{:,.0f}')}\n"
        f"  makespan  {span(e.makespan_seconds, '{:,.0f}')} s, set by the {e.makespan_bound} "
        f"({e.concurrency} agent loops at once)"
    )
