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
import functools
import importlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import ray
from pydantic import SecretStr
from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    RayActorError,
    RayError,
    RayTaskError,
    WorkerCrashedError,
)

from piserini_ray.config import RunConfig
from piserini_ray.data import Query, load_benchmark
from piserini_ray.engine_contract import PreparedRun, charge_served, in_turn
from piserini_ray.errors import ConfigError, DataError, PiseriniRayError, ProviderRefused
from piserini_ray.llm.limiter import quota_key
from piserini_ray.llm.secrets import driver_keys, scrub
from piserini_ray.progress import Progress
from piserini_ray.records import QueryRecord, Usage, now_iso
from piserini_ray.retrieval.index import find_index
from piserini_ray.runtime.driver_services import RayLimiters, driver_services, services_name
from piserini_ray.runtime.encoders import start_node_encoders
from piserini_ray.runtime.identity import code_identity
from piserini_ray.runtime.judge_alongside import JudgeAlongside
from piserini_ray.runtime.limiter_actor import RemoteLimiter
from piserini_ray.runtime.metrics import RunExporter
from piserini_ray.runtime.model_servers import ServedModels
from piserini_ray.runtime.ray_env import cluster_can_grow, start_ray
from piserini_ray.runtime.readiness import (
    PROGRESS_SECONDS,
    check_feasible,
    describe,
    nodes_that_fit,
    started,
)
from piserini_ray.runtime.relay import relayed
from piserini_ray.runtime.shipping import serve_index
from piserini_ray.runtime.worker import QueryJob, SearchWorker
from piserini_ray.serving import served_key

if TYPE_CHECKING:
    from piserini_ray.endpoints import ModelEndpoints

_INFRASTRUCTURE = (ActorDiedError, ActorUnavailableError, RayActorError, WorkerCrashedError)
#: How soon a replica that Ray is still restarting is asked again whether it is back.
REPROBE_SECONDS = 0.5
#: How often the progress line asks the limiters how many calls wait (a round trip to each,
#: not one per finished query).
WAITING_EVERY = 1.0
#: What the driver needs after the last query, loaded while it only waits on the replicas: the
#: reports' modules (SciPy and matplotlib, 1.5 s between the last query and the report). The
#: judge's come with the judging beside the queries (`judge_alongside.py`).
AFTER_THE_QUERIES = ("piserini_ray.report",)
#: Calls sent to a replica that has just come up, each with what to do with its result.
OnUp = Callable[["_Group", int], dict[Any, Callable[[Any], None]]]


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
    #: The node each replica runs on (from its readiness probe; a restart may move it).
    nodes: dict[int, str] = field(default_factory=dict)
    ips: dict[int, str] = field(default_factory=dict)

    def placed(self, index: int, info: dict[str, Any]) -> None:
        self.nodes[index], self.ips[index] = info["node"], info.get("ip", "?")

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


def check_same_code(infos: list[dict[str, Any]]) -> None:
    """Every replica must run the driver's `piserini_ray` (version and source): a node with
    another one is named, before any query."""
    ours = code_identity()
    other = {(i.get("ip", "?"), i.get("code")) for i in infos if i.get("code") != ours}
    if other:
        nodes = ", ".join(f"{ip} runs {code}" for ip, code in sorted(other, key=str))
        raise SchedulerError(
            f"a node runs another piserini_ray than the driver ({ours}): {nodes}. Install the "
            "same version on every node (the same image, or `pip install` of the same commit), "
            "then run again; nothing was run."
        )


class Replicas:
    """What a job keeps up on Ray for its runs: one group of searcher replicas per benchmark and
    retrieval settings (shared by the runs that have them), the query encoders of dense groups
    (their handles held, so they live as long as the job), and the job's actor on the driver's
    node (`driver_services.py`: a limiter per quota key of the runs' models and judges, the
    index's bytes for other nodes, the other nodes' requests to its loopback endpoints)."""

    def __init__(self, configs: list[RunConfig], log: Callable[[str], None]) -> None:
        """`configs`: every run of the job, so that the CPU fit counts all of their groups,
        whether they come up now (`bring_up`) or after `prepare` (`add`)."""
        self.runtime = configs[0].runtime
        self.registry = RayLimiters(start=True)
        self.limiters: dict[str, RemoteLimiter] = {}  # of the runs' models, by quota key
        self._limited: list[RunConfig] = []  # the runs whose models' limiters `ready` starts
        self.groups: dict[str, _Group] = {}
        self.encoders: list[Any] = []
        self.cpus = _replica_cpus(configs, self.runtime, log)

    def add(
        self,
        configs: list[RunConfig],
        log: Callable[[str], None],
        indexes: Mapping[str, Path] | None = None,
    ) -> None:
        """Start what these runs need and is not up yet (actor creation returns at once;
        `ready` waits). Replicas first: they take the workers Ray pre-started (a second of
        start-up each); the limiters come once they are placed (`ready`). `indexes`: each
        run's index on this node where the caller found it already (by `_group_key`), else it
        is looked up."""
        for config in configs:
            key = _group_key(config)
            if key not in self.groups:
                found = (indexes or {}).get(key) or _built_index(config)
                self.groups[key] = self._start_group(config, found, log)
        # After the replicas, which take the workers Ray pre-started (the model client loaded:
        # `warm.py`): one light worker that serves the index, the limiters and the other
        # nodes' relays.
        driver_services(start=True)
        self._limited += configs  # (one limiter per quota key: `_start_limiters`)

    def _start_limiters(self) -> None:
        """The limiters of the runs' models, added once their replicas are placed (their first
        queries need them, not their start). A judge's comes with its client, at the first
        answer (`judging.judge_client`)."""
        for config in self._limited:
            key = quota_key(config.model, config.offline)
            if key not in self.limiters:
                self.limiters[key] = self.registry.limiter(config.model, config.offline)

    def _start_group(
        self, config: RunConfig, index: Path | None, log: Callable[[str], None]
    ) -> _Group:
        runtime = self.runtime
        strategy = "SPREAD" if runtime.placement == "spread" else "DEFAULT"
        # The index was built (or found) on this node; replicas here open it at once, and
        # nodes without it get it shipped from here (`shipping.py`).
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
        source = serve_index(index) if index is not None else None
        log(f"starting {runtime.replicas} searcher replica(s) for {retrieval.describe()}")
        actors = [
            SearchWorker.options(  # type: ignore[attr-defined]  # Ray types the class as is
                num_cpus=self.cpus,
                max_concurrency=runtime.max_concurrency + 4,  # + room for info() while busy
                max_restarts=runtime.max_restarts,
                scheduling_strategy=strategy,
            ).remote(config.benchmark, retrieval, encoders, source)
            for _ in range(runtime.replicas)
        ]
        return _Group(actors, capacity=runtime.max_concurrency)

    def ready(self, log: Callable[[str], None], on_up: OnUp | None = None) -> None:
        """Wait until every replica has opened its index, and check that each runs the
        driver's code. `on_up(group, index)`, called as soon as a replica is placed (its
        constructor returns at once: `SearchWorker.where`), may send it calls that must answer
        before any query (its node's model checks), which then run while its searcher opens:
        their refs, each with what to do with its result, waited for here too."""
        placed = [(g, i) for g in self.groups.values() for i in range(len(g.actors))]
        locating = {g.actors[i].where.remote(): (g, i) for g, i in placed}
        starting: dict[Any, tuple[_Group, int]] = {}
        calls: dict[Any, Callable[[Any], None]] = {}
        infos = []
        while locating or starting or calls:
            done, _ = ray.wait(
                [*locating, *starting, *calls], num_returns=1, timeout=PROGRESS_SECONDS
            )
            if not done:
                log(
                    f"waiting for {len(locating) + len(starting)} of {len(placed)} searcher "
                    f"replicas to start and {len(calls)} check(s) "
                    f"(free now: {describe(ray.available_resources())})"
                )
            elif done[0] in calls:
                calls.pop(done[0])(done[0])
            elif done[0] in locating:
                group, index = locating.pop(done[0])
                group.placed(index, started(done[0], "searcher replicas"))
                if not locating:
                    self._start_limiters()
                starting[group.actors[index].info.remote()] = (group, index)
                calls.update(on_up(group, index) if on_up else {})
            else:
                group, index = starting.pop(done[0])
                info = started(done[0], "searcher replicas")
                group.placed(index, info)  # a replica restarted meanwhile may have moved
                infos.append(info)
        self._start_limiters()  # (started above, once every replica was placed)
        check_same_code(infos)
        log(
            f"{len(infos)} searcher replica(s) ready on {len({i['node'] for i in infos})} "
            f"node(s), {self.runtime.max_concurrency} queries at once each (pids "
            + ", ".join(str(i["pid"]) for i in infos)
            + ")"
        )

    def nodes_for_replicas(self) -> list[str]:
        """The alive nodes that a replica fits, where there are no more of them than replicas
        (so that what each node needs can start before the replicas are placed); else none."""
        nodes = nodes_that_fit({"CPU": self.cpus})
        wanted = sum(len(g.actors) for g in self.groups.values())
        return nodes if len(nodes) <= wanted else []

    def close(self) -> None:
        for group in self.groups.values():
            for actor in group.actors:
                ray.kill(actor)
        self.groups.clear()


def _built_index(config: RunConfig) -> Path | None:
    """The run's index on this node, if built; None also where the driver cannot read the
    corpus (the replicas' own start then names the file: `readiness`)."""
    try:
        corpus = load_benchmark(config.benchmark).corpus
    except DataError:
        return None
    return find_index(corpus, config.retrieval.resolved_index_root())


def bring_up(configs: list[RunConfig], log: Callable[[str], None]) -> Replicas:
    """Start Ray (or wait for its start) and, while the driver still checks the data
    (`prepare`), the replicas of every run whose index is already built. The others come up
    after it: it builds their indexes (and an index that a replica were building would hide its
    corpus errors from `prepare`). A job with a dense run starts none early: `prepare` may
    build a dense index on encoder actors, which must not wait for CPUs held by idle replicas."""
    start_ray(configs[0].runtime, log)
    replicas = Replicas(configs, log)
    if any(c.retrieval.uses_dense for c in configs):
        return replicas
    indexes = {_group_key(c): index for c in configs if (index := _built_index(c)) is not None}
    replicas.add([c for c in configs if _group_key(c) in indexes], log, indexes)
    return replicas


def run_prepared(
    runs: list[PreparedRun],
    endpoints: ModelEndpoints,
    log: Callable[[str], None],
    early: Future[Replicas] | None = None,
) -> None:
    """Run every prepared run's todo list to completion (or Ctrl-C) on Ray. `early`: the
    `bring_up` begun before `prepare`."""
    todo = [run for run in runs if run.todo]
    replicas = early.result() if early is not None else None
    stack = contextlib.ExitStack()  # the model servers stop (and are charged) on the way out
    try:
        if not todo:
            return
        if replicas is None:
            start_ray(runs[0].config.runtime, log)
            replicas = Replicas([r.config for r in runs], log)
        replicas.add([r.config for r in todo], log, {_group_key(r.config): r.index for r in todo})
        served = ServedModels([r.config.model for r in todo], log)
        stack.callback(_charge, todo, served)
        served.start()  # the model servers come up beside the replicas
        bases = {
            str(run.run_dir): None
            if served.serves(run.config.model)
            else endpoints.api_base(run.config.model, run.config.offline)
            for run in todo
        }
        dispatcher = Dispatcher(todo, bases, replicas, log, served)
        replicas.ready(log, dispatcher.model_checks)
        dispatcher.raise_check_failures()
        # The judge's imports, then the reports', load from now on: after the replicas' start
        # (on a small machine they would slow it), before most of the queries' work.
        dispatcher.alongside = alongside = JudgeAlongside(todo, endpoints, log)
        loading = _load_meanwhile(AFTER_THE_QUERIES, after=alongside.imported)
        interrupted = True
        try:
            dispatcher.start_batchers(after=loading)
            dispatcher.run()
            interrupted = False
        finally:
            alongside.close(cancel=interrupted)
            loading.join()  # no import of the driver's may meet it half-done
            dispatcher.stop_batchers()
    finally:
        try:
            stack.close()
        finally:
            if replicas is not None:
                replicas.close()


def _charge(runs: list[PreparedRun], served: ServedModels) -> None:
    """Stop the model servers and charge their hours to the runs they served."""
    for key, (seconds, count) in served.stop().items():
        charge_served([r for r in runs if served_key(r.config.model) == key], seconds, count)


def _load_meanwhile(
    modules: tuple[str, ...], after: threading.Event | None = None
) -> threading.Thread:
    """Import `modules` on a thread of their own, once `after` is set (another thread's
    imports are done). Started once the replicas are up: from then on the driver's own
    thread imports nothing they share (two threads importing the same package's modules at
    once have failed in importlib)."""

    def load() -> None:
        if after is not None:
            after.wait()
        for name in modules:
            with contextlib.suppress(Exception):  # a failed import is raised where it is used
                importlib.import_module(name)

    thread = threading.Thread(target=load, name="load-reports", daemon=True)
    thread.start()
    return thread


@dataclass
class _InFlight:
    plan: PreparedRun
    query: Query
    group: _Group
    index: int  # the replica's place in its group
    #: The server of a served model that holds the query's every turn (`model_servers.py`).
    server: int | None = None


class Dispatcher:
    """The driver's loop over a job's queries, its state explicit: the queue not yet sent, the
    queries in flight (by the ref of their result), and how often each was lost to the
    infrastructure. Each step waits for one result (or a replica's readiness probe), then
    fills every free slot again."""

    def __init__(
        self,
        runs: list[PreparedRun],
        bases: dict[str, str | None],
        replicas: Replicas,
        log: Callable[[str], None],
        served: ServedModels | None = None,
    ) -> None:
        self.runs = runs
        self.bases = bases
        #: The servers of the models the run serves: each query gets one (`_job`).
        self.served = served
        self.replicas = replicas
        self.driver_node = ray.get_runtime_context().get_node_id()
        self.log = log
        self.queue: deque[tuple[PreparedRun, Query]] = deque(in_turn(runs))
        self.in_flight: dict[Any, _InFlight] = {}
        self.attempts: dict[tuple[str, str], int] = {}
        self.progress = Progress(len(self.queue))
        for run in runs:
            self.progress.add_run(run.run_dir.name, len(run.todo))
        self._asked_limiters = 0.0
        #: Each run's model key, read once here on the driver (`secrets.driver_keys`), before
        #: any query: the reports' loading thread and this one never import at once.
        self._handed = {str(r.run_dir): driver_keys([r.config.model]) for r in runs}
        #: Each batch-tier run's batcher actor, by run directory.
        self.batchers: dict[str, Any] = {}
        #: The model checks sent (node, model, endpoint, keys), and what did not answer.
        self._checked: set[tuple[str, str, str, tuple[str, ...]]] = set()
        self.check_failures: list[str] = []
        #: Judges each answer as it comes, for the runs judged next (`run_prepared` sets it).
        self.alongside: JudgeAlongside | None = None
        #: The runs whose stop (`piserini-ray stop`) the replicas were told of, by run dir.
        self._stopped: set[str] = set()
        #: The runs whose model has no server left (`_unserved`), by run dir.
        self._unserved_runs: set[str] = set()
        #: Each run's Ray metrics, told of its records and verdicts by its store.
        self.exporters = {str(r.run_dir): RunExporter(r) for r in runs}
        for run in runs:
            run.store.listeners.append(self.exporters[str(run.run_dir)])

    def start_batchers(self, after: threading.Thread) -> None:
        """A batcher actor on this node for each run whose model is at the batch tier: every
        replica hands it its queries' turns, so one batch holds the turns of the whole run.
        `after`: the thread loading the driver's other modules, which this one waits for."""
        batched = [plan for plan in self.runs if plan.config.model.service_tier == "batch"]
        if not batched:
            return
        # Imported here, once no other thread imports: litellm comes with them, and
        # `bring_up` imports this module before it starts the replicas.
        after.join()
        from piserini_ray.llm.client import LLMClient
        from piserini_ray.runtime.batcher_actor import start_batcher

        for plan in batched:
            name = f"{services_name()}-batcher-{plan.store.config_hash[:12]}"
            base = self.bases[str(plan.run_dir)]
            # The key the run's clients send (the driver's, or none for a loopback endpoint).
            client = LLMClient(plan.config.model, api_base=base, keys=self._keys(plan))
            key = client.api_key()
            secret = SecretStr(key) if key else None
            self.batchers[str(plan.run_dir)] = (
                name,
                start_batcher(name, plan.config, plan.run_dir, client.provider, base, secret),
            )
            self.log(f"{plan.run_dir}: model turns go out in batches (batcher {name})")

    def stop_batchers(self) -> None:
        for _name, actor in self.batchers.values():
            ray.kill(actor)

    def run(self) -> None:
        self.progress.started = time.monotonic()
        try:
            self.submit()
            while self.in_flight or self.queue:
                self.step()
                self.submit()
            self._show_live({})  # the gauges' last word: nothing in flight, nothing waiting
            self.progress.close()
            for plan in self.runs:
                if plan.stop_reason():
                    self.log(f"{plan.run_dir} stopped: {plan.stop_reason()}")
        except KeyboardInterrupt:
            self.progress.close()
            for ref in self.in_flight:
                ray.cancel(ref)
            self.log(
                f"interrupted: {len(self.in_flight)} queries in flight were abandoned and "
                f"{len(self.queue)} not started; run the same command (or `piserini-ray "
                "resume`) to continue: they run again, nothing else does"
            )
            raise

    def submit(self) -> None:
        """Send queued queries to the least loaded free replica of their group; a query whose
        group has no free replica waits in place, one the cost cap stops is dropped (resume
        runs it)."""
        deferred = []
        while self.queue:
            plan, query = self.queue.popleft()
            if not plan.may_start(sum(1 for f in self.in_flight.values() if f.plan is plan)):
                continue
            group = self.replicas.groups[_group_key(plan.config)]
            free = group.available()
            if not free:
                deferred.append((plan, query))
                continue
            index = min(free, key=lambda i: group.load.get(i, 0))
            server, base = None, None
            if self.served is not None and self.served.serves(plan.config.model):
                if self.served.gone(plan.config.model):
                    self._unserved(plan)
                    continue
                picked = self.served.pick(plan.config.model)
                if picked is None:  # its servers are being replaced: it waits for one
                    deferred.append((plan, query))
                    continue
                server, base = picked
            job = self._job(plan, query, group.nodes[index], base)
            ref = group.actors[index].run.remote(job, self._keys(plan))
            group.load[index] = group.load.get(index, 0) + 1
            self.in_flight[ref] = _InFlight(plan, query, group, index, server)
        self.queue.extendleft(reversed(deferred))

    def _job(
        self, plan: PreparedRun, query: Query, node: str, server: str | None = None
    ) -> QueryJob:
        """The query as its replica runs it, on `node`: a loopback endpoint of the driver's
        node is reached from another node through the replica's relay; a served model's
        calls go to `server` (default: its first, for the model check)."""
        config = plan.config
        base = self.bases[str(plan.run_dir)]
        if self.served is not None and self.served.serves(config.model):
            base = server or self.served.first(config.model)
        return QueryJob(
            run_id=plan.store.run_id,
            config_hash=plan.store.config_hash,
            query=query,
            model=config.model,
            retry=config.retry,
            agent=config.agent,
            tools=config.tools,
            offline=config.offline,
            api_base=base,
            relay=relayed(base, node, self.driver_node),
            seed=config.run.request_seed(),
            batcher=self.batchers[str(plan.run_dir)][0]
            if str(plan.run_dir) in self.batchers
            else None,
        )

    def _keys(self, plan: PreparedRun) -> dict[str, SecretStr]:
        """The run's model key: handed with each call as an argument of its own, never inside
        the job (`QueryJob`)."""
        return self._handed[str(plan.run_dir)]

    def model_checks(self, group: _Group, index: int) -> dict[Any, Callable[[Any], None]]:
        """Before anything is spent: each hosted model answers the one-word check from every
        node that hosts its replicas, with the key and endpoint its queries will use (a node
        that cannot reach the provider, or lacks the key, is named). Sent to a replica as it
        comes up (`Replicas.ready`), once per node and model (endpoint, key), whatever the
        replicas or runs there. Offline models are free and local: not checked here."""
        node, ip = group.nodes[index], group.ips[index]
        calls: dict[Any, Callable[[Any], None]] = {}
        for plan in self.runs:
            if (
                plan.config.model.is_offline
                or self.replicas.groups[_group_key(plan.config)] is not group
            ):
                continue
            job, keys = self._job(plan, plan.todo[0], node), self._keys(plan)
            key = (node, job.model.model_dump_json(), str(job.api_base), tuple(sorted(keys)))
            if key not in self._checked:
                self._checked.add(key)
                ref = group.actors[index].check_model.remote(job, keys)
                calls[ref] = functools.partial(self._model_checked, plan.config.model.name, ip)
        return calls

    def _model_checked(self, name: str, ip: str, ref: Any) -> None:
        try:
            problem = ray.get(ref)
        except RayError as exc:  # the replica died, or runs other code (named after)
            problem = f"the check could not run there ({type(exc).__name__})"
        if problem is None:
            self.log(f"checked {name} from node {ip}: it answers")
        else:
            self.check_failures.append(f"{name} from node {ip}: {problem}")

    def raise_check_failures(self) -> None:
        if self.check_failures:
            raise ConfigError(
                "a model did not answer a one-word check from every node that will call it, so "
                "nothing was run (give the driver the key, or make the endpoint reachable from "
                "that node):\n  " + "\n  ".join(self.check_failures)
            )

    def step(self) -> None:
        """Show progress, wait up to a second for one result or probe, and act on it."""
        groups = self.replicas.groups.values()
        self.progress.running = len(self.in_flight)
        if time.monotonic() - self._asked_limiters >= WAITING_EVERY:
            waiting = _waiting(self.replicas.limiters)
            self.progress.waiting = sum(waiting.values())
            self._asked_limiters = time.monotonic()
            self._show_live(waiting)
        self._send_stops()
        self.progress.show()
        for group in groups:
            group.reprobe_due()
        probes = {ref: (g, i) for g in groups for i, ref in g.restarting.items()}
        if not self.in_flight and not any(g.can_recover() for g in groups):
            raise SchedulerError(
                f"every searcher replica died; {len(self.queue)} queries were not run. Their "
                "records are missing, nothing else is lost: fix the cluster and resume."
            )
        servers = self.served.watched() if self.served is not None else []
        ready, _ = ray.wait([*self.in_flight, *probes, *servers], num_returns=1, timeout=1.0)
        for ref in ready:
            if ref in probes:
                self._probe_returned(ref, *probes[ref])
            elif ref in self.in_flight:
                self._query_returned(ref, self.in_flight.pop(ref))
            elif self.served is not None and (moved := self.served.returned(ref)):
                self._redirect(*moved)

    def _redirect(self, old: str, new: str) -> None:
        """A served model's server moved (lost, and placed again elsewhere): every replica's
        calls in flight to `old` are retried at `new` (`SearchWorker.redirect`)."""
        for group in self.replicas.groups.values():
            for index, actor in enumerate(group.actors):
                if index not in group.dead:
                    actor.redirect.remote(old, new)

    def _unserved(self, plan: PreparedRun) -> None:
        """A query whose model has no server left is not started: it stays for a resume."""
        if str(plan.run_dir) not in self._unserved_runs:
            self._unserved_runs.add(str(plan.run_dir))
            self.log(
                f"{plan.run_dir}: every server of {plan.config.model.name} is gone for good; "
                "its queries not started stay for a resume (`piserini-ray resume`)"
            )

    def _show_live(self, waiting: dict[str, int]) -> None:
        """Each run's gauges for its live status: its queries in flight, the calls waiting on
        its model's limiter, its replicas by node."""
        for plan in self.runs:
            group = self.replicas.groups[_group_key(plan.config)]
            alive = [i for i in range(len(group.actors)) if i not in group.dead]
            running = sum(1 for f in self.in_flight.values() if f.plan is plan)
            calls = waiting.get(quota_key(plan.config.model, plan.config.offline), 0)
            replicas = dict(Counter(group.ips.get(i, "?") for i in alive))
            plan.show_live(running=running, waiting=calls, replicas=replicas)
            self.exporters[str(plan.run_dir)].live(running, calls, replicas)

    def _send_stops(self) -> None:
        """A run stopped by `piserini-ray stop`: its queued queries start no more
        (`PreparedRun.may_start`) and every replica of its group ends its queries in flight
        (`SearchWorker.stop_run`), whose records come back as retryable failures."""
        for plan in self.runs:
            if plan.stop_requested and str(plan.run_dir) not in self._stopped:
                self._stopped.add(str(plan.run_dir))
                group = self.replicas.groups[_group_key(plan.config)]
                for index, actor in enumerate(group.actors):
                    if index not in group.dead:
                        actor.stop_run.remote(plan.store.run_id)
                flying = sum(1 for f in self.in_flight.values() if f.plan is plan)
                self.log(f"{plan.run_dir}: stopping ({flying} queries in flight end now)")

    def _probe_returned(self, ref: Any, group: _Group, index: int) -> None:
        del group.restarting[index]
        try:
            info = ray.get(ref)
            group.placed(index, info)
            self.log(f"replica {index} is back (pid {info['pid']}, node {info.get('ip', '?')})")
        except (*_INFRASTRUCTURE, RayTaskError) as exc:  # RayTaskError: it could not reopen
            if group.probe_failed(index, exc):
                self.log(
                    f"replica {index} is gone for good ({type(exc).__name__}: restarts "
                    "exhausted or its node is gone)"
                )

    def _query_returned(self, ref: Any, flight: _InFlight) -> None:
        flight.group.load[flight.index] -= 1
        if flight.server is not None and self.served is not None:
            self.served.release(flight.plan.config.model, flight.server)
        try:
            record = QueryRecord.model_validate(ray.get(ref))
        except _INFRASTRUCTURE as exc:
            flight.group.lost(flight.index)
            self._retry_or_fail(flight, exc, "replica lost")
            return
        except RayTaskError as exc:  # the replica raised outside the agent loop
            if isinstance(exc.cause, ProviderRefused):  # every query would fail alike
                flight.plan.refused(str(exc.cause))
            else:
                self._retry_or_fail(flight, exc, "replica error")
            return
        flight.plan.complete(record, self.progress)
        if self.alongside is not None:
            self.alongside.submit(flight.plan, flight.query, record)

    def _retry_or_fail(self, flight: _InFlight, exc: BaseException, what: str) -> None:
        """Infrastructure is not the query's fault: run it again, and only after
        `max_infrastructure_attempts` record it as failed."""
        plan, query = flight.plan, flight.query
        key = (str(plan.run_dir), query.query_id)
        self.attempts[key] = self.attempts.get(key, 0) + 1
        if self.attempts[key] >= self.replicas.runtime.max_infrastructure_attempts:
            plan.complete(infrastructure_failure(plan, query, exc), self.progress)
        else:
            self.log(f"{query.query_id}: {what} ({type(exc).__name__}); re-running it")
            self.queue.appendleft((plan, query))


def _waiting(limiters: dict[str, RemoteLimiter]) -> dict[str, int]:
    """Calls waiting on each limiter, by quota key (none known: an empty map)."""
    try:
        asked = {key: limiter.handle.stats.remote(limiter.key) for key, limiter in limiters.items()}
        answers = ray.get(list(asked.values()), timeout=2)
        return {key: stats.waiting for key, stats in zip(asked, answers, strict=True)}
    except Exception:  # progress must never stop the run
        return {}


def infrastructure_failure(plan: PreparedRun, query: Query, exc: BaseException) -> QueryRecord:
    return QueryRecord(
        run_id=plan.store.run_id,
        config_hash=plan.store.config_hash,
        query_id=query.query_id,
        model=plan.config.model.name,
        status="failed",
        termination="infrastructure",
        retryable=True,  # not the query's fault: `resume` runs it again
        error=(
            f"infrastructure: the query's replica failed "
            f"{plan.config.runtime.max_infrastructure_attempts} times "
            f"({type(exc).__name__}: {scrub(str(exc))[:300]})"
        ),
        usage=Usage(),
        started_at=now_iso(),
        finished_at=now_iso(),
    )
