"""The one light actor a job keeps on the driver's node: what the cluster's other processes ask
of that node.

- The cluster-wide rate limiters, one per quota key (`limiter_actor.Limiters`).
- The bytes of an index, for a replica on a node that lacks it (`shipping.py`).
- Requests to a loopback endpoint of that node, forwarded by the relays of replicas on other
  nodes (`relay.py`: each relay runs in its replica, this sends the requests on).

Why one actor and not one each: every actor is a worker process of its own, and a worker's
start costs about 0.6 s of CPU (Ray's own imports and registration), at the start of the run,
while the replicas start on the same cores (measured on the two-host kit, `bench/two_hosts.py`:
four light workers took as much CPU as the two replicas). Their work is light and waits on I/O,
so they share one event loop.

Ray restarts the actor if its process dies (the limiters must come back), so it keeps nothing a
caller cannot give again: a limiter is added again by the first call that finds its key missing
(and then admits nothing for one window), and the index folder and the endpoint come with each
call. It serves only index folders (those with piserini_ray's `index.json`) and only loopback
endpoints, the paths and methods a model client uses.
"""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from piserini_ray.config import ModelConfig
from piserini_ray.config.offline import OfflineConfig
from piserini_ray.engines.ray.limiter_actor import Limiters, RemoteLimiter
from piserini_ray.engines.ray.relay import forward
from piserini_ray.errors import DataError
from piserini_ray.llm.limiter import quota_key


@ray.remote(num_cpus=0, max_concurrency=100_000)  # type: ignore[call-overload]
class DriverServices(Limiters):  # max_concurrency: limiter waiters sleep in their calls
    """An async actor (see the module's docstring): the limiters' calls are `Limiters`' own
    (`limiter_actor.RemoteLimiter` makes them). Never a threaded one (sync methods,
    max_concurrency > 1): one destroyed before it ran a single task aborts its worker in Ray
    2.60 (`~CoreWorker` -> `~BoundedExecutor` with its pool's threads still joinable:
    "terminate called without an active exception", "Fatal Python error: Aborted"), and a run
    whose replicas all find the index on their node never calls `chunk`. File reads go to a
    thread, off the loop."""

    def __init__(self) -> None:
        with warnings.catch_warnings():  # Ray's property reads its own deprecated actor_id
            warnings.simplefilter("ignore")
            super().__init__(bool(ray.get_runtime_context().was_current_actor_reconstructed))
        self._session: Any = None

    # -- index shipping (`shipping.py`)

    async def where(self) -> str:
        return str(ray.util.get_node_ip_address())

    async def chunk(self, folder: str, relative: str, offset: int, size: int) -> bytes:
        return await asyncio.to_thread(read_chunk, Path(folder), relative, offset, size)

    # -- the other nodes' relays (`relay.py`)

    async def forward(
        self, origin: str, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        if self._session is None:
            import aiohttp

            timeout = aiohttp.ClientTimeout(total=None)  # the caller's call_timeout governs
            self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        return await forward(self._session, origin, method, path, headers, body)


def read_chunk(folder: Path, relative: str, offset: int, size: int) -> bytes:
    """`size` bytes at `offset` of the index file `relative` of the index `folder`: only a
    file inside an index folder."""
    if not (folder / "index.json").is_file():
        raise DataError(str(folder), "not an index folder")
    path = (folder / relative).resolve()
    if not path.is_relative_to(folder.resolve()):  # only the index's own files
        raise DataError(relative, "not a file of the index")
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def services_name() -> str:
    """The actor's name: one per job (its limiters, index and endpoints are the job's)."""
    return f"piserini-driver:{ray.get_runtime_context().get_job_id()}"


#: The handle the driver holds, by (its node id, the actor's name): Ray ends an actor whose
#: owner's last handle is gone, and this one must live as long as the job (a run's judge uses
#: its limiter after the run). Node ids are unique per Ray start: never a stale handle.
_STARTED: dict[tuple[str, str], Any] = {}


def driver_services(start: bool = False) -> Any:
    """The job's actor: with `start` (the driver), started here on the driver's node if it is
    not up yet, and kept for as long as the job runs; else (a replica) found by its name."""
    name = services_name()
    if not start:
        return ray.get_actor(name)
    node = ray.get_runtime_context().get_node_id()
    if (node, name) not in _STARTED:
        _STARTED[(node, name)] = DriverServices.options(  # type: ignore[attr-defined]
            name=name,
            get_if_exists=True,
            max_restarts=-1,
            # A call in flight when the actor died is sent again to its successor (an acquire
            # waits on, a release of a ticket the new one never granted is a no-op, a chunk
            # is read again, a forwarded request is sent again as a 502 would have had it).
            max_task_retries=-1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
        ).remote()
    return _STARTED[(node, name)]


class RayLimiters:
    """The limiter registry on Ray (`llm.limiter.LimiterRegistry`): each quota key's limiter in
    the job's actor on the driver's node (`driver_services.py`). The driver starts the actor
    (`start=True`); a replica hands over the `services` handle it looked up once, and `ride`."""

    def __init__(self, start: bool = False, services: Any = None, ride: bool = False) -> None:
        self.start = start
        self.services = services
        self.ride = ride  # see `RemoteLimiter`: a replica's limiters let a call's end ride

    def limiter(self, model: ModelConfig, offline: OfflineConfig) -> RemoteLimiter:
        # The key is added by its first call (`RemoteLimiter.acquire`), not sent ahead: a call
        # left in flight when the driver ends is retried by Ray against a dying actor.
        key = quota_key(model, offline)
        services = self.services or driver_services(start=self.start)
        return RemoteLimiter(services, key, model.rate_limit, self.ride)
