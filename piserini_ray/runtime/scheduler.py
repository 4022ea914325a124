"""The driver: fan a run's queries (or a sweep's runs) out to searcher replicas on Ray.

- **Backpressure**: at most `replicas x max_concurrency` queries in flight per replica group;
  the rest wait in the driver's queue, so a 100K-query run costs no object-store memory.
- **Recorded once**: the driver is the only writer; each finished record goes to its run store
  as it arrives (`ray.wait`), and the store refuses a second record for a query.
- **Infrastructure is not the query's fault**: a query whose actor or node died is re-submitted
  (Ray restarts the actor, up to `max_restarts`) and only after `max_infrastructure_attempts`
  is it recorded as failed. A query's own `failed` / `timeout` is its result.
- **Ctrl-C**: in-flight queries are abandoned (nothing half-written: records are whole lines),
  and the next run or `resume` re-runs exactly them.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import ray
from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    RayActorError,
    RayTaskError,
    WorkerCrashedError,
)

from piserini_ray.config import RunConfig
from piserini_ray.data import Query, load_benchmark
from piserini_ray.errors import PiseriniRayError
from piserini_ray.llm.usage import Usage
from piserini_ray.metrics.cost import PricingTable, pricing_for
from piserini_ray.preflight import preflight
from piserini_ray.retrieval import ensure_index
from piserini_ray.runtime.limiter_actor import start_limiter
from piserini_ray.runtime.progress import Progress
from piserini_ray.runtime.ray_env import JVM_SAFE_ENV, start_ray
from piserini_ray.runtime.worker import QueryJob, SearchWorker
from piserini_ray.store import QueryRecord, RunStore, now_iso

_INFRASTRUCTURE = (ActorDiedError, ActorUnavailableError, RayActorError, WorkerCrashedError)


class SchedulerError(PiseriniRayError):
    """The cluster cannot run the remaining queries."""


@dataclass
class RunPlan:
    config: RunConfig
    run_dir: Path
    store: RunStore | None = None
    todo: list[Query] = field(default_factory=list)
    wanted: set[str] = field(default_factory=set)  # the slice's query ids
    api_base: str | None = None
    ran: int = 0  # records written by this execution
    pricing: PricingTable | None = None


@dataclass
class _Group:
    """Replicas that share a benchmark and retrieval settings (shared across a sweep's runs)."""

    actors: list[Any]
    capacity: int
    load: dict[int, int] = field(default_factory=dict)
    #: Replicas being restarted by Ray: a readiness probe each; no new work until it answers.
    restarting: dict[int, Any] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)

    def available(self) -> list[int]:
        return [
            i
            for i in range(len(self.actors))
            if i not in self.restarting
            and i not in self.dead
            and self.load.get(i, 0) < self.capacity
        ]

    def lost(self, index: int) -> None:
        if index not in self.restarting and index not in self.dead:
            self.restarting[index] = self.actors[index].info.remote()


def _group_key(config: RunConfig) -> str:
    return orjson.dumps(
        [config.benchmark.model_dump(mode="json"), config.retrieval.model_dump(mode="json")],
        option=orjson.OPT_SORT_KEYS,
    ).decode()


@contextlib.contextmanager
def _offline_endpoints(plans: list[RunPlan]) -> Iterator[None]:
    """Start one loopback offline provider per distinct offline config that a run needs."""
    from piserini_ray.offline import OfflineProvider

    with contextlib.ExitStack() as stack:
        started: dict[str, str] = {}
        for plan in plans:
            model = plan.config.model
            if not (model.is_offline and model.api_base is None):
                plan.api_base = model.api_base
                continue
            key = plan.config.offline.model_dump_json()
            if key not in started:
                provider = stack.enter_context(OfflineProvider(plan.config.offline))
                started[key] = provider.base_url
            plan.api_base = started[key]
        yield


def run_plans(
    plans: list[RunPlan],
    log: Callable[[str], None],
    pricing: PricingTable | None = None,
) -> list[list[QueryRecord]]:
    """Run every plan to completion (or Ctrl-C); return each run's records of its slice."""
    runtime = plans[0].config.runtime
    for plan in plans:  # every run of a sweep is checked before any starts
        plan.pricing = pricing or pricing_for(plan.config)
        preflight(plan.config, plan.pricing)
    with contextlib.ExitStack() as stack:
        for plan in plans:
            plan.store = stack.enter_context(RunStore(plan.run_dir, plan.config, log=log))
            benchmark = load_benchmark(plan.config.benchmark)
            queries = benchmark.select(**plan.config.slice.model_dump())
            plan.wanted = {q.query_id for q in queries}
            done = plan.store.done()
            plan.todo = [q for q in queries if q.query_id not in done]
            log(
                f"run {plan.run_dir}: {len(queries)} queries, {len(queries) - len(plan.todo)} "
                f"already recorded, {len(plan.todo)} to run with {plan.config.model.name}"
            )
        if any(plan.todo for plan in plans):
            start_ray(runtime, log)
            stack.enter_context(_offline_endpoints(plans))
            _execute([p for p in plans if p.todo], runtime, log)
        return [
            [r for r in plan.store.records() if r.query_id in plan.wanted]
            for plan in plans
            if plan.store is not None
        ]


def _execute(plans: list[RunPlan], runtime: Any, log: Callable[[str], None]) -> None:
    # Named per job, so replicas find them by name (handles in constructor arguments would
    # put those arguments in the object store, which breaks actor restarts).
    prefix = f"piserini-limiter:{ray.get_runtime_context().get_job_id()}:"
    limiters = {}
    for plan in plans:
        name = plan.config.model.name
        if name not in limiters:
            limiters[name] = start_limiter(prefix + name, plan.config.model.rate_limit)
    groups: dict[str, _Group] = {}
    for plan in plans:
        key = _group_key(plan.config)
        if key in groups:
            continue
        strategy = "SPREAD" if runtime.placement == "spread" else "DEFAULT"
        retrieval = plan.config.retrieval.model_copy(
            update={"index_root": plan.config.retrieval.resolved_index_root()}
        )
        # Build (or find) the index here first, with visible progress; replicas on this node
        # then open it at once, and nodes elsewhere build their own under the same lock.
        ensure_index(load_benchmark(plan.config.benchmark).corpus, retrieval, log)
        actors = [
            SearchWorker.options(  # type: ignore[attr-defined]  # Ray types the class as is
                num_cpus=runtime.cpus_per_replica,
                max_concurrency=runtime.max_concurrency + 4,  # + room for info() while busy
                max_restarts=runtime.max_restarts,
                scheduling_strategy=strategy,
                runtime_env={"env_vars": JVM_SAFE_ENV},
            ).remote(plan.config.benchmark, retrieval, prefix)
            for _ in range(runtime.replicas)
        ]
        groups[key] = _Group(actors, capacity=runtime.max_concurrency)
    infos = ray.get([a.info.remote() for g in groups.values() for a in g.actors])
    log(
        f"{len(infos)} searcher replica(s) ready on {len({i['node'] for i in infos})} node(s), "
        f"{runtime.max_concurrency} queries at once each"
    )

    queue: deque[tuple[RunPlan, Query]] = deque((p, q) for p in plans for q in p.todo)
    in_flight: dict[Any, tuple[RunPlan, Query, _Group, int]] = {}
    attempts: dict[tuple[str, str], int] = {}
    progress = Progress(len(queue))

    def submit() -> None:
        deferred = []
        while queue:
            plan, query = queue.popleft()
            group = groups[_group_key(plan.config)]
            free = group.available()
            if not free:
                deferred.append((plan, query))
                continue
            index = min(free, key=lambda i: group.load.get(i, 0))
            assert plan.store is not None
            job = QueryJob(
                run_id=plan.store.run_id,
                config_hash=plan.store.config_hash,
                query=query,
                spill_dir=str(plan.store.spill_dir(query.query_id)),
                model=plan.config.model,
                retry=plan.config.retry,
                agent=plan.config.agent,
                tools=plan.config.tools,
                api_base=plan.api_base,
            )
            ref = group.actors[index].run.remote(job)
            group.load[index] = group.load.get(index, 0) + 1
            in_flight[ref] = (plan, query, group, index)
        queue.extendleft(reversed(deferred))

    def finish(plan: RunPlan, record: QueryRecord) -> None:
        assert plan.store is not None
        plan.store.append(record)
        plan.ran += 1
        assert plan.pricing is not None
        price = plan.pricing.price(record.model)
        progress.record(record.status, record.usage, price.cost(record.usage) if price else None)

    def retry_or_fail(plan: RunPlan, query: Query, exc: BaseException, what: str) -> None:
        key = (str(plan.run_dir), query.query_id)
        attempts[key] = attempts.get(key, 0) + 1
        if attempts[key] >= runtime.max_infrastructure_attempts:
            finish(plan, _infrastructure_failure(plan, query, exc))
        else:
            log(f"{query.query_id}: {what} ({type(exc).__name__}); re-running it")
            queue.appendleft((plan, query))

    try:
        submit()
        while in_flight or queue:
            progress.running = len(in_flight)
            progress.waiting = _waiting(limiters)
            progress.show()
            probes = {ref: (g, i) for g in groups.values() for i, ref in g.restarting.items()}
            if not in_flight and not probes:
                raise SchedulerError(
                    f"every searcher replica died; {len(queue)} queries were not run. Their "
                    "records are missing, nothing else is lost: fix the cluster and resume."
                )
            ready, _ = ray.wait([*in_flight, *probes], num_returns=1, timeout=1.0)
            for ref in ready:
                if ref in probes:
                    group, index = probes[ref]
                    del group.restarting[index]
                    try:
                        ray.get(ref)
                        log(f"replica {index} is back")
                    except _INFRASTRUCTURE:
                        group.dead.add(index)
                        log(f"replica {index} is gone for good (restarts exhausted)")
                    continue
                plan, query, group, index = in_flight.pop(ref)
                group.load[index] -= 1
                try:
                    finish(plan, QueryRecord.model_validate(ray.get(ref)))
                except _INFRASTRUCTURE as exc:
                    group.lost(index)
                    retry_or_fail(plan, query, exc, "replica lost")
                except RayTaskError as exc:  # the replica raised outside the agent loop
                    retry_or_fail(plan, query, exc, "replica error")
            submit()
        progress.close()
    except KeyboardInterrupt:
        progress.close()
        for ref in in_flight:
            ray.cancel(ref)
        log(
            f"interrupted: {len(in_flight)} queries in flight were abandoned and "
            f"{len(queue)} not started; run the same command (or `piserini-ray resume`) to "
            "continue: they run again, nothing else does"
        )
        raise
    finally:
        for group in groups.values():
            for actor in group.actors:
                ray.kill(actor)
        for limiter in limiters.values():
            ray.kill(limiter)


def _waiting(limiters: dict[str, Any]) -> int:
    try:
        return sum(
            s.waiting for s in ray.get([a.stats.remote() for a in limiters.values()], timeout=2)
        )
    except Exception:  # progress must never stop the run
        return 0


def _infrastructure_failure(plan: RunPlan, query: Query, exc: BaseException) -> QueryRecord:
    assert plan.store is not None
    return QueryRecord(
        run_id=plan.store.run_id,
        config_hash=plan.store.config_hash,
        query_id=query.query_id,
        model=plan.config.model.name,
        status="failed",
        termination="infrastructure",
        error=(
            f"infrastructure: the query's replica failed "
            f"{plan.config.runtime.max_infrastructure_attempts} times "
            f"({type(exc).__name__}: {str(exc)[:300]})"
        ),
        usage=Usage(),
        started_at=now_iso(),
        finished_at=now_iso(),
    )
