"""The test kit's emulated provider over real HTTP: scripted behaviours, seeded fault rates,
`reset`, and the gate that holds requests (`hold`, `release`, `wait_held`)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from offline_chat import AGENT, POLICIES, chat_body, conversation, first_tool_call, post

from piserini_ray.offline import OfflineConfig
from piserini_ray_testkit import BatchFates, EmulatedProvider, FaultRates, Scripted

# No network here: use litellm's bundled price map instead of retrying a download on import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture
def provider() -> Iterator[EmulatedProvider]:
    with EmulatedProvider(OfflineConfig(), POLICIES) as running:
        yield running


SCRIPTED_ERRORS = [
    (Scripted(kind="insufficient_quota"), 429, "insufficient_quota"),
    (Scripted(kind="http_error", status=503), 503, None),
    (Scripted(kind="auth_error"), 401, "invalid_api_key"),
    (Scripted(kind="bad_request", message="no such parameter"), 400, None),
    (Scripted(kind="context_window"), 400, "context_length_exceeded"),
]


@pytest.mark.parametrize(("spec", "status", "code"), SCRIPTED_ERRORS, ids=lambda x: str(x)[:24])
def test_scripted_errors(
    provider: EmulatedProvider, spec: Scripted, status: int, code: str | None
) -> None:
    provider.script(spec)
    response = post(provider, chat_body())
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    if spec.kind == "bad_request":
        assert error["message"] == "no such parameter"
    if spec.kind == "context_window":
        assert "maximum context length" in error["message"]
    assert post(provider, chat_body()).status_code == 200  # one-shot
    first, second = provider.requests
    assert (first.fault, first.scripted, second.fault) == (spec.kind, True, None)


def test_scripted_rate_limits(provider: EmulatedProvider) -> None:
    provider.script(Scripted(kind="rate_limit", retry_after=1.5), Scripted(kind="rate_limit"))
    with_header = post(provider, chat_body())
    assert with_header.status_code == 429 and with_header.headers["Retry-After"] == "1.5"
    assert with_header.json()["error"]["code"] == "rate_limit_exceeded"
    without = post(provider, chat_body())
    assert without.status_code == 429 and "Retry-After" not in without.headers
    assert post(provider, chat_body()).status_code == 200


def test_scripted_per_model(provider: EmulatedProvider) -> None:
    provider.script(Scripted(kind="http_error", status=500, model="offline/exact-match-judge"))
    assert post(provider, chat_body()).status_code == 200
    judge_body = {"model": "offline/exact-match-judge", "messages": conversation()}
    assert post(provider, judge_body).status_code == 500
    assert post(provider, judge_body).status_code == 200


def test_scripted_reply_faults(provider: EmulatedProvider) -> None:
    provider.script(
        Scripted(kind="malformed_arguments"),
        Scripted(kind="unknown_tool"),
        Scripted(kind="missing_fields"),
        Scripted(kind="empty_reply"),
    )
    malformed = first_tool_call(post(provider, chat_body()))
    with pytest.raises(json.JSONDecodeError):
        json.loads(malformed["arguments"])
    unknown = first_tool_call(post(provider, chat_body()))
    assert unknown["name"] == "web_browse"
    missing = json.loads(first_tool_call(post(provider, chat_body()))["arguments"])
    assert missing == {"query": "Where is the Louvre?"}
    empty = post(provider, chat_body()).json()["choices"][0]
    assert empty["message"]["content"] == "" and not empty["message"].get("tool_calls")
    assert empty["finish_reason"] == "stop"
    assert post(provider, chat_body()).json()["choices"][0]["finish_reason"] == "tool_calls"
    faults = [r.fault for r in provider.requests]
    assert faults == ["malformed_arguments", "unknown_tool", "missing_fields", "empty_reply", None]


def test_scripted_latency_delays_then_answers(provider: EmulatedProvider) -> None:
    provider.script(Scripted(kind="latency", seconds=0.3))
    response = post(provider, chat_body())
    assert response.status_code == 200 and provider.requests[0].fault == "latency"
    assert provider.requests[0].delayed == 0.3


def test_fault_rates_reproduce_with_a_seed() -> None:
    config, faults = OfflineConfig(seed=7), FaultRates(http_500=0.5, malformed_arguments=0.3)

    def pattern() -> list[tuple[int, str | None]]:
        with EmulatedProvider(config, POLICIES, faults=faults) as provider:
            for _ in range(16):
                post(provider, chat_body())
            return [(r.status or 0, r.fault) for r in provider.requests]

    first = pattern()
    assert first == pattern()
    statuses = {status for status, _ in first}
    assert 200 in statuses and statuses & {500, 502, 503}
    assert "malformed_arguments" in {fault for _, fault in first}
    other_seed = OfflineConfig(seed=8)
    with EmulatedProvider(other_seed, POLICIES, faults=faults) as provider:
        for _ in range(16):
            post(provider, chat_body())
        assert [(r.status, r.fault) for r in provider.requests] != first


def test_reset_clears_log_script_and_cache(provider: EmulatedProvider) -> None:
    post(provider, chat_body())
    provider.script(Scripted(kind="http_error"))
    provider.reset()
    assert provider.requests == []
    response = post(provider, chat_body())
    assert response.status_code == 200
    assert response.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_litellm_sees_scripted_429_with_retry_after(provider: EmulatedProvider) -> None:
    import litellm

    provider.script(Scripted(kind="rate_limit", retry_after=2))

    async def call() -> Any:
        return await litellm.acompletion(
            model=f"openai/{AGENT}",
            api_base=provider.base_url,
            api_key="test-key",
            messages=conversation(),
            num_retries=0,
        )

    with pytest.raises(litellm.RateLimitError) as caught:
        asyncio.run(call())
    error = caught.value
    headers = getattr(error, "litellm_response_headers", None) or error.response.headers
    assert headers.get("retry-after") == "2"
    assert len(provider.requests) == 1  # litellm did not retry on its own


def test_held_requests_wait_unanswered_until_released(provider: EmulatedProvider) -> None:
    # A test keeps a run in flight with `hold` (to kill a process mid-run) and waits on
    # `wait_held`, an event, instead of a clock.
    provider.hold(after=1)
    assert post(provider, chat_body()).status_code == 200  # answered before the gate closed
    replies: list[httpx.Response] = []
    late = threading.Thread(target=lambda: replies.append(post(provider, chat_body(), timeout=60)))
    late.start()
    assert provider.wait_held(1, timeout=30) and provider.held == 1
    assert not replies and len(provider.requests) == 1  # held: neither answered nor logged
    provider.release()
    late.join(30)
    assert [r.status_code for r in replies] == [200] and provider.held == 0
    assert post(provider, chat_body()).status_code == 200  # released: every later one too
    assert len(provider.requests) == 3


def test_the_settings_refuse_unknown_kinds_and_impossible_fates() -> None:
    with pytest.raises(ValueError):
        FaultRates.model_validate({"http_500": 0.1, "typo": 0.2})
    with pytest.raises(ValueError):
        BatchFates(error_rate=0.6, expire_rate=0.5)
    with pytest.raises(ValueError):
        Scripted(kind="latency")  # a scripted latency needs seconds


def test_the_kit_is_in_no_wheel_and_the_products_provider_has_no_test_hooks() -> None:
    import tomllib
    from pathlib import Path

    from setuptools import find_packages

    from piserini_ray.config import OfflineConfig as ProductConfig
    from piserini_ray.offline import OfflineProvider

    root = Path(__file__).resolve().parents[2]
    found = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = find_packages(str(root), include=found["packages"]["find"]["include"])
    assert "piserini_ray" in packages and not [p for p in packages if "testkit" in p]
    hooks = ("script", "hold", "release", "wait_held", "held", "reset")
    assert [h for h in hooks if hasattr(OfflineProvider, h)] == []
    assert all(hasattr(EmulatedProvider, h) for h in hooks)
    assert not {"faults", "hang_seconds"} & set(ProductConfig.model_fields)
