"""litellm's chat-to-responses bridge (gpt-5.4+ with function tools and a reasoning effort)
against the offline provider's Responses API (`/v1/responses`, `offline/responses.py`):
reasoning items kept across a tool loop, prefix caching in OpenAI's steps, cost as billed, and
requests the real API rejects rejected."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from route_run import run_sample_query

from piserini_ray.config import ModelConfig
from piserini_ray.data import Benchmark
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.offline.responses import CACHE_STEP, MIN_CACHED_TOKENS

ALIASES = {"gpt-5.4-mini": "offline/long-horizon"}


def test_a_reasoning_tool_loop_over_the_responses_api_is_billed_as_served(
    searcher, sample: Benchmark
) -> None:
    with OfflineProvider(OfflineConfig(model_aliases=ALIASES)) as provider:
        model = ModelConfig(
            name="gpt-5.4-mini",
            litellm_model="openai/gpt-5.4-mini",
            api_base=provider.base_url,
            reasoning_effort="low",
        )
        record = run_sample_query(searcher, sample, model)
        requests = provider.requests
    assert record.status == "completed" and len(record.trajectory) >= 6
    assert {r.status for r in requests} == {200} and all(r.messages for r in requests)
    assert all(t.reasoning for t in record.trajectory)
    # Every earlier turn's reasoning item went back, ahead of its function calls.
    last: list[dict[str, Any]] = requests[-1].messages or []
    replayed = [i for i in last if i.get("type") == "reasoning"]
    assert len(replayed) == len(record.trajectory) - 1
    bills = [r.usage for r in requests if r.usage is not None]
    for b in bills:
        assert b.cached_tokens == 0 or (
            b.cached_tokens >= MIN_CACHED_TOKENS
            and (b.cached_tokens - MIN_CACHED_TOKENS) % CACHE_STEP == 0
        )
    assert sum(b.cached_tokens for b in bills) > 0
    assert record.usage.input_tokens == sum(b.prompt_tokens for b in bills)
    assert record.usage.cached_tokens == sum(b.cached_tokens for b in bills)
    price = load_pricing().price("gpt-5.4-mini")
    assert price is not None
    by_hand = (
        sum(
            (b.prompt_tokens - b.cached_tokens) * 0.75
            + b.cached_tokens * 0.075
            + b.completion_tokens * 4.5
            for b in bills
        )
        / 1_000_000
    )
    assert price.cost(record.usage) == pytest.approx(by_hand)


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (
            [{"type": "function_call_output", "call_id": "call_xyz", "output": "x"}],
            "No tool call found for function call output with call_id call_xyz",
        ),
        (
            [
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "encrypted_content": "forged",
                    "summary": [{"type": "summary_text", "text": "t"}],
                },
            ],
            "could not be verified",
        ),
    ],
)
def test_requests_the_real_api_rejects_are_rejected(items: list, expected: str) -> None:
    question = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]}
    with OfflineProvider(OfflineConfig(model_aliases=ALIASES)) as provider:
        url = f"{provider.base_url}/responses"
        reply = httpx.post(
            url, json={"model": "gpt-5.4-mini", "input": [question, *items]}, timeout=30
        )
        missing = httpx.post(url, json={"model": "gpt-5.4-mini"}, timeout=30)
    assert reply.status_code == 400 and expected in reply.json()["error"]["message"]
    assert missing.status_code == 400 and "'input'" in missing.text
