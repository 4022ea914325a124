"""The local engine: a benchmark slice in this process (asyncio, no Ray), for `--engine local`,
`ask` and rehearsing a run on one machine.

Each finished query is written to the run store at once (`PreparedRun.complete`, as on Ray);
running the same command again skips every query that has a record, so an interrupted run
resumes without losing or repeating one.
"""

from __future__ import annotations

import asyncio

from piserini_ray.agent.loop import run_query
from piserini_ray.config import ModelConfig, RunConfig
from piserini_ray.data import Query
from piserini_ray.endpoints import ModelEndpoints
from piserini_ray.engine_contract import Log, PreparedRun
from piserini_ray.errors import ProviderRefused
from piserini_ray.judge import judge_records
from piserini_ray.llm.batcher import TurnBatcher
from piserini_ray.llm.batches import batches_for
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.client_builder import build_client
from piserini_ray.llm.limiter import LOCAL_LIMITERS
from piserini_ray.progress import Progress
from piserini_ray.records import QueryRecord
from piserini_ray.retrieval.backends import SearchBackend, open_backend
from piserini_ray.store import RunStore, TurnLedger
from piserini_ray.tools import ToolSession, tool_schemas

#: How often a local run looks at its stop flag (the status board raises it).
STOP_POLL_SECONDS = 0.2


def local_client(
    model: ModelConfig, config: RunConfig, endpoints: ModelEndpoints, seed: int | None = None
) -> LLMClient:
    """A client for one of a run's models in this process: its endpoint, and this process's
    limiter for its quota key (the one `ask`, the judge and the local engine share); `seed`:
    the `seed` request parameter (the agent's, in an epoch after the first)."""
    return build_client(
        model,
        config.retry,
        config.offline,
        api_base=endpoints.api_base(model, config.offline),
        limiters=LOCAL_LIMITERS,
        seed=seed,
    )


def turn_batcher(run: PreparedRun, client: LLMClient, log: Log) -> TurnBatcher:
    """The run's batcher of agent turns, its ledger in the run directory (`agent_batches.jsonl`,
    so a killed driver polls the batches it sent and reuses the turns it paid for)."""
    settings = run.config.runtime.batch
    return TurnBatcher(
        batches_for(
            client.provider,
            client.api_base,
            client.api_key(),
            cache=client.model.prompt_caching == "auto",
        ),
        TurnLedger(run.run_dir / "agent_batches.jsonl", log),
        gather_seconds=settings.gather_seconds,
        poll_seconds=settings.poll_seconds,
        max_rounds=run.config.retry.max_attempts,
        log=log,
    )


async def _run_all(
    run: PreparedRun, searcher: SearchBackend, client: LLMClient, concurrency: int
) -> None:
    config, store = run.config, run.store
    schemas = tool_schemas(config.tools)
    gate = asyncio.Semaphore(concurrency)
    progress = Progress(len(run.todo))
    running = 0
    stop = asyncio.Event()  # set once the run is stopped: its queries in flight end

    async def watch_stop() -> None:
        while not run.stop_requested:
            await asyncio.sleep(STOP_POLL_SECONDS)
        stop.set()

    def show() -> None:
        progress.running = running
        run.show_live(running=running)

    async def one(query: Query) -> None:
        nonlocal running
        async with gate:
            if not run.may_start(running):
                return
            running += 1
            show()
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
                    stop=stop,
                )
            except ProviderRefused as refused:  # every query would fail alike: none more
                run.refused(str(refused))
                return
            finally:
                running -= 1
                show()
            run.complete(record, progress)
            progress.show()

    run.show_live(replicas={"local": 1})
    watcher = asyncio.ensure_future(watch_stop())
    try:
        await asyncio.gather(*(one(q) for q in run.todo))
    finally:
        watcher.cancel()
        if isinstance(client.batcher, TurnBatcher):
            await client.batcher.close()
    progress.close()


class LocalEngine:
    """The in-process engine: one searcher and asyncio agent loops, `concurrency` at once."""

    checks_agent_models = False  # `prepare` checks them: this process is where they are called

    def __init__(self, concurrency: int = 4) -> None:
        self.concurrency = concurrency
        self.endpoints = ModelEndpoints()

    def start(self, configs: list[RunConfig], log: Log) -> None:
        pass  # nothing to bring up: the searcher opens in `run`

    def run(self, runs: list[PreparedRun], log: Log) -> None:
        for run in runs:
            if not run.todo:
                continue
            searcher = open_backend(run.index, run.config.retrieval)
            client = local_client(
                run.config.model, run.config, self.endpoints, run.config.run.request_seed()
            )
            at_once = self.concurrency
            if run.config.model.service_tier == "batch":
                # Every turn waits for its batch: the more queries in a round, the fewer rounds.
                client.batcher = turn_batcher(run, client, log)
                at_once = run.config.runtime.batch.queries_at_once
            asyncio.run(_run_all(run, searcher, client, at_once))
            if run.stop_reason():
                log(f"stopped: {run.stop_reason()}")

    def judge(
        self,
        config: RunConfig,
        store: RunStore,
        records: list[QueryRecord],
        queries: dict[str, Query],
        log: Log,
    ) -> None:
        client = local_client(config.judge_model(), config, self.endpoints)
        asyncio.run(judge_records(config, store, records, queries, client, log))

    def close(self) -> None:
        self.endpoints.close()
