"""What a test sets on the emulated provider (`EmulatedProvider`): seeded fault rates, batch
fates and scripted one-shot behaviours. None of it is a run config's: a run never injects
faults into its own provider.

All models are frozen and reject unknown keys, so a typo in a test fails instead of silently
disabling a fault.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FaultRates(_Strict):
    """Probability (0..1) that a request suffers each fault; draws come from a seeded RNG
    (`OfflineConfig.seed`).

    At most one fault applies per request, checked in field order; the tool-call faults apply
    only when the policy made a tool call (otherwise the next fault that fired is tried).
    """

    http_500: float = Field(0.0, ge=0, le=1)
    hang: float = Field(0.0, ge=0, le=1)
    empty_reply: float = Field(0.0, ge=0, le=1)
    malformed_arguments: float = Field(0.0, ge=0, le=1)
    unknown_tool: float = Field(0.0, ge=0, le=1)
    missing_fields: float = Field(0.0, ge=0, le=1)


class BatchFates(_Strict):
    """How often a request of a batch (OpenAI's Batch API, Anthropic's Message Batches) ends
    errored (`error_rate`: a server error, not billed) or expired (`expire_rate`: never run,
    not billed), drawn when the batch is created from a seeded RNG (`OfflineConfig.seed`)."""

    error_rate: float = Field(0.0, ge=0, le=1)
    expire_rate: float = Field(0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _check(self) -> BatchFates:
        if self.error_rate + self.expire_rate > 1:
            raise ValueError("batch error_rate + expire_rate must not exceed 1")
        return self


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
    `hang`: wait `seconds` (default: the provider's `hang_seconds`) then answer normally.
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
