"""Usage extraction and failure classification (the HTTP paths are in test_agent.py)."""

import httpx
import litellm
import pytest

from piserini_ray.config import ModelConfig, RetryConfig
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.error_catalogue import classify
from piserini_ray.llm.failures import FailureKind
from piserini_ray.llm.retry import backoff_seconds
from piserini_ray.llm.usage import usage_from_response
from piserini_ray.records import Usage


class _Response:
    def __init__(self, usage: object) -> None:
        self.usage = usage


def test_openai_usage_fields() -> None:
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 50,
        "prompt_tokens_details": {"cached_tokens": 800},
        "completion_tokens_details": {"reasoning_tokens": 20},
    }
    assert usage_from_response(_Response(usage)) == Usage(
        input_tokens=1000, output_tokens=50, cached_tokens=800, reasoning_tokens=20
    )


def test_anthropic_cache_fields() -> None:
    usage = {
        "prompt_tokens": 900,
        "completion_tokens": 10,
        "cache_read_input_tokens": 700,
        "cache_creation_input_tokens": 150,
    }
    assert usage_from_response(_Response(usage)) == Usage(
        input_tokens=900, output_tokens=10, cached_tokens=700, cache_write_tokens=150
    )
    assert usage_from_response(_Response(None)) == Usage()


def _response(status: int, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, headers=headers, request=httpx.Request("POST", "http://x"))


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (
            litellm.RateLimitError("slow down", "openai", "m", response=_response(429)),
            FailureKind.RATE_LIMIT,
        ),
        (litellm.InternalServerError("boom", "openai", "m"), FailureKind.TRANSIENT),
        (litellm.Timeout("slow", "m", "openai"), FailureKind.TRANSIENT),
        (litellm.APIConnectionError("down", "openai", "m"), FailureKind.TRANSIENT),
        (litellm.AuthenticationError("no", "openai", "m"), FailureKind.PERMANENT),
        (litellm.BadRequestError("bad", "m", "openai"), FailureKind.PERMANENT),
        (litellm.ContextWindowExceededError("long", "m", "openai"), FailureKind.PERMANENT),
        (ValueError("our own bug"), FailureKind.PERMANENT),
    ],
)
def test_classification(exc: BaseException, kind: FailureKind) -> None:
    assert classify(exc).kind is kind


def test_retry_after_comes_from_the_headers() -> None:
    exc = litellm.RateLimitError("slow", "openai", "m", response=_response(429))
    exc.litellm_response_headers = httpx.Headers({"retry-after": "2.5"})
    assert classify(exc).retry_after == 2.5
    exc.litellm_response_headers = httpx.Headers({"retry-after-ms": "1500"})
    assert classify(exc).retry_after == 1.5


def test_backoff_is_jittered_and_capped() -> None:
    import random

    config = RetryConfig(backoff_base=1.0, backoff_cap=8.0)
    rng = random.Random(0)
    waits = [backoff_seconds(n, config, rng) for n in range(1, 10) for _ in range(20)]
    assert all(0 <= w <= 8.0 for w in waits) and len(set(waits)) > 100


def test_key_values_are_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_PROVIDER_KEY", "sk-live-123456")
    client = LLMClient(ModelConfig(name="gpt-5", api_key_env="MY_PROVIDER_KEY"))
    assert client.scrub("Incorrect API key provided: sk-live-123456.") == (
        "Incorrect API key provided: ***."
    )


def test_key_names_not_values_in_config() -> None:
    with pytest.raises(ValueError, match="NAME of an environment variable"):
        ModelConfig(name="gpt-5", api_key_env="sk-live-123456-abc")


def test_the_limiter_learns_the_tokens_a_call_really_used() -> None:
    """Over real HTTP: the slot was granted on a rough estimate; the release carries the
    provider's prompt + completion count, which is what a token quota must be filled with."""
    import asyncio

    from piserini_ray.config import RateLimitConfig
    from piserini_ray.llm.limiter import LocalLimiter, RateLimiter
    from piserini_ray.offline import OfflineProvider

    limiter = RateLimiter(RateLimitConfig(tokens_per_minute=1_000_000))
    with OfflineProvider() as provider:
        client = LLMClient(
            ModelConfig(name="offline/exact-match-judge"),
            RetryConfig(),
            api_base=provider.base_url,
            limiter=LocalLimiter(limiter),
        )
        messages = [{"role": "user", "content": "Exact Answer: 42\nCorrect Answer: 42"}]
        asyncio.run(client.complete(messages, estimated_tokens=5_000))
        served = provider.requests[-1].usage
    assert served is not None
    ((_, counted),) = limiter._closed
    assert counted == served.prompt_tokens + served.completion_tokens != 5_000
