"""What a query costs when the budget cuts a model call mid-flight, or a call fails after it was
sent: the provider received the request and bills it, so the record keeps its prompt as an
estimate, marked; the summary's cost includes it and says how much is estimated; the cost guard
counts it. The offline provider over real HTTP, litellm unpatched."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import litellm
import orjson
import pytest
from helpers import wait_for

from piserini_ray.agent.loop import run_query
from piserini_ray.agent.prompt import SYSTEM_PROMPT, question_message
from piserini_ray.config import AgentConfig, ModelConfig, RetryConfig, RunConfig
from piserini_ray.data import Benchmark
from piserini_ray.llm.client import LLMClient
from piserini_ray.metrics.cost import CostGuard, load_pricing
from piserini_ray.offline import OfflineConfig, PolicyReply, PolicyToolCall, default_policies
from piserini_ray.offline.tokens import count_prompt_tokens
from piserini_ray.records import QueryRecord
from piserini_ray.store import RunStore
from piserini_ray.tools import ToolSession, tool_schemas
from piserini_ray_testkit import EmulatedProvider, Scripted

QUESTION_ID = "2hop__150763_14904"
FAST_RETRY = RetryConfig(backoff_base=0.05, backoff_cap=0.2, max_attempts=4)
KEY = "PISERINI_TEST_CUT_KEY"


def searches(_request: dict[str, Any]) -> PolicyReply:
    """Searches on every turn: only the budget (or a failure) ends the query."""
    return PolicyReply(
        tool_calls=[PolicyToolCall(name="search", arguments='{"reason": "r", "query": "journal"}')]
    )


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatedProvider]:
    monkeypatch.setenv(KEY, "sk-test-cut-calls")
    config = OfflineConfig(model_aliases={"gpt-5": "test/searches"})
    with EmulatedProvider(config, default_policies() | {"test/searches": searches}) as p:
        yield p


def _run(
    searcher, provider: EmulatedProvider, sample: Benchmark, model: str, budget: float
) -> QueryRecord:
    config = ModelConfig(name=model, litellm_model=f"openai/{model}", api_key_env=KEY)
    client = LLMClient(config, FAST_RETRY, api_base=provider.base_url, seed=1)
    return asyncio.run(
        run_query(
            sample.query(QUESTION_ID),
            ToolSession(searcher),
            client,
            AgentConfig(budget_seconds=budget),
            tool_schemas(),
            run_id="test",
            config_hash="h",
        )
    )


def test_a_call_cut_at_the_budget_is_billed_as_its_estimated_prompt(
    searcher, provider, sample, tmp_path: Path
) -> None:
    """gpt-5 (served by the offline provider under its name): two turns answered, the third
    hangs until the budget cuts it. Its prompt is counted with gpt-5's tokenizer (o200k_base,
    shipped with litellm), priced as input; the record, the summary, the report and the cost
    guard all count it and say it is an estimate."""
    provider.script(
        Scripted(kind="latency", seconds=0),
        Scripted(kind="latency", seconds=0),
        Scripted(kind="hang", seconds=600),
    )
    record = _run(searcher, provider, sample, "gpt-5", budget=8)
    assert record.status == "timeout" and record.termination == "budget"
    *answered, cut = record.trajectory
    assert len(answered) == 2 and all(t.usage_reported and not t.usage_estimated for t in answered)
    assert cut.model_output is None and cut.usage_estimated and not cut.usage_reported
    assert cut.attempts == 1 and cut.estimate_method is not None
    assert cut.estimate_method.startswith(  # calibrated by the query's last reply
        "tokenizer o200k_base: the provider's count of the previous request "
        f"({answered[-1].usage.input_tokens}) + "
        f"{cut.usage.input_tokens - answered[-1].usage.input_tokens} added"
    )
    expected = cut.usage.input_tokens  # the whole history the cut request carried
    assert expected == cut.usage.estimated_input_tokens > _first_prompt(sample, "gpt-5")
    assert cut.usage.output_tokens == 0  # what it may have generated is unknown
    assert record.usage.estimated_input_tokens == expected
    assert record.usage.input_tokens == expected + sum(t.usage.input_tokens for t in answered)
    assert record.calls_usage_estimated == 1 and record.calls_without_usage == 0

    # The provider bills the cut request too: its prompt, as uncached input, once the client
    # has left (the handler is cancelled then). Its count is its own tokenizer's, so the
    # estimate is near it, not equal (`bench/provider_routes.py --cut` shows it per route):
    # only the part added since the last reported request is counted here.
    _wait_until_idle(provider)
    line = provider.bill[("standard", "gpt-5")]
    assert (line.requests, line.cut_requests) == (3, 1)
    added = expected - answered[-1].usage.input_tokens
    print(f"cut call: estimated {expected} tokens, billed {line.cut_prompt_tokens}")
    assert abs(line.cut_prompt_tokens - expected) <= 0.1 * added

    price = load_pricing().price("gpt-5")
    assert price is not None
    estimated_cost = expected * price.input / 1_000_000
    assert price.estimated_cost(record.usage) == pytest.approx(estimated_cost)
    assert price.cost(record.usage) > estimated_cost > 0

    # The cost guard counts what the cut call cost.
    guard = CostGuard(cap=10.0, price=price)
    guard.finished(record.usage)
    assert guard.spent == pytest.approx(price.cost(record.usage))
    assert guard.estimated == pytest.approx(estimated_cost)

    # The summary and the report: the cost includes it and says how much is estimated.
    from piserini_ray.pipeline import finish

    config = RunConfig(
        model=ModelConfig(name="gpt-5", litellm_model="openai/gpt-5", api_key_env=KEY)
    )
    run_dir = tmp_path / "run"
    with RunStore(run_dir, config) as store:
        store.append(record.model_copy(update={"config_hash": store.config_hash}))
    metrics = finish(config, run_dir, lambda _m: None, judge=False)
    assert metrics.cost_usd == pytest.approx(price.cost(record.usage), abs=1e-4)
    assert metrics.cost_estimated_usd == pytest.approx(estimated_cost, abs=1e-4)
    assert metrics.calls_usage_estimated == 1 and metrics.calls_without_usage == 0
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["cost_usd"] == metrics.cost_usd
    assert summary["cost_estimated_usd"] == metrics.cost_estimated_usd
    assert summary["calls_usage_estimated"] == 1
    assert summary["tokens_total"]["estimated_input_tokens"] == expected
    report = (run_dir / "report.md").read_text()
    assert (
        f"Cost ${metrics.cost_usd:,.4f} (of which ${metrics.cost_estimated_usd:,.4f} estimated "
        "for 1 call cut at the budget or failed after sending)"
    ) in report


def test_a_first_call_cut_at_the_budget_counts_too(searcher, provider, sample) -> None:
    """A model litellm has no tokenizer for, cut on its first call (nothing reported yet): its
    prompt is the request's characters / 4, and still non-zero and marked."""
    provider.script(Scripted(kind="hang", seconds=600))
    record = _run(searcher, provider, sample, "test/searches", budget=2)
    assert record.status == "timeout" and len(record.trajectory) == 1
    turn = record.trajectory[0]
    assert turn.usage_estimated and turn.usage.input_tokens > 100
    assert turn.estimate_method is not None and turn.estimate_method.startswith("characters")
    assert record.calls_usage_estimated == 1
    assert record.usage.estimated_input_tokens == record.usage.input_tokens


def test_a_call_that_failed_after_sending_is_estimated_from_the_providers_last_count(
    searcher, provider, sample
) -> None:
    """One turn answered, then a 500 on every attempt: the query fails, and the failed call
    keeps its prompt: the provider's count of the answered request plus what was added (in
    characters / 4 scaled by the provider's ratio: no tokenizer for this model), close to what
    the provider counts for that request."""
    provider.script(
        Scripted(kind="latency", seconds=0),
        *[Scripted(kind="http_error", status=500)] * FAST_RETRY.max_attempts,
    )
    record = _run(searcher, provider, sample, "test/searches", budget=60)
    assert record.status == "failed" and "after 4 attempt(s)" in (record.error or "")
    first, failed = record.trajectory
    assert first.usage_reported and not first.usage_estimated
    assert failed.usage_estimated and failed.attempts == 4 and len(failed.retries) == 3
    assert failed.estimate_method is not None and failed.estimate_method.startswith(
        "characters / 4: the provider's count of the previous request "
        f"({first.usage.input_tokens}) + {failed.usage.input_tokens - first.usage.input_tokens}"
        " added"
    )
    last = provider.requests[-1]  # the last 500 (completion order)
    counted = count_prompt_tokens(last.messages or [], last.tools)  # the provider's own rule
    added = counted - first.usage.input_tokens
    assert abs(failed.usage.input_tokens - counted) <= 0.15 * added
    assert record.calls_usage_estimated == 1
    assert record.usage.estimated_input_tokens == failed.usage.input_tokens


def test_a_call_refused_at_the_door_is_not_estimated(searcher, provider, sample) -> None:
    """A 400: the provider ran nothing and bills nothing; the failed query's cost stays what
    was reported."""
    provider.script(Scripted(kind="bad_request"))
    record = _run(searcher, provider, sample, "test/searches", budget=60)
    assert record.status == "failed"
    assert not record.trajectory[0].usage_estimated and record.calls_usage_estimated == 0
    assert record.usage.input_tokens == 0


def _wait_until_idle(provider: EmulatedProvider) -> None:
    """Until the provider has handled every request (a cut one ends when its client leaves)."""
    # The client left before the run ended: the handler of the cut request is cancelled.
    wait_for("the cut request's handler cancelled", lambda: provider.in_flight == 0, 30)


def _first_prompt(sample: Benchmark, model: str) -> int:
    """The first request's prompt (system, question, tools) as litellm counts it for `model`."""
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question_message(sample.query(QUESTION_ID).query)},
    ]
    tools: Any = tool_schemas()  # OpenAI tool dicts (litellm types them as TypedDicts)
    return int(litellm.token_counter(model=model, messages=messages, tools=tools))


def test_the_estimate_is_litellms_count_of_the_cut_request(searcher, provider, sample) -> None:
    """The first request cut: its prompt is known, and the turn holds litellm's count of it."""
    provider.script(Scripted(kind="hang", seconds=600))
    record = _run(searcher, provider, sample, "gpt-5", budget=2)
    assert record.trajectory[0].usage.input_tokens == _first_prompt(sample, "gpt-5") > 100


def test_a_stopped_query_ends_retryable_with_its_cut_call_estimated(
    searcher, provider, sample
) -> None:
    """`piserini-ray stop` sets the query's stop event while its third call waits on the
    provider: the loop ends at once, as a retryable failure (`resume` runs it again), and the
    cut call's prompt is on its record, as at the budget."""
    provider.hold(after=2)
    config = ModelConfig(name="gpt-5", litellm_model="openai/gpt-5", api_key_env=KEY)
    client = LLMClient(config, FAST_RETRY, api_base=provider.base_url, seed=1)

    async def stopped_mid_call() -> QueryRecord:
        stop = asyncio.Event()
        query = asyncio.ensure_future(
            run_query(
                sample.query(QUESTION_ID),
                ToolSession(searcher),
                client,
                AgentConfig(budget_seconds=300),
                tool_schemas(),
                run_id="test",
                config_hash="h",
                stop=stop,
            )
        )
        assert await asyncio.to_thread(provider.wait_held, 1, 120)
        stop.set()
        return await query

    try:
        record = asyncio.run(stopped_mid_call())
    finally:
        provider.release()
    assert (record.status, record.termination, record.retryable) == ("failed", "stopped", True)
    *answered, cut = record.trajectory
    assert len(answered) == 2 and cut.usage_estimated and cut.usage.input_tokens > 0
    assert record.usage.estimated_input_tokens == cut.usage.input_tokens
