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
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
from piserini_ray.data import Query
from piserini_ray.errors import PiseriniRayError, ProviderRefused
from piserini_ray.llm.secrets import scrub
from piserini_ray.records import QueryRecord, Usage, now_iso
from piserini_ray.runtime.encoders import start_node_encoders
from piserini_ray.runtime.limiter_actor import job_limiter_prefix, limiter_name, start_limiter
from piserini_ray.runtime.progress import Progress
from piserini_ray.runtime.ray_env import cluster_can_grow, jvm_actor_options, start_ray
from piserini_ray.runtime.readiness import check_feasible, wait_until_up
from piserini_ray.runtime.worker import QueryJob, SearchWorker

if TYPE_CHECKING:
    from piserini_ray.pipeline import PreparedRun

_INFRASTRUCTURE = (ActorDiedError, ActorUnavailableError, RayActorError, WorkerCrashedError)
#: How soon a replica that Ray is still restarting is asked again whether it is back.
REPROBE_SECONDS = 0.5
#: How often the progress line asks the limiters how many calls wait (a round trip to each,
#: not one per finished query).
WAITING_EVERY = 1.0


class SchedulerError(PiseriniRayError):
    """The cluster cannot run the remaining queries."""


@dataclass
class _Group:
    """Replicas that share a benchmark and retrieval settings (shared across a sweep's runs)."""

    actors: list[Any]
    capacity: int
    load: dict[int, int] = field(default_factory=dict)
    #: Replicas being restarted by Ray: a readiness probe each; no new work until it answers.
    restarting: dict[int, Any] = field(default_factory=dict)
    #: Replicas whose probe found them still restarting: probed again from the given time.
    reprobe_at: dict[int, float] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)

    def available(self) -> list[int]:
        return [
            i
            for i in range(len(self.actors))
            if i not in self.restarting
            and i not in self.reprobe_at
            and i not in self.dead
            and self.load.get(i, 0) < self.capacity
        ]

    def lost(self, index: int) -> None:
        if index not in self.restarting and index not in self.reprobe_at and index not in self.dead:
            self.restarting[index] = self.actors[index].info.remote()

    def probe_failed(self, index: int, exc: BaseException) -> bool:
        """A readiness probe failed. `ActorUnavailableError` means Ray is still restarting the
        replica: probe again shortly. Anything else means it cannot come back (restarts
        exhausted, node gone): True."""
        if isinstance(exc, ActorUnavailableError):
            self.reprobe_at[index] = time.monotonic() + REPROBE_SECONDS
            return False
        self.dead.add(index)
        return True

    def reprobe_due(self) -> None:
        now = time.monotonic()
        for index, due in list(self.reprobe_at.items()):
            if due <= now:
                del self.reprobe_at[index]
                self.restarting[index] = self.actors[index].info.remote()

    def can_recover(self) -> bool:
        return bool(self.restarting or self.reprobe_at)


def _replica_cpus(configs: list[RunConfig], runtime: Any, log: Callable[[str], None]) -> float:
    """The CPUs each replica reserves. Runs with other benchmark or retrieval settings (a sweep
    over backends or BM25 parameters) each get their own replicas; on a local Ray that has
    fewer CPUs than they reserve, the reservation shrinks so that all of them start (they
    mostly wait on the model) instead of some waiting forever. A cluster is left to its
    autoscaler, with a warning."""
    wanted = len({_group_key(c) for c in configs}) * runtime.replicas
    need = wanted * runtime.cpus_per_replica
    have = float(ray.cluster_resources().get("CPU", 0.0))
    if need <= have or have <= 0:
        return float(runtime.cpus_per_replica)
    if cluster_can_grow():
        log(
            f"warning: {wanted} searcher replicas reserve {need:g} CPUs and the cluster has "
            f"{have:g} now: the rest start when it grows (or lower runtime.cpus_per_replica)"
        )
        return float(runtime.cpus_per_replica)
    fitted = int(have / wanted * 1000) / 1000
    log(
        f"{wanted} searcher replicas on {have:g} CPUs: each reserves {fitted:g} CPU instead of "
        f"{runtime.cpus_per_replica:g} so that all of them start"
    )
    return fitted


def _group_key(config: RunConfig) -> str:
    return orjson.dumps(
        [config.benchmark.model_dump(mode="json"), config.retrieval.model_dump(mode="json")],
        option=orjson.OPT_SORT_KEYS,
    ).decode()


@contextlib.contextmanager
def _offline_endpoints(runs: list[PreparedRun]) -> Iterator[dict[str, str | None]]:
    """Each run's API base (by run directory): one loopback offline provider per distinct
    offline config that a run needs, started here."""
    from piserini_ray.offline import OfflineProvider

    with contextlib.ExitStack() as stack:
        started: dict[str, str] = {}
        bases: dict[str, str | None] = {}
        for run in runs:
            model = run.config.model
            if not (model.is_offline and model.api_base is None):
                bases[str(run.run_dir)] = model.api_base
                continue
            key = run.config.offline.model_dump_json()
            if key not in started:
                provider = stack.enter_context(OfflineProvider(run.config.offline))
                started[key] = provider.base_url
            bases[str(run.run_dir)] = started[key]
        yield bases


class Replicas:
    """What a job keeps up on Ray for its runs: one group of searcher replicas per benchmark and
    retrieval settings (shared by the runs that have them), the query encoders of dense groups
    (their handles held, so they live as long as the job), and a limiter per quota key of the
    runs' models and judges (kept by `start_limiter`)."""

    def __init__(self, configs: list[RunConfig], log: Callable[[str], None]) -> None:
        """`configs`: every run of the job, so that the CPU fit counts all of their groups,
        whether they come up now (`bring_up`) or after `prepare` (`add`)."""
        self.runtime = configs[0].runtime
        self.prefix = job_limiter_prefix()
        self.limiters: dict[str, Any] = {}  # actor name -> handle, of the runs' models
        self.groups: dict[str, _Group] = {}
        self.encoders: list[Any] = []
        self.cpus = _replica_cpus(configs, self.runtime, log)

    def add(self, configs: list[RunConfig], log: Callable[[str], None]) -> None:
        """Start what these runs need and is not up yet (actor creation returns at once;
        `ready` waits). Replicas first: they take the workers Ray pre-started (a second of
        start-up each), the light limiters get new ones."""
        for config in configs:
            key = _group_key(config)
            if key not in self.groups:
                self.groups[key] = self._start_group(config, log)
        for config in configs:
            name = limiter_name(self.prefix, config.model, config.offline)
            if name not in self.limiters:
                self.limiters[name] = start_limiter(name, config.model.rate_limit)
            # The judge's too, so that judging after the run finds it up (`reporting.py`).
            judge = config.judge_model()
            start_limiter(limiter_name(self.prefix, judge, config.offline), judge.rate_limit)

    def _start_group(self, config: RunConfig, log: Callable[[str], None]) -> _Group:
        runtime = self.runtime
        strategy = "SPREAD" if runtime.placement == "spread" else "DEFAULT"
        # The index was built (or found) on this node; replicas here open it at once, and
        # nodes elsewhere build their own under the same lock.
        retrieval = config.retrieval.with_resolved_index_root()
        # Dense backends: one query encoder per node and encoder, shared by the replicas there
        # (of every run that uses it), held here for the whole run.
        encoders = None
        if retrieval.uses_dense:
            encoders, handles = start_node_encoders(retrieval.dense, log)
            self.encoders += handles
            log(f"query encoders ready on {len(encoders)} node(s) for {retrieval.describe()}")
        check_feasible(
            {"CPU": self.cpus},
            "searcher replicas",
            "lower runtime.cpus_per_replica",
            log,
        )
        actors = [
            SearchWorker.options(  # type: ignore[attr-defined]  # Ray types the class as is
                num_cpus=self.cpus,
                max_concurrency=runtime.max_concurrency + 4,  # + room for info() while busy
                max_restarts=runtime.max_restarts,
                scheduling_strategy=strategy,
                **jvm_actor_options(),
            ).remote(config.benchmark, retrieval, encoders)
            for _ in range(runtime.replicas)
        ]
        return _Group(actors, capacity=runtime.max_concurrency)

    def ready(self, log: Callable[[str], None]) -> None:
        """Wait until every replica has opened its index."""
        refs = [a.info.remote() for g in self.groups.values() for a in g.actors]
        infos = wait_until_up(refs, "searcher replicas", log)
        log(
            f"{len(infos)} searcher replica(s) ready on {len({i['node'] for i in infos})} "
            f"node(s), {self.runtime.max_concurrency} queries at once each (pids "
            + ", ".join(str(i["pid"]) for i in infos)
            + ")"
        )

    def close(self) -> None:
        for group in self.groups.values():
            for actor in group.actors:
                ray.kill(actor)
        self.groups.clear()


def bring_up(configs: list[RunConfig], log: Callable[[str], None]) -> Replicas:
    """Start Ray (or wait for its start) and, while the driver still checks the data
    (`prepare`), the replicas of every run whose index is already built. The others come up
    after it: it builds their indexes (and an index that a replica were building would hide its
    corpus errors from `prepare`). A job with a dense run starts none early: `prepare` may
    build a dense index on encoder actors, which must not wait for CPUs held by idle replicas."""
    from piserini_ray.data import load_benchmark
    from piserini_ray.retrieval.index import find_index

    start_ray(configs[0].runtime, log)
    replicas = Replicas(configs, log)
    if any(c.retrieval.uses_dense for c in configs):
        return replicas
    built = [
        config
        for config in configs
        if find_index(
            load_benchmark(config.benchmark).corpus, config.retrieval.resolved_index_root()
        )
    ]
    replicas.add(built, log)
    return replicas


def run_prepared(
    runs: list[PreparedRun],
    log: Callable[[str], None],
    early: Future[Replicas] | None = None,
) -> None:
    """Run every prepared run's todo list to completion (or Ctrl-C) on Ray. `early`: the
    `bring_up` begun before `prepare`."""
    todo = [run for run in runs if run.todo]
    replicas = early.result() if early is not None else None
    try:
        if not todo:
            return
        if replicas is None:
            start_ray(runs[0].config.runtime, log)
            replicas = Replicas([r.config for r in runs], log)
        replicas.add([r.config for r in todo], log)
        replicas.ready(log)
        with _offline_endpoints(todo) as bases:
            _execute(todo, bases, replicas, log)
    finally:
        if replicas is not None:
            replicas.close()


def _execute(
    runs: list[PreparedRun],
    bases: dict[str, str | None],
    replicas: Replicas,
    log: Callable[[str], None],
) -> None:
    runtime = replicas.runtime
    prefix = replicas.prefix
    groups = replicas.groups
    limiters = replicas.limiters
    queue: deque[tuple[PreparedRun, Query]] = deque((r, q) for r in runs for q in r.todo)
    in_flight: dict[Any, tuple[PreparedRun, Query, _Group, int]] = {}
    attempts: dict[tuple[str, str], int] = {}
    progress = Progress(len(queue))

    def submit() -> None:
        deferred = []
        while queue:
            plan, query = queue.popleft()
            if not plan.guard.may_start(sum(1 for p, *_ in in_flight.values() if p is plan)):
                continue  # the cost cap: this query is not started (resume runs it)
            group = groups[_group_key(plan.config)]
            free = group.available()
            if not free:
                deferred.append((plan, query))
                continue
            index = min(free, key=lambda i: group.load.get(i, 0))
            job = QueryJob(
                run_id=plan.store.run_id,
                config_hash=plan.store.config_hash,
                query=query,
                model=plan.config.model,
                retry=plan.config.retry,
                agent=plan.config.agent,
                tools=plan.config.tools,
                api_base=bases[str(plan.run_dir)],
                limiter=limiter_name(prefix, plan.config.model, plan.config.offline),
            )
            ref = group.actors[index].run.remote(job)
            group.load[index] = group.load.get(index, 0) + 1
            in_flight[ref] = (plan, query, group, index)
        queue.extendleft(reversed(deferred))

    def finish(plan: PreparedRun, record: QueryRecord) -> None:
        plan.store.append(record)
        plan.guard.finished(record.usage)
        plan.ran += 1
        price = plan.pricing.price(record.model)
        progress.record(record.status, record.usage, price.cost(record.usage) if price else None)

    def retry_or_fail(plan: PreparedRun, query: Query, exc: BaseException, what: str) -> None:
        key = (str(plan.run_dir), query.query_id)
        attempts[key] = attempts.get(key, 0) + 1
        if attempts[key] >= runtime.max_infrastructure_attempts:
            finish(plan, _infrastructure_failure(plan, query, exc))
        else:
            log(f"{query.query_id}: {what} ({type(exc).__name__}); re-running it")
            queue.appendleft((plan, query))

    asked_limiters = 0.0
    try:
        submit()
        while in_flight or queue:
            progress.running = len(in_flight)
            if time.monotonic() - asked_limiters >= WAITING_EVERY:
                progress.waiting = _waiting(limiters)
                asked_limiters = time.monotonic()
            progress.show()
            for group in groups.values():
                group.reprobe_due()
            probes = {ref: (g, i) for g in groups.values() for i, ref in g.restarting.items()}
            recovering = any(g.can_recover() for g in groups.values())
            if not in_flight and not recovering:
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
                        info = ray.get(ref)
                        log(f"replica {index} is back (pid {info['pid']})")
                    except _INFRASTRUCTURE as exc:
                        if group.probe_failed(index, exc):
                            log(
                                f"replica {index} is gone for good ({type(exc).__name__}: "
                                "restarts exhausted or its node is gone)"
                            )
                    continue
                plan, query, group, index = in_flight.pop(ref)
                group.load[index] -= 1
                try:
                    finish(plan, QueryRecord.model_validate(ray.get(ref)))
                except _INFRASTRUCTURE as exc:
                    group.lost(index)
                    retry_or_fail(plan, query, exc, "replica lost")
                except RayTaskError as exc:  # the replica raised outside the agent loop
                    if isinstance(exc.cause, ProviderRefused):  # every query would fail alike
                        plan.guard.halt(str(exc.cause))
                    else:
                        retry_or_fail(plan, query, exc, "replica error")
            submit()
        progress.close()
        for plan in runs:
            if plan.guard.stop_reason():
                log(f"{plan.run_dir} stopped: {plan.guard.stop_reason()}")
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


def _waiting(limiters: dict[str, Any]) -> int:
    try:
        return sum(
            s.waiting for s in ray.get([a.stats.remote() for a in limiters.values()], timeout=2)
        )
    except Exception:  # progress must never stop the run
        return 0


def _infrastructure_failure(plan: PreparedRun, query: Query, exc: BaseException) -> QueryRecord:
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
            f"({type(exc).__name__}: {scrub(str(exc))[:300]})"
        ),
        usage=Usage(),
        started_at=now_iso(),
        finished_at=now_iso(),
    )
