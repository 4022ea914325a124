"""The cluster-wide rate limiters on Ray: one `RateLimiter` per quota key, all of a job's in
one pool (`Limiters`) inside the job's actor on the driver's node (`driver_services.py`), which
every worker asks. The actor is owned by the driver's job and disappears with it."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from piserini_ray.config import RateLimitConfig
from piserini_ray.errors import InfrastructureError, RequestTooLarge
from piserini_ray.llm.failures import Failure
from piserini_ray.llm.limiter import (
    LimiterStats,
    Outcome,
    RateLimiter,
    new_ticket,
    outcome_of,
)

#: The figures of a key not added.
_NONE = LimiterStats(
    in_flight=0, limit=0.0, waiting=0, granted=0, rate_limited=0, cooldown_remaining=0.0
)
#: `Limiters.acquire`'s answer for a quota key it does not hold (yet, or since a restart).
UNKNOWN = "unknown"
#: How long a call's clean end may wait to ride on the replica's next `acquire` of the same
#: key (one round trip a model turn instead of two); if none comes, it is sent alone. A
#: rate-limit or capacity answer is sent at once, with the ends that wait before it.
RIDE_SECONDS = 0.05
#: A call's end, as `Limiters.release` takes it: (ticket, outcome, retry_after, used).
Release = tuple[str, Outcome, float | None, tuple[int, int] | None]


class Limiters:
    """Every quota key's limiter, on one event loop (so they need no locking): a ticket's
    `acquire` is one call that returns when its slot is granted (waiters sleep on their key's
    condition, woken by every release), instead of thousands of polls.

    Keys are added by whoever first needs them (`add_limiter`, with the quota). After Ray restarted
    the actor (`restarted`), the pool has lost its windows: each key added again then admits
    nothing for one window (`RateLimiter.assume_window_full`), so a restart never doubles a
    quota."""

    def __init__(self, restarted: bool = False) -> None:
        self.restarted = restarted
        self.limiters: dict[str, RateLimiter] = {}
        self.released: dict[str, asyncio.Condition] = {}
        self.abandoned: set[str] = set()  # tickets are unique across keys

    async def add_limiter(self, key: str, config: RateLimitConfig) -> None:
        if key not in self.limiters:
            limiter = RateLimiter(config)
            if self.restarted:
                limiter.assume_window_full()
            self.limiters[key] = limiter
            self.released[key] = asyncio.Condition()

    async def acquire(
        self,
        key: str,
        tokens: int,
        ticket: str,
        max_output: int | None = None,
        ended: list[Release] | None = None,
    ) -> str:
        """Wait for a slot: "granted", "abandoned" (the ticket gave up meanwhile), `UNKNOWN`
        (no such key: add it, then ask again), or the message of a `RequestTooLarge` (raised
        again by the caller, not here: a Ray task error would hide its type). `ended`: the
        caller's calls of this key that ended since it last asked, released first."""
        await self.release_all(key, ended or [])
        limiter = self.limiters.get(key)
        if limiter is None:
            return UNKNOWN
        while True:
            if ticket in self.abandoned:
                self.abandoned.discard(ticket)
                limiter.forget(ticket)
                return "abandoned"
            try:
                granted, wait = limiter.try_acquire(tokens, ticket, max_output)
            except RequestTooLarge as e:
                return f"too large: {e}"
            if granted:
                return "granted"
            if limiter.last_denial == "concurrency":
                wait = 1.0  # a release wakes us; the timeout only guards against a lost one
            async with self.released[key]:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.released[key].wait(), timeout=wait)

    async def release(
        self,
        key: str,
        ticket: str,
        outcome: Outcome,
        retry_after: float | None,
        used: tuple[int, int] | None = None,
    ) -> None:
        await self.release_all(key, [(ticket, outcome, retry_after, used)])

    async def release_all(self, key: str, ended: list[Release]) -> None:
        """Give each slot back, in order, and wake the waiters once. A ticket released already
        (a call sent again after the actor restarted) is a no-op."""
        limiter = self.limiters.get(key)
        # No such key: granted before a restart, and the new window holds it already.
        if limiter is None or not ended:
            return
        for ticket, outcome, retry_after, used in ended:
            limiter.release(ticket, outcome, retry_after, *(used or (None, None)))
        async with self.released[key]:
            self.released[key].notify_all()

    async def abandon(self, key: str, ticket: str) -> None:
        """The ticket was cancelled: drop its wait, or give back the slot it may hold."""
        limiter = self.limiters.get(key)
        if limiter is None:
            return
        if limiter.holds(ticket):
            await self.release(key, ticket, "error", None)
        else:
            self.abandoned.add(ticket)

    async def stats(self, key: str) -> LimiterStats:
        """The key's figures (zeros for a key not added), with this process's pid."""
        limiter = self.limiters.get(key)
        found = limiter.stats() if limiter is not None else _NONE
        return found.model_copy(update={"pid": os.getpid(), "restarted": self.restarted})


class RemoteLimiter:
    """The LLM client's `Limiter` over the job's actor on the driver's node (`handle`), for
    one quota key (`key`, with its quota `config`, added there by the first call that finds
    it missing).

    Ray restarts that actor if its process dies: while it restarts, callers wait. If it is gone
    for good, a call never goes ahead unlimited: it raises `InfrastructureError`, and the
    scheduler runs the query again once it can.

    With `ride` (a replica's, whose event loop lives as long as it does), a call's clean end
    (`report`) rides on this process's next `acquire` of the key if one comes within
    `RIDE_SECONDS`, else goes alone: a model turn costs one round trip to the actor, not two.
    The slot is held that much longer (never a quota overfilled); an answer that slows the
    provider down (rate limit, quota, capacity) goes at once, after the ends before it, so the
    actor counts the calls really in flight; `flush` sends what waits (a replica, at each
    query's end: nothing waits when it goes). Without `ride` (the driver's judges, whose
    loops end with their judging), every end goes at once.
    """

    def __init__(self, handle: Any, key: str, config: RateLimitConfig, ride: bool = False) -> None:
        self.handle = handle
        self.key = key
        self.config = config
        self.ride = ride
        self._ended: list[Release] = []
        self._alone: asyncio.TimerHandle | None = None

    def _take_ended(self) -> list[Release]:
        if self._alone is not None:
            self._alone.cancel()
            self._alone = None
        ended, self._ended = self._ended, []
        return ended

    def flush(self) -> None:
        """Send the ends that wait for a ride."""
        self._send(self._take_ended())

    def _send(self, ended: list[Release]) -> None:
        if ended:
            self.handle.release_all.remote(self.key, ended)

    async def acquire(self, estimated_tokens: int, max_output: int | None = None) -> str:
        ticket = new_ticket()
        ended = self._take_ended()
        try:
            while True:
                try:
                    answer = await self.handle.acquire.remote(
                        self.key, estimated_tokens, ticket, max_output, ended
                    )
                    ended = []  # delivered: a call sent again would release nothing more
                    if answer == UNKNOWN:
                        await self.handle.add_limiter.remote(self.key, self.config)
                        continue
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
            self._send(ended)  # perhaps never delivered: sent again (a no-op if they were)
            self.handle.abandon.remote(self.key, ticket)
            raise

    def report(
        self, ticket: str, failure: Failure | None, used: tuple[int, int] | None = None
    ) -> None:
        outcome, retry_after = outcome_of(failure)
        self._ended.append((ticket, outcome, retry_after, used))
        if not self.ride or outcome not in ("ok", "error"):
            self.flush()  # no ride, or the provider pushed back: every caller must know now
        elif self._alone is None:
            loop = asyncio.get_running_loop()
            self._alone = loop.call_later(RIDE_SECONDS, self.flush)
