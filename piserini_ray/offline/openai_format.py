"""OpenAI's error format and request basics, shared by its Chat Completions and Responses routes
and by DeepSeek's (OpenAI-compatible) route.

From OpenAI's published documents (https://platform.openai.com/docs/guides/error-codes,
https://platform.openai.com/docs/guides/rate-limits): an error body is
`{"error": {"message", "type", "param", "code"}}`. A rate limit is a 429 with code
`rate_limit_exceeded` whose `type` names the window (`requests` or `tokens`), with a
`retry-after` header and, for each window, `x-ratelimit-limit-<window>`,
`x-ratelimit-remaining-<window>` and `x-ratelimit-reset-<window>` (the time until the window is
fully replenished, as a Go duration: `1s`, `6m0s`, `20ms`). No credit left is a 429 whose type
and code are `insufficient_quota`; server errors are `server_error` (503: overloaded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from piserini_ray.offline.codec import Problem, Window

#: The values OpenAI accepts for the `service_tier` request parameter (Chat Completions and
#: Responses); "flex" and "priority" are billed at their own prices.
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
#: Context length quoted by scripted `context_window` errors.
CONTEXT_WINDOW = 128_000
SERVER_ERRORS = {
    500: "The server had an error while processing your request. Sorry about that!",
    502: "Bad gateway.",
    503: "The engine is currently overloaded, please try again later.",
}
_STATUS = {
    "invalid_request": 400,
    "authentication": 401,
    "not_found": 404,
    "rate_limit": 429,
    "quota_exhausted": 429,
    "server_error": 500,
    "overloaded": 503,
    "context_window": 400,
}
_TYPE = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "invalid_request_error",
    "quota_exhausted": "insufficient_quota",
    "server_error": "server_error",
    "overloaded": "server_error",
    "context_window": "invalid_request_error",
}
_CODE = {
    "authentication": "invalid_api_key",
    "not_found": "model_not_found",
    "rate_limit": "rate_limit_exceeded",
    "quota_exhausted": "insufficient_quota",
    "context_window": "context_length_exceeded",
}
_MESSAGE = {
    "invalid_request": "Invalid request.",
    "authentication": "Incorrect API key provided.",
    "not_found": "The model does not exist.",
    "rate_limit": "Rate limit reached for requests.",
    "quota_exhausted": (
        "You exceeded your current quota, please check your plan and billing details."
    ),
}


def go_duration(seconds: float) -> str:
    """A duration as Go prints it, as OpenAI's `x-ratelimit-reset-*` headers carry it: `0s`,
    `20ms` under a second, else `1h2m3.5s` (hours and minutes only when non-zero above them),
    to the millisecond."""
    ms = max(0, round(seconds * 1000))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    text = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def openai_rate_limit_headers(limits: tuple[Window, ...]) -> dict[str, str]:
    headers = {}
    for window in limits:
        headers[f"x-ratelimit-limit-{window.name}"] = str(window.limit)
        headers[f"x-ratelimit-remaining-{window.name}"] = str(window.remaining)
        headers[f"x-ratelimit-reset-{window.name}"] = go_duration(window.reset)
    return headers


def openai_error(
    problem: Problem, prompt_param: str = "messages", rate_limit_headers: bool = True
) -> web.Response:
    """`problem` in OpenAI's error format (`prompt_param`: where the route's prompt is, quoted
    by a context-window error; `rate_limit_headers`: whether the provider sends the
    `x-ratelimit-*` headers)."""
    kind = problem.kind
    status = problem.status or _STATUS[kind]
    type_ = (problem.window or "requests") if kind == "rate_limit" else _TYPE[kind]
    message = problem.message or _message(problem, status, type_)
    code = problem.code or _CODE.get(kind)
    param = problem.param or (prompt_param if kind == "context_window" else None)
    headers = {}
    if problem.retry_after is not None:
        headers["retry-after"] = problem.retry_after
    if rate_limit_headers:
        headers |= openai_rate_limit_headers(problem.limits)
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=200 if problem.in_200 else status, headers=headers)


def _message(problem: Problem, status: int, type_: str) -> str:
    """OpenAI's wording for a problem that brings none."""
    if problem.kind == "rate_limit" and problem.detail is not None:
        return (
            f"Rate limit reached for {type_} per minute on the offline provider: "
            f"{problem.detail} Please try again in {problem.retry_after}s."
        )
    if problem.kind == "context_window":
        tokens = max(problem.tokens or 0, CONTEXT_WINDOW + 1)
        return (
            f"This model's maximum context length is {CONTEXT_WINDOW} tokens. However, your "
            f"messages resulted in {tokens} tokens. Please reduce the length of the messages."
        )
    if problem.kind in ("server_error", "overloaded") and status in SERVER_ERRORS:
        return SERVER_ERRORS[status]
    return _MESSAGE.get(problem.kind) or f"HTTP {status}"


def bearer_key(headers: Mapping[str, str]) -> str | None:
    scheme, _, key = headers.get("Authorization", "").partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def missing_bearer_key() -> Problem:
    return Problem("authentication", "missing API key: send the header 'Authorization: Bearer KEY'")


def sampling_problem(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(param, message) when `temperature`, `top_p` or `service_tier` has a value OpenAI's
    routes refuse with a 400, else None."""
    for param, top in (("temperature", 2), ("top_p", 1)):
        value = body.get(param)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= top
        ):
            return (
                param,
                f"Invalid '{param}': expected a decimal between 0 and {top}, got {value!r}.",
            )
    tier = body.get("service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        supported = ", ".join(f"'{t}'" for t in SERVICE_TIERS)
        return "service_tier", f"Invalid value: {tier!r}. Supported values are: {supported}."
    return None
