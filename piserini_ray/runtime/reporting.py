"""Judging and reducing on Ray: judge tasks under the judge model's cluster-wide limiter, and
the metrics' map step over chunks of records, combined by the driver."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import ray

from piserini_ray.config import RunConfig
from piserini_ray.data import Query, load_benchmark
from piserini_ray.judge import judge_client, judge_many, to_judge
from piserini_ray.records import Judgement, QueryRecord, RankingLog
from piserini_ray.report.metrics import QueryFacts, facts_for
from piserini_ray.runtime.limiter_actor import (
    RemoteLimiter,
    job_limiter_prefix,
    limiter_name,
    start_limiter,
)
from piserini_ray.store import RunStore

CHUNK = 50


@ray.remote(num_cpus=0, num_returns="streaming")  # judging waits on HTTP
def _judge_chunk(
    config: RunConfig,
    items: list[tuple[Query, QueryRecord]],
    api_base: str | None,
    limiter_name: str,
) -> Iterator[Judgement]:
    """Yields each verdict as it comes, so the driver writes it at once (a crash loses none)."""
    client = judge_client(config, api_base, RemoteLimiter(ray.get_actor(limiter_name)))
    loop = asyncio.new_event_loop()
    verdicts = judge_many(client, items, config.judge.max_parse_retries, config.judge.concurrency)
    try:
        while True:
            try:
                yield loop.run_until_complete(anext(verdicts))
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(verdicts.aclose())
        loop.close()


def judge_on_ray(
    config: RunConfig,
    store: RunStore,
    records: list[QueryRecord],
    queries: dict[str, Query],
    api_base: str | None,
    log: Callable[[str], None],
) -> dict[str, Judgement]:
    """Judge what has no verdict yet in Ray tasks of `CHUNK` answers; every verdict is written
    by the driver as soon as its task yields it."""
    model = config.judge_model()
    done = store.judgements(model.name)
    todo = to_judge(records, done)
    if not todo:
        return done
    log(f"judging {len(todo)} answers with {model.name} on Ray ({len(done)} judged before)")
    name = limiter_name(job_limiter_prefix(), model, config.offline)
    limiter = start_limiter(name, model.rate_limit)
    try:
        streams: list[Any] = [  # ObjectRefGenerators
            _judge_chunk.remote(
                config,
                [(queries[r.query_id], r) for r in todo[i : i + CHUNK]],
                api_base,
                name,
            )
            for i in range(0, len(todo), CHUNK)
        ]
        while streams:
            ready, _ = ray.wait(streams, num_returns=1)
            stream: Any = ready[0]
            try:
                judgement: Judgement = ray.get(next(stream))
            except StopIteration:
                streams.remove(stream)
                continue
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
