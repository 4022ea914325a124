"""How a failed LLM call is classified, in one place: the catalogue of the providers' errors.

A failure is classified once (`classify`) into:
- **rate limit**: wait what the provider says (`Retry-After`, Gemini's `RetryInfo`, the reset
  header of the window it names), else jittered exponential back-off;
- **transient** (5xx, 529, an error object in a 200, an error event in a stream, connection
  errors, read time-outs): jittered exponential back-off, or the provider's `Retry-After`;
- **quota exhausted** (no credit, a spend limit, a daily quota): no retry, and the run stops
  starting queries, since every one of them would fail alike;
- **permanent** (auth, bad request, context window exceeded, unknown model): no retry; the
  query fails with the reason.

**Status and body first, litellm's class second.** litellm maps some failures by their message
text (a 500 whose message says "rate limit" becomes its `RateLimitError`, a 529 whose message
mentions a context length its `ContextWindowExceededError`). So `classify` first finds what the
provider sent (`provider_reply`: the status, headers and JSON body of the HTTP response litellm
raised from, or the error object of a 200 reply litellm refused) and looks it up in `CATALOGUE`,
built from the providers' published error formats. Only when no reply is known (a time-out, a
refused connection, an exception built by hand) does litellm's class decide. No message text is
ever read.

The waits a rate limit names (`Retry-After`, reset headers, `RetryInfo`) are read here too;
`retry.py` waits them.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from piserini_ray.errors import InfrastructureError, RequestTooLarge
from piserini_ray.llm.failures import CAPACITY, Failure, FailureKind
from piserini_ray.llm.provider_errors import (
    ErrorShape,
    error_shape,
    lower_headers,
    parse_duration,
    provider_reply,
)

# ---------------------------------------------------------------- the catalogue


#: OpenAI's `insufficient_quota` family: no credit, or a spend or usage limit reached.
OPENAI_QUOTA_CODES = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "organization_usage_limit_exceeded",
        "billing_hard_limit_reached",
        "billing_hard_limit",
        "quota_exceeded",
    }
)


def _gemini_windows(shape: ErrorShape) -> list[tuple[str, str | None, str | None]]:
    """(resource, period, limit) of each quota a Gemini `QuotaFailure` names, from its quota
    id (`GenerateRequestsPerMinutePerProjectPerModel-FreeTier`,
    `GenerateContentInputTokensPerModelPerDay`, ...) or metric."""
    found = []
    for name, value in shape.quotas:
        flat = name.lower().replace("_", "")
        if "inputtoken" in flat:
            resource = "input_tokens"
        elif "outputtoken" in flat:
            resource = "output_tokens"
        elif "token" in flat:
            resource = "tokens"
        elif "request" in flat:
            resource = "requests"
        else:
            continue
        period = next((p for p in ("minute", "day", "hour") if f"per{p}" in flat), None)
        found.append((resource, period, value))
    return found


def _gemini_exhausted(shape: ErrorShape) -> bool:
    """A daily quota used up, or a model with a quota of 0 on this tier: waiting minutes
    will not bring it back."""
    return any(p == "day" or v == "0" for _, p, v in _gemini_windows(shape))


@dataclass(frozen=True)
class CatalogueRow:
    provider: str
    status: str
    shape: str  # what of the body or headers the row reads
    kind: FailureKind
    retry_after: str  # where the wait comes from
    matches: Callable[[ErrorShape], bool]
    label: str
    stops_run: bool = False


def _row(
    provider: str,
    status: str,
    shape: str,
    kind: FailureKind,
    retry_after: str,
    matches: Callable[[ErrorShape], bool],
    label: str,
    stops_run: bool = False,
) -> CatalogueRow:
    return CatalogueRow(provider, status, shape, kind, retry_after, matches, label, stops_run)


_RL, _TR, _PE, _QE = (
    FailureKind.RATE_LIMIT,
    FailureKind.TRANSIENT,
    FailureKind.PERMANENT,
    FailureKind.QUOTA_EXHAUSTED,
)
_EXPLICIT = "retry-after-ms / retry-after"

#: The providers' published error formats, first match wins. Sources: OpenAI's error codes
#: and rate-limit headers; Anthropic's errors page (429 `rate_limit_error`, 529
#: `overloaded_error`, 500 `api_error`, `error` events in streams, `anthropic-ratelimit-*`);
#: Gemini's google.rpc errors (`RESOURCE_EXHAUSTED` with `QuotaFailure` and `RetryInfo`,
#: `UNAVAILABLE`); DeepSeek's error codes (402 insufficient balance, 429, 500, 503 server
#: overloaded); OpenRouter's errors (`{"error": {"code", "message", "metadata"}}`, in a 200
#: once the model started; 402 out of credits; `X-RateLimit-*`).
CATALOGUE: tuple[CatalogueRow, ...] = (
    # -- quota exhausted: waiting does not help
    _row("OpenAI", "429", "error.type insufficient_quota, or error.code credit_balance_exhausted"
         " / *_spend_limit_exceeded / organization_usage_limit_exceeded", _QE, "none",
         lambda s: s.type == "insufficient_quota" or s.code in OPENAI_QUOTA_CODES,
         "OpenAI insufficient_quota"),
    _row("Anthropic", "429", "error.type rate_limit_error with error.details.error_code "
         "enforced_spend_limit_reached", _QE, "none",
         lambda s: s.status == 429 and s.detail_code == "enforced_spend_limit_reached",
         "Anthropic enforced_spend_limit_reached"),
    _row("Gemini", "429", "error.status RESOURCE_EXHAUSTED whose QuotaFailure names a per-day "
         "quota, or a quota of 0", _QE, "none",
         lambda s: s.status == 429 and s.grpc_status == "RESOURCE_EXHAUSTED"
         and _gemini_exhausted(s),
         "Gemini RESOURCE_EXHAUSTED (daily or zero quota)"),
    _row("OpenRouter", "402 + Retry-After", "error.code 402 with a Retry-After header (the "
         "in-flight spending budget)", _RL, _EXPLICIT,
         lambda s: s.status == 402 and _explicit_wait(s.headers, None) is not None,
         "OpenRouter 402 in-flight budget"),
    _row("DeepSeek, OpenRouter, Anthropic", "402", "any body: insufficient balance (DeepSeek), "
         "insufficient credits (OpenRouter), billing_error (Anthropic)", _QE, "none",
         lambda s: s.status == 402, "402 payment required"),
    # -- rate limits: wait, then retry
    _row("OpenAI", "429", "error.code resource_unavailable (the flex tier has no capacity; "
         "no quota of the caller is full)", _RL, f"{_EXPLICIT}, else back-off",
         lambda s: s.status == 429 and s.code == "resource_unavailable",
         "OpenAI 429 resource_unavailable (flex capacity)"),
    _row("OpenAI", "429", "error.code rate_limit_exceeded; error.type requests or tokens and "
         "x-ratelimit-remaining-* = 0 name the window", _RL,
         f"{_EXPLICIT}, else x-ratelimit-reset-<window> (1s, 6m0s, 20ms)",
         lambda s: s.status == 429 and s.code == "rate_limit_exceeded",
         "OpenAI 429 rate_limit_exceeded"),
    _row("Anthropic", "429", "error.type rate_limit_error; anthropic-ratelimit-<window>-remaining"
         " = 0 names the window", _RL,
         "retry-after, else anthropic-ratelimit-<window>-reset (RFC 3339)",
         lambda s: s.status == 429 and s.type == "rate_limit_error",
         "Anthropic 429 rate_limit_error"),
    _row("Gemini", "429", "error.status RESOURCE_EXHAUSTED; QuotaFailure's quotaId names the "
         "window", _RL, "RetryInfo.retryDelay, else retry-after",
         lambda s: s.status == 429 and s.grpc_status == "RESOURCE_EXHAUSTED",
         "Gemini 429 RESOURCE_EXHAUSTED"),
    _row("OpenRouter", "429", "error.code 429; X-RateLimit-Remaining = 0 (header or "
         "error.metadata.headers) names the request window", _RL,
         "retry-after, else X-RateLimit-Reset (epoch ms)",
         lambda s: s.status == 429 and ("x-ratelimit-reset" in s.headers or s.code == "429"),
         "OpenRouter 429"),
    _row("DeepSeek, any", "429", "any body (DeepSeek: rate or concurrency)", _RL,
         f"{_EXPLICIT}, else a reset header above, else back-off", lambda s: s.status == 429,
         "429 rate limit"),
    # -- transient: back off, then retry
    _row("Anthropic", "529", "error.type overloaded_error", _TR, f"{_EXPLICIT}, else back-off",
         lambda s: s.status == 529, "Anthropic 529 overloaded_error"),
    _row("Anthropic", "500", "error.type api_error", _TR, f"{_EXPLICIT}, else back-off",
         lambda s: s.status == 500 and s.type == "api_error", "Anthropic 500 api_error"),
    _row("Anthropic (stream)", "200, then `event: error`", "no HTTP error and no broken "
         "connection; litellm's provider error says 500 (it drops the event's type)", _TR,
         "back-off", lambda s: s.source == "provider_status" and s.status >= 500,
         "error event inside a stream"),
    _row("Gemini", "503", "error.status UNAVAILABLE", _TR, f"{_EXPLICIT}, else back-off",
         lambda s: s.status == 503 and s.grpc_status == "UNAVAILABLE", "Gemini 503 UNAVAILABLE"),
    _row("DeepSeek", "503", "any body (server overloaded)", _TR, f"{_EXPLICIT}, else back-off",
         lambda s: s.status == 503, "503 overloaded or unavailable"),
    _row("OpenAI, OpenRouter", "200", "an `error` object whose code is no HTTP status (OpenAI "
         "error.type server_error); one whose code is a status is classified as that status",
         _TR, "back-off", lambda s: s.status == 200, "error object in a 200 reply"),
    _row("any", "5xx", "any body (OpenAI server_error, OpenRouter 502 model down, Gemini "
         "INTERNAL / DEADLINE_EXCEEDED)", _TR, f"{_EXPLICIT}, else back-off",
         lambda s: s.status >= 500, "5xx server error"),
    _row("any", "408, 409", "any body (a time-out at the provider, Anthropic conflict_error)",
         _TR, f"{_EXPLICIT}, else back-off", lambda s: s.status in (408, 409),
         "provider time-out or conflict"),
    # -- permanent
    _row("OpenAI", "400", "error.code context_length_exceeded", _PE, "none",
         lambda s: s.status == 400 and s.code == "context_length_exceeded",
         "context window exceeded"),
    _row("any", "401, 403, 404", "any body (bad key, no access, unknown model)", _PE, "none",
         lambda s: s.status in (401, 403, 404), "refused", stops_run=True),
    _row("any", "other 4xx", "any body (invalid request)", _PE, "none",
         lambda s: 400 <= s.status < 500, "invalid request"),
)  # fmt: skip


def catalogue_row(shape: ErrorShape) -> CatalogueRow | None:
    return next((row for row in CATALOGUE if row.matches(shape)), None)


def catalogue_table() -> str:
    """`CATALOGUE` as a Markdown table, in matching order (for notes and docs)."""
    lines = [
        "| provider | status | body / headers | class | retry-after from |",
        "|---|---|---|---|---|",
    ]
    for row in CATALOGUE:
        stops = row.stops_run or row.kind is FailureKind.QUOTA_EXHAUSTED
        kind = row.kind.value + (" (stops the run)" if stops else "")
        lines.append(
            f"| {row.provider} | {row.status} | {row.shape} | {kind} | {row.retry_after} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- waits and windows


def _explicit_wait(headers: Mapping[str, str], now: float | None) -> float | None:
    try:
        if (ms := headers.get("retry-after-ms")) is not None:
            return max(0.0, float(ms) / 1000)
    except ValueError:
        pass
    if (value := headers.get("retry-after")) is not None:
        return parse_retry_after(value, now)
    return None


def _is_zero(value: str | None) -> bool:
    try:
        return value is not None and float(value) == 0
    except ValueError:
        return False


def _tightest_anthropic_window(headers: Mapping[str, str]) -> str | None:
    shares = []
    for resource in ("requests", "tokens", "input-tokens", "output-tokens"):
        try:
            left = float(headers[f"anthropic-ratelimit-{resource}-remaining"])
            limit = float(headers[f"anthropic-ratelimit-{resource}-limit"])
        except (KeyError, ValueError):
            continue
        if limit > 0:
            shares.append((left / limit, resource.replace("-", "_")))
    return min(shares)[1] if shares else None


def quota_window(shape: ErrorShape) -> str | None:
    """The window a 429 names as full: Gemini's quota id; the `*-remaining` header at 0
    (OpenAI, Anthropic, OpenRouter); OpenAI's `error.type` (`requests` or `tokens`)."""
    if shape.status == 429 and shape.code == "resource_unavailable":
        return CAPACITY  # the provider's capacity, not a quota of the caller's
    if gemini := _gemini_windows(shape):
        return gemini[0][0]
    h = shape.headers
    for resource in ("requests", "tokens"):
        if _is_zero(h.get(f"x-ratelimit-remaining-{resource}")):
            return resource
    for resource in ("requests", "tokens", "input-tokens", "output-tokens"):
        if _is_zero(h.get(f"anthropic-ratelimit-{resource}-remaining")):
            return resource.replace("-", "_")
    # An Anthropic 429 for a request larger than what is left: no family is at 0, the one
    # with the least left of its limit is the window that refused it.
    if shape.status == 429 and (tightest := _tightest_anthropic_window(h)) is not None:
        return tightest
    if _is_zero(h.get("x-ratelimit-remaining")):
        return "requests"  # OpenRouter counts requests
    if shape.type in ("requests", "tokens"):
        return shape.type
    return None


def _reset_wait(shape: ErrorShape, window: str | None, now: float | None) -> float | None:
    """Seconds until the named window resets, from the provider's reset headers."""
    h = shape.headers
    now = time.time() if now is None else now
    if window is not None:
        if (value := h.get(f"x-ratelimit-reset-{window}")) is not None:
            return parse_duration(value)
        if (value := h.get(f"anthropic-ratelimit-{window.replace('_', '-')}-reset")) is not None:
            try:
                moment = datetime.fromisoformat(value.strip())
            except ValueError:
                return None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            return max(0.0, moment.timestamp() - now)
    if (value := h.get("x-ratelimit-reset")) is not None:  # OpenRouter: epoch milliseconds
        try:
            number = float(value)
        except ValueError:
            return parse_duration(value)
        if number > 1e11:
            return max(0.0, number / 1000 - now)
        return max(0.0, number - now) if number > 1e9 else number
    return None


def _failure_from(row: CatalogueRow, shape: ErrorShape, exc: BaseException) -> Failure:
    kind = row.kind
    wait = shape.retry_delay
    if wait is None:
        wait = _explicit_wait(shape.headers, None)
    window = quota_window(shape) if shape.status == 429 else None
    if wait is None and kind is FailureKind.RATE_LIMIT:
        wait = _reset_wait(shape, window, None)
    prefix = "quota exhausted: " if kind is FailureKind.QUOTA_EXHAUSTED else ""
    # A status only litellm's provider layer reported is no HTTP status the provider sent.
    status = shape.http_status if shape.source != "provider_status" else None
    where = f"HTTP {status}" if status is not None else f"provider status {shape.status}"
    return Failure(
        kind,
        f"{prefix}{row.label} ({where}): {type(exc).__name__}: {exc}",
        retry_after=wait if kind in (FailureKind.RATE_LIMIT, FailureKind.TRANSIENT) else None,
        stops_run=row.stops_run or kind is FailureKind.QUOTA_EXHAUSTED,
        quota_window=window if kind is not FailureKind.TRANSIENT else None,
        status=status,
    )


# ---------------------------------------------------------------- classification


def retry_after_seconds(exc: BaseException, now: float | None = None) -> float | None:
    """`Retry-After` from the error's HTTP response headers: `retry-after-ms`, or `retry-after`
    as seconds or as an HTTP date (RFC 9110 §10.2.3 allows both)."""
    for headers in (
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ):
        if headers and (seconds := _explicit_wait(lower_headers(headers), now)) is not None:
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
    """Map any exception from an LLM call to rate limit, transient, quota exhausted or
    permanent: by the provider's status and body (`CATALOGUE`) when its reply is known, else
    by litellm's exception class."""
    reason = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RequestTooLarge):  # refused by our limiter before it was sent
        return Failure(FailureKind.PERMANENT, str(exc))
    if isinstance(exc, InfrastructureError):  # not the call's fault: it goes up as it is
        return Failure(FailureKind.PERMANENT, reason)
    # Imported here: the limiter (and its actor) use this module's types but never call a
    # model, and litellm costs them seconds of start-up.
    reply = provider_reply(exc)
    if reply is not None:
        shape = error_shape(reply)
        row = catalogue_row(shape)
        if row is not None:
            return _failure_from(row, shape, exc)
    return _by_class(exc, reason)


def _by_class(exc: BaseException, reason: str) -> Failure:
    """No reply known: litellm's class decides (its status, its body's codes; never its
    message). `Failure.status` stays None: nothing says what the provider sent, if anything."""
    import litellm

    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    if isinstance(exc, litellm.RateLimitError):
        body = getattr(exc, "body", None)
        body = body if isinstance(body, dict) else {}
        if {str(body.get("code")), str(body.get("type"))} & OPENAI_QUOTA_CODES:
            return Failure(FailureKind.QUOTA_EXHAUSTED, f"quota exhausted: {reason}", None, True)
        window = body.get("type") if body.get("type") in ("requests", "tokens") else None
        return Failure(FailureKind.RATE_LIMIT, reason, retry_after_seconds(exc), False, window)
    if isinstance(exc, litellm.PaymentRequiredError):
        return Failure(FailureKind.QUOTA_EXHAUSTED, f"quota exhausted: {reason}", None, True)
    if isinstance(exc, litellm.ContextWindowExceededError):
        return Failure(FailureKind.PERMANENT, f"context window exceeded: {reason}")
    if isinstance(
        exc, litellm.AuthenticationError | litellm.PermissionDeniedError | litellm.NotFoundError
    ):
        return Failure(FailureKind.PERMANENT, reason, stops_run=True)
    if isinstance(exc, litellm.BadRequestError | litellm.UnprocessableEntityError):
        return Failure(FailureKind.PERMANENT, reason)
    transient = (
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,  # also litellm's MidStreamFallbackError
        litellm.BadGatewayError,
        litellm.APIError,
        asyncio.TimeoutError,
        ConnectionError,
    )
    if isinstance(exc, transient):
        return Failure(FailureKind.TRANSIENT, reason)
    if status is not None and status >= 500:
        return Failure(FailureKind.TRANSIENT, reason)
    return Failure(FailureKind.PERMANENT, f"unexpected error: {reason}")
