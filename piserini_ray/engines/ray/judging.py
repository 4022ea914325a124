"""Judging on Ray: in the driver, under the judge's cluster-wide limiter actor. (The metrics'
map step runs in the driver too, streaming the run's records: see `pipeline.finish`.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from piserini_ray.config import RunConfig
from piserini_ray.data import Query
from piserini_ray.engines.ray.driver_services import RayLimiters
from piserini_ray.judging.grader import judge_records
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.client_builder import build_client
from piserini_ray.records import Judgement, QueryRecord
from piserini_ray.store import RunStore


def judge_on_ray(
    config: RunConfig,
    store: RunStore,
    records: list[QueryRecord],
    queries: dict[str, Query],
    api_base: str | None,
    log: Callable[[str], None],
) -> dict[str, Judgement]:
    """Judge what has no verdict yet, from the driver, under the judge's cluster-wide limiter
    (so runs and other judges on the cluster share its quota). Judging waits on HTTP: one
    asyncio loop holds `judge.concurrency` calls at once, and Ray tasks would only add worker
    start-up (bench/engines.py). Each verdict is written as it arrives."""
    client = judge_client(config, api_base)
    return asyncio.run(judge_records(config, store, records, queries, client, log))


def judge_client(config: RunConfig, api_base: str | None) -> LLMClient:
    """The client of `config`'s judge on Ray: under the judge's cluster-wide limiter (the
    run's, or a new one), at `api_base`."""
    return build_client(
        config.judge_model(),
        config.retry,
        config.offline,
        api_base=api_base,
        limiters=RayLimiters(start=True),
    )
