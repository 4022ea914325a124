"""Every retry of every LLM call, in one place: `retrying` builds the tenacity policy,
bounded by attempts and elapsed time, and reporting every wait to `on_wait` *before*
sleeping, so a time budget sees a wait the moment it starts (the pattern of inspect_ai's
`model/_retry.py`, with our classification).

Whether a failure is retried, and how long to wait, is the classification's
(`error_catalogue.classify`, from what the provider sent: `provider_errors.py`): a rate
limit waits what the provider says, else jittered exponential back-off (`backoff_seconds`);
a transient failure backs off; quota exhausted and permanent failures are not retried.
What a failure is: `failures.py`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base

from piserini_ray.config import RetryConfig
from piserini_ray.llm.error_catalogue import classify
from piserini_ray.llm.failures import OnWait


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
        if not failure.retryable:
            return False
        return not (
            failure.retry_after is not None and failure.retry_after > config.max_retry_after
        )

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        failure = classify(exc) if exc else None
        if failure and failure.retryable and failure.retry_after is not None:
            return failure.retry_after  # the provider said how long
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
