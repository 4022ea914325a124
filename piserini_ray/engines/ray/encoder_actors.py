"""Encoder actors: one model in memory per node for the queries of every replica there, and a
pool of them for building a dense index.

At run time the driver starts one `EncoderActor` per alive node and dense config, pinned to
that node (no CPU reserved: it mostly waits; `retrieval.dense.num_gpus` when the cluster has
GPUs) and named per job, so replicas find their node's encoder by name (a handle in a
constructor argument would break actor restarts, see `limiter_actor.py`). Concurrent query
encodings, from one replica's agent loops or from several replicas, are batched: a request
waits at most `dense.batch_wait` seconds for others to join, and requests that arrive while a
batch runs form the next one.

`ray_shard_encoder` is the Ray side of `dense_index.build_dense_index`: `dense.build_actors`
encoder actors (one CPU, or `num_gpus`, each; spread over the nodes) take shards as they free
up, and the driver writes each returned shard, so a build stopped anywhere resumes at the first
missing shard.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from piserini_ray.config import DenseConfig
from piserini_ray.engines.ray.readiness import (
    StartupError,
    actors_that_fit,
    check_feasible,
    nodes_that_fit,
    wait_until_up,
)
from piserini_ray.retrieval.dense_index import ShardEncoder
from piserini_ray.retrieval.encoder import encoder_identity


@ray.remote
class EncoderActor:
    def __init__(self, dense: DenseConfig, threads: int | None = None) -> None:
        from piserini_ray.retrieval.encoder import TextEncoder

        self.dense = dense
        self.encoder = TextEncoder(dense, threads)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")
        self._pending: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.batches: list[int] = []

    async def encode_query(self, text: str) -> np.ndarray:
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending.append((text, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        await asyncio.sleep(self.dense.batch_wait)  # let concurrent searches join the batch
        loop = asyncio.get_running_loop()
        while self._pending:
            size = self.dense.batch_size
            batch, self._pending = self._pending[:size], self._pending[size:]
            try:
                vectors = await loop.run_in_executor(
                    self._pool, self.encoder.encode_queries, [text for text, _ in batch]
                )
            except Exception as e:  # every waiter learns why, none hangs
                for _, future in batch:
                    future.set_exception(e)
                continue
            self.batches.append(len(batch))
            for (_, future), vector in zip(batch, vectors, strict=True):
                future.set_result(vector)

    async def encode_documents(self, texts: list[str]) -> np.ndarray:
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, self.encoder.encode_documents, texts
        )

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
            "batches": list(self.batches),
        }


def start_node_encoders(
    dense: DenseConfig, log: Callable[[str], None] = lambda _m: None
) -> tuple[dict[str, str], list[Any]]:
    """One query encoder per alive node that has `dense.num_gpus` GPUs (every node, on the
    CPU), up and holding its model when this returns (a model that cannot load fails here,
    before any replica starts): node id -> actor name, and the handles, which the caller holds
    for as long as the run needs them (an actor whose last handle is dropped ends, named or
    not). Replicas on a node without an encoder use another node's."""
    names, handles = {}, []
    prefix = f"piserini-encoder:{ray.get_runtime_context().get_job_id()}"
    key = encoder_identity(dense)[:12]
    nodes = nodes_that_fit({"GPU": dense.num_gpus})
    if not nodes:
        raise StartupError(
            f"retrieval.dense.num_gpus is {dense.num_gpus:g}, and no node of the cluster has "
            "that many GPUs: set it to 0 to encode on the CPU, or add GPU nodes"
        )
    for node_id in nodes:
        name = f"{prefix}:{node_id[:16]}:{key}"
        handle = EncoderActor.options(  # type: ignore[attr-defined]  # Ray types the class as is
            name=name,
            get_if_exists=True,
            num_cpus=0,
            num_gpus=dense.num_gpus,
            max_restarts=3,
            max_concurrency=1000,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(dense)
        names[node_id] = name
        handles.append(handle)
    wait_until_up([h.info.remote() for h in handles], "query encoders", log)
    return names, handles


class RemoteQueryEncoder:
    """A replica's view of its node's encoder actor. `prefetch` (awaited on the replica's
    event loop before a search runs) lets concurrent searches batch; the call itself, made on
    the tool thread, takes the prefetched vector or asks the actor directly."""

    def __init__(self, names: dict[str, str]) -> None:
        node = ray.get_runtime_context().get_node_id()
        # A node that joined after the run started has no encoder of its own: use any.
        self.actor = ray.get_actor(names.get(node) or next(iter(names.values())))
        self._ready: OrderedDict[str, np.ndarray] = OrderedDict()

    async def prefetch(self, text: str) -> None:
        if text not in self._ready:
            self._ready[text] = await self.actor.encode_query.remote(text)
            while len(self._ready) > 256:
                self._ready.popitem(last=False)

    def __call__(self, text: str) -> np.ndarray:
        vector = self._ready.pop(text, None)
        if vector is None:
            # On the tool thread of an async actor: its future, never `ray.get` (which Ray
            # refuses to see in such a process, "blocking ray.get inside async actor").
            vector = np.asarray(self.actor.encode_query.remote(text).future().result())
        return vector

    def encode_documents(
        self, shards: Iterable[tuple[int, list[str]]]
    ) -> Iterator[tuple[int, np.ndarray]]:
        """A shard encoder over this one actor (a replica building its node's dense index)."""
        for number, texts in shards:
            yield number, np.asarray(self.actor.encode_documents.remote(texts).future().result())


def shard_encoder_if_ray(dense: DenseConfig, log: Any = lambda _m: None) -> ShardEncoder | None:
    """`ray_shard_encoder` when this process has Ray up (`index --backend dense` starts it, a
    Ray engine has it), else None: the dense index is then encoded in this process."""
    return ray_shard_encoder(dense, log) if ray.is_initialized() else None


def ray_shard_encoder(dense: DenseConfig, log: Any = lambda _m: None) -> ShardEncoder:
    """Shards spread over `dense.build_actors` encoder actors, two in flight per actor."""

    def encode(shards: Iterable[tuple[int, list[str]]]) -> Iterator[tuple[int, np.ndarray]]:
        source = iter(shards)
        first = next(source, None)
        if first is None:  # nothing to encode: no actors (and no models loaded) for it
            return
        source = itertools.chain([first], source)
        check_feasible(
            {"CPU": 1, "GPU": dense.num_gpus},
            "dense-index encoder actors",
            "set retrieval.dense.num_gpus to 0 to encode on the CPU",
            log,
        )
        demand = {"CPU": 1, "GPU": dense.num_gpus}
        count = actors_that_fit(dense.build_actors, demand, "encoder actors", log)
        actors = [
            EncoderActor.options(  # type: ignore[attr-defined]
                num_cpus=1, num_gpus=dense.num_gpus, scheduling_strategy="SPREAD"
            ).remote(dense, 1)
            for _ in range(count)
        ]
        try:
            nodes = wait_until_up([a.info.remote() for a in actors], "encoder actors", log)
            log(
                f"{len(actors)} encoder actor(s) on {len({n['node'] for n in nodes})} node(s) "
                "encode the shards"
            )
            in_flight: dict[Any, tuple[int, Any]] = {}

            def feed(actor: Any) -> None:
                item = next(source, None)
                if item is not None:
                    in_flight[actor.encode_documents.remote(item[1])] = (item[0], actor)

            for actor in actors:
                feed(actor)
                feed(actor)
            while in_flight:
                ready, _ = ray.wait(list(in_flight), num_returns=1)
                number, actor = in_flight.pop(ready[0])
                feed(actor)
                yield number, np.asarray(ray.get(ready[0]))
        finally:
            for actor in actors:
                ray.kill(actor)

    return encode
