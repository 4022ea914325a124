"""Admission control for one provider model: quotas, adaptive concurrency and a shared cooldown.

`RateLimiter` is plain Python with an injectable clock, so its rules are tested without Ray; the
Ray runtime wraps one instance per model in an actor that every worker on every node asks, which
makes the limits cluster-wide.

- **Quotas**: requests and tokens per window. A granted request counts from its grant until one
  window (plus a small margin) after its call *returned*: the provider saw it arrive somewhere
  in between, so a provider counting arrivals over a sliding window never sees more than the
  quota, however long a request took to leave the client or to come back. Token reservations
  are the caller's estimate scaled by what the provider has been counting (`token_scale`), and
  a returned call counts with the provider's own figure.
- **Adaptive concurrency (AIMD)**: at most `limit` requests in flight; a 429 sets the limit to
  `decrease_factor` x the calls in flight at that moment (not x the nominal limit, which may be
  far above what was actually sent), each clean period without one adds one (the idea inspect_ai
  applies per process, here shared by every worker).
- **Cooldown**: a `Retry-After` from the provider holds every caller until it has passed.
- **Tickets**: every grant has its own id, and the release names it. (Keyed by caller instead,
  a caller's next `acquire` could reach the cluster-wide actor before its previous `release`,
  which Ray does not order for async actors, and two calls would count as one: quotas would
  overfill.)
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel

from piserini_ray.config import RateLimitConfig
from piserini_ray.llm.retry import Failure, FailureKind

Outcome = Literal["ok", "rate_limit", "error"]
#: Weight of the newest call in the moving average of provider tokens per estimated token.
TOKEN_SCALE_WEIGHT = 0.1


class LimiterStats(BaseModel):
    in_flight: int
    limit: float
    waiting: int
    granted: int
    rate_limited: int
    cooldown_remaining: float


class RateLimiter:
    def __init__(self, config: RateLimitConfig, now: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._now = now
        #: ticket -> (tokens reserved, caller's estimate) of a call in flight; (end time,
        #: tokens) of calls that returned.
        self._open: dict[str, tuple[int, int]] = {}
        self._closed: deque[tuple[float, int]] = deque()
        # Running totals of the two, kept with them: every grant checks the token quota.
        self._open_tokens = 0
        self._closed_tokens = 0
        initial = config.initial_concurrency or config.max_concurrency
        self.limit = float(min(initial, config.max_concurrency))
        self._cooldown_until = 0.0
        self._last_decrease = now()
        self._last_increase = now()
        self._waiting: set[str] = set()
        #: Why the last `try_acquire` was refused: cooldown, concurrency or quota.
        self.last_denial: str | None = None
        self.granted = 0
        self.rate_limited = 0
        #: Provider-counted tokens per estimated token, learned from releases (a moving
        #: average): callers estimate roughly (about 4 characters a token) and a systematic
        #: underestimate would let in-flight calls overfill a token quota.
        self.token_scale = 1.0

    def _expire(self, now: float) -> None:
        horizon = now - (self.config.window_seconds + self.config.window_margin)
        while self._closed and self._closed[0][0] <= horizon:
            self._closed_tokens -= self._closed.popleft()[1]

    def try_acquire(self, tokens: int = 0, ticket: str = "") -> tuple[bool, float]:
        """(granted, seconds to wait before asking again). A grant takes one in-flight slot,
        which `release(ticket, ...)` gives back."""
        now = self._now()
        self._expire(now)
        self._grow(now)
        wait = 0.0
        in_flight = len(self._open)
        reserve = math.ceil(tokens * self.token_scale)
        self.last_denial = None
        if now < self._cooldown_until:
            wait = self._cooldown_until - now
            self.last_denial = "cooldown"
        elif in_flight >= math.floor(self.limit):
            wait = 0.05  # a slot frees when a call returns; ask again soon
            self.last_denial = "concurrency"
        else:
            rpm, tpm = self.config.requests_per_minute, self.config.tokens_per_minute
            counted = in_flight + len(self._closed)
            counted_tokens = self._open_tokens + self._closed_tokens
            over_requests = rpm is not None and counted >= rpm
            over_tokens = tpm is not None and counted and counted_tokens + reserve > tpm
            if over_requests or over_tokens:
                span = self.config.window_seconds + self.config.window_margin
                wait = self._closed[0][0] + span - now if self._closed else 0.05
                self.last_denial = "quota"
        if wait > 0:
            self._waiting.add(ticket)
            return False, max(wait, 0.01)
        self._waiting.discard(ticket)
        self._open[ticket] = (reserve, tokens)
        self._open_tokens += reserve
        self.granted += 1
        return True, 0.0

    def release(
        self,
        ticket: str = "",
        outcome: Outcome = "ok",
        retry_after: float | None = None,
        tokens: int | None = None,
    ) -> None:
        """Give the ticket's slot back and learn from how the call went. `tokens`: what the
        call really used (prompt + completion, from the provider's usage); it replaces the
        reservation the slot was granted with, so a token quota is filled by real counts, and
        it teaches `token_scale` how far off the callers' estimates are."""
        now = self._now()
        in_flight = len(self._open)  # this call included
        if ticket in self._open:
            reserved, estimate = self._open.pop(ticket)
            if tokens is not None and estimate > 0:
                ratio = min(max(tokens / estimate, 0.1), 10.0)
                self.token_scale += TOKEN_SCALE_WEIGHT * (ratio - self.token_scale)
            counted = reserved if tokens is None else tokens
            self._open_tokens -= reserved
            self._closed_tokens += counted
            self._closed.append((now, counted))
        if outcome == "rate_limit":
            self.rate_limited += 1
            sent = min(self.limit, max(in_flight, 1))
            self.limit = max(float(self.config.min_concurrency), sent * self.config.decrease_factor)
            self._last_decrease = self._last_increase = now
            if retry_after:
                self._cooldown_until = max(self._cooldown_until, now + retry_after)

    def _grow(self, now: float) -> None:
        if now - max(self._last_decrease, self._last_increase) >= self.config.clean_period:
            self.limit = min(float(self.config.max_concurrency), self.limit + 1)
            self._last_increase = now

    def forget(self, ticket: str) -> None:
        self._waiting.discard(ticket)

    def holds(self, ticket: str) -> bool:
        """Whether the ticket has a call in flight (a granted, unreleased slot)."""
        return ticket in self._open

    def stats(self) -> LimiterStats:
        now = self._now()
        return LimiterStats(
            in_flight=len(self._open),
            limit=round(self.limit, 2),
            waiting=len(self._waiting),
            granted=self.granted,
            rate_limited=self.rate_limited,
            cooldown_remaining=round(max(0.0, self._cooldown_until - now), 3),
        )


def outcome_of(failure: Failure | None) -> tuple[Outcome, float | None]:
    """How a call ended, in the limiter's terms."""
    if failure is None:
        return "ok", None
    if failure.kind is FailureKind.RATE_LIMIT:
        return "rate_limit", failure.retry_after
    return "error", None


class LocalLimiter:
    """The client's `Limiter` over a `RateLimiter` in this process (one asyncio loop)."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    async def acquire(self, estimated_tokens: int) -> str:
        ticket = new_ticket()
        try:
            while True:
                granted, wait = self.limiter.try_acquire(estimated_tokens, ticket)
                if granted:
                    return ticket
                await asyncio.sleep(min(wait, 1.0))
        except asyncio.CancelledError:
            self.limiter.forget(ticket)
            raise

    def report(self, ticket: str, failure: Failure | None, tokens: int | None = None) -> None:
        self.limiter.release(ticket, *outcome_of(failure), tokens=tokens)


def new_ticket() -> str:
    """A grant's id, unique across processes and nodes."""
    return uuid.uuid4().hex
