"""One `RateLimiter` per provider model, as a Ray actor every worker asks: limits that hold for
the whole cluster. The actor is owned by the driver's job and disappears with it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from piserini_ray.config import RateLimitConfig
from piserini_ray.llm.limiter import LimiterStats, Outcome, RateLimiter, new_ticket, outcome_of
from piserini_ray.llm.retry import Failure


@ray.remote(num_cpus=0, max_concurrency=100_000)  # type: ignore[call-overload]
class LimiterActor:
    """An async actor: a ticket's `acquire` is one call that returns when its slot is granted
    (waiters sleep on a condition, woken by every release), instead of thousands of polls.
    All methods run on the actor's one event loop, so the limiter needs no locking."""

    def __init__(self, config: RateLimitConfig) -> None:
        self.limiter = RateLimiter(config)
        self.released = asyncio.Condition()
        self.abandoned: set[str] = set()

    async def acquire(self, tokens: int, ticket: str) -> bool:
        """Wait for a slot; False if the ticket gave up meanwhile."""
        while True:
            if ticket in self.abandoned:
                self.abandoned.discard(ticket)
                self.limiter.forget(ticket)
                return False
            granted, wait = self.limiter.try_acquire(tokens, ticket)
            if granted:
                return True
            if self.limiter.last_denial == "concurrency":
                wait = 1.0  # a release wakes us; the timeout only guards against a lost one
            async with self.released:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.released.wait(), timeout=wait)

    async def release(
        self, ticket: str, outcome: Outcome, retry_after: float | None, tokens: int | None = None
    ) -> None:
        self.limiter.release(ticket, outcome, retry_after, tokens)
        async with self.released:
            self.released.notify_all()

    async def abandon(self, ticket: str) -> None:
        """The ticket was cancelled: drop its wait, or give back the slot it may hold."""
        if self.limiter.holds(ticket):
            await self.release(ticket, "error", None)
        else:
            self.abandoned.add(ticket)

    async def stats(self) -> LimiterStats:
        return self.limiter.stats()


class RemoteLimiter:
    """The LLM client's `Limiter` over a `LimiterActor` handle.

    The limiter lives on the driver's node and is restarted by Ray if its process dies (it then
    starts afresh). While it restarts, callers wait; if it is gone for good, calls go ahead
    unlimited (the provider's own 429s still slow them down) rather than fail queries.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.gone = False

    async def acquire(self, estimated_tokens: int) -> str:
        ticket = new_ticket()
        try:
            while not self.gone:
                try:
                    if await self.handle.acquire.remote(estimated_tokens, ticket):
                        return ticket
                except ActorUnavailableError:
                    await asyncio.sleep(0.5)  # restarting: ask again
                except (ActorDiedError, RayActorError):
                    self.gone = True
        except asyncio.CancelledError:
            if not self.gone:
                self.handle.abandon.remote(ticket)
            raise
        return ticket  # the limiter is gone for good: unlimited

    def report(self, ticket: str, failure: Failure | None, tokens: int | None = None) -> None:
        if not self.gone:
            self.handle.release.remote(ticket, *outcome_of(failure), tokens)


def start_limiter(name: str, config: RateLimitConfig) -> Any:
    """A limiter actor pinned to this (the driver's) node, restarted by Ray if it dies."""
    node = ray.get_runtime_context().get_node_id()
    return LimiterActor.options(  # type: ignore[attr-defined]  # Ray types the class as is
        name=name,
        max_restarts=-1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
    ).remote(config)
