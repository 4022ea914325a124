"""Models the run serves on its own nodes (`model.serve`, issue 51), on the Ray engine.

Each server is a `ModelServerActor` that Ray places by `serve.num_cpus` / `serve.num_gpus`
(a demand no node can meet is refused before anything starts), running the engine's server as
its child process (`serving/process.py`) on its node's address, so every node reaches it. The
driver routes each query to one server for all of its turns (`ServedModels.pick` when the
query starts, `release` when it returns): a conversation stays where its prompt is cached, and
queries go to the least loaded server. The servers stop when the run ends, also after Ctrl-C
or a failure (and, should the actor die, its server with it: `PR_SET_PDEATHSIG`).

A server that exits starts again at its address, inside its actor (`supervise`). A server
lost with its actor (its node gone, its worker killed, or a server that would not come back)
is replaced: Ray places a new actor wherever the resources are, at a new address, and the
driver tells every replica (`SearchWorker.redirect`), whose calls in flight to the old
address are retried at the new one: the queries go on, none is lost or run twice.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from piserini_ray.config import ModelConfig
from piserini_ray.config.serving import ServeConfig
from piserini_ray.endpoints import StopServers
from piserini_ray.engines.ray.readiness import check_feasible
from piserini_ray.engines.ray.worker import stamped
from piserini_ray.serving import ServeError, ServerProcess, served_key

#: Beyond `serve.startup_timeout`, how long the driver waits for an actor's answer (its own
#: start: Ray placing it, its worker process).
ACTOR_MARGIN_SECONDS = 120.0
#: How many times in a row a lost server is replaced before it is given up (its model's
#: other servers go on; with none left, its queries not started stay for a resume).
MAX_REPLACEMENTS = 3


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=2)  # type: ignore[call-overload]
class ModelServerActor:
    """One server of a served model, on the node Ray placed this actor on. Two threads: one
    supervises the server (`supervise`), the other answers the driver."""

    def __init__(self, serve: ServeConfig, name: str) -> None:
        ip = ray.util.get_node_ip_address()
        self.server = ServerProcess(serve, name, node=ip, host=ip)

    def start(self) -> dict[str, Any]:
        base = self.server.start()
        return {"api_base": base, "node": self.server.node, "pid": os.getpid()}

    def supervise(self) -> int:
        """Until the server is stopped: a server that exits starts again at the same address
        (`ServerProcess.supervise`); the restarts."""
        return self.server.supervise(lambda message: print(stamped(message), flush=True))

    def alive(self) -> bool:
        return self.server.alive()

    def stop(self) -> float:
        """Stop the server; how long it was up."""
        self.server.stop()
        return self.server.seconds_up()


@dataclass
class _Servers:
    """The servers of one served model: their actors, addresses and queries in flight."""

    model: ModelConfig
    actors: list[Any]
    bases: list[str] = field(default_factory=list)
    load: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    #: Each server's supervision (`ModelServerActor.supervise`): its restarts when it ends.
    supervising: list[Any] = field(default_factory=list)
    #: The servers lost and not (yet) replaced: no query is routed to them.
    down: set[int] = field(default_factory=set)
    #: Replacements in a row of each server that did not come up (`MAX_REPLACEMENTS`).
    failed_replacements: dict[int, int] = field(default_factory=dict)

    def new_actor(self) -> Any:
        """A server's actor, placed by its resources wherever a node has them free."""
        serve = self.model.serve
        assert serve is not None
        return ModelServerActor.options(  # type: ignore[attr-defined]
            num_cpus=serve.num_cpus, num_gpus=serve.num_gpus, resources=serve.resources
        ).remote(serve, self.model.name)


class ServedModels:
    """The served models of a job's runs: started together, routed per query, stopped."""

    def __init__(self, models: list[ModelConfig], log: Callable[[str], None]) -> None:
        self.log = log
        self.models = {served_key(m): m for m in models if m.serve is not None}
        self.servers: dict[str, _Servers] = {}
        #: What the driver waits on besides its queries: each live server's supervision (it
        #: ends when the server is lost) and each replacement's start, with its server.
        self._watched: dict[Any, tuple[_Servers, int]] = {}
        self._replacing: dict[Any, tuple[_Servers, int, Any]] = {}

    def start(self) -> None:
        """Place and start every server, and wait until each answers (`ServeError` names the
        node, the engine and its last log lines; a demand no node has is refused first)."""
        for key, model in self.models.items():
            serve = model.serve
            assert serve is not None
            demand = {"CPU": serve.num_cpus, "GPU": serve.num_gpus, **serve.resources}
            check_feasible(
                demand,
                f"the servers of {model.name} ({serve.engine})",
                "lower serve.num_cpus / num_gpus / resources, or add a node that has them",
                self.log,
            )
            self.servers[key] = servers = _Servers(model, [])
            servers.actors = [servers.new_actor() for _ in range(serve.replicas)]
        for servers in self.servers.values():
            serve = servers.model.serve
            assert serve is not None
            refs = [actor.start.remote() for actor in servers.actors]
            timeout = serve.startup_timeout + ACTOR_MARGIN_SECONDS
            for index, ref in enumerate(refs):
                info = _answer(ref, timeout, f"server {index} of {servers.model.name}")
                servers.supervising.append(servers.actors[index].supervise.remote())
                self._watched[servers.supervising[-1]] = (servers, index)
                servers.bases.append(info["api_base"])
                servers.load.append(0)
                self.log(
                    f"model server {index} of {servers.model.name} ({serve.engine}) up at "
                    f"{info['api_base']} on node {info['node']}"
                )
            servers.started = time.time()

    def serves(self, model: ModelConfig) -> bool:
        return served_key(model) in self.servers

    def first(self, model: ModelConfig) -> str:
        """A server's address (the model check's)."""
        return self.servers[served_key(model)].bases[0]

    def pick(self, model: ModelConfig) -> tuple[int, str] | None:
        """The server for a query starting now: the least loaded that is up; it keeps the
        query's every turn (its prompt cache holds the conversation). Its index and address;
        None while every server of the model is being replaced."""
        servers = self.servers[served_key(model)]
        up = [i for i in range(len(servers.bases)) if i not in servers.down]
        if not up:
            return None
        index = min(up, key=lambda i: servers.load[i])
        servers.load[index] += 1
        return index, servers.bases[index]

    def gone(self, model: ModelConfig) -> bool:
        """Whether every server of the model is lost for good (none is being replaced)."""
        servers = self.servers[served_key(model)]
        replacing = {index for s, index, _actor in self._replacing.values() if s is servers}
        return len(servers.down) == len(servers.bases) and not replacing

    def watched(self) -> list[Any]:
        """The refs the driver waits on for its servers (`returned` acts on one)."""
        return [*self._watched, *self._replacing]

    def returned(self, ref: Any) -> tuple[str, str] | None:
        """A watched ref is ready: a server was lost (its replacement is started), or a
        replacement is up. The address that moved, old and new, for the replicas' calls in
        flight (`SearchWorker.redirect`); None when nothing moved yet."""
        if ref in self._watched:
            servers, index = self._watched.pop(ref)
            self._lost(servers, index, ref)
            return None
        servers, index, actor = self._replacing.pop(ref)
        name = f"model server {index} of {servers.model.name}"
        try:
            info = _answer(ref, 1.0, name)
        except ServeError as error:
            failures = servers.failed_replacements.get(index, 0) + 1
            servers.failed_replacements[index] = failures
            with contextlib.suppress(Exception):
                ray.kill(actor)
            if failures >= MAX_REPLACEMENTS:
                self.log(f"{name} is gone for good: {failures} replacements failed ({error})")
            else:
                self.log(f"the replacement of {name} did not come up ({error}); trying again")
                self._replace(servers, index)
            return None
        old = servers.bases[index]
        servers.actors[index], servers.bases[index] = actor, info["api_base"]
        servers.supervising[index] = actor.supervise.remote()
        self._watched[servers.supervising[index]] = (servers, index)
        servers.down.discard(index)
        servers.failed_replacements.pop(index, None)
        self.log(f"{name} is back at {info['api_base']} on node {info['node']} (was {old})")
        return old, info["api_base"]

    def _lost(self, servers: _Servers, index: int, ref: Any) -> None:
        """Server `index` is lost: its actor died (`RayActorError`), or its server would not
        come back (the supervision ended). Its queries' calls fail until it is replaced."""
        name = f"model server {index} of {servers.model.name}"
        try:
            restarts = int(ray.get(ref, timeout=1.0))
            why = f"its server would not start again (after {restarts} restart(s))"
        except (RayActorError, RayTaskError, GetTimeoutError) as exc:
            why = f"its actor died ({type(exc).__name__}: its node or worker is gone)"
        self.log(f"{name} at {servers.bases[index]} is lost: {why}; placing a new one")
        servers.down.add(index)
        with contextlib.suppress(Exception):
            ray.kill(servers.actors[index])
        self._replace(servers, index)

    def _replace(self, servers: _Servers, index: int) -> None:
        actor = servers.new_actor()
        self._replacing[actor.start.remote()] = (servers, index, actor)

    def release(self, model: ModelConfig, index: int) -> None:
        self.servers[served_key(model)].load[index] -= 1

    def stop(self) -> dict[str, tuple[float, int]]:
        """Stop every server; per served model, the seconds its servers were up (the longest)
        and how many there were."""
        up: dict[str, tuple[float, int]] = {}
        for key, servers in self.servers.items():
            seconds = time.time() - servers.started
            for actor in servers.actors:
                # An actor gone already took its server with it.
                with contextlib.suppress(RayActorError, RayTaskError, GetTimeoutError):
                    seconds = max(seconds, float(ray.get(actor.stop.remote(), timeout=60)))
            for index, ref in enumerate(servers.supervising):
                with contextlib.suppress(RayActorError, RayTaskError, GetTimeoutError):
                    if restarts := int(ray.get(ref, timeout=30)):
                        self.log(
                            f"model server {index} of {servers.model.name} was restarted "
                            f"{restarts} time(s)"
                        )
            for actor in servers.actors:
                ray.kill(actor)
            up[key] = (seconds, len(servers.actors))
        for _servers, _index, actor in self._replacing.values():
            ray.kill(actor)  # a replacement still starting: its server goes with it
        self.servers.clear()
        self._watched.clear()
        self._replacing.clear()
        return up


def _answer(ref: Any, timeout: float, what: str) -> dict[str, Any]:
    try:
        return dict(ray.get(ref, timeout=timeout))
    except RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, ServeError) else exc
        raise ServeError(str(cause)) from None
    except RayActorError as exc:
        raise ServeError(f"{what}: its actor died before it answered ({exc})") from None
    except GetTimeoutError:
        raise ServeError(
            f"{what} was not placed and up within {timeout:g} s: no node has its resources "
            "free, or its start hangs"
        ) from None


def place_on_cluster(model: ModelConfig, log: Callable[[str], None]) -> tuple[str, StopServers]:
    """A served judge on the cluster (`ModelEndpoints`' `Place` on the Ray engine): its server
    placed by its resources like an agent's, its address, and how to stop it. (A server that
    exits comes back at its address; one lost with its node is not placed again: the judging
    after the run says which verdicts are missing, and `piserini-ray judge` gives them.)"""
    served = ServedModels([model], log)
    try:
        served.start()
    except BaseException:
        served.stop()
        raise
    return served.first(model), lambda: served.stop()[served_key(model)]
