"""One `RateLimiter` per provider model, as a Ray actor every worker asks: limits that hold for
the whole cluster. The actor is owned by the driver's job and disappears with it."""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from piserini_ray.config import RateLimitConfig
from piserini_ray.llm.limiter import LimiterStats, Outcome, RateLimiter, caller_id, outcome_of
from piserini_ray.llm.retry import Failure


@ray.remote(num_cpus=0)
class LimiterActor:
    """Serial (a plain actor runs one call at a time), so the limiter needs no locking."""

    def __init__(self, config: RateLimitConfig) -> None:
        self.limiter = RateLimiter(config)

    def try_acquire(self, tokens: int, caller: str) -> tuple[bool, float]:
        return self.limiter.try_acquire(tokens, caller)

    def release(self, caller: str, outcome: Outcome, retry_after: float | None) -> None:
        self.limiter.release(caller, outcome, retry_after)

    def forget(self, caller: str) -> None:
        self.limiter.forget(caller)

    def stats(self) -> LimiterStats:
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

    async def acquire(self, estimated_tokens: int) -> None:
        caller = caller_id()
        try:
            while not self.gone:
                try:
                    granted, wait = await self.handle.try_acquire.remote(estimated_tokens, caller)
                except ActorUnavailableError:
                    granted, wait = False, 0.5  # restarting: ask again
                except (ActorDiedError, RayActorError):
                    self.gone = True
                    return
                if granted:
                    return
                await asyncio.sleep(min(wait, 1.0))
        except asyncio.CancelledError:
            if not self.gone:
                self.handle.forget.remote(caller)
            raise

    def report(self, failure: Failure | None) -> None:
        if not self.gone:
            self.handle.release.remote(caller_id(), *outcome_of(failure))


def start_limiter(name: str, config: RateLimitConfig) -> Any:
    """A limiter actor pinned to this (the driver's) node, restarted by Ray if it dies."""
    node = ray.get_runtime_context().get_node_id()
    return LimiterActor.options(
        name=name,
        max_restarts=-1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
    ).remote(config)
