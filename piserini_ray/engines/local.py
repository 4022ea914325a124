"""The local engine: a benchmark slice in this process (asyncio, no Ray), for `--engine local`,
`ask` and rehearsing a run on one machine.

Each finished query is written to the run store at once (`PreparedRun.complete`, as on Ray);
running the same command again skips every query that has a record, so an interrupted run
resumes without losing or repeating one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from piserini_ray.agent.loop import run_query
from piserini_ray.config import ModelConfig, RunConfig
from piserini_ray.data import Query
from piserini_ray.endpoints import ModelEndpoints
from piserini_ray.engines.contract import Log, PreparedRun, charge_served, in_turn
from piserini_ray.errors import ProviderRefused
from piserini_ray.judging.grader import judge_one, judge_records
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
    model: ModelConfig,
    config: RunConfig,
    endpoints: ModelEndpoints,
    seed: int | None = None,
    judging: RunStore | None = None,
) -> LLMClient:
    """A client for one of a run's models in this process: its endpoint, and this process's
    limiter for its quota key (the one `ask`, the judge and the local engine share); `seed`:
    the `seed` request parameter (the agent's, in an epoch after the first); `judging`: the
    run `model` judges (`ModelEndpoints.api_base`)."""
    return build_client(
        model,
        config.retry,
        config.offline,
        api_base=endpoints.api_base(model, config.offline, judging),
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


@dataclass
class _Plan:
    """One run's part in this process: its searcher, its agent client, how many of its
    queries run at once, and its judge's client when it judges each answer as it comes."""

    run: PreparedRun
    searcher: SearchBackend
    client: LLMClient
    at_once: int
    judge: LLMClient | None = None


async def _run_all(plans: list[_Plan]) -> None:
    """The plans' queries, each run `at_once` at a time: run after run, or side by side in
    their shared order when they are compared as they go (`engines.contract.in_turn`)."""
    runs = [plan.run for plan in plans]
    by_run = {id(plan.run): plan for plan in plans}
    progress = Progress(sum(len(run.todo) for run in runs))
    gates = {id(plan.run): asyncio.Semaphore(plan.at_once) for plan in plans}
    running = {id(run): 0 for run in runs}
    stops = {id(run): asyncio.Event() for run in runs}  # set once a run is stopped
    verdicts: set[asyncio.Task[None]] = set()
    judging = {id(run): asyncio.Semaphore(run.config.judge.concurrency) for run in runs}

    async def watch_stop() -> None:
        while not all(stops[id(run)].is_set() for run in runs):
            for run in runs:
                if run.stop_requested:
                    stops[id(run)].set()
            await asyncio.sleep(STOP_POLL_SECONDS)

    def show(run: PreparedRun) -> None:
        progress.running = sum(running.values())
        run.show_live(running=running[id(run)])

    async def one(run: PreparedRun, query: Query) -> None:
        plan = by_run[id(run)]
        config, store = run.config, run.store
        async with gates[id(run)]:
            if not run.may_start(running[id(run)]):
                return
            running[id(run)] += 1
            show(run)
            session = ToolSession(plan.searcher, config.tools)  # the store writes its spills
            try:
                record = await run_query(
                    query,
                    session,
                    plan.client,
                    config.agent,
                    tool_schemas(config.tools),
                    run_id=store.run_id,
                    config_hash=store.config_hash,
                    stop=stops[id(run)],
                )
            except ProviderRefused as refused:  # every query would fail alike: none more
                run.refused(str(refused))
                return
            finally:
                running[id(run)] -= 1
                show(run)
            run.complete(record, progress)
            progress.show()
        if plan.judge is not None:  # off the run's gate: the next query starts meanwhile
            verdict = _judge_now(plan, plan.judge, judging[id(run)], query, record)
            task = asyncio.ensure_future(verdict)
            verdicts.add(task)
            task.add_done_callback(verdicts.discard)

    for run in runs:
        run.show_live(replicas={"local": 1})
    watcher = asyncio.ensure_future(watch_stop())
    try:
        await asyncio.gather(*(one(run, query) for run, query in in_turn(runs)))
        await asyncio.gather(*verdicts)
    finally:
        watcher.cancel()
        for plan in plans:
            if isinstance(plan.client.batcher, TurnBatcher):
                await plan.client.batcher.close()
    progress.close()


async def _judge_now(
    plan: _Plan, judge: LLMClient, gate: asyncio.Semaphore, query: Query, record: QueryRecord
) -> None:
    """Judge one answer as it comes, `judge.concurrency` at once (what fails here, the
    judging after the run does, and says why)."""
    config = plan.run.config
    try:
        async with gate:
            verdict = await judge_one(
                judge, query, record, config.judge.max_parse_retries, config.judge.template
            )
    except Exception:
        return
    plan.run.store.append_judgement(verdict)


class LocalEngine:
    """The in-process engine: one searcher and asyncio agent loops, `concurrency` at once."""

    checks_agent_models = False  # `prepare` checks them: this process is where they are called

    def __init__(self, concurrency: int = 4) -> None:
        self.concurrency = concurrency
        self.endpoints = ModelEndpoints()

    def start(self, configs: list[RunConfig], log: Log) -> None:
        pass  # nothing to bring up: the searcher opens in `run`

    def run(self, runs: list[PreparedRun], log: Log) -> None:
        began = time.time()  # a served model's server starts with the plans: it counts
        plans = [self._plan(run, log) for run in runs if run.todo]
        together = any(plan.run.decisions is not None for plan in plans)
        for batch in [plans] if together else [[plan] for plan in plans]:
            try:
                asyncio.run(_run_all(batch))
            finally:
                ended = time.time()
                charge_served([plan.run for plan in batch], ended - began)
                began = ended
        for plan in plans:
            if plan.run.stop_reason():
                log(f"{plan.run.run_dir} stopped: {plan.run.stop_reason()}")

    def _plan(self, run: PreparedRun, log: Log) -> _Plan:
        config = run.config
        client = local_client(config.model, config, self.endpoints, config.run.request_seed())
        at_once = self.concurrency
        if config.model.service_tier == "batch":
            # Every turn waits for its batch: the more queries in a round, the fewer rounds.
            client.batcher = turn_batcher(run, client, log)
            at_once = config.runtime.batch.queries_at_once
        judge = None
        if run.decisions is not None and config.judge_model().service_tier != "batch":
            judge = local_client(config.judge_model(), config, self.endpoints, judging=run.store)
        return _Plan(run, open_backend(run.index, config.retrieval), client, at_once, judge)

    def judge(
        self,
        config: RunConfig,
        store: RunStore,
        records: list[QueryRecord],
        queries: dict[str, Query],
        log: Log,
    ) -> None:
        client = local_client(config.judge_model(), config, self.endpoints, judging=store)
        asyncio.run(judge_records(config, store, records, queries, client, log))

    def close(self) -> None:
        self.endpoints.close()
