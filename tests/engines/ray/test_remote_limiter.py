"""A replica's limiter over the job's actor on the driver's node (`runtime/limiter_actor.
RemoteLimiter`), on a real Ray: a call's clean end rides on the next acquire of its key (one
round trip a model turn), one that no acquire takes is sent alone, and an end that says the
provider pushed back goes at once, after the ends that waited before it."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import ray
from helpers import wait_for

from piserini_ray.config import RateLimitConfig
from piserini_ray.engines.ray import limiter_actor
from piserini_ray.engines.ray.driver_services import driver_services
from piserini_ray.engines.ray.limiter_actor import RemoteLimiter
from piserini_ray.llm.failures import Failure, FailureKind
from piserini_ray.llm.limiter import LimiterStats

pytestmark = pytest.mark.usefixtures("module_ray")

#: Room for every call of these tests, and a cut to half the calls in flight on a rate limit.
CONFIG = RateLimitConfig(initial_concurrency=8, max_concurrency=8, decrease_factor=0.5)


def _limiter(ride: bool = True) -> RemoteLimiter:
    # A key of its own per test: the job's actor outlives each test.
    return RemoteLimiter(driver_services(start=True), f"test-{uuid.uuid4().hex}", CONFIG, ride)


def _stats(limiter: RemoteLimiter) -> LimiterStats:
    stats: LimiterStats = ray.get(limiter.handle.stats.remote(limiter.key), timeout=60)
    return stats


def test_a_clean_end_rides_on_the_next_acquire_and_a_flush_sends_what_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limiter_actor, "RIDE_SECONDS", 3600.0)  # no end goes alone here
    limiter = _limiter()

    async def turns() -> tuple[int, int, int]:
        first = await limiter.acquire(100)
        limiter.report(first, None, (100, 10))
        waiting = _stats(limiter).in_flight  # its end waits for a ride
        second = await limiter.acquire(100)  # ... and takes this one
        carried = _stats(limiter).in_flight
        limiter.report(second, None, (100, 10))
        before_flush = _stats(limiter).in_flight
        limiter.flush()
        return waiting, carried, before_flush

    waiting, carried, before_flush = asyncio.run(turns())
    assert (waiting, carried, before_flush) == (1, 1, 1)
    wait_for("the flushed end", lambda: _stats(limiter).in_flight == 0, deadline_s=60)
    assert _stats(limiter).granted == 2


def test_an_end_no_acquire_takes_goes_alone() -> None:
    limiter = _limiter()

    async def one_turn() -> None:
        limiter.report(await limiter.acquire(100), None, (100, 10))
        # The loop runs on: the end's own send comes from it.
        await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: wait_for("the end sent alone", lambda: _stats(limiter).in_flight == 0, 60),
        )

    asyncio.run(one_turn())


def test_a_rate_limit_goes_at_once_after_the_ends_that_waited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limiter_actor, "RIDE_SECONDS", 3600.0)
    limiter = _limiter()
    refused = Failure(FailureKind.RATE_LIMIT, "429", retry_after=30.0, status=429)

    async def three_calls() -> None:
        a, b, c = [await limiter.acquire(100) for _ in range(3)]
        limiter.report(a, None, (100, 10))
        limiter.report(b, None, (100, 10))
        limiter.report(c, refused)  # nothing acquires after it: it must not wait

    asyncio.run(three_calls())
    wait_for("the rate limit", lambda: _stats(limiter).rate_limited == 1, deadline_s=60)
    stats = _stats(limiter)
    assert stats.in_flight == 0
    # Cut to half of the calls in flight when it came: a and b had been released before it
    # (1 in flight: the floor of 1), not 3 (1.5).
    assert stats.limit == 1.0
    assert stats.cooldown_remaining > 0  # its Retry-After holds every caller


def test_without_ride_every_end_goes_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The driver's judges: their loops end with their judging, and an end left waiting for a
    # ride would hold its slot for good.
    monkeypatch.setattr(limiter_actor, "RIDE_SECONDS", 3600.0)
    limiter = _limiter(ride=False)

    async def one_turn() -> None:
        limiter.report(await limiter.acquire(100), None, (100, 10))

    asyncio.run(one_turn())
    wait_for("the end", lambda: _stats(limiter).in_flight == 0, deadline_s=60)
