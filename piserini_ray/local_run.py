"""Run a benchmark slice in this process (asyncio, no Ray): the engine of `piserini-ray run`
until the Ray runtime lands, and the way to rehearse a run on one machine.

Each finished query is written to the run store at once; running the same command again skips
every query that has a record, so an interrupted run resumes without losing or repeating one.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel

from piserini_ray.agent.loop import run_query
from piserini_ray.config import ModelConfig, RunConfig
from piserini_ray.data import Query
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.limiter import LOCAL_LIMITERS
from piserini_ray.pipeline import prepare
from piserini_ray.records import QueryRecord
from piserini_ray.retrieval import BM25Searcher, open_searcher
from piserini_ray.store import RunStore
from piserini_ray.tools import ToolSession, tool_schemas


class RunSummary(BaseModel):
    run_dir: str
    config_hash: str
    model: str
    queries: int
    ran_now: int
    statuses: dict[str, int]
    tool_calls_per_query: dict[str, float]
    tokens_total: dict[str, int]
    tokens_median_per_query: float
    cached_token_ratio: float
    #: USD from the pricing table; None when the model is not in it.
    cost_usd: float | None
    #: Model calls whose reply had no usage block (cost is then a lower bound).
    calls_without_usage: int = 0


@contextmanager
def endpoint_for(model: ModelConfig, config: RunConfig) -> Iterator[str | None]:
    """The API base for a model: the offline provider on loopback for an offline model without
    an explicit `api_base` (started here with the run's offline settings, stopped on exit)."""
    if model.is_offline and model.api_base is None:
        from piserini_ray.offline import OfflineProvider

        with OfflineProvider(config.offline) as provider:
            yield provider.base_url
    else:
        yield model.api_base


def model_endpoint(config: RunConfig) -> contextlib.AbstractContextManager[str | None]:
    return endpoint_for(config.model, config)


async def _run_all(
    config: RunConfig,
    queries: list[Query],
    store: RunStore,
    searcher: BM25Searcher,
    api_base: str | None,
    concurrency: int,
    log: Callable[[str], None],
) -> int:
    limiter = LOCAL_LIMITERS.limiter(config.model, config.offline)
    client = LLMClient(config.model, config.retry, api_base=api_base, limiter=limiter)
    schemas = tool_schemas(config.tools)
    gate = asyncio.Semaphore(concurrency)
    counts: Counter[str] = Counter()
    total = len(queries)

    async def one(query: Query) -> None:
        async with gate:
            session = ToolSession(searcher, config.tools)  # the store writes its spill files
            record = await run_query(
                query,
                session,
                client,
                config.agent,
                schemas,
                run_id=store.run_id,
                config_hash=store.config_hash,
            )
            store.append(record)
            counts[record.status] += 1
            calls = sum(record.tool_call_counts.values())
            log(
                f"[{sum(counts.values())}/{total}] {query.query_id}: {record.status} "
                f"({calls} tool calls, {record.usage.input_tokens + record.usage.output_tokens} "
                f"tokens, {record.charged_seconds:.1f} s) | "
                + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            )

    await asyncio.gather(*(one(q) for q in queries))
    return total


def summarize(records: list[QueryRecord], config: RunConfig, run_dir: Path, ran: int) -> RunSummary:
    from piserini_ray.metrics.cost import pricing_for

    price = pricing_for(config).price(config.model.name)
    n = max(1, len(records))
    tools: Counter[str] = Counter()
    for record in records:
        tools.update(record.tool_call_counts)
    totals: Counter[str] = Counter()
    for record in records:
        totals.update(record.usage.model_dump())
    per_query = [r.usage.input_tokens + r.usage.output_tokens for r in records] or [0]
    return RunSummary(
        run_dir=str(run_dir),
        config_hash=config.config_hash(),
        model=config.model.name,
        queries=len(records),
        ran_now=ran,
        statuses=dict(Counter(r.status for r in records)),
        tool_calls_per_query={k: round(v / n, 2) for k, v in sorted(tools.items())}
        | {"total": round(sum(tools.values()) / n, 2)},
        tokens_total=dict(totals),
        tokens_median_per_query=statistics.median(per_query),
        cached_token_ratio=round(totals["cached_tokens"] / max(1, totals["input_tokens"]), 4),
        cost_usd=round(sum(price.cost(r.usage) for r in records), 4) if price else None,
        calls_without_usage=sum(r.calls_without_usage for r in records),
    )


def run_local(
    config: RunConfig,
    run_dir: Path | None = None,
    concurrency: int = 4,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> RunSummary:
    """Run (or resume) the configured slice; return the summary of every record in the slice."""
    with contextlib.ExitStack() as stack:
        (run,) = prepare([(config, run_dir)], log, stack)
        if run.todo:
            searcher = open_searcher(run.index, config.retrieval)
            with model_endpoint(config) as api_base:
                run.ran = asyncio.run(
                    _run_all(config, run.todo, run.store, searcher, api_base, concurrency, log)
                )
        records = [r for r in run.store.records() if r.query_id in run.wanted]
    return summarize(records, config, run.run_dir, run.ran)
