"""Judging after a Ray run: in the driver, under the judge's cluster-wide limiter actor. (The
metrics' map step runs in the driver too, streaming the run's records: see
`pipeline.finish`.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from piserini_ray.config import RunConfig
from piserini_ray.data import Query
from piserini_ray.judge import judge_records
from piserini_ray.records import Judgement, QueryRecord
from piserini_ray.runtime.limiter_actor import (
    RemoteLimiter,
    job_limiter_prefix,
    limiter_name,
    start_limiter,
)
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
    model = config.judge_model()
    name = limiter_name(job_limiter_prefix(), model, config.offline)
    limiter = RemoteLimiter(start_limiter(name, model.rate_limit))  # the run's, or a new one
    return asyncio.run(judge_records(config, store, records, queries, api_base, log, limiter))
