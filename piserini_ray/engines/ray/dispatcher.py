"""The dispatcher: the driver's loop that hands queries to replicas with backpressure (at most
`replicas x max_concurrency` in flight per group), records each result once as it arrives,
resubmits a query whose actor or node died (up to `max_infrastructure_attempts`), follows a
served model's new address and stops a run asked to stop.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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

from piserini_ray.data import Query
from piserini_ray.engines.contract import PreparedRun, in_turn
from piserini_ray.engines.ray.driver_services import services_name
from piserini_ray.engines.ray.judge_alongside import JudgeAlongside
from piserini_ray.engines.ray.limiter_actor import RemoteLimiter
from piserini_ray.engines.ray.metrics import RunExporter
from piserini_ray.engines.ray.model_servers import ServedModels
from piserini_ray.engines.ray.relay import relayed
from piserini_ray.engines.ray.replicas import ReplicaGroup, Replicas, SchedulerError, group_key
from piserini_ray.engines.ray.worker import QueryJob
from piserini_ray.errors import ConfigError, ProviderRefused
from piserini_ray.llm.limiter import quota_key
from piserini_ray.llm.scrubber import driver_keys, scrub
from piserini_ray.progress import Progress
from piserini_ray.records import QueryRecord, Usage, now_iso

if TYPE_CHECKING:
    pass


INFRASTRUCTURE = (ActorDiedError, ActorUnavailableError, RayActorError, WorkerCrashedError)


#: How often the progress line asks the limiters how many calls wait (a round trip to each,
#: not one per finished query).
WAITING_EVERY = 1.0


@dataclass
class _InFlight:
    plan: PreparedRun
    query: Query
    group: ReplicaGroup
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
        self._limiter_waits: dict[str, int] = {}
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
        from piserini_ray.engines.ray.batcher_actor import start_batcher
        from piserini_ray.llm.client import LLMClient

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
            group = self.replicas.groups[group_key(plan.config)]
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

    def model_checks(self, group: ReplicaGroup, index: int) -> dict[Any, Callable[[Any], None]]:
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
                or self.replicas.groups[group_key(plan.config)] is not group
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
            self._limiter_waits = _waiting(self.replicas.limiters)
            self.progress.waiting = sum(self._limiter_waits.values())
            self._asked_limiters = time.monotonic()
        # Queries in flight are counted at every step, so that a status's count follows its
        # records (not a second behind); the limiters are asked (a remote call) once a second.
        self._show_live(self._limiter_waits)
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
            group = self.replicas.groups[group_key(plan.config)]
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
                group = self.replicas.groups[group_key(plan.config)]
                for index, actor in enumerate(group.actors):
                    if index not in group.dead:
                        actor.stop_run.remote(plan.store.run_id)
                flying = sum(1 for f in self.in_flight.values() if f.plan is plan)
                self.log(f"{plan.run_dir}: stopping ({flying} queries in flight end now)")

    def _probe_returned(self, ref: Any, group: ReplicaGroup, index: int) -> None:
        del group.restarting[index]
        try:
            info = ray.get(ref)
            group.placed(index, info)
            self.log(f"replica {index} is back (pid {info['pid']}, node {info.get('ip', '?')})")
        except (*INFRASTRUCTURE, RayTaskError) as exc:  # RayTaskError: it could not reopen
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
        except INFRASTRUCTURE as exc:
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
