"""Admission control for one provider model: quotas, adaptive concurrency and a shared cooldown.

`RateLimiter` is plain Python with an injectable clock, so its rules are tested without Ray; the
Ray runtime wraps one instance per model in an actor that every worker on every node asks, which
makes the limits cluster-wide.

- **Quotas**: requests and tokens per window. A granted request counts from its grant until one
  window (plus a small margin) after its call *returned*: the provider saw it arrive somewhere
  in between, so a provider counting arrivals over a sliding window never sees more than the
  quota, however long a request took to leave the client or to come back. A token reservation
  is the prompt (the caller's estimate scaled by what the provider has been counting,
  `token_scale`) plus the completion (`max_output_tokens` when the model has one, else the mean
  the provider has been reporting); a returned call counts with the provider's own figures. A
  call whose reservation exceeds the whole quota can never be admitted and is refused
  (`RequestTooLarge`) before it is sent.
- **Adaptive concurrency (AIMD)**: at most `limit` requests in flight; a 429 sets the limit to
  `decrease_factor` x the calls in flight at that moment (not x the nominal limit, which may be
  far above what was actually sent), each clean period without one adds one (the idea inspect_ai
  applies per process, here shared by every worker). A 429 whose body or headers name a quota
  window is not a concurrency problem: it sets a cooldown (its `Retry-After`, else until the
  oldest call leaves the window) and leaves the limit alone.
- **Cooldown**: a `Retry-After` from the provider holds every caller until it has passed.
- **Restarts**: a limiter that lost its memory (its actor restarted) cannot know what the
  provider saw in the last window, so with a quota configured it admits nothing for one window
  (`assume_window_full`) instead of admitting a fresh quota on top of the old one.
- **Tickets**: every grant has its own id, and the release names it. (Keyed by caller instead,
  a caller's next `acquire` could reach the cluster-wide actor before its previous `release`,
  which Ray does not order for async actors, and two calls would count as one: quotas would
  overfill.)
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel

from piserini_ray.config import ModelConfig, RateLimitConfig, RunConfig
from piserini_ray.config.offline import OfflineConfig
from piserini_ray.errors import ConfigError, RequestTooLarge
from piserini_ray.llm.failures import CAPACITY, Failure, FailureKind
from piserini_ray.llm.routes import route_facts

if TYPE_CHECKING:
    from piserini_ray.llm.client import Limiter

Outcome = Literal["ok", "rate_limit", "quota", "capacity", "error"]
#: Weight of the newest call in the moving averages (prompt tokens per estimated token, and
#: completion tokens per call).
TOKEN_SCALE_WEIGHT = 0.1


class LimiterStats(BaseModel):
    pid: int = 0  # the process holding the limiter (an actor's, on Ray)
    restarted: bool = False  # it restarted and admitted nothing for one window
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
        #: Provider-counted prompt tokens per estimated token, learned from releases (a moving
        #: average): callers estimate roughly (about 4 characters a token) and a systematic
        #: underestimate would let in-flight calls overfill a token quota.
        self.token_scale = 1.0
        #: Completion tokens per call, learned the same way (reserved when the model sets no
        #: `max_output_tokens`).
        self.output_mean = float(config.output_tokens_guess)

    def assume_window_full(self) -> None:
        """Admit nothing until one window has passed (after a restart lost the window)."""
        if self.config.requests_per_minute or self.config.tokens_per_minute:
            span = self.config.window_seconds + self.config.window_margin
            self._cooldown_until = max(self._cooldown_until, self._now() + span)

    def reservation(self, tokens: int, max_output: int | None = None) -> int:
        """Tokens a call reserves: its scaled prompt estimate plus its completion (the bound
        when given, else the learned mean), the learned parts raised by `estimate_margin`."""
        margin = 1 + self.config.estimate_margin
        output = max_output if max_output is not None else self.output_mean * margin
        return self.prompt_reservation(tokens) + _ceil(output)

    def prompt_reservation(self, tokens: int) -> int:
        return _ceil(tokens * self.token_scale * (1 + self.config.estimate_margin))

    def _expire(self, now: float) -> None:
        horizon = now - (self.config.window_seconds + self.config.window_margin)
        while self._closed and self._closed[0][0] <= horizon:
            self._closed_tokens -= self._closed.popleft()[1]

    def try_acquire(
        self, tokens: int = 0, ticket: str = "", max_output: int | None = None
    ) -> tuple[bool, float]:
        """(granted, seconds to wait before asking again) for a call with a prompt of about
        `tokens`. A grant takes one in-flight slot, which `release(ticket, ...)` gives back.
        Raises `RequestTooLarge` for a call that no window could ever hold."""
        now = self._now()
        self._expire(now)
        self._grow(now)
        wait = 0.0
        in_flight = len(self._open)
        reserve = self.reservation(tokens, max_output)
        tpm = self.config.tokens_per_minute
        if tpm is not None and reserve > tpm:
            self._waiting.discard(ticket)
            prompt = self.prompt_reservation(tokens)
            raise RequestTooLarge(
                f"this call reserves {reserve:,} tokens (prompt ~{prompt:,} + completion "
                f"{reserve - prompt:,}) but model.rate_limit.tokens_per_minute is {tpm:,}: "
                "it could never be sent within the quota. Raise the quota, or lower "
                "model.max_output_tokens"
            )
        self.last_denial = None
        if now < self._cooldown_until:
            wait = self._cooldown_until - now
            self.last_denial = "cooldown"
        elif in_flight >= math.floor(self.limit):
            wait = 0.05  # a slot frees when a call returns; ask again soon
            self.last_denial = "concurrency"
        else:
            rpm = self.config.requests_per_minute
            counted = in_flight + len(self._closed)
            counted_tokens = self._open_tokens + self._closed_tokens
            over_requests = rpm is not None and counted >= rpm
            over_tokens = tpm is not None and counted_tokens + reserve > tpm
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
        prompt_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None:
        """Give the ticket's slot back and learn from how the call went. `prompt_tokens` and
        `output_tokens`: what the call really used, from the provider's usage (None when it
        reported none); they replace the reservation in the window, so a token quota is
        filled by real counts, and they teach `token_scale` and `output_mean`."""
        now = self._now()
        in_flight = len(self._open)  # this call included
        if ticket in self._open:
            reserved, estimate = self._open.pop(ticket)
            counted = reserved
            if prompt_tokens is not None and output_tokens is not None:
                if estimate > 0:
                    ratio = min(max(prompt_tokens / estimate, 0.1), 10.0)
                    self.token_scale += TOKEN_SCALE_WEIGHT * (ratio - self.token_scale)
                self.output_mean += TOKEN_SCALE_WEIGHT * (output_tokens - self.output_mean)
                counted = prompt_tokens + output_tokens
            self._open_tokens -= reserved
            self._closed_tokens += counted
            self._closed.append((now, counted))
        if outcome in ("rate_limit", "quota", "capacity"):
            self.rate_limited += 1
            self._last_decrease = self._last_increase = now
        if outcome == "rate_limit":
            sent = min(self.limit, max(in_flight, 1))
            self.limit = max(float(self.config.min_concurrency), sent * self.config.decrease_factor)
        if outcome == "quota" and not retry_after:
            # The window is full at the provider: hold until its oldest call leaves it.
            span = self.config.window_seconds + self.config.window_margin
            retry_after = (self._closed[0][0] + span - now) if self._closed else span
        if outcome in ("rate_limit", "quota", "capacity") and retry_after:
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


def _ceil(value: float) -> int:
    """Round up, ignoring float noise (400 x 1.1 reserves 440, not 441)."""
    return math.ceil(round(value, 6))


def outcome_of(failure: Failure | None) -> tuple[Outcome, float | None]:
    """How a call ended, in the limiter's terms."""
    if failure is None:
        return "ok", None
    if failure.kind is FailureKind.RATE_LIMIT:
        # A 429 whose body or headers name a full quota window (requests, tokens) is a
        # cooldown; one that names none is a concurrency cut (`retry.quota_window`).
        kind: Outcome = "quota" if failure.quota_window is not None else "rate_limit"
        if failure.quota_window == CAPACITY:
            kind = "capacity"  # the provider's, not ours: wait it out, send as many
        return kind, failure.retry_after
    return "error", None


class LocalLimiter:
    """The client's `Limiter` over a `RateLimiter` in this process (one asyncio loop)."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    async def acquire(self, estimated_tokens: int, max_output: int | None = None) -> str:
        ticket = new_ticket()
        try:
            while True:
                granted, wait = self.limiter.try_acquire(estimated_tokens, ticket, max_output)
                if granted:
                    return ticket
                await asyncio.sleep(min(wait, 1.0))
        except asyncio.CancelledError:
            self.limiter.forget(ticket)
            raise

    def report(
        self, ticket: str, failure: Failure | None, used: tuple[int, int] | None = None
    ) -> None:
        self.limiter.release(ticket, *outcome_of(failure), *(used or (None, None)))


def new_ticket() -> str:
    """A grant's id, unique across processes and nodes."""
    return uuid.uuid4().hex


# ---------------------------------------------------------------- one limiter per quota


def quota_key(model: ModelConfig, offline: OfflineConfig) -> str:
    """Who counts a model's quota: the account (the variables that hold its credentials,
    `routes.route_facts`: `model.api_key_env` or the route's own, such as `OPENAI_API_KEY`;
    else its endpoint) and the model. Two runs, or a run and its judge, that share a key share
    its quota, so they share one limiter, whether a config names the route's own variable in
    `api_key_env` or leaves it to the route."""
    if offline.serves(model):  # the loopback provider of these settings
        digest = hashlib.sha256(offline.model_dump_json().encode()).hexdigest()[:12]
        account = f"offline-{digest}"
    else:
        facts = route_facts(model)
        secrets = "+".join(v for v in facts.variables if facts.secret(v))
        account = secrets or model.api_base or "default-key"
    return f"{account}|{model.resolved_litellm_model()}"


def check_quotas(configs: Iterable[RunConfig]) -> None:
    """Runs that share a quota must agree on it: a second `rate_limit` for the same key would
    otherwise be silently dropped (or doubled)."""
    seen: dict[str, tuple[RateLimitConfig, str]] = {}
    for config in configs:
        for role, model in (("model", config.model), ("judge.model", config.judge_model())):
            key = quota_key(model, config.offline)
            where = f"{role} {model.name!r} (config {config.config_hash()[:8]})"
            if key in seen and seen[key][0] != model.rate_limit:
                raise ConfigError(
                    f"{where} and {seen[key][1]} share a quota ({key}) but set different "
                    "rate_limit blocks; give them the same model.rate_limit, or separate keys "
                    "(model.api_key_env)"
                )
            seen.setdefault(key, (model.rate_limit, where))


class LimiterRegistry(Protocol):
    """Where a model's limiter is found: one per quota key (`quota_key`), shared by every
    caller that the registry serves (`LocalLimiters` in this process; the Ray runtime's
    `RayLimiters`, cluster-wide)."""

    def limiter(self, model: ModelConfig, offline: OfflineConfig) -> Limiter: ...


class LocalLimiters:
    """The in-process limiter registry: one `RateLimiter` per quota key, shared by every caller
    in this process (the local engine, `ask`, the judge)."""

    def __init__(self) -> None:
        self._limiters: dict[str, LocalLimiter] = {}

    def limiter(self, model: ModelConfig, offline: OfflineConfig) -> LocalLimiter:
        key = quota_key(model, offline)
        if key not in self._limiters:
            self._limiters[key] = LocalLimiter(RateLimiter(model.rate_limit))
        return self._limiters[key]


#: This process's limiters: whoever calls a model in-process asks here.
LOCAL_LIMITERS = LocalLimiters()
