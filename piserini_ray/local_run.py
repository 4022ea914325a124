"""The local engine: a benchmark slice in this process (asyncio, no Ray), for `--engine local`,
`ask` and rehearsing a run on one machine.

Each finished query is written to the run store at once; running the same command again skips
every query that has a record, so an interrupted run resumes without losing or repeating one.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from piserini_ray.agent.loop import run_query
from piserini_ray.config import ModelConfig, RunConfig
from piserini_ray.data import Query
from piserini_ray.errors import ProviderRefused
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.limiter import LOCAL_LIMITERS
from piserini_ray.pipeline import Log, PreparedRun, RunSummary, execute
from piserini_ray.retrieval.backends import SearchBackend, open_backend
from piserini_ray.tools import ToolSession, tool_schemas


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
    run: PreparedRun,
    searcher: SearchBackend,
    api_base: str | None,
    concurrency: int,
    log: Callable[[str], None],
) -> int:
    config, queries, store = run.config, run.todo, run.store
    limiter = LOCAL_LIMITERS.limiter(config.model, config.offline)
    client = LLMClient(config.model, config.retry, api_base=api_base, limiter=limiter)
    schemas = tool_schemas(config.tools)
    gate = asyncio.Semaphore(concurrency)
    counts: Counter[str] = Counter()
    total = len(queries)
    running = 0

    async def one(query: Query) -> None:
        nonlocal running
        async with gate:
            if not run.guard.may_start(running):
                return
            running += 1
            session = ToolSession(searcher, config.tools)  # the store writes its spill files
            try:
                record = await run_query(
                    query,
                    session,
                    client,
                    config.agent,
                    schemas,
                    run_id=store.run_id,
                    config_hash=store.config_hash,
                )
            except ProviderRefused as refused:  # every query would fail alike: none more
                run.guard.halt(str(refused))
                return
            finally:
                running -= 1
            store.append(record)
            run.guard.finished(record.usage)
            counts[record.status] += 1
            calls = sum(record.tool_call_counts.values())
            log(
                f"[{sum(counts.values())}/{total}] {query.query_id}: {record.status} "
                f"({calls} tool calls, {record.usage.input_tokens + record.usage.output_tokens} "
                f"tokens, {record.charged_seconds:.1f} s) | "
                + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            )

    await asyncio.gather(*(one(q) for q in queries))
    if run.guard.stop_reason():
        log(f"stopped: {run.guard.stop_reason()}")
    return sum(counts.values())


class LocalEngine:
    """The in-process engine: one searcher and asyncio agent loops, `concurrency` at once."""

    def __init__(self, concurrency: int = 4) -> None:
        self.concurrency = concurrency

    def start(self, configs: list[RunConfig], log: Log) -> None:
        pass  # nothing to bring up: the searcher opens in `run`

    def close(self) -> None:
        pass

    def run(self, runs: list[PreparedRun], log: Log) -> None:
        for run in runs:
            if not run.todo:
                continue
            searcher = open_backend(run.index, run.config.retrieval)
            with model_endpoint(run.config) as api_base:
                run.ran = asyncio.run(_run_all(run, searcher, api_base, self.concurrency, log))


def run_local(
    config: RunConfig,
    run_dir: Path | None = None,
    concurrency: int = 4,
    log: Log = lambda m: print(m, file=sys.stderr, flush=True),
    only: set[str] | None = None,
) -> RunSummary:
    """Run (or resume) the configured slice in this process (`only`: just those queries of
    it); its summary."""
    return execute([(config, run_dir)], LocalEngine(concurrency), log, only)[0]
