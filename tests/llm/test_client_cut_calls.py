"""Calls the provider received but never reported: a call cancelled mid-flight (the budget) or
failed for good after it was sent keeps its prompt, counted here and marked as an estimate
(providers bill what they received). Over real HTTP to the loopback provider, litellm unpatched.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import litellm
import pytest

from piserini_ray.agent.prompt import SYSTEM_PROMPT, question_message
from piserini_ray.config import ModelConfig, RetryConfig
from piserini_ray.llm.client import CallTrace, LLMClient
from piserini_ray.llm.failures import RetryError
from piserini_ray.llm.usage import character_estimate, count_prompt, local_tokenizer
from piserini_ray.offline import OfflineConfig
from piserini_ray.tools import tool_schemas
from piserini_ray_testkit import EmulatedProvider, Scripted

MESSAGES = [
    {"role": "system", "content": SYSTEM_PROMPT},
    {"role": "user", "content": question_message("Who founded the Journal of Psychotherapy?")},
]
TOOLS = tool_schemas()
TINY_BACKOFF = RetryConfig(backoff_base=0.01, backoff_cap=0.02, max_attempts=3)


@pytest.fixture
def provider() -> Iterator[EmulatedProvider]:
    config = OfflineConfig(model_aliases={"gpt-5": "offline/heuristic"})
    with EmulatedProvider(config) as p:
        yield p


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection off this machine fails (a tokenizer download would): loopback only."""
    real = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        host = address[0] if isinstance(address, tuple) else address
        if host not in ("127.0.0.1", "::1", "localhost") and not isinstance(host, bytes):
            raise OSError(f"test: no network ({address})")
        real(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in ("127.0.0.1", "::1", "localhost", None):
            raise socket.gaierror(f"test: no network ({host})")
        return real_getaddrinfo(host, *args, **kwargs)

    real_getaddrinfo = socket.getaddrinfo
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PISERINI_TEST_CUT_KEY", "sk-test-cut-calls")


def _client(provider: EmulatedProvider, name: str = "offline/heuristic") -> LLMClient:
    config = ModelConfig(
        name=name, litellm_model=f"openai/{name}", api_key_env="PISERINI_TEST_CUT_KEY"
    )
    return LLMClient(config, TINY_BACKOFF, provider.base_url, seed=1)


async def _cut(
    client: LLMClient, provider: EmulatedProvider, messages: list[dict[str, Any]] = MESSAGES
) -> CallTrace:
    """One call, cancelled (as the budget's watchdog cancels it) once the provider holds it;
    returns once the provider has let the request go (and billed it)."""
    trace = CallTrace()
    task = asyncio.ensure_future(client.complete(messages, TOOLS, trace=trace))
    while not provider.in_flight:
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    while provider.in_flight:  # the handler ends when the server sees the client leave
        await asyncio.sleep(0.02)
    return trace


def _served_prompt(provider: EmulatedProvider) -> int:
    """The prompt tokens the provider counted for MESSAGES and TOOLS (a normal reply)."""
    reply = [r for r in provider.requests if r.status == 200 and r.usage is not None][-1]
    assert reply.usage is not None
    return reply.usage.prompt_tokens


def test_a_cancelled_call_keeps_its_prompt_calibrated_by_the_providers_last_count(
    provider,
) -> None:
    """No tokenizer for the model in litellm: the first cut call counts characters / 4; once a
    call reported usage, the provider's count calibrates the estimate: the same prompt again
    is that count; a longer one continuing it is that count plus the added characters, scaled
    by the provider's ratio; an unrelated one is scaled by that ratio."""
    longer = [*MESSAGES, {"role": "assistant", "content": "Searching the archive now."}]
    other = [{"role": "user", "content": "A different question, on its own."}]

    async def scenario() -> list[CallTrace]:
        client = _client(provider)
        provider.script(Scripted(kind="hang", seconds=600))
        traces = [await _cut(client, provider)]
        await client.complete(MESSAGES, TOOLS)  # reported: calibrates what follows
        assert client.reported.latest is not None
        for messages in (MESSAGES, longer, other):
            provider.script(Scripted(kind="hang", seconds=600))
            traces.append(await _cut(client, provider, messages))
        return traces

    first, same, continued, unrelated = asyncio.run(scenario())
    assert first.attempts == 1 and first.model_seconds > 0  # the cut attempt is on record
    assert first.estimate is not None
    assert first.estimate.input_tokens == character_estimate(MESSAGES, TOOLS) > 0
    assert first.estimate.estimated_input_tokens == first.estimate.input_tokens
    assert first.estimate_method is not None and first.estimate_method.startswith("characters")
    served = _served_prompt(provider)
    assert same.estimate is not None and same.estimate.input_tokens == served
    assert same.estimate.output_tokens == 0  # what it generated is unknown: never guessed
    assert same.estimate_method is not None and "previous request" in same.estimate_method
    billed = {r.seq: r.usage.prompt_tokens for r in provider.requests if r.cut and r.usage}
    assert len(billed) == 4  # every cut request is on the provider's bill
    *_, longer_billed, other_billed = (billed[k] for k in sorted(billed))
    assert continued.estimate is not None and unrelated.estimate is not None
    # Only the added part is estimated: the error is within it, not a share of the prompt.
    added = longer_billed - served
    assert abs(continued.estimate.input_tokens - longer_billed) < added
    assert unrelated.estimate_method is not None and "ratio" in unrelated.estimate_method
    assert abs(unrelated.estimate.input_tokens - other_billed) <= 0.3 * other_billed


def test_a_cancelled_call_is_counted_with_the_models_tokenizer_offline(
    provider, no_network
) -> None:
    """gpt-5 has a tokenizer in litellm (tiktoken's o200k_base, shipped with it): the prompt is
    counted with it, with no network (any download attempt would fail this test)."""
    assert local_tokenizer("openai/gpt-5") == "o200k_base"
    provider.script(Scripted(kind="hang", seconds=600))
    trace = asyncio.run(_cut(_client(provider, "gpt-5"), provider))
    assert (
        trace.estimate_method == "tokenizer o200k_base (no call of this client reported usage yet)"
    )
    tools: Any = TOOLS  # OpenAI tool dicts (litellm types them as TypedDicts)
    expected = litellm.token_counter(model="gpt-5", messages=MESSAGES, tools=tools)
    assert trace.estimate is not None and trace.estimate.input_tokens == expected > 100
    assert trace.estimate.estimated_input_tokens == expected


def test_tokenizers_are_only_those_litellm_ships(no_network) -> None:
    """Which models count with their own tokenizer: never one litellm would download (Llama's,
    from the Hugging Face hub) nor a stand-in for a model it does not know."""
    assert local_tokenizer("gpt-5.4-mini") == "o200k_base"
    assert local_tokenizer("anthropic/claude-haiku-4-5") == "anthropic"
    for model in (
        "deepseek/deepseek-chat",
        "openai/offline/heuristic",
        "groq/llama-3.1-8b-instant",
        "gemini/gemini-2.5-pro",
    ):
        assert local_tokenizer(model) is None, model
        assert count_prompt(model, MESSAGES, TOOLS) is None
    counted = count_prompt("anthropic/claude-haiku-4-5", MESSAGES, TOOLS)
    assert counted is not None and counted[0] > 100 and counted[1] == "tokenizer anthropic"


def test_a_call_that_failed_after_sending_is_estimated(provider) -> None:
    """500 on every attempt: the provider received each request; the call keeps the prompt of
    its last one."""
    provider.script(*[Scripted(kind="http_error", status=500)] * TINY_BACKOFF.max_attempts)
    trace = CallTrace()
    with pytest.raises(RetryError, match="after 3 attempt"):
        asyncio.run(_client(provider).complete(MESSAGES, TOOLS, trace=trace))
    assert trace.attempts == 3 and len(trace.failures) == 2
    assert trace.estimate is not None and trace.estimate.estimated_input_tokens > 0


@pytest.mark.parametrize("kind", ["bad_request", "context_window", "insufficient_quota"])
def test_a_call_refused_at_the_door_is_not_estimated(provider, kind: str) -> None:
    """A client error or a quota refusal: the provider ran nothing and bills nothing."""
    provider.script(Scripted(kind=kind))
    trace = CallTrace()
    with pytest.raises(RetryError):
        asyncio.run(_client(provider).complete(MESSAGES, TOOLS, trace=trace))
    assert trace.estimate is None and not trace.unreported


def test_a_connection_that_never_opened_is_not_estimated() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = ModelConfig(
        name="offline/heuristic",
        litellm_model="openai/offline/heuristic",
        api_key_env="PISERINI_TEST_CUT_KEY",
    )
    client = LLMClient(config, TINY_BACKOFF, f"http://127.0.0.1:{port}/v1", seed=1)
    trace = CallTrace()
    with pytest.raises(RetryError):
        asyncio.run(client.complete(MESSAGES, TOOLS, trace=trace))
    assert trace.attempts == 3 and trace.estimate is None


def test_a_call_that_recovers_is_not_estimated(provider) -> None:
    """A 500 and then a reply: the call's usage is the reply's, as reported."""
    provider.script(Scripted(kind="http_error", status=500))
    trace = CallTrace()
    completion = asyncio.run(_client(provider).complete(MESSAGES, TOOLS, trace=trace))
    assert completion.attempts == 2 and completion.usage.estimated_input_tokens == 0
    assert trace.estimate is None and not trace.unreported


def test_a_call_cut_while_it_waits_out_a_rate_limit_is_not_estimated(provider) -> None:
    """Cut during the back-off after a 429: the only request it sent was refused at the door;
    nothing is billed."""
    provider.script(Scripted(kind="rate_limit", retry_after=30))

    async def scenario() -> CallTrace:
        trace = CallTrace()
        task = asyncio.ensure_future(_client(provider).complete(MESSAGES, TOOLS, trace=trace))
        while not trace.failures:  # the 429 is on record: the back-off has begun
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return trace

    trace = asyncio.run(scenario())
    assert trace.attempts == 1 and trace.failures[0].startswith("rate_limit")
    assert trace.estimate is None and not trace.unreported


def test_a_call_that_timed_out_waiting_for_its_reply_is_estimated(provider) -> None:
    """`model.call_timeout` on every attempt: each request was with the provider, which went on
    working on it (and bills it); the call keeps its last prompt."""
    provider.script(*[Scripted(kind="hang", seconds=30)] * 2)
    config = ModelConfig(
        name="offline/heuristic",
        litellm_model="openai/offline/heuristic",
        api_key_env="PISERINI_TEST_CUT_KEY",
        call_timeout=0.5,
    )
    client = LLMClient(config, RetryConfig(backoff_base=0.01, max_attempts=2), provider.base_url)
    trace = CallTrace()
    with pytest.raises(RetryError, match="Timeout"):
        asyncio.run(client.complete(MESSAGES, TOOLS, trace=trace))
    assert trace.attempts == 2 and trace.estimate is not None
    assert trace.estimate.estimated_input_tokens == character_estimate(MESSAGES, TOOLS)
