"""litellm's native `anthropic/` route against the offline provider's Messages API emulator
(`/v1/messages`, `piserini_ray/offline/anthropic.py`): a thinking model's tool loop, prompt
caching billed as Anthropic bills it, and an emulator that refuses what the real API refuses."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import litellm
import pytest
from route_run import run_sample_query

from piserini_ray.config import ModelConfig
from piserini_ray.data import Benchmark
from piserini_ray.llm.usage import usage_from
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.offline.anthropic import MIN_CACHEABLE_TOKENS
from piserini_ray.tools import tool_schemas

ROUTE = "anthropic/claude-haiku-4-5"
ALIASES = {"claude-haiku-4-5": "offline/long-horizon"}  # at least 6 turns, tool calls in each


def _model(provider: OfflineProvider, **kw: Any) -> ModelConfig:
    return ModelConfig(
        name="claude-haiku-4.5",
        litellm_model=ROUTE,
        api_base=f"http://127.0.0.1:{provider.port}",
        reasoning_effort="low",  # litellm turns this into extended thinking
        max_output_tokens=4096,
        **kw,
    )


def test_a_thinking_tool_loop_with_caching_is_billed_as_the_emulator_billed(
    searcher, sample: Benchmark
) -> None:
    with OfflineProvider(OfflineConfig(model_aliases=ALIASES)) as provider:
        record = run_sample_query(searcher, sample, _model(provider))
        bills = [r.usage for r in provider.requests if r.usage is not None]
        statuses = {r.status for r in provider.requests}
    assert record.status == "completed", record.error
    assert len(record.trajectory) >= 6 and statuses == {200}
    # Every turn's thinking came back with its signature, or the emulator would have refused
    # the next request; the trajectory keeps the reasoning text.
    assert all(t.reasoning for t in record.trajectory)
    # The system prompt and the moving tail are marked: once the previous prompt was long
    # enough to cache (1,024 tokens), every turn reads it (here from turn 2 or 3).
    assert bills[0].cached_tokens == 0
    assert all(
        b.cached_tokens >= a.prompt_tokens
        for a, b in itertools.pairwise(bills)
        if a.prompt_tokens >= MIN_CACHEABLE_TOKENS
    )
    assert bills[2].cached_tokens > 0 and sum(b.cache_write_tokens for b in bills) > 0
    ours = sum(t.usage.cached_tokens for t in record.trajectory)
    billed_prompt = sum(b.prompt_tokens for b in bills)
    assert record.usage.input_tokens == billed_prompt
    assert abs(ours / billed_prompt - sum(b.cached_tokens for b in bills) / billed_prompt) < 0.02
    # Cost to the token, from the emulator's own usage log and the table's Claude prices.
    price = load_pricing().price("claude-haiku-4.5")
    assert price is not None and price.cache_write == 1.25
    by_hand = (
        sum(
            (b.prompt_tokens - b.cached_tokens - b.cache_write_tokens) * 1.00
            + b.cached_tokens * 0.10
            + b.cache_write_tokens * 1.25
            + b.completion_tokens * 5
            for b in bills
        )
        / 1_000_000
    )
    assert price.cost(record.usage) == pytest.approx(by_hand)
    for turn in record.trajectory:  # uncached input is never negative
        u = turn.usage
        assert u.input_tokens - u.cached_tokens - u.cache_write_tokens >= 0


def _call(provider: OfflineProvider, messages: list[dict[str, Any]]) -> Any:
    """One thinking call on the route, litellm's retries off; the reply's message."""
    reply = litellm.completion(
        model=ROUTE,
        api_base=f"http://127.0.0.1:{provider.port}",
        api_key="k",
        messages=messages,
        tools=tool_schemas(),
        reasoning_effort="low",
        max_tokens=4096,
        num_retries=0,
    )
    return reply.choices[0].message


def _first_turn(provider: OfflineProvider) -> tuple[list[dict[str, Any]], Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Answer with the tools."},
        {"role": "user", "content": "Question: who edited the journal?"},
    ]
    return messages, _call(provider, messages)


def test_the_emulator_refuses_a_history_without_its_thinking_blocks() -> None:
    """The bug this route had: the assistant message rebuilt from content and tool calls only.
    The emulator must refuse it as Anthropic does, and accept it with the blocks kept."""
    with OfflineProvider(OfflineConfig(model_aliases=ALIASES)) as provider:
        messages, message = _first_turn(provider)
        call = message.tool_calls[0]
        function = {"name": call.function.name, "arguments": call.function.arguments}
        calls = [{"id": call.id, "type": "function", "function": function}]
        result = {"role": "tool", "tool_call_id": call.id, "content": "no results"}
        dropped = [*messages, {"role": "assistant", "content": None, "tool_calls": calls}, result]
        with pytest.raises(litellm.BadRequestError, match="must start with a thinking block"):
            _call(provider, dropped)
        forged = [dict(b) | {"thinking": "something else"} for b in message.thinking_blocks]
        assistant = {"role": "assistant", "content": None, "tool_calls": calls}
        with pytest.raises(litellm.BadRequestError, match="Invalid `signature`"):
            _call(provider, [*messages, assistant | {"thinking_blocks": forged}, result])
        kept = assistant | {"thinking_blocks": message.thinking_blocks}
        _call(provider, [*messages, kept, result])  # accepted


def _tool_use_without_result(body: dict[str, Any]) -> None:
    use = {"type": "tool_use", "id": "toolu_x", "name": "search", "input": {}}
    body["messages"].append({"role": "assistant", "content": [use]})


def _result_without_tool_use(body: dict[str, Any]) -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_y", "content": "x"}
    body["messages"].append({"role": "user", "content": [result]})


def _five_breakpoints(body: dict[str, Any]) -> None:
    mark = {"type": "ephemeral"}
    body["system"] = [{"type": "text", "text": str(i), "cache_control": mark} for i in range(5)]


def _marked(*ttls: str) -> Any:
    def change(body: dict[str, Any]) -> None:
        body["system"] = [
            {"type": "text", "text": ttl, "cache_control": {"type": "ephemeral", "ttl": ttl}}
            for ttl in ttls
        ]

    return change


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda b: b.pop("max_tokens"), "max_tokens: Field required"),
        (lambda b: b.update(temperature=0.2), "`temperature` may only be set to 1"),
        (lambda b: b.update(thinking={"type": "enabled", "budget_tokens": 100}), ">= 1024"),
        (_tool_use_without_result, "without `tool_result` blocks"),
        (_result_without_tool_use, "unexpected `tool_use_id`"),
        (_five_breakpoints, "A maximum of 4 blocks with cache_control"),
        (_marked("10m"), "cache_control.ttl: Input should be '5m' or '1h'"),
        (_marked("5m", "1h"), "ttl='1h' must not come after one with ttl='5m'"),
    ],
)
def test_requests_the_real_api_rejects_are_rejected(change: Any, expected: str) -> None:
    body: dict[str, Any] = {
        "model": "claude-haiku-4-5",
        "max_tokens": 2048,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": "hello"}],
    }
    change(body)
    with OfflineProvider(OfflineConfig(model_aliases=ALIASES)) as provider:
        url = f"http://127.0.0.1:{provider.port}/v1/messages"
        headers = {"anthropic-version": "2023-06-01", "x-api-key": "k"}
        reply = httpx.post(url, json=body, headers=headers, timeout=30)
        no_version = httpx.post(url, json={}, headers={"x-api-key": "k"}, timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["type"] == "error" and expected in reply.json()["error"]["message"]
    assert no_version.status_code == 400 and "anthropic-version" in no_version.text


def test_one_hour_cache_writes_are_reported_and_billed_apart() -> None:
    """`ttl: 1h` breakpoints write to the 1-hour cache: the reply's `cache_creation` splits the
    writes by lifetime, the bill keeps the 1-hour part, and a later request reads it."""
    long_text = "the prompt's shared part, long enough to be cached. " * 200
    one_hour = {"type": "ephemeral", "ttl": "1h"}
    body: dict[str, Any] = {
        "model": "claude-haiku-4-5",
        "max_tokens": 512,
        "system": [{"type": "text", "text": long_text, "cache_control": one_hour}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": long_text, "cache_control": {"type": "ephemeral"}},
        ]}],
    }  # fmt: skip
    with OfflineProvider(OfflineConfig(model_aliases=ALIASES)) as provider:
        url = f"http://127.0.0.1:{provider.port}/v1/messages"
        headers = {"anthropic-version": "2023-06-01", "x-api-key": "k"}
        first = httpx.post(url, json=body, headers=headers, timeout=30).json()["usage"]
        again = httpx.post(url, json=body, headers=headers, timeout=30).json()["usage"]
        (line,) = provider.bill.values()
    split = first["cache_creation"]
    assert split["ephemeral_1h_input_tokens"] > 0 and split["ephemeral_5m_input_tokens"] > 0
    assert sum(split.values()) == first["cache_creation_input_tokens"]
    assert again["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert line.cache_write_1h_tokens == split["ephemeral_1h_input_tokens"]
    # litellm's usage keeps the split, and our price charges 1-hour writes twice the input.
    usage = usage_from(
        litellm.llms.anthropic.chat.transformation.AnthropicConfig().calculate_usage(first, None)
    )
    assert usage.cache_write_1h_tokens == split["ephemeral_1h_input_tokens"]
    price = load_pricing().price("claude-haiku-4.5")
    assert price is not None
    by_hand = (
        first["input_tokens"] * 1.00
        + split["ephemeral_5m_input_tokens"] * 1.25
        + split["ephemeral_1h_input_tokens"] * 2.00
        + first["output_tokens"] * 5
    ) / 1_000_000
    assert price.cost(usage) == pytest.approx(by_hand)
