"""The searcher replicas of a run or a sweep on Ray: one group per distinct retrieval setup, each
replica placed by its CPUs and started with the run's limiters; ready when every replica
answered its probe (the same code as the driver's, the index found or shipped); a lost replica
reprobed until its group cannot recover.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import ray
from ray.exceptions import (
    ActorUnavailableError,
)

from piserini_ray.config import RunConfig
from piserini_ray.data import load_benchmark
from piserini_ray.engines.ray.driver_services import RayLimiters, driver_services
from piserini_ray.engines.ray.encoder_actors import start_node_encoders
from piserini_ray.engines.ray.identity import code_identity
from piserini_ray.engines.ray.limiter_actor import RemoteLimiter
from piserini_ray.engines.ray.ray_env import cluster_can_grow, start_ray
from piserini_ray.engines.ray.readiness import (
    PROGRESS_SECONDS,
    check_feasible,
    describe,
    nodes_that_fit,
    started,
)
from piserini_ray.engines.ray.shipping import serve_index
from piserini_ray.engines.ray.worker import SearchWorker
from piserini_ray.errors import DataError, PiseriniRayError
from piserini_ray.llm.limiter import quota_key
from piserini_ray.retrieval.index import find_index

if TYPE_CHECKING:
    pass


#: How soon a replica that Ray is still restarting is asked again whether it is back.
REPROBE_SECONDS = 0.5

#: Calls sent to a replica that has just come up, each with what to do with its result.
OnUp = Callable[["ReplicaGroup", int], dict[Any, Callable[[Any], None]]]


class SchedulerError(PiseriniRayError):
    """The cluster cannot run the remaining queries."""


@dataclass
class ReplicaGroup:
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
    wanted = len({group_key(c) for c in configs}) * runtime.replicas
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


def group_key(config: RunConfig) -> str:
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
        self.groups: dict[str, ReplicaGroup] = {}
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
        run's index on this node where the caller found it already (by `group_key`), else it
        is looked up."""
        for config in configs:
            key = group_key(config)
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
    ) -> ReplicaGroup:
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
        return ReplicaGroup(actors, capacity=runtime.max_concurrency)

    def ready(self, log: Callable[[str], None], on_up: OnUp | None = None) -> None:
        """Wait until every replica has opened its index, and check that each runs the
        driver's code. `on_up(group, index)`, called as soon as a replica is placed (its
        constructor returns at once: `SearchWorker.where`), may send it calls that must answer
        before any query (its node's model checks), which then run while its searcher opens:
        their refs, each with what to do with its result, waited for here too."""
        placed = [(g, i) for g in self.groups.values() for i in range(len(g.actors))]
        locating = {g.actors[i].where.remote(): (g, i) for g, i in placed}
        starting: dict[Any, tuple[ReplicaGroup, int]] = {}
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
    indexes = {group_key(c): index for c in configs if (index := _built_index(c)) is not None}
    replicas.add([c for c in configs if group_key(c) in indexes], log, indexes)
    return replicas
