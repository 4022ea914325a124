"""Every retry decision of every LLM call, in one place.

A failure is classified once (`classify`) into:
- **rate limit** (HTTP 429): wait what `Retry-After` says, else jittered exponential back-off;
- **transient** (5xx, connection errors, read time-outs): jittered exponential back-off;
- **permanent** (auth, bad request, context window exceeded, quota exhausted, unknown model):
  no retry; the query fails with the reason.

`retrying` builds the tenacity policy: bounded by attempts and elapsed time, and reporting every
wait to `on_wait` *before* sleeping, so a time budget sees a wait the moment it starts (the
pattern of inspect_ai's `model/_retry.py`, with our classification).
"""

from __future__ import annotations

import asyncio
import email.utils
import enum
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base

from piserini_ray.config import RetryConfig
from piserini_ray.errors import InfrastructureError, PiseriniRayError, RequestTooLarge


class FailureKind(enum.StrEnum):
    RATE_LIMIT = "rate_limit"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    reason: str
    retry_after: float | None = None
    #: The same call would fail for every query of the run (a bad key, an unknown model, an
    #: exhausted quota): the run stops starting queries.
    stops_run: bool = False


#: Called with (seconds, failure) before each back-off sleep, so the wait is on record first.
OnWait = Callable[[float, Failure], None]

_PERMANENT_429_CODES = ("insufficient_quota", "billing_hard_limit", "quota_exceeded")


def retry_after_seconds(exc: BaseException, now: float | None = None) -> float | None:
    """`Retry-After` from the error's HTTP response headers: `retry-after-ms`, or `retry-after`
    as seconds or as an HTTP date (RFC 9110 §10.2.3 allows both)."""
    for headers in (
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ):
        if not headers:
            continue
        try:
            if (ms := headers.get("retry-after-ms")) is not None:
                return max(0.0, float(ms) / 1000)
        except (TypeError, ValueError):
            pass
        if (value := headers.get("retry-after")) is not None:
            seconds = parse_retry_after(str(value), now)
            if seconds is not None:
                return seconds
    return None


def parse_retry_after(value: str, now: float | None = None) -> float | None:
    """Seconds to wait for a `Retry-After` value (delay-seconds or HTTP-date); None if neither."""
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:  # an obsolete date form without a zone is GMT (RFC 9110)
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, moment.timestamp() - (time.time() if now is None else now))


def classify(exc: BaseException) -> Failure:
    """Map any exception from an LLM call to rate limit, transient or permanent."""
    # Imported here: the limiter (and its actor) use this module's types but never call a
    # model, and litellm costs them seconds of start-up.
    import litellm

    reason = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RequestTooLarge):  # refused by our limiter before it was sent
        return Failure(FailureKind.PERMANENT, str(exc))
    if isinstance(exc, InfrastructureError):  # not the call's fault: it goes up as it is
        return Failure(FailureKind.PERMANENT, reason)
    if isinstance(exc, litellm.RateLimitError):
        body = getattr(exc, "body", None)
        codes = {str(body.get(k)) for k in ("code", "type")} if isinstance(body, dict) else set()
        text = str(exc).lower()
        if codes & set(_PERMANENT_429_CODES) or "exceeded your current quota" in text:
            return Failure(FailureKind.PERMANENT, f"quota exhausted: {reason}", stops_run=True)
        return Failure(FailureKind.RATE_LIMIT, reason, retry_after_seconds(exc))
    if isinstance(exc, litellm.ContextWindowExceededError):
        return Failure(FailureKind.PERMANENT, f"context window exceeded: {reason}")
    if isinstance(
        exc, litellm.AuthenticationError | litellm.PermissionDeniedError | litellm.NotFoundError
    ):
        return Failure(FailureKind.PERMANENT, reason, stops_run=True)
    permanent = (
        litellm.BadRequestError,
        litellm.UnprocessableEntityError,
    )
    if isinstance(exc, permanent):
        return Failure(FailureKind.PERMANENT, reason)
    transient = (
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
        litellm.BadGatewayError,
        litellm.APIError,
        asyncio.TimeoutError,
        ConnectionError,
    )
    if isinstance(exc, transient):
        return Failure(FailureKind.TRANSIENT, reason)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status >= 500:
        return Failure(FailureKind.TRANSIENT, reason)
    return Failure(FailureKind.PERMANENT, f"unexpected error: {reason}")


class RetryError(PiseriniRayError):
    """An LLM call failed for good; `failure` says why and how it was classified, the rest
    what the call went through on the way (for the turn that made it)."""

    def __init__(
        self,
        failure: Failure,
        attempts: int,
        failures: list[str] | None = None,
        model_seconds: float = 0.0,
        waited_seconds: float = 0.0,
    ) -> None:
        super().__init__(failure, attempts, failures, model_seconds, waited_seconds)  # pickles
        self.failure = failure
        self.attempts = attempts
        self.failures = failures or []  # one line per retried attempt
        self.model_seconds = model_seconds
        self.waited_seconds = waited_seconds

    def __str__(self) -> str:
        return f"{self.failure.kind.value} after {self.attempts} attempt(s): {self.failure.reason}"


def backoff_seconds(attempt: int, config: RetryConfig, rng: random.Random) -> float:
    """Full-jitter exponential back-off: uniform in [0, min(cap, base * 2**(attempt-1))]."""
    return rng.uniform(0, min(config.backoff_cap, config.backoff_base * 2 ** (attempt - 1)))


class _StopAfterWaited(stop_base):
    """Stop when the time already spent waiting plus the next wait would pass the bound."""

    def __init__(self, max_elapsed: float) -> None:
        self.max_elapsed = max_elapsed

    def __call__(self, retry_state: RetryCallState) -> bool:
        return (retry_state.idle_for + (retry_state.upcoming_sleep or 0)) > self.max_elapsed


def retrying(
    config: RetryConfig,
    on_wait: OnWait | None = None,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> AsyncRetrying:
    """The tenacity policy for one logical LLM call."""
    rng = rng or random.Random()

    def retryable(exc: BaseException) -> bool:
        failure = classify(exc)
        if failure.kind is FailureKind.PERMANENT:
            return False
        return not (
            failure.retry_after is not None and failure.retry_after > config.max_retry_after
        )

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        failure = classify(exc) if exc else None
        if failure and failure.kind is FailureKind.RATE_LIMIT and failure.retry_after is not None:
            return failure.retry_after
        return backoff_seconds(state.attempt_number, config, rng)

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if on_wait is not None and exc is not None and state.next_action is not None:
            on_wait(state.next_action.sleep, classify(exc))

    return AsyncRetrying(
        stop=stop_after_attempt(config.max_attempts) | _StopAfterWaited(config.max_elapsed),
        wait=wait,
        retry=retry_if_exception(retryable),
        before_sleep=before_sleep,
        sleep=sleep,
        reraise=True,
    )
