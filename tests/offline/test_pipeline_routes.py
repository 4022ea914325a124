"""One request pipeline for every route of the offline provider: quotas, latency, seeded and
scripted faults on Chat Completions, DeepSeek, Anthropic Messages and OpenAI Responses alike,
each failure in that provider's own error shape and headers, over real HTTP; and our client
(`LLMClient` with a `LocalLimiter`) honouring each route's 429."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest

from piserini_ray.config import ModelConfig, RateLimitConfig, RetryConfig
from piserini_ray.llm.failures import Failure, FailureKind, RetryError
from piserini_ray.llm.limiter import LocalLimiter, RateLimiter
from piserini_ray.llm.provider_errors import parse_duration
from piserini_ray.offline import (
    LatencyConfig,
    OfflineConfig,
    Policy,
    PolicyReply,
    PolicyToolCall,
    QuotaConfig,
)
from piserini_ray.offline import anthropic as messages_api
from piserini_ray_testkit import EmulatedProvider, FaultRates, Scripted

# No network here: use litellm's bundled price map instead of retrying a download on import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

AGENT = "test/agent"
SYSTEM = "You answer with the search tool."
QUESTION = "Where is the Louvre?"
SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "reason": {"type": "string"}},
    "required": ["query", "reason"],
}


def agent_policy(request: dict[str, Any]) -> PolicyReply:
    """Searches for the last user message; answers once a tool result is in the history."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        return PolicyReply(content="Explanation: found it.\nExact Answer: Paris")
    arguments = json.dumps({"query": last["content"], "reason": "look it up"})
    return PolicyReply(tool_calls=[PolicyToolCall(name="search", arguments=arguments)])


POLICIES: dict[str, Policy] = {AGENT: agent_policy}
ALIASES = {"claude-haiku-4-5": AGENT, "gpt-5.4-mini": AGENT, "deepseek-chat": AGENT}


@dataclass(frozen=True)
class Route:
    """One wire format: where it is served, a minimal valid request and where its tool call is."""

    name: str  # the codec's name, as `RecordedRequest.route` keeps it
    path: str  # after http://127.0.0.1:<port>
    body: Callable[[], dict[str, Any]]
    headers: Callable[[str], dict[str, str]]  # for a key
    tool_name: Callable[[dict[str, Any]], str]
    #: What the route sends for the seeded server error drawn as 500, 502 or 503.
    server_statuses: dict[int, int] = field(default_factory=lambda: {500: 500, 502: 502, 503: 503})


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _chat_body(model: str) -> Callable[[], dict[str, Any]]:
    def body() -> dict[str, Any]:
        tool = {"type": "function", "function": {"name": "search", "parameters": SCHEMA}}
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
        return {"model": model, "messages": messages, "tools": [tool]}

    return body


def _chat_tool(reply: dict[str, Any]) -> str:
    return str(reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"])


def _messages_body() -> dict[str, Any]:
    return {
        "model": "claude-haiku-4-5",
        "max_tokens": 1024,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [{"name": "search", "description": "Search.", "input_schema": SCHEMA}],
    }


def _messages_headers(key: str) -> dict[str, str]:
    return {"x-api-key": key, "anthropic-version": "2023-06-01"}


def _messages_tool(reply: dict[str, Any]) -> str:
    return next(str(b["name"]) for b in reply["content"] if b["type"] == "tool_use")


def _responses_body() -> dict[str, Any]:
    return {
        "model": "gpt-5.4-mini",
        "instructions": SYSTEM,
        "input": [{"type": "message", "role": "user", "content": QUESTION}],
        "tools": [{"type": "function", "name": "search", "parameters": SCHEMA}],
    }


def _responses_tool(reply: dict[str, Any]) -> str:
    return next(str(i["name"]) for i in reply["output"] if i["type"] == "function_call")


CHAT = Route("chat", "/v1/chat/completions", _chat_body(AGENT), _bearer, _chat_tool)
DEEPSEEK = Route(
    "deepseek", "/deepseek/chat/completions", _chat_body("deepseek-chat"), _bearer, _chat_tool
)
MESSAGES = Route(
    "messages",
    "/v1/messages",
    _messages_body,
    _messages_headers,
    _messages_tool,
    {500: 500, 502: 502, 503: 529},  # Anthropic's overload is its 529
)
RESPONSES = Route("responses", "/v1/responses", _responses_body, _bearer, _responses_tool)
ROUTES = [CHAT, DEEPSEEK, MESSAGES, RESPONSES]


def post(
    provider: EmulatedProvider,
    route: Route,
    body: dict[str, Any] | None = None,
    key: str = "k1",
    timeout: float = 30,
) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{provider.port}{route.path}",
        json=route.body() if body is None else body,
        headers=route.headers(key),
        timeout=timeout,
    )


def _config(**settings: Any) -> OfflineConfig:
    return OfflineConfig(model_aliases=ALIASES, **settings)


def _rfc3339(value: str) -> float:
    assert value.endswith("Z") and "T" in value, value
    return datetime.fromisoformat(value).timestamp()


def _assert_openai_error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


def _assert_anthropic_error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error"
    assert body["request_id"].startswith("req_")
    assert response.headers["request-id"] == body["request_id"]
    assert {"type", "message"} <= set(body["error"])
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


# ---------------------------------------------------------------- quotas, in each format


def test_a_quota_on_the_anthropic_route_answers_anthropics_429() -> None:
    with EmulatedProvider(_config(quotas=QuotaConfig(requests_per_minute=2)), POLICIES) as p:
        assert [post(p, MESSAGES).status_code for _ in range(2)] == [200, 200]
        before = time.time()
        limited = post(p, MESSAGES)
        assert post(p, MESSAGES, key="k2").status_code == 200  # windows are per key
        records = p.requests
    assert limited.status_code == 429
    error = _assert_anthropic_error(limited)
    assert set(error) == {"type", "message"} and error["type"] == "rate_limit_error"
    assert "rate limit of 2 requests per minute" in error["message"]
    headers = limited.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["anthropic-ratelimit-requests-limit"] == "2"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    reset = _rfc3339(headers["anthropic-ratelimit-requests-reset"])
    assert before < reset <= before + 61
    # Only the configured window is reported; no OpenAI headers on Anthropic's route.
    assert not [h for h in headers if h.startswith("anthropic-ratelimit-tokens")]
    assert not [h for h in headers if h.startswith("x-ratelimit")]
    assert [(r.route, r.status, r.fault) for r in records] == [
        ("messages", 200, None),
        ("messages", 200, None),
        ("messages", 429, "quota"),
        ("messages", 200, None),
    ]


def test_a_token_quota_on_the_anthropic_route_reports_every_token_family() -> None:
    prompt = messages_api.prompt_tokens(_messages_body())
    # The first request fits; with its completion counted, a second one does not.
    quotas = QuotaConfig(tokens_per_minute=2 * prompt)
    with EmulatedProvider(_config(quotas=quotas), POLICIES) as p:
        first = post(p, MESSAGES).json()["usage"]
        limited = post(p, MESSAGES)
    billed = (
        first["input_tokens"]
        + first["cache_creation_input_tokens"]
        + first["cache_read_input_tokens"]
    )
    assert billed == prompt  # admission counts the prompt as the route bills it
    assert limited.status_code == 429
    assert _assert_anthropic_error(limited)["type"] == "rate_limit_error"
    remaining = max(0, 2 * prompt - prompt - first["output_tokens"])
    for family in ("tokens", "input-tokens", "output-tokens"):  # one window, in and out
        assert limited.headers[f"anthropic-ratelimit-{family}-limit"] == str(2 * prompt)
        assert limited.headers[f"anthropic-ratelimit-{family}-remaining"] == str(remaining)
        _rfc3339(limited.headers[f"anthropic-ratelimit-{family}-reset"])
    assert "anthropic-ratelimit-requests-limit" not in limited.headers


def test_a_quota_on_the_responses_route_answers_openais_429() -> None:
    with EmulatedProvider(_config(quotas=QuotaConfig(requests_per_minute=2)), POLICIES) as p:
        assert [post(p, RESPONSES).status_code for _ in range(2)] == [200, 200]
        limited = post(p, RESPONSES)
        records = p.requests
    assert limited.status_code == 429
    error = _assert_openai_error(limited)
    assert error == {
        "message": error["message"],
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert error["message"].startswith("Rate limit reached for requests per minute")
    headers = limited.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    reset = parse_duration(headers["x-ratelimit-reset-requests"])  # a Go duration: 59.98s
    assert reset is not None and 0 < reset <= 60
    assert not [h for h in headers if h.startswith(("x-ratelimit-limit-tokens", "anthropic"))]
    assert [(r.route, r.fault) for r in records][-1] == ("responses", "quota")


def test_a_token_quota_on_the_responses_route_names_the_token_window() -> None:
    with EmulatedProvider(_config(quotas=QuotaConfig(tokens_per_minute=10)), POLICIES) as p:
        limited = post(p, RESPONSES)  # the prompt alone is over the quota
    assert limited.status_code == 429
    error = _assert_openai_error(limited)
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert "Request too large" in error["message"]
    assert limited.headers["x-ratelimit-limit-tokens"] == "10"
    assert limited.headers["x-ratelimit-remaining-tokens"] == "10"  # nothing was used
    assert limited.headers["retry-after"] == "60"


def test_deepseeks_429_carries_no_rate_limit_headers() -> None:
    """DeepSeek publishes none: its 429 has `retry-after` and the OpenAI body only."""
    with EmulatedProvider(_config(quotas=QuotaConfig(requests_per_minute=1)), POLICIES) as p:
        assert post(p, DEEPSEEK).status_code == 200
        limited = post(p, DEEPSEEK)
    assert limited.status_code == 429
    assert _assert_openai_error(limited)["type"] == "requests"
    assert int(limited.headers["retry-after"]) >= 1
    assert not [h for h in limited.headers if h.startswith("x-ratelimit")]


def test_a_refused_request_consumes_no_quota() -> None:
    """Parsing comes before admission: what the API rejects never fills a window."""
    with EmulatedProvider(_config(quotas=QuotaConfig(requests_per_minute=1)), POLICIES) as p:
        bad = _messages_body()
        del bad["max_tokens"]
        assert post(p, MESSAGES, bad).status_code == 400
        assert post(p, RESPONSES, {"model": "gpt-5.4-mini"}).status_code == 400
        assert post(p, MESSAGES).status_code == 200
        assert post(p, MESSAGES).status_code == 429
        assert [r.fault for r in p.requests] == [None, None, None, "quota"]


# ---------------------------------------------------------------- our client honours them


class RecordingLimiter(LocalLimiter):
    """A `LocalLimiter` that keeps every failure reported to it and when it came."""

    def __init__(self) -> None:
        super().__init__(RateLimiter(RateLimitConfig()))
        self.reports: list[tuple[Failure, float, float]] = []  # failure, when, cooldown after

    def report(
        self, ticket: str, failure: Failure | None, used: tuple[int, int] | None = None
    ) -> None:
        reported = time.monotonic()
        super().report(ticket, failure, used)
        if failure is not None:
            self.reports.append((failure, reported, self.limiter._cooldown_until))


CLIENT_ROUTES = {
    "messages": lambda port: ModelConfig(
        name="claude-haiku-4.5",
        litellm_model="anthropic/claude-haiku-4-5",
        api_base=f"http://127.0.0.1:{port}",
        max_output_tokens=1024,
    ),
    "responses": lambda port: ModelConfig(
        name="gpt-5.4-mini",
        litellm_model="openai/gpt-5.4-mini",
        api_base=f"http://127.0.0.1:{port}/v1",
        reasoning_effort="low",  # with tools: litellm's bridge to the Responses API
    ),
}
CLIENT_MESSAGES = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": QUESTION},
]
CLIENT_TOOLS = [{"type": "function", "function": {"name": "search", "parameters": SCHEMA}}]


@pytest.mark.parametrize("route", sorted(CLIENT_ROUTES))
def test_the_limiter_honours_each_routes_429(route: str) -> None:
    """One request a second: the second call is refused, the limiter cools down for the
    provider's `retry-after`, and the call completes once it has passed."""
    from piserini_ray.llm.client import LLMClient

    quotas = QuotaConfig(requests_per_minute=1, window_seconds=1.0)
    with EmulatedProvider(_config(quotas=quotas), POLICIES) as provider:
        limiter = RecordingLimiter()
        retry = RetryConfig(backoff_base=0.01, backoff_cap=0.02, max_attempts=3)
        client = LLMClient(CLIENT_ROUTES[route](provider.port), retry, limiter=limiter, seed=1)
        first = asyncio.run(client.complete(CLIENT_MESSAGES, tools=CLIENT_TOOLS))
        second = asyncio.run(client.complete(CLIENT_MESSAGES, tools=CLIENT_TOOLS))
        served = [(r.route, r.status) for r in provider.requests]
    assert first.attempts == 1 and first.tool_calls
    assert second.attempts == 2 and second.tool_calls  # completed after waiting
    assert served == [(route, 200), (route, 429), (route, 200)]
    ((failure, reported, cooldown),) = limiter.reports
    assert failure.kind is FailureKind.RATE_LIMIT and failure.status == 429
    assert failure.quota_window == "requests"  # named by the provider's answer
    assert failure.retry_after == 1.0  # its retry-after
    assert cooldown == pytest.approx(reported + 1.0, abs=0.2)  # the cooldown it set
    # A named window is a cooldown, not a concurrency cut: the limit is untouched.
    assert limiter.limiter.limit == RateLimitConfig().max_concurrency
    assert limiter.limiter.rate_limited == 1
    assert second.waited_seconds >= 0.8


# ---------------------------------------------------------------- latency and faults


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_latency_applies_on_every_route(route: Route) -> None:
    with EmulatedProvider(_config(latency=LatencyConfig(kind="fixed", seconds=0.3)), POLICIES) as p:
        response = post(p, route)
        (record,) = p.requests
    assert response.status_code == 200, response.text
    assert route.tool_name(response.json()) == "search"
    assert record.delayed == 0.3  # the provider's own record of the wait it made
    assert (record.route, record.concurrent, record.fault) == (route.name, 1, None)


def _faults_of(
    route: Route, config: OfflineConfig, faults: FaultRates, n: int
) -> list[tuple[int, str | None]]:
    with EmulatedProvider(config, POLICIES, faults=faults) as provider:
        for _ in range(n):
            post(provider, route)
        return [(r.status or 0, r.fault) for r in provider.requests]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_a_seeded_server_error_applies_on_every_route(route: Route) -> None:
    config, faults = _config(seed=7), FaultRates(http_500=0.5, unknown_tool=0.4)
    pattern = _faults_of(route, config, faults, 12)
    # The same draws on every route: the chat route's pattern, each status in the route's terms.
    expected = [
        (route.server_statuses.get(status, status), fault)
        for status, fault in _faults_of(CHAT, config, faults, 12)
    ]
    assert pattern == expected
    assert {fault for _, fault in pattern} == {"http_500", "unknown_tool", None}
    with EmulatedProvider(_config(), POLICIES, faults=FaultRates(http_500=1.0)) as provider:
        failed = post(provider, route)
    assert failed.status_code in route.server_statuses.values()
    if route is MESSAGES:
        error = _assert_anthropic_error(failed)
        expected_type = "overloaded_error" if failed.status_code == 529 else "api_error"
        assert error["type"] == expected_type
    else:
        assert _assert_openai_error(failed)["type"] == "server_error"


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_a_seeded_reply_fault_applies_on_every_route(route: Route) -> None:
    with EmulatedProvider(_config(), POLICIES, faults=FaultRates(unknown_tool=1.0)) as provider:
        response = post(provider, route)
        (record,) = provider.requests
    assert response.status_code == 200
    assert route.tool_name(response.json()) == "web_browse"  # in the route's own format
    assert record.fault == "unknown_tool" and record.usage is not None


def test_every_seeded_server_status_in_anthropics_terms() -> None:
    """500 and 502 are `api_error`; the overload (OpenAI's 503) is Anthropic's 529."""
    from piserini_ray_testkit.faults import SERVER_ERROR_STATUSES, seeded_server_error

    codec = messages_api.MessagesCodec(messages_api.Signer(b"k"))
    seen = {}
    for status in SERVER_ERROR_STATUSES:
        response = codec.error(seeded_server_error(status))
        seen[status] = (response.status, json.loads(response.text or "")["error"]["type"])
    assert seen == {
        500: (500, "api_error"),
        502: (502, "api_error"),
        503: (529, "overloaded_error"),
    }


# ---------------------------------------------------------------- scripted, on every route


SCRIPTED = [
    (Scripted(kind="insufficient_quota"), FailureKind.QUOTA_EXHAUSTED),
    (Scripted(kind="http_error", status=503), FailureKind.TRANSIENT),
    (Scripted(kind="error_body"), FailureKind.TRANSIENT),
    (Scripted(kind="auth_error"), FailureKind.PERMANENT),
]


def _client_model(route: Route, port: int) -> ModelConfig:
    if route.name in CLIENT_ROUTES:
        return CLIENT_ROUTES[route.name](port)
    if route is DEEPSEEK:
        return ModelConfig(
            name="deepseek-chat",
            litellm_model="deepseek/deepseek-chat",
            api_base=f"http://127.0.0.1:{port}/deepseek",
        )
    return ModelConfig(
        name=AGENT, litellm_model=f"openai/{AGENT}", api_base=f"http://127.0.0.1:{port}/v1"
    )


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_scripted_failures_on_every_route_are_classified_as_the_provider_means_them(
    route: Route,
) -> None:
    from piserini_ray.llm.client import LLMClient

    with EmulatedProvider(_config(), POLICIES) as provider:
        client = LLMClient(_client_model(route, provider.port), RetryConfig(max_attempts=1), seed=1)
        kinds = []
        for spec, _ in SCRIPTED:
            provider.script(spec)
            with pytest.raises(RetryError) as raised:
                asyncio.run(client.complete(CLIENT_MESSAGES, tools=CLIENT_TOOLS))
            kinds.append(raised.value.failure.kind)
        records = provider.requests
    assert kinds == [kind for _, kind in SCRIPTED]
    assert [r.fault for r in records] == [spec.kind for spec, _ in SCRIPTED]
    assert all(r.route == route.name and r.scripted for r in records)


def test_scripted_failures_in_each_providers_shape() -> None:
    with EmulatedProvider(_config(), POLICIES) as provider:
        provider.script(Scripted(kind="rate_limit", retry_after=2))
        limited = post(provider, MESSAGES)
        provider.script(Scripted(kind="insufficient_quota"))
        spent = post(provider, MESSAGES)
        provider.script(Scripted(kind="insufficient_quota"))
        broke = post(provider, DEEPSEEK)
        provider.script(Scripted(kind="context_window"))
        too_long = post(provider, MESSAGES)
        provider.script(Scripted(kind="error_body"))
        failed = post(provider, RESPONSES)
    assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
    assert _assert_anthropic_error(limited)["type"] == "rate_limit_error"
    # Anthropic's spend limit: a 429 that no wait cures, named in error.details.
    assert spent.status_code == 429 and "retry-after" not in spent.headers
    error = _assert_anthropic_error(spent)
    assert error["details"] == {"error_code": "enforced_spend_limit_reached"}
    # DeepSeek's empty balance is a 402, in its own body.
    assert broke.status_code == 402
    assert _assert_openai_error(broke) == {
        "message": "Insufficient Balance",
        "type": "unknown_error",
        "param": None,
        "code": "invalid_request_error",
    }
    assert too_long.status_code == 400
    assert _assert_anthropic_error(too_long)["message"].startswith("prompt is too long")
    # A Responses call that fails after it was accepted: a 200 whose status is `failed`.
    assert failed.status_code == 200
    assert failed.json()["status"] == "failed" and failed.json()["error"]["code"] == "server_error"


# ---------------------------------------------------------------- what the real APIs reject


def test_the_anthropic_route_rejects_in_anthropics_shape() -> None:
    body = _messages_body()
    del body["max_tokens"]
    with EmulatedProvider(_config(require_key=True), POLICIES) as provider:
        no_max_tokens = post(provider, MESSAGES, body)
        no_key = httpx.post(
            f"http://127.0.0.1:{provider.port}/v1/messages",
            json=_messages_body(),
            headers={"anthropic-version": "2023-06-01"},
            timeout=30,
        )
        unknown = post(provider, MESSAGES, _messages_body() | {"model": "claude-nope"})
    assert no_max_tokens.status_code == 400
    assert _assert_anthropic_error(no_max_tokens) == {
        "type": "invalid_request_error",
        "message": "max_tokens: Field required",
    }
    assert no_key.status_code == 401
    assert _assert_anthropic_error(no_key)["type"] == "authentication_error"
    assert unknown.status_code == 404
    assert _assert_anthropic_error(unknown) == {
        "type": "not_found_error",
        "message": "model: claude-nope",
    }


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        (lambda b: b.update(input=5), "input", "invalid_type"),
        (lambda b: b.update(input=["not an item"]), "input[0]", "invalid_type"),
        (lambda b: b.update(input=[{"type": "nonsense"}]), "input[0].type", "invalid_value"),
        (lambda b: b.update(tools={"search": {}}), "tools", "invalid_type"),
        (lambda b: b.pop("input"), "input", "missing_required_parameter"),
    ],
    ids=["input-number", "input-item-string", "input-item-type", "tools-object", "no-input"],
)
def test_the_responses_route_rejects_a_malformed_input_in_openais_shape(
    change: Callable[[dict[str, Any]], Any], param: str, code: str
) -> None:
    body = _responses_body()
    change(body)
    with EmulatedProvider(_config(), POLICIES) as provider:
        reply = post(provider, RESPONSES, body)
        (record,) = provider.requests
    assert reply.status_code == 400
    error = _assert_openai_error(reply)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert (record.route, record.status, record.usage) == ("responses", 400, None)
