"""Judging and reducing on Ray: judge tasks under the judge model's cluster-wide limiter, and
the metrics' map step over chunks of records, combined by the driver."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import ray

from piserini_ray.config import RunConfig
from piserini_ray.data import Query, load_benchmark
from piserini_ray.judge import judge_one
from piserini_ray.llm.client import LLMClient
from piserini_ray.report.metrics import QueryFacts, facts_for
from piserini_ray.runtime.limiter_actor import RemoteLimiter, start_limiter
from piserini_ray.store import Judgement, QueryRecord, RankingLog, RunStore

CHUNK = 50


@ray.remote(num_cpus=0)  # judging waits on HTTP
def _judge_chunk(
    config: RunConfig,
    records: list[QueryRecord],
    queries: dict[str, Query],
    api_base: str | None,
    limiter_name: str,
) -> list[Judgement]:
    model = config.judge_model()
    limiter = RemoteLimiter(ray.get_actor(limiter_name))
    client = LLMClient(model, config.retry, api_base=api_base or model.api_base, limiter=limiter)

    async def run_all() -> list[Judgement]:
        gate = asyncio.Semaphore(config.judge.concurrency)

        async def one(record: QueryRecord) -> Judgement:
            async with gate:
                return await judge_one(
                    client, queries[record.query_id], record, config.judge.max_parse_retries
                )

        return list(await asyncio.gather(*(one(r) for r in records)))

    return asyncio.run(run_all())


def judge_on_ray(
    config: RunConfig,
    store: RunStore,
    records: list[QueryRecord],
    queries: dict[str, Query],
    api_base: str | None,
    log: Callable[[str], None],
) -> dict[str, Judgement]:
    """Judge what has no verdict yet, a chunk per Ray task; verdicts are written as they come."""
    model = config.judge_model()
    done = store.judgements(model.name)
    todo = [r for r in records if r.query_id not in done]
    if not todo:
        return done
    log(f"judging {len(todo)} answers with {model.name} on Ray ({len(done)} judged before)")
    name = f"piserini-judge-limiter:{ray.get_runtime_context().get_job_id()}:{model.name}"
    limiter = start_limiter(name, model.rate_limit)
    try:
        pending = [
            _judge_chunk.remote(
                config,
                todo[i : i + CHUNK],
                {r.query_id: queries[r.query_id] for r in todo[i : i + CHUNK]},
                api_base,
                name,
            )
            for i in range(0, len(todo), CHUNK)
        ]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for judgement in ray.get(ready[0]):
                store.append_judgement(judgement)
                done[judgement.query_id] = judgement
    finally:
        ray.kill(limiter)
    return done


@ray.remote(num_cpus=0.25)
def _facts_chunk(
    config: RunConfig,
    records: list[QueryRecord],
    rankings: dict[str, list[RankingLog]],
    judgements: dict[str, Judgement],
) -> list[QueryFacts]:
    return facts_for(records, load_benchmark(config.benchmark), rankings, judgements)


def facts_on_ray(
    config: RunConfig,
    records: list[QueryRecord],
    rankings: dict[str, list[RankingLog]],
    judgements: dict[str, Judgement],
) -> list[QueryFacts]:
    """The metrics' map step as Ray tasks over chunks of records."""
    refs: list[Any] = []
    for i in range(0, len(records), CHUNK):
        chunk = records[i : i + CHUNK]
        ids = {r.query_id for r in chunk}
        refs.append(
            _facts_chunk.remote(
                config,
                chunk,
                {q: v for q, v in rankings.items() if q in ids},
                {q: v for q, v in judgements.items() if q in ids},
            )
        )
    return [fact for chunk in ray.get(refs) for fact in chunk]
