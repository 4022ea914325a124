"""What a failed LLM call is: its kind (rate limit, transient, quota exhausted, permanent), the
`Failure` that `error_catalogue.classify` makes of an exception, and the `RetryError` a call
ends with when it fails for good (`retry.py` decides the waits in between).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from piserini_ray.errors import PiseriniRayError

#: The `quota_window` of a 429 that says the provider has no capacity (OpenAI's flex tier):
#: a cooldown that cuts no concurrency, since sending less would not help.
CAPACITY = "capacity"


class FailureKind(enum.StrEnum):
    RATE_LIMIT = "rate_limit"
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    #: No credit left, a spend limit, a daily quota used up: never retried, and it stops the
    #: run (`Failure.stops_run`).
    QUOTA_EXHAUSTED = "quota_exhausted"


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    reason: str
    retry_after: float | None = None
    #: The same call would fail for every query of the run (a bad key, an unknown model, an
    #: exhausted quota): the run stops starting queries.
    stops_run: bool = False
    #: The provider's quota window that a rate limit says is full, as its body or headers
    #: name it (never its message): "requests", "tokens", "input_tokens" or "output_tokens".
    #: None for a rate limit that names no window (too many concurrent requests, or a
    #: provider that does not say).
    quota_window: str | None = None
    #: The HTTP status the provider answered with (200 for an error object inside a
    #: successful reply); None when no reply is known (a time-out, a refused connection).
    status: int | None = None

    @property
    def retryable(self) -> bool:
        return self.kind in (FailureKind.RATE_LIMIT, FailureKind.TRANSIENT)


#: Called with (seconds, failure) before each back-off sleep, so the wait is on record first.
OnWait = Callable[[float, Failure], None]


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
