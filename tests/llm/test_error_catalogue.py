"""The error catalogue (`llm/error_catalogue.py`) over loopback HTTP: every row's exact payload
(status, headers, body, or a stream with an `error` event) sent by a small aiohttp server on
127.0.0.1, through litellm (unpatched) on the route the project uses, into the class the
catalogue says; and every row again with three other messages, each worded to mislead a
classifier that reads messages (litellm's does), into the same class."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import litellm
import pytest
from aiohttp import web

from piserini_ray.config import ModelConfig, RetryConfig
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.error_catalogue import CATALOGUE, catalogue_table, classify
from piserini_ray.llm.failures import Failure, FailureKind, RetryError

RL, TR, PE, QE = (
    FailureKind.RATE_LIMIT,
    FailureKind.TRANSIENT,
    FailureKind.PERMANENT,
    FailureKind.QUOTA_EXHAUSTED,
)
#: Messages that would each decide a message-reading classifier: a rate limit, a quota and a
#: context window at once, an overload.
MISLEADING = (
    "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
    "Limit 30000, Used 30000, Requested 900. Please try again in 2s.",
    "You exceeded your current quota, please check your plan and billing details. This "
    "model's maximum context length is 8192 tokens.",
    "Overloaded",
)
MESSAGES = [{"role": "user", "content": "Who founded the Journal of Psychotherapy?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the corpus.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


def _iso_in(seconds: float) -> str:
    return datetime.fromtimestamp(time.time() + seconds, UTC).isoformat(timespec="seconds")


def _epoch_ms_in(seconds: float) -> str:
    return str(int((time.time() + seconds) * 1000))


def _openai(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _anthropic(message: str, type_: str, **more: Any) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message, **more}}


def _gemini(message: str, code: int, status: str, *details: dict[str, Any]) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = list(details)
    return {"error": error}


def _quota_failure(quota_id: str, value: str) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [
            {
                "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                "quotaId": quota_id,
                "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"},
                "quotaValue": value,
            }
        ],
    }


def _retry_info(delay: str) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}


def _openrouter(message: str, code: int, **metadata: Any) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if metadata:
        error["metadata"] = metadata
    return {"error": error}


def _openrouter_limits() -> dict[str, str]:
    return {
        "X-RateLimit-Limit": "20",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": _epoch_ms_in(20),
    }


@dataclass(frozen=True)
class Route:
    litellm_model: str
    base: str  # appended to http://127.0.0.1:<port>
    path: str  # what the request must have hit (the route really is this provider's)
    model: dict[str, Any] = field(default_factory=dict)
    tools: bool = False


OPENAI = Route("openai/gpt-4o", "/v1", "/v1/chat/completions")
RESPONSES = Route(
    "openai/gpt-5.4-mini", "/v1", "/v1/responses", {"reasoning_effort": "low"}, tools=True
)
ANTHROPIC = Route("anthropic/claude-haiku-4-5", "", "/v1/messages", {"max_output_tokens": 1024})
GEMINI = Route("gemini/gemini-2.5-flash", "", "/models/gemini-2.5-flash:generateContent")
DEEPSEEK = Route("deepseek/deepseek-chat", "/deepseek", "/deepseek/chat/completions")
OPENROUTER = Route("openrouter/openai/gpt-4o", "/api/v1", "/api/v1/chat/completions")


@dataclass(frozen=True)
class Case:
    """One catalogue row as the provider sends it, and the class it must get."""

    id: str
    route: Route
    status: int
    body: Callable[[str], Any]  # the body for a message
    message: str  # the provider's own wording
    kind: FailureKind
    label: str  # the catalogue row it must match
    retry_after: float | None = None
    window: str | None = None
    headers: Callable[[], dict[str, str]] = dict
    stream: bool = False  # the body is a list of SSE events after a 200

    @property
    def stops_run(self) -> bool:
        return self.kind is QE or self.label == "refused"


CASES = [
    # ---- OpenAI
    Case(
        "openai-429-rate_limit_exceeded-tokens", OPENAI, 429,
        lambda m: _openai(m, "tokens", "rate_limit_exceeded"),
        "Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000.",
        RL, "OpenAI 429 rate_limit_exceeded", retry_after=90.0, window="tokens",
        headers=lambda: {
            "x-ratelimit-limit-tokens": "30000", "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-remaining-requests": "499", "x-ratelimit-reset-tokens": "1m30s",
            "x-ratelimit-reset-requests": "120ms",
        },
    ),
    Case(
        "openai-429-rate_limit_exceeded-retry-after", OPENAI, 429,
        lambda m: _openai(m, "requests", "rate_limit_exceeded"),
        "Rate limit reached for gpt-4o on requests per min (RPM): Limit 500.",
        RL, "OpenAI 429 rate_limit_exceeded", retry_after=20.0, window="requests",
        headers=lambda: {
            "retry-after": "20", "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "6m0s",
        },
    ),
    Case(
        "openai-429-resource_unavailable-flex", OPENAI, 429,
        lambda m: _openai(m, "server_error", "resource_unavailable"),
        "Resource unavailable: flex processing has no capacity right now.",
        RL, "OpenAI 429 resource_unavailable (flex capacity)", window="capacity",
    ),
    Case(
        "openai-429-insufficient_quota", OPENAI, 429,
        lambda m: _openai(m, "insufficient_quota", "insufficient_quota"),
        "You exceeded your current quota, please check your plan and billing details.",
        QE, "OpenAI insufficient_quota",
    ),
    Case(
        "openai-429-credit_balance_exhausted", OPENAI, 429,
        lambda m: _openai(m, "insufficient_quota", "credit_balance_exhausted"),
        "Your credit balance is too low.", QE, "OpenAI insufficient_quota",
    ),
    Case(
        "openai-500-server_error", OPENAI, 500, lambda m: _openai(m, "server_error", None),
        "The server had an error while processing your request. Sorry about that!",
        TR, "5xx server error",
    ),
    Case(
        "openai-503-server_error", OPENAI, 503, lambda m: _openai(m, "server_error", None),
        "The engine is currently overloaded, please try again later.",
        TR, "503 overloaded or unavailable",
    ),
    Case(
        "openai-200-error-object", OPENAI, 200, lambda m: _openai(m, "server_error", None),
        "The server had an error processing your request.", TR, "error object in a 200 reply",
    ),
    Case(
        "openai-400-context_length_exceeded", OPENAI, 400,
        lambda m: _openai(m, "invalid_request_error", "context_length_exceeded"),
        "This model's maximum context length is 128000 tokens.",
        PE, "context window exceeded",
    ),
    Case(
        "openai-401-invalid_api_key", OPENAI, 401,
        lambda m: _openai(m, "invalid_request_error", "invalid_api_key"),
        "Incorrect API key provided.", PE, "refused",
    ),
    Case(
        "openai-responses-429-rate_limit_exceeded", RESPONSES, 429,
        lambda m: _openai(m, "tokens", "rate_limit_exceeded"),
        "Rate limit reached for gpt-5.4-mini on tokens per min (TPM).",
        RL, "OpenAI 429 rate_limit_exceeded", retry_after=2.5, window="tokens",
        headers=lambda: {"retry-after-ms": "2500"},
    ),
    # ---- Anthropic
    Case(
        "anthropic-429-rate_limit_error", ANTHROPIC, 429,
        lambda m: _anthropic(m, "rate_limit_error"),
        "This request would exceed the rate limit for your organization of 8,000 output "
        "tokens per minute.",
        RL, "Anthropic 429 rate_limit_error", retry_after=7.0, window="output_tokens",
        headers=lambda: {
            "retry-after": "7", "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-output-tokens-remaining": "0",
            "anthropic-ratelimit-output-tokens-reset": _iso_in(7),
        },
    ),
    Case(
        "anthropic-429-rate_limit_error-reset-only", ANTHROPIC, 429,
        lambda m: _anthropic(m, "rate_limit_error"),
        "This request would exceed the rate limit for your organization.",
        RL, "Anthropic 429 rate_limit_error", retry_after=30.0, window="input_tokens",
        headers=lambda: {
            "anthropic-ratelimit-input-tokens-remaining": "0",
            "anthropic-ratelimit-input-tokens-reset": _iso_in(30),
        },
    ),
    Case(
        "anthropic-429-enforced_spend_limit_reached", ANTHROPIC, 429,
        lambda m: _anthropic(
            m, "rate_limit_error", details={"error_code": "enforced_spend_limit_reached"}
        ),
        "You have reached your specified API usage limits.",
        QE, "Anthropic enforced_spend_limit_reached",
    ),
    Case(
        "anthropic-529-overloaded_error", ANTHROPIC, 529,
        lambda m: _anthropic(m, "overloaded_error"), "Overloaded",
        TR, "Anthropic 529 overloaded_error",
    ),
    Case(
        "anthropic-500-api_error", ANTHROPIC, 500, lambda m: _anthropic(m, "api_error"),
        "Internal server error", TR, "Anthropic 500 api_error",
    ),
    Case(
        "anthropic-402-billing_error", ANTHROPIC, 402,
        lambda m: _anthropic(m, "billing_error"), "Your credit balance is too low.",
        QE, "402 payment required",
    ),
    Case(
        "anthropic-400-invalid_request_error", ANTHROPIC, 400,
        lambda m: _anthropic(m, "invalid_request_error"), "messages: field required",
        PE, "invalid request",
    ),
    Case(
        "anthropic-stream-error-event", ANTHROPIC, 200,
        lambda m: [
            ("message_start", {"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "content": [],
                "model": "claude-haiku-4-5", "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 12, "output_tokens": 1}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": "The"}}),
            ("error", _anthropic(m, "overloaded_error")),
        ],
        "Overloaded", TR, "error event inside a stream", stream=True,
    ),
    # ---- Gemini
    Case(
        "gemini-429-RESOURCE_EXHAUSTED-RetryInfo", GEMINI, 429,
        lambda m: _gemini(
            m, 429, "RESOURCE_EXHAUSTED",
            _quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "10"),
            _retry_info("46s"),
        ),
        "You exceeded your current quota, please check your plan and billing details.",
        RL, "Gemini 429 RESOURCE_EXHAUSTED", retry_after=46.0, window="requests",
    ),
    Case(
        "gemini-429-RESOURCE_EXHAUSTED-per-day", GEMINI, 429,
        lambda m: _gemini(
            m, 429, "RESOURCE_EXHAUSTED",
            _quota_failure("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "250"),
            _retry_info("35640s"),
        ),
        "You exceeded your current quota, please check your plan and billing details.",
        QE, "Gemini RESOURCE_EXHAUSTED (daily or zero quota)", window="requests",
    ),
    Case(
        "gemini-503-UNAVAILABLE", GEMINI, 503, lambda m: _gemini(m, 503, "UNAVAILABLE"),
        "The model is overloaded. Please try again later.", TR, "Gemini 503 UNAVAILABLE",
    ),
    # ---- DeepSeek
    Case(
        "deepseek-503-server-overloaded", DEEPSEEK, 503,
        lambda m: _openai(m, "server_error", None),
        "Server overloaded, please retry shortly.", TR, "503 overloaded or unavailable",
    ),
    Case(
        "deepseek-402-insufficient-balance", DEEPSEEK, 402,
        lambda m: _openai(m, "unknown_error", "invalid_request_error"),
        "Insufficient Balance", QE, "402 payment required",
    ),
    Case(
        "deepseek-429-rate-limit", DEEPSEEK, 429,
        lambda m: _openai(m, "unknown_error", None), "Rate Limit Reached",
        RL, "429 rate limit",
    ),
    # ---- OpenRouter
    Case(
        "openrouter-200-error-502", OPENROUTER, 200,
        lambda m: _openrouter(m, 502, provider_name="OpenAI", raw="upstream error"),
        "Provider returned error", TR, "5xx server error",  # its code is its status
    ),
    Case(
        "openrouter-200-error-429", OPENROUTER, 200,
        lambda m: _openrouter(m, 429, provider_name="OpenAI"),
        "Provider rate limited", RL, "OpenRouter 429",
    ),
    Case(
        "openrouter-429-x-ratelimit-reset", OPENROUTER, 429,
        lambda m: _openrouter(m, 429, headers=_openrouter_limits()),
        "Rate limit exceeded: free-models-per-min.",
        RL, "OpenRouter 429", retry_after=20.0, window="requests", headers=_openrouter_limits,
    ),
    Case(
        "openrouter-402-insufficient-credits", OPENROUTER, 402,
        lambda m: _openrouter(m, 402),
        "This request requires more credits, or fewer max_tokens.",
        QE, "402 payment required",
    ),
    Case(
        "openrouter-402-in-flight-budget", OPENROUTER, 402,
        lambda m: _openrouter(m, 402, limit_source="openrouter_in_flight_budget"),
        "In-flight spending budget exceeded.",
        RL, "OpenRouter 402 in-flight budget", retry_after=3.0,
        headers=lambda: {"Retry-After": "3"},
    ),
    Case(
        "openrouter-408-timeout", OPENROUTER, 408, lambda m: _openrouter(m, 408),
        "Request timed out", TR, "provider time-out or conflict",
    ),
]  # fmt: skip


# ---------------------------------------------------------------- the loopback provider


async def _serving(
    case: Case, message: str, call: Callable[[str], Awaitable[Failure]]
) -> tuple[Failure, list[str]]:
    """Serve `case` with `message` on 127.0.0.1 while `call(base_url)` runs."""
    paths: list[str] = []

    async def reply(request: web.Request) -> web.StreamResponse:
        await request.read()
        paths.append(request.path)
        headers = {"content-type": "application/json", **case.headers()}
        if not case.stream:
            body = json.dumps(case.body(message)).encode()
            return web.Response(status=case.status, body=body, headers=headers)
        stream = web.StreamResponse(status=200, headers={"content-type": "text/event-stream"})
        await stream.prepare(request)
        for event, data in case.body(message):
            await stream.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
        await stream.write_eof()
        return stream

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", reply)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        failure = await call(f"http://127.0.0.1:{port}{case.route.base}")
    finally:
        await runner.cleanup()
    return failure, paths


def _model(route: Route, base: str) -> ModelConfig:
    name = route.litellm_model.split("/")[-1]
    return ModelConfig(name=name, litellm_model=route.litellm_model, api_base=base, **route.model)


async def _through_the_client(case: Case, base: str) -> Failure:
    """One attempt through the project's `LLMClient`: its failure as classified."""
    client = LLMClient(_model(case.route, base), RetryConfig(max_attempts=1), seed=1)
    try:
        await client.complete(MESSAGES, tools=TOOLS if case.route.tools else None)
    except RetryError as error:
        return error.failure
    raise AssertionError("the call succeeded")


async def _streamed(case: Case, base: str) -> Failure:
    """The same route streaming (litellm's `acompletion(stream=True)`): the error event comes
    while the chunks are read, after the 200."""
    response = await litellm.acompletion(
        model=case.route.litellm_model,
        api_base=base,
        api_key="no-key",
        messages=MESSAGES,
        max_tokens=1024,
        num_retries=0,
        stream=True,
    )
    try:
        async for _ in response:
            pass
    except Exception as error:
        return classify(error)
    raise AssertionError("the stream ended without the error")


def _failure_of(case: Case, message: str) -> tuple[Failure, list[str]]:
    call = _streamed if case.stream else _through_the_client
    return asyncio.run(_serving(case, message, lambda base: call(case, base)))


def _assert_class(case: Case, failure: Failure, paths: list[str]) -> None:
    assert paths and all(p == case.route.path for p in paths), paths  # the route it claims
    prefix = "quota exhausted: " if case.kind is QE else ""
    assert failure.reason.startswith(f"{prefix}{case.label} ("), failure.reason
    assert failure.kind is case.kind, failure.reason
    assert failure.stops_run is case.stops_run
    assert failure.quota_window == case.window
    assert failure.status == (None if case.stream else case.status)
    if case.retry_after is None:
        assert failure.retry_after is None
    else:
        assert failure.retry_after == pytest.approx(case.retry_after, abs=1.5)


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_row_is_classified_by_its_shape(case: Case) -> None:
    failure, paths = _failure_of(case, case.message)
    _assert_class(case, failure, paths)


@pytest.mark.parametrize("message", range(len(MISLEADING)), ids=["rate", "quota", "overload"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_message_never_decides(case: Case, message: int) -> None:
    failure, paths = _failure_of(case, MISLEADING[message])
    _assert_class(case, failure, paths)


def test_every_row_of_the_catalogue_has_a_case() -> None:
    assert {row.label for row in CATALOGUE} == {case.label for case in CASES}
    assert len({row.label for row in CATALOGUE}) == len(CATALOGUE)
    table = catalogue_table()
    assert table.count("\n") == len(CATALOGUE) + 1 and "| quota_exhausted (stops" in table


def test_the_reset_header_is_waited_for_and_the_call_then_succeeds() -> None:
    """The wait a rate limit names is the wait the retry takes (not the tiny back-off)."""
    replies = [
        web.json_response(
            _openai("slow down", "tokens", "rate_limit_exceeded"),
            status=429,
            headers={"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1.2s"},
        )
    ]

    async def reply(request: web.Request) -> web.Response:
        await request.read()
        if replies:
            return replies.pop()
        return web.json_response(
            {
                "id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "Freud"}}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
            }
        )  # fmt: skip

    async def run() -> Any:
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", reply)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        retry = RetryConfig(max_attempts=2, backoff_base=0.01, backoff_cap=0.02)
        try:
            return await LLMClient(_model(OPENAI, base), retry, seed=1).complete(MESSAGES)
        finally:
            await runner.cleanup()

    completion = asyncio.run(run())
    assert completion.attempts == 2 and completion.content == "Freud"
    assert completion.failures[0].startswith("rate_limit, waiting 1.20 s")
    assert completion.waited_seconds >= 1.1


def test_a_retry_after_date_on_a_transient_failure_is_its_wait() -> None:
    """529 with a Retry-After (Anthropic sends one when it can): the wait it names."""
    date = email.utils.formatdate(time.time() + 10, usegmt=True)
    case = Case(
        "anthropic-529-retry-after", ANTHROPIC, 529,
        lambda m: _anthropic(m, "overloaded_error"), "Overloaded",
        TR, "Anthropic 529 overloaded_error", retry_after=10.0,
        headers=lambda: {"retry-after": date},
    )  # fmt: skip
    failure, paths = _failure_of(case, case.message)
    _assert_class(case, failure, paths)


def test_an_anthropic_429_for_a_request_larger_than_what_is_left_names_its_window() -> None:
    """No family is at 0 (the request was larger than what was left): the family with the least
    left of its limit is the window, so the limiter cools down instead of cutting concurrency."""
    from piserini_ray.llm.error_catalogue import quota_window
    from piserini_ray.llm.provider_errors import ErrorShape

    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-tokens-limit": "10000",
        "anthropic-ratelimit-tokens-remaining": "1200",
    }
    shape = ErrorShape(429, 429, "anthropic", type="rate_limit_error", headers=headers)
    assert quota_window(shape) == "tokens"
    assert quota_window(ErrorShape(429, 429, "anthropic", type="rate_limit_error")) is None
