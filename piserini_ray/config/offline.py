"""Configuration of the offline provider: latency, quotas, fault rates and scripted behaviours.

All models are frozen and reject unknown keys, like the rest of the project's configs, so a typo
in a rehearsal config fails instead of silently disabling a fault.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from piserini_ray.config.base import StrictModel as _Strict


class LatencyConfig(_Strict):
    """Delay before each admitted request is answered.

    `none`: no delay. `fixed`: `seconds` every time. `lognormal`: a log-normal draw whose *mean*
    is `seconds` and whose log-space standard deviation is `sigma` (so mu = ln(seconds) -
    sigma²/2), seeded by `OfflineConfig.seed`; `max_seconds` caps the long tail.
    """

    IDENTITY = ("kind", "seconds", "sigma", "max_seconds")
    NOT_IDENTITY = ()

    kind: Literal["none", "fixed", "lognormal"] = "none"
    seconds: float = Field(0.0, ge=0)
    sigma: float = Field(0.5, ge=0)
    max_seconds: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> LatencyConfig:
        if self.kind == "lognormal" and self.seconds <= 0:
            raise ValueError("lognormal latency needs seconds > 0 (it is the mean delay)")
        return self


class QuotaConfig(_Strict):
    """Per-API-key limits over a sliding window (60 s, as providers define per-minute limits).

    A request is admitted when the window holds fewer than `requests_per_minute` requests and
    its tokens (prompt + completion of admitted requests) plus this request's prompt tokens stay
    within `tokens_per_minute`. Rejected (429) requests consume nothing. Every route applies
    them and answers in its provider's format: the window in the body (OpenAI's `type`) and
    the rate-limit headers (`x-ratelimit-*`; Anthropic's `anthropic-ratelimit-*`).
    """

    IDENTITY = ("requests_per_minute", "tokens_per_minute", "window_seconds")
    NOT_IDENTITY = ()

    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    window_seconds: float = Field(60.0, gt=0)


class FaultRates(_Strict):
    """Probability (0..1) that a request suffers each fault; draws come from a seeded RNG.

    At most one fault applies per request, checked in field order; the tool-call faults apply
    only when the policy made a tool call (otherwise the next fault that fired is tried).
    """

    IDENTITY = (
        "http_500",
        "hang",
        "empty_reply",
        "malformed_arguments",
        "unknown_tool",
        "missing_fields",
    )
    NOT_IDENTITY = ()

    http_500: float = Field(0.0, ge=0, le=1)
    hang: float = Field(0.0, ge=0, le=1)
    empty_reply: float = Field(0.0, ge=0, le=1)
    malformed_arguments: float = Field(0.0, ge=0, le=1)
    unknown_tool: float = Field(0.0, ge=0, le=1)
    missing_fields: float = Field(0.0, ge=0, le=1)


class BatchConfig(_Strict):
    """The batch emulators (OpenAI's Batch API, Anthropic's Message Batches): how long a batch
    queues and how often a request in it errors or expires.

    `completion_seconds`: time a batch waits in the queue before its requests run (the
    providers promise 24 hours; most batches end within one). `error_rate` and `expire_rate`:
    probability (0..1) that a request of a batch ends errored (a server error, not billed) or
    expired (never run, not billed), drawn when the batch is created from a seeded RNG.
    `max_requests` and `max_bytes`: lower caps than the providers' published ones (OpenAI
    50,000 requests and 200 MB; Anthropic 100,000 requests and 256 MB), to rehearse splitting;
    None keeps the published limit.
    """

    IDENTITY = ("completion_seconds", "error_rate", "expire_rate", "max_requests", "max_bytes")
    NOT_IDENTITY = ()

    completion_seconds: float = Field(0.0, ge=0)
    error_rate: float = Field(0.0, ge=0, le=1)
    expire_rate: float = Field(0.0, ge=0, le=1)
    max_requests: int | None = Field(None, ge=1)
    max_bytes: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> BatchConfig:
        if self.error_rate + self.expire_rate > 1:
            raise ValueError("batch error_rate + expire_rate must not exceed 1")
        return self


class OfflineConfig(_Strict):
    """Everything the offline provider does besides the policies themselves."""

    IDENTITY = (
        "port",
        "require_key",
        "prefix_caching",
        "latency",
        "quotas",
        "faults",
        "hang_seconds",
        "seed",
        "request_log",
        "model_aliases",
    )
    # The batch emulators serve only batch-tier calls, which no run makes yet; counting them
    # would rename every offline run (the default config's hash is pinned).
    NOT_IDENTITY = ("batch",)

    port: int = Field(0, ge=0, le=65535)  # 0: the OS picks a free port
    require_key: bool = False
    prefix_caching: bool = True
    latency: LatencyConfig = LatencyConfig()
    quotas: QuotaConfig = QuotaConfig()
    faults: FaultRates = FaultRates()
    hang_seconds: float = Field(3600.0, gt=0)
    seed: int = 0
    #: Recent requests that `OfflineProvider.requests` keeps, conversations included; older ones
    #: are dropped, so a long rehearsal's memory stays flat.
    request_log: int = Field(1000, ge=1)
    #: Models served under other names, e.g. `{claude-haiku-4-5: offline/heuristic}`: a
    #: provider's native route (Anthropic's `/v1/messages`) rehearsed with its own model names.
    model_aliases: dict[str, str] = Field(default_factory=dict)
    #: The batch emulators (`/v1/batches`, `/v1/messages/batches`).
    batch: BatchConfig = BatchConfig()

    def serves(self, model: Any) -> bool:
        """Whether the run-started provider of these settings serves `model` (a ModelConfig):
        an offline model, or a provider's model listed in `model_aliases` by its name or by
        its name on its route (`claude-haiku-4-5` of `anthropic/claude-haiku-4-5`: a rehearsal
        under real names and prices), either without an `api_base` of its own."""
        on_route = model.resolved_litellm_model().split("/", 1)[-1]
        return model.api_base is None and (
            model.is_offline or model.name in self.model_aliases or on_route in self.model_aliases
        )


ScriptedKind = Literal[
    "rate_limit",
    "insufficient_quota",
    "http_error",
    "hang",
    "latency",
    "auth_error",
    "bad_request",
    "context_window",
    "malformed_arguments",
    "unknown_tool",
    "missing_fields",
    "empty_reply",
    "error_body",
    "no_usage",
    "resource_unavailable",
]

#: Scripted kinds that alter the policy's reply rather than replacing the response.
REPLY_FAULTS = frozenset({"malformed_arguments", "unknown_tool", "missing_fields", "empty_reply"})


class Scripted(_Strict):
    """A one-shot behaviour for the next request (of `model`, when given), on any route, in
    that route's provider's error format.

    `rate_limit`: 429, with `Retry-After: retry_after` when set (fractions allowed).
    `insufficient_quota`: no credit left, never retried (OpenAI: 429 with code
    `insufficient_quota`; Anthropic: 429 whose `error.details.error_code` is
    `enforced_spend_limit_reached`; DeepSeek: 402 Insufficient Balance). `http_error`: `status`.
    `hang`: wait `seconds` (default: the config's `hang_seconds`) then answer normally.
    `latency`: wait `seconds` more, then answer normally. `auth_error`: 401.
    `bad_request`: 400 with `message`. `context_window`: 400, the prompt too long (OpenAI's
    code `context_length_exceeded`).
    `error_body`: HTTP 200 whose body is an error object (`{"error": {"type": "server_error"}}`;
    on the Responses route a response whose `status` is `failed`), as providers send when a
    failure happens after the status line went out. `no_usage`: a
    normal reply without its `usage` block. `retry_after_date`: a rate limit's `Retry-After` as
    an HTTP date (RFC 9110) instead of seconds. `resource_unavailable`: OpenAI's flex tier
    without capacity (429 whose `error.code` is `resource_unavailable`, no rate-limit headers:
    no quota of the caller is full).
    The reply faults (`malformed_arguments`, ...) alter the policy's reply as the random faults do.
    """

    # Not identity: a test's scripted provider behaviour, never part of a run config.
    IDENTITY = ()
    NOT_IDENTITY = (
        "kind",
        "retry_after",
        "status",
        "seconds",
        "message",
        "model",
        "retry_after_date",
    )

    kind: ScriptedKind
    retry_after: float | None = Field(None, ge=0)
    status: int = Field(500, ge=400, le=599)
    seconds: float | None = Field(None, ge=0)
    message: str | None = None
    model: str | None = None
    retry_after_date: bool = False

    @model_validator(mode="after")
    def _check(self) -> Scripted:
        if self.kind == "latency" and self.seconds is None:
            raise ValueError("a scripted latency needs seconds")
        return self
