"""One `RateLimiter` per provider model, as a Ray actor every worker asks: limits that hold for
the whole cluster. The actor is owned by the driver's job and disappears with it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import warnings
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from piserini_ray.config import ModelConfig, RateLimitConfig
from piserini_ray.config.offline import OfflineConfig
from piserini_ray.errors import InfrastructureError, RequestTooLarge
from piserini_ray.llm.failures import Failure
from piserini_ray.llm.limiter import (
    LimiterStats,
    Outcome,
    RateLimiter,
    new_ticket,
    outcome_of,
    quota_key,
)


@ray.remote(num_cpus=0, max_concurrency=100_000)  # type: ignore[call-overload]
class LimiterActor:
    """An async actor: a ticket's `acquire` is one call that returns when its slot is granted
    (waiters sleep on a condition, woken by every release), instead of thousands of polls.
    All methods run on the actor's one event loop, so the limiter needs no locking.

    Restarted by Ray after a crash, it has lost its window: it then admits nothing for one
    window (`RateLimiter.assume_window_full`), so a restart never doubles a quota."""

    def __init__(self, config: RateLimitConfig) -> None:
        self.limiter = RateLimiter(config)
        with warnings.catch_warnings():  # Ray's property reads its own deprecated actor_id
            warnings.simplefilter("ignore")
            self.restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        if self.restarted:
            self.limiter.assume_window_full()
        self.released = asyncio.Condition()
        self.abandoned: set[str] = set()

    async def acquire(self, tokens: int, ticket: str, max_output: int | None = None) -> str:
        """Wait for a slot: "granted", "abandoned" (the ticket gave up meanwhile), or the
        message of a `RequestTooLarge` (raised again by the caller, not here: a Ray task
        error would hide its type)."""
        while True:
            if ticket in self.abandoned:
                self.abandoned.discard(ticket)
                self.limiter.forget(ticket)
                return "abandoned"
            try:
                granted, wait = self.limiter.try_acquire(tokens, ticket, max_output)
            except RequestTooLarge as e:
                return f"too large: {e}"
            if granted:
                return "granted"
            if self.limiter.last_denial == "concurrency":
                wait = 1.0  # a release wakes us; the timeout only guards against a lost one
            async with self.released:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.released.wait(), timeout=wait)

    async def release(
        self,
        ticket: str,
        outcome: Outcome,
        retry_after: float | None,
        used: tuple[int, int] | None = None,
    ) -> None:
        self.limiter.release(ticket, outcome, retry_after, *(used or (None, None)))
        async with self.released:
            self.released.notify_all()

    async def abandon(self, ticket: str) -> None:
        """The ticket was cancelled: drop its wait, or give back the slot it may hold."""
        if self.limiter.holds(ticket):
            await self.release(ticket, "error", None)
        else:
            self.abandoned.add(ticket)

    async def stats(self) -> LimiterStats:
        return self.limiter.stats().model_copy(
            update={"pid": os.getpid(), "restarted": self.restarted}
        )


class RemoteLimiter:
    """The LLM client's `Limiter` over a `LimiterActor` handle.

    The limiter lives on the driver's node and is restarted by Ray if its process dies: while
    it restarts, callers wait. If it is gone for good, a call never goes ahead unlimited: it
    raises `InfrastructureError`, and the scheduler runs the query again once it can.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def acquire(self, estimated_tokens: int, max_output: int | None = None) -> str:
        ticket = new_ticket()
        try:
            while True:
                try:
                    answer = await self.handle.acquire.remote(estimated_tokens, ticket, max_output)
                except ActorUnavailableError:
                    await asyncio.sleep(0.5)  # restarting: ask again
                    continue
                except (ActorDiedError, RayActorError) as e:
                    raise InfrastructureError(
                        f"the rate limiter of this model is gone ({type(e).__name__}); the "
                        "query is not sent unlimited"
                    ) from None
                if answer == "granted":
                    return ticket
                if answer.startswith("too large: "):
                    raise RequestTooLarge(answer.removeprefix("too large: "))
        except asyncio.CancelledError:
            self.handle.abandon.remote(ticket)
            raise

    def report(
        self, ticket: str, failure: Failure | None, used: tuple[int, int] | None = None
    ) -> None:
        self.handle.release.remote(ticket, *outcome_of(failure), used)


def job_limiter_prefix() -> str:
    """Limiter actors are named per job, so replicas find them by name (handles in constructor
    arguments would put those arguments in the object store, which breaks actor restarts)."""
    return f"piserini-limiter:{ray.get_runtime_context().get_job_id()}:"


def limiter_name(prefix: str, model: ModelConfig, offline: OfflineConfig) -> str:
    """The actor name of a model's limiter: one per quota key (see `llm.limiter.quota_key`)."""
    return prefix + quota_key(model, offline)


#: Handles of the limiters this driver started, by (driver's node id, name): Ray ends an actor
#: whose last handle is gone, and a limiter must live as long as the job (a run's judge uses it
#: after the run). Node ids are unique per Ray start, so a later Ray never gets a stale handle.
_STARTED: dict[tuple[str, str], Any] = {}


def start_limiter(name: str, config: RateLimitConfig) -> Any:
    """The named limiter actor (started, or the running one), pinned to this (the driver's)
    node, restarted by Ray if it dies, and kept for as long as this job runs."""
    node = ray.get_runtime_context().get_node_id()
    key = (node, name)
    if key in _STARTED:
        return _STARTED[key]
    _STARTED[key] = LimiterActor.options(  # type: ignore[attr-defined]  # Ray types the class as is
        name=name,
        get_if_exists=True,
        max_restarts=-1,
        # A call in flight when the actor died is sent again to its successor (an acquire
        # waits on, a release of a ticket the new one never granted is a no-op).
        max_task_retries=-1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
    ).remote(config)
    return _STARTED[key]


class RayLimiters:
    """The limiter registry on Ray (`llm.limiter.LimiterRegistry`): the cluster-wide actor of
    each quota key, found by its name. The driver starts them (`start=True`: a run's models
    and judges); replicas only look them up (the driver started them before any query)."""

    def __init__(self, prefix: str | None = None, start: bool = False) -> None:
        self.prefix = prefix if prefix is not None else job_limiter_prefix()
        self.start = start

    def limiter(self, model: ModelConfig, offline: OfflineConfig) -> RemoteLimiter:
        name = self.name(model, offline)
        handle = start_limiter(name, model.rate_limit) if self.start else ray.get_actor(name)
        return RemoteLimiter(handle)

    def name(self, model: ModelConfig, offline: OfflineConfig) -> str:
        return limiter_name(self.prefix, model, offline)
