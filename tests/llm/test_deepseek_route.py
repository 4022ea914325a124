"""litellm's native `deepseek/` route against the offline provider's DeepSeek dialect
(`/deepseek/chat/completions`, `piserini_ray/offline/deepseek.py`): thinking mode's
`reasoning_content` kept across a tool loop, refused when dropped, and DeepSeek's cache usage."""

from __future__ import annotations

import litellm
import pytest
from route_run import run_sample_query

from piserini_ray.config import ModelConfig
from piserini_ray.data import Benchmark
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.offline.deepseek import MISSING_REASONING
from piserini_ray.tools import tool_schemas

ROUTE = "deepseek/deepseek-v4-flash"
ALIASES = {"deepseek-v4-flash": "offline/long-horizon"}


def _base(provider: OfflineProvider) -> str:
    return f"http://127.0.0.1:{provider.port}/deepseek"


def test_a_thinking_tool_loop_keeps_its_reasoning_and_is_billed_as_served(
    searcher, sample: Benchmark
) -> None:
    with OfflineProvider(OfflineConfig(model_aliases=ALIASES)) as provider:
        model = ModelConfig(
            name="deepseek-v4-flash", litellm_model=ROUTE, api_base=_base(provider),
            reasoning_effort="low",
        )  # fmt: skip
        record = run_sample_query(searcher, sample, model)
        bills = [r.usage for r in provider.requests if r.usage is not None]
        statuses = {r.status for r in provider.requests}
        last = provider.requests[-1].messages or []
    assert record.status == "completed" and len(record.trajectory) >= 6 and statuses == {200}
    assert all(t.reasoning for t in record.trajectory)
    sent_back = [m for m in last if m.get("role") == "assistant" and m.get("tool_calls")]
    assert sent_back and all(m.get("reasoning_content") for m in sent_back)
    assert all("thinking_blocks" not in m for m in last)  # nothing Anthropic's on this route
    assert record.usage.input_tokens == sum(b.prompt_tokens for b in bills)
    assert record.usage.cached_tokens == sum(b.cached_tokens for b in bills) > 0
    assert record.usage.output_tokens == sum(b.completion_tokens for b in bills)
    price = load_pricing().price("deepseek-v4-flash")
    assert price is not None
    by_hand = sum(
        (b.prompt_tokens - b.cached_tokens) * 0.14 + b.cached_tokens * 0.028
        + b.completion_tokens * 0.28
        for b in bills
    ) / 1_000_000  # fmt: skip
    assert price.cost(record.usage) == pytest.approx(by_hand)


def test_a_history_without_reasoning_content_is_refused_in_thinking_mode() -> None:
    with OfflineProvider(OfflineConfig(model_aliases=ALIASES)) as provider:
        messages = [
            {"role": "user", "content": "Question: who?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "search", "arguments": '{"reason": "r", "query": "q"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "nothing"},
        ]  # fmt: skip
        call = {"model": ROUTE, "api_base": _base(provider), "api_key": "k",
                "tools": tool_schemas(), "num_retries": 0}  # fmt: skip
        with pytest.raises(litellm.BadRequestError, match="reasoning_content in the thinking"):
            litellm.completion(messages=messages, thinking={"type": "enabled"}, **call)
        litellm.completion(messages=messages, **call)  # without thinking mode it is fine
    assert MISSING_REASONING.startswith("The reasoning_content")
