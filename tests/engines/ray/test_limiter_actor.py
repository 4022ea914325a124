"""The limiters of a job's actor on the driver's node (`runtime/limiter_actor.Limiters`), without
Ray: a key is added by whoever first needs it, and after a restart (the pool lost its windows)
a key added again admits nothing until a window has passed, so a restart never doubles a
quota."""

from __future__ import annotations

import asyncio

from piserini_ray.config import RateLimitConfig
from piserini_ray.engines.ray.limiter_actor import UNKNOWN, Limiters

QUOTA = RateLimitConfig(requests_per_minute=1000, window_seconds=60.0)


def _first_acquire(pool: Limiters) -> str:
    async def ask() -> str:
        try:  # a pool that admits nothing makes the caller wait: a short wait says so
            return await asyncio.wait_for(pool.acquire("k", 0, "t1"), timeout=0.5)
        except TimeoutError:
            return "waiting"

    return asyncio.run(ask())


def test_a_key_not_added_is_unknown_and_its_figures_are_zeros() -> None:
    pool = Limiters()
    assert asyncio.run(pool.acquire("k", 0, "t1")) == UNKNOWN
    assert asyncio.run(pool.stats("k")).granted == 0


def test_a_restarted_pool_admits_nothing_for_a_window_and_a_fresh_one_admits_at_once() -> None:
    fresh, restarted = Limiters(), Limiters(restarted=True)
    for pool in (fresh, restarted):
        asyncio.run(pool.add_limiter("k", QUOTA))
    assert _first_acquire(fresh) == "granted"
    assert _first_acquire(restarted) == "waiting"
    assert asyncio.run(restarted.stats("k")).restarted
