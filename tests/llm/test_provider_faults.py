"""What providers really send, over real HTTP to the loopback provider (litellm unpatched):
`Retry-After` as an HTTP date, an error object inside an HTTP 200, a reply without usage, a
key quoted back in an error, and a call too large for its quota."""

from __future__ import annotations

import asyncio
import email.utils
import os
import time

import pytest

from piserini_ray.agent.prompt import SYSTEM_PROMPT, question_message
from piserini_ray.config import ModelConfig, RateLimitConfig, RetryConfig
from piserini_ray.llm.client import Completion, LLMClient
from piserini_ray.llm.error_catalogue import parse_retry_after
from piserini_ray.llm.failures import FailureKind, RetryError
from piserini_ray.llm.limiter import LocalLimiter, RateLimiter
from piserini_ray.offline import OfflineConfig
from piserini_ray_testkit import EmulatedProvider, Scripted

MESSAGES = [
    {"role": "system", "content": SYSTEM_PROMPT},
    {"role": "user", "content": question_message("Who founded the Journal of Psychotherapy?")},
]
#: Back-off so short that any wait above a second must come from the provider's Retry-After.
TINY_BACKOFF = RetryConfig(backoff_base=0.01, backoff_cap=0.02, max_attempts=4)


@pytest.fixture
def provider():
    with EmulatedProvider(OfflineConfig()) as p:
        yield p


def _complete(
    provider: EmulatedProvider,
    limiter: LocalLimiter | None = None,
    retry: RetryConfig = TINY_BACKOFF,
    **model: object,
) -> Completion:
    client = LLMClient(
        ModelConfig(name="offline/heuristic", **model), retry, provider.base_url, limiter, seed=1
    )
    return asyncio.run(client.complete(MESSAGES))


def test_retry_after_as_an_http_date_is_honoured_and_shared(provider) -> None:
    provider.script(Scripted(kind="rate_limit", retry_after=2, retry_after_date=True))
    limiter = LocalLimiter(RateLimiter(RateLimitConfig()))
    completion = _complete(provider, limiter)
    assert completion.attempts == 2
    # From the date, not the 0.01 s back-off: the retry reached the server no earlier than the
    # date it named (both instants read off the server's clock: no bound on elapsed time).
    first, retry = provider.requests[:2]
    assert first.retry_after is not None and retry.retry_after is None
    told = email.utils.parsedate_to_datetime(first.retry_after).timestamp()
    assert retry.received_at >= told
    assert limiter.limiter.rate_limited == 1
    assert limiter.limiter._cooldown_until > 0  # the limiter's shared cooldown was set


def test_retry_after_values_of_both_forms() -> None:
    now = time.time()
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("1.5") == 1.5
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None


def test_an_error_object_in_an_http_200_is_transient(provider) -> None:
    provider.script(Scripted(kind="error_body"), Scripted(kind="error_body"))
    completion = _complete(provider)
    assert completion.attempts == 3 and completion.tool_calls
    assert all(line.startswith("transient") for line in completion.failures)


def test_a_reply_without_usage_is_marked(provider) -> None:
    provider.script(Scripted(kind="no_usage"))
    completion = _complete(provider)
    assert not completion.usage_reported and completion.usage.input_tokens == 0
    assert _complete(provider).usage_reported  # a normal reply is counted


def test_a_failed_call_keeps_every_attempt(provider) -> None:
    provider.script(*[Scripted(kind="http_error", status=503)] * 4)
    with pytest.raises(RetryError) as raised:
        _complete(provider)
    error = raised.value
    assert error.attempts == 4 and len(error.failures) == 3
    assert "after 4 attempt(s)" in str(error) and error.model_seconds > 0


def test_a_key_from_litellms_own_variable_is_scrubbed(provider, monkeypatch) -> None:
    secret = "sk-litellm-own-variable-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    provider.script(Scripted(kind="auth_error", message=f"Incorrect API key provided: {secret}"))
    with pytest.raises(RetryError) as raised:
        _complete(provider)
    assert secret not in str(raised.value) and "***" in str(raised.value)


def test_a_call_too_large_for_the_quota_is_refused_before_it_is_sent(provider) -> None:
    limiter = LocalLimiter(RateLimiter(RateLimitConfig(tokens_per_minute=2000)))
    with pytest.raises(RetryError) as raised:
        _complete(provider, limiter, max_output_tokens=4000)
    assert raised.value.failure.kind is FailureKind.PERMANENT
    assert "tokens_per_minute is 2,000" in str(raised.value)
    assert provider.requests == []  # nothing reached the provider
    assert limiter.limiter.stats().in_flight == 0


def test_scrub_covers_every_secret_variable(monkeypatch) -> None:
    from piserini_ray.llm.scrubber import scrub

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-0123456789abcdef")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-0123456789")
    monkeypatch.setenv("PISERINI_FLAG", "on-and-on-and-on")  # not a secret by its name
    text = "sent sk-ant-0123456789abcdef and tok-0123456789 with on-and-on-and-on"
    assert scrub(text) == "sent *** and *** with on-and-on-and-on"
    assert os.environ["PISERINI_FLAG"] in scrub(text)
