"""One `RateLimiter` per provider model, as a Ray actor every worker asks: limits that hold for
the whole cluster. The actor is owned by the driver's job and disappears with it."""

from __future__ import annotations

import asyncio
from typing import Any

import ray

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
    """The LLM client's `Limiter` over a `LimiterActor` handle."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def acquire(self, estimated_tokens: int) -> None:
        caller = caller_id()
        try:
            while True:
                granted, wait = await self.handle.try_acquire.remote(estimated_tokens, caller)
                if granted:
                    return
                await asyncio.sleep(min(wait, 1.0))
        except asyncio.CancelledError:
            self.handle.forget.remote(caller)
            raise

    def report(self, failure: Failure | None) -> None:
        self.handle.release.remote(caller_id(), *outcome_of(failure))
