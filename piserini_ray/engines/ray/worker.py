"""The searcher replica: a Ray actor with its own JVM and BM25 searcher, running many agent
loops at once.

The searcher is built inside the actor (never pickled), on the one thread that makes every JVM
call, so blocking Lucene work stays off the event loop where the agent loops wait on the model.
A replica serves any run that uses its benchmark and retrieval settings; everything specific to
a run (model, budget, tools, run ids) comes with each query.

Start-up does at once what can be done at once: the model client's modules (litellm: seconds
of imports, not needed to open an index) load on a thread of their own, the JVM boots on the
JVM thread, and a start-up thread finds or fetches the index meanwhile (`shipping.py`), then has
the JVM thread open it. The constructor only starts them, so the replica answers `where` at
once and its node's model check (`check_model`: a model call, mostly waiting) runs while the
searcher still opens; `info` answers once it is open. So this module imports none of them at
its top: a new worker loads it before the constructor can start anything.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from pydantic import BaseModel, SecretStr

from piserini_ray import warm
from piserini_ray.config import (
    AgentConfig,
    BenchmarkConfig,
    ModelConfig,
    OfflineConfig,
    RetrievalConfig,
    RetryConfig,
    ToolsConfig,
)
from piserini_ray.data import Query, load_benchmark
from piserini_ray.engines.ray.background import on_thread
from piserini_ray.engines.ray.driver_services import RayLimiters, driver_services
from piserini_ray.engines.ray.encoder_actors import RemoteQueryEncoder
from piserini_ray.engines.ray.identity import code_identity
from piserini_ray.engines.ray.limiter_actor import RemoteLimiter
from piserini_ray.engines.ray.relay import Relay
from piserini_ray.engines.ray.shipping import IndexSource, local_index
from piserini_ray.retrieval import ensure_index
from piserini_ray.retrieval.backends import SearchBackend, open_backend
from piserini_ray.retrieval.jvm import boot_jvm, class_archive_mapped
from piserini_ray.tools import ToolResult, ToolSession, tool_schemas
from piserini_ray.tools.session import search_query

if TYPE_CHECKING:
    from piserini_ray.llm.client import LLMClient

#: What the agent loops and the model check need, loaded at start-up on a thread of their own:
#: the third-party modules a warm worker preloaded (`warm.MODULES`: at once there, seconds
#: elsewhere), then ours.
MODEL_MODULES = (
    *warm.MODULES,
    "piserini_ray.agent.loop",
    "piserini_ray.llm.client_builder",
    "piserini_ray.llm.check",
    "piserini_ray.engines.ray.batcher_actor",
)


def _load_model_modules() -> None:
    for name in MODEL_MODULES:
        importlib.import_module(name)
    warm.first_call()  # off the event loop, before the model check's call needs them


#: Key values by variable name, handed by the driver (`secrets.driver_keys`).
Keys = dict[str, SecretStr]


class QueryJob(BaseModel):
    """One query of one run, as sent to a replica. Never with the model's key: that comes as
    a task argument of its own (`SearchWorker.run(job, keys)`), which Ray inlines in the call's
    message, while a job over Ray's 100 KiB inline limit (a long query) is put in the object
    store, which spills to disk when full."""

    run_id: str
    config_hash: str
    query: Query
    model: ModelConfig
    retry: RetryConfig
    agent: AgentConfig
    tools: ToolsConfig
    offline: OfflineConfig  # names an offline model's quota key
    api_base: str | None = None
    #: Whether `api_base` is a loopback endpoint of the driver's node that this replica, on
    #: another node, reaches through its relay (`relay.py`).
    relay: bool = False
    #: The epoch's `seed` request parameter (`EpochsConfig.request_seed`).
    seed: int | None = None
    #: The name of the run's batcher actor (`model.service_tier: batch`).
    batcher: str | None = None


def stamped(message: str) -> str:
    """`message` with the wall-clock time (UTC, ms) it is said at: Ray forwards a worker's
    output to the driver up to a second late, and bench/two_hosts.py reads a node's start-up
    phases from these lines."""
    now = time.time()
    clock = time.strftime("%H:%M:%S", time.gmtime(now))
    return f"[piserini-ray] {clock}.{int(now % 1 * 1000):03d} {message}"


def _say(message: str) -> None:
    where = f"replica on {ray.util.get_node_ip_address()} pid {os.getpid()}"
    print(stamped(f"{where}: {message}"), flush=True)


def _boot(heap: str) -> None:
    began = time.monotonic()
    boot_jvm(heap)
    archive = "class archive mapped" if class_archive_mapped() else "no class archive"
    _say(f"JVM up in {time.monotonic() - began:.2f} s ({archive})")


def _shipped(source: IndexSource) -> Path:
    began = time.monotonic()
    index = local_index(source, _say)
    _say(f"index ready in {time.monotonic() - began:.2f} s")
    return index


@ray.remote
class SearchWorker:
    def __init__(
        self,
        benchmark: BenchmarkConfig,
        retrieval: RetrievalConfig,
        encoders: dict[str, str] | None = None,
        source: IndexSource | None = None,
    ) -> None:
        """`encoders`: node id -> name of that node's query encoder actor (dense backends).
        `source`: where the driver's index is (shipped here if this node lacks it); None:
        build it here from the corpus."""
        began = time.monotonic()
        _say("worker started")
        self._first: float | None = None
        self._clients: dict[str, LLMClient] = {}
        self._relays: dict[str, Relay] = {}  # by the endpoint they reach (`QueryJob.relay`)
        self._services: Any = None  # the job's actor on the driver's node, once looked up
        #: A stop event per run id (`stop_run`): its queries here end as retryable.
        self._stops: dict[str, asyncio.Event] = {}
        #: Where each moved server of a served model is now, by its old address (`redirect`).
        self._moved: dict[str, str] = {}
        # A failed import is raised where the module is used (the check, the first query).
        self._imports = on_thread(_load_model_modules, "imports")
        self._jvm = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jvm")
        self._encoder = RemoteQueryEncoder(encoders) if encoders else None
        jvm = self._jvm.submit(_boot, retrieval.jvm_heap)  # boots while the index is fetched

        def start() -> SearchBackend:
            index = _shipped(source) if source is not None else None
            jvm.result()
            searcher: SearchBackend = self._jvm.submit(
                self._open, benchmark, retrieval, self._encoder, index
            ).result()
            _say(f"searcher open, {time.monotonic() - began:.2f} s after the worker started")
            return searcher

        self._opening = on_thread(start, "start-up")

    async def _searcher(self) -> SearchBackend:
        """The searcher, once open; a failure to open it (a damaged index, a missing corpus)
        is raised here, to whoever asks first and again to everyone after."""
        searcher: SearchBackend = await asyncio.wrap_future(self._opening)
        return searcher

    @staticmethod
    def _open(
        benchmark: BenchmarkConfig,
        retrieval: RetrievalConfig,
        encoder: RemoteQueryEncoder | None,
        index: Path | None,
    ) -> SearchBackend:
        """On the JVM thread: the index opened (`index`: shipped or found; None: built here
        from the corpus)."""
        if index is None:
            began = time.monotonic()
            index = ensure_index(load_benchmark(benchmark).corpus, retrieval)
            _say(f"index ready in {time.monotonic() - began:.2f} s (built here)")
        if encoder is None:
            return open_backend(index, retrieval)
        # A node without the dense index builds it with its own encoder actor.
        return open_backend(index, retrieval, encoder, build_with=encoder.encode_documents)

    def where(self) -> dict[str, Any]:
        """Where this replica runs, answered as soon as it is constructed (before its searcher
        is open): the driver sends the node's model check on it."""
        return {
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
        }

    async def info(self) -> dict[str, Any]:
        """`where`, once the searcher is open, with its document count and the code identity:
        the replica's readiness."""
        searcher = await self._searcher()
        return {**self.where(), "documents": searcher.num_docs, "code": code_identity()}

    async def check_model(self, job: QueryJob, keys: Keys) -> str | None:
        """The one-word check (`llm/check.py`) from this replica's node, with the key and
        endpoint its queries will use: None when the model answers, else why not. `keys`: the
        driver's, in memory only (`QueryJob`). Runs while the searcher still opens."""
        began = time.monotonic()
        await asyncio.wrap_future(self._imports)  # never import beside the import thread
        from piserini_ray.llm.check import PROMPT, probe_model
        from piserini_ray.llm.client_builder import build_client
        from piserini_ray.llm.failures import RetryError

        client = build_client(
            probe_model(job.model),
            job.retry.model_copy(update={"max_attempts": 1}),
            job.offline,
            api_base=await self._api_base(job),
            limiters=None,
            keys=keys,
        )
        try:
            await client.complete(PROMPT)
        except RetryError as error:
            _say(f"model check of {job.model.name} failed in {time.monotonic() - began:.2f} s")
            return str(error)
        _say(f"model check of {job.model.name} answered in {time.monotonic() - began:.2f} s")
        return None

    def _driver_services(self) -> Any:
        """The job's actor on the driver's node (limiters, relayed requests), looked up once:
        a blocking lookup, so called off the event loop."""
        if self._services is None:
            self._services = driver_services()
        return self._services

    async def redirect(self, old: str, new: str) -> None:
        """A served model's server moved from `old` to `new` (`model_servers.py`): the calls in
        flight to it here are retried there, and every later job for `old` goes there too."""
        self._moved = {was: new if now == old else now for was, now in self._moved.items()}
        self._moved[old] = new
        moved = [client for client in self._clients.values() if client.api_base == old]
        for client in moved:
            client.move(new)
        _say(f"model server moved from {old} to {new} ({len(moved)} client(s) follow)")

    async def _api_base(self, job: QueryJob) -> str | None:
        """The URL this replica's client calls for `job.api_base`: its relay's, if relayed;
        where a served model's server moved to, if it did (`redirect`)."""
        if job.api_base in self._moved:
            return self._moved[job.api_base]
        if not job.relay or job.api_base is None:
            return job.api_base
        if job.api_base not in self._relays:
            self._relays[job.api_base] = Relay(job.api_base, self._driver_services)
        return await self._relays[job.api_base].url()

    async def _client(self, job: QueryJob, keys: Keys) -> LLMClient:
        from piserini_ray.engines.ray.batcher_actor import RayBatcher
        from piserini_ray.llm.client_builder import build_client

        # Both awaited before the lookup below: no await after it.
        api_base = await self._api_base(job)
        services = self._services or await asyncio.to_thread(self._driver_services)
        settings = [m.model_dump_json() for m in (job.model, job.retry, job.offline)]
        # In memory only; a rotated key gets a new client.
        handed = [f"{k}={v.get_secret_value()}" for k, v in sorted(keys.items())]
        key = "|".join(
            [
                *settings,
                str(api_base),
                str(job.seed),
                str(job.batcher),
                *handed,
            ]
        )
        if key not in self._clients:
            self._clients[key] = build_client(
                job.model,
                job.retry,
                job.offline,
                api_base=api_base,
                limiters=RayLimiters(services=services, ride=True),
                keys=keys,
                seed=job.seed,
            )
            if job.batcher is not None:
                self._clients[key].batcher = RayBatcher(job.batcher)
        return self._clients[key]

    async def _run_tool(self, session: ToolSession, name: str, arguments: str) -> ToolResult:
        if self._encoder is not None and name == "search" and (text := search_query(arguments)):
            # Encoded here, on the event loop, so concurrent searches batch at the encoder.
            await self._encoder.prefetch(text)
        return await asyncio.get_running_loop().run_in_executor(
            self._jvm, session.call, name, arguments
        )

    async def stop_run(self, run_id: str) -> None:
        """The run `run_id` was stopped (`piserini-ray stop`): its queries in flight here end
        now, as retryable failures with their spend on record (a query of it that still comes
        ends at once: the driver sends none after this)."""
        self._stop(run_id).set()

    def _stop(self, run_id: str) -> asyncio.Event:
        if run_id not in self._stops:
            self._stops[run_id] = asyncio.Event()
        return self._stops[run_id]

    async def run(self, job: QueryJob, keys: Keys) -> dict[str, Any]:
        """Run one query to its record (as JSON-ready data), with the driver's `keys`."""
        await asyncio.wrap_future(self._imports)  # never import beside the import thread
        from piserini_ray.agent.loop import run_query

        # No spill folder here: the spill texts ride back with the record and the driver's
        # store writes them into the run directory (this replica may sit on another node).
        session = ToolSession(await self._searcher(), job.tools)
        first = self._first is None
        if first:
            self._first = time.monotonic()
            _say("first query started")
        client = await self._client(job, keys)
        try:
            record = await run_query(
                job.query,
                session,
                client,
                job.agent,
                tool_schemas(job.tools),
                run_id=job.run_id,
                config_hash=job.config_hash,
                tool_runner=self._run_tool,
                stop=self._stop(job.run_id),
            )
        finally:
            if isinstance(client.limiter, RemoteLimiter):
                client.limiter.flush()  # its last call's end: none waits once the query ends
        if first:
            _say(f"first query done in {time.monotonic() - (self._first or 0.0):.2f} s")
        return record.model_dump(mode="json")
