"""Admission control for one provider model: quotas, adaptive concurrency and a shared cooldown.

`RateLimiter` is plain Python with an injectable clock, so its rules are tested without Ray; the
Ray runtime wraps one instance per model in an actor that every worker on every node asks, which
makes the limits cluster-wide.

- **Quotas**: requests and tokens per window, counted over a sliding window (plus a small
  margin) of granted requests, so a provider that counts arrivals the same way never sees more
  than the quota, whatever the jitter between our grant and its arrival.
- **Adaptive concurrency (AIMD)**: at most `limit` requests in flight; a 429 multiplies the limit
  by `decrease_factor`, each clean period without one adds one (the idea inspect_ai applies per
  process, here shared by every worker).
- **Cooldown**: a `Retry-After` from the provider holds every caller until it has passed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel

from piserini_ray.config import RateLimitConfig
from piserini_ray.llm.retry import Failure, FailureKind

Outcome = Literal["ok", "rate_limit", "error"]


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
        self._window: deque[tuple[float, int]] = deque()  # (grant time, tokens)
        self._window_tokens = 0
        self.limit = float(min(config.initial_concurrency, config.max_concurrency))
        self.in_flight = 0
        self._cooldown_until = 0.0
        self._last_decrease = now()
        self._last_increase = now()
        self._waiting: set[str] = set()
        self.granted = 0
        self.rate_limited = 0

    def _expire(self, now: float) -> None:
        horizon = now - (self.config.window_seconds + self.config.window_margin)
        while self._window and self._window[0][0] <= horizon:
            self._window_tokens -= self._window.popleft()[1]

    def try_acquire(self, tokens: int = 0, caller: str = "") -> tuple[bool, float]:
        """(granted, seconds to wait before asking again). A grant takes one in-flight slot,
        which `release` gives back."""
        now = self._now()
        self._expire(now)
        self._grow(now)
        wait = 0.0
        if now < self._cooldown_until:
            wait = self._cooldown_until - now
        elif self.in_flight >= math.floor(self.limit):
            wait = 0.05  # a slot frees when a call returns; ask again soon
        else:
            span = self.config.window_seconds + self.config.window_margin
            rpm, tpm = self.config.requests_per_minute, self.config.tokens_per_minute
            over_requests = rpm is not None and len(self._window) >= rpm
            over_tokens = tpm is not None and self._window_tokens + tokens > tpm
            if self._window and (over_requests or over_tokens):
                wait = self._window[0][0] + span - now
        if wait > 0:
            self._waiting.add(caller)
            return False, max(wait, 0.01)
        self._waiting.discard(caller)
        self._window.append((now, tokens))
        self._window_tokens += tokens
        self.in_flight += 1
        self.granted += 1
        return True, 0.0

    def release(self, outcome: Outcome = "ok", retry_after: float | None = None) -> None:
        """Give the slot back and learn from how the call went."""
        now = self._now()
        self.in_flight = max(0, self.in_flight - 1)
        if outcome == "rate_limit":
            self.rate_limited += 1
            self.limit = max(
                float(self.config.min_concurrency), self.limit * self.config.decrease_factor
            )
            self._last_decrease = self._last_increase = now
            if retry_after:
                self._cooldown_until = max(self._cooldown_until, now + retry_after)

    def _grow(self, now: float) -> None:
        if now - max(self._last_decrease, self._last_increase) >= self.config.clean_period:
            self.limit = min(float(self.config.max_concurrency), self.limit + 1)
            self._last_increase = now

    def forget(self, caller: str) -> None:
        self._waiting.discard(caller)

    def stats(self) -> LimiterStats:
        now = self._now()
        return LimiterStats(
            in_flight=self.in_flight,
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

    async def acquire(self, estimated_tokens: int) -> None:
        caller = str(id(asyncio.current_task()))
        while True:
            granted, wait = self.limiter.try_acquire(estimated_tokens, caller)
            if granted:
                return
            await asyncio.sleep(min(wait, 1.0))

    def report(self, failure: Failure | None) -> None:
        self.limiter.release(*outcome_of(failure))
