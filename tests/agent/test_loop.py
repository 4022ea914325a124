"""The agent loop against the offline provider over real HTTP (litellm is never patched)."""

from __future__ import annotations

import asyncio
import os
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from piserini_ray.agent.loop import run_query
from piserini_ray.agent.prompt import STEER_MESSAGE
from piserini_ray.config import AgentConfig, ModelConfig, RetryConfig, RunConfig
from piserini_ray.data import Benchmark
from piserini_ray.errors import ProviderRefused
from piserini_ray.llm.client import LLMClient
from piserini_ray.offline import (
    LatencyConfig,
    OfflineConfig,
    PolicyReply,
    PolicyToolCall,
    default_policies,
)
from piserini_ray.offline.long_horizon import MAX_CALLS, MIN_CALLS, planned_calls
from piserini_ray.records import QueryRecord, Usage
from piserini_ray.store import RunStore
from piserini_ray.tools import ToolSession, tool_schemas
from piserini_ray_testkit import EmulatedProvider, Scripted

QUESTION_ID = "2hop__150763_14904"
FAST_RETRY = RetryConfig(backoff_base=0.05, backoff_cap=0.2, max_attempts=6)
ANSWER = (
    "Explanation: It is in [msq-7976b1e35e0a] and [no-such-doc].\n"
    "Exact Answer: **G. Stanley Hall**\nConfidence: 80"
)


def stubborn(_request: dict[str, Any]) -> PolicyReply:
    """Searches forever, even after the steer: only the budget stops it."""
    return PolicyReply(
        tool_calls=[
            PolicyToolCall(name="search", arguments='{"reason": "again", "query": "journal"}')
        ]
    )


def one_search_then_answer(request: dict[str, Any]) -> PolicyReply:
    """One search, then two tool calls in one turn, then an answer with a citation."""
    tool_turns = sum(1 for m in request["messages"] if m.get("role") == "assistant")
    if tool_turns == 0:
        return PolicyReply(
            tool_calls=[
                PolicyToolCall(
                    name="search", arguments='{"reason": "r", "query": "psychotherapy integration"}'
                )
            ]
        )
    if tool_turns == 1:
        return PolicyReply(
            tool_calls=[
                PolicyToolCall(
                    name="read_document", arguments='{"reason": "r", "docid": "msq-7976b1e35e0a"}'
                ),
                PolicyToolCall(
                    name="read_search_results", arguments='{"reason": "r", "search_id": "s1"}'
                ),
            ]
        )
    return PolicyReply(content=ANSWER)


def answers_after_steer(request: dict[str, Any]) -> PolicyReply:
    if any(m.get("content") == STEER_MESSAGE for m in request["messages"]):
        return PolicyReply(content=ANSWER)
    return stubborn(request)


POLICIES = {
    "test/stubborn": stubborn,
    "test/scripted": one_search_then_answer,
    "test/steerable": answers_after_steer,
}


@pytest.fixture
def provider():
    with EmulatedProvider(OfflineConfig(), default_policies() | POLICIES) as p:
        yield p


def _run(
    searcher,
    provider,
    sample: Benchmark,
    model: str,
    *,
    agent: AgentConfig = AgentConfig(),
    retry: RetryConfig = FAST_RETRY,
    spill: Path | None = None,
    **model_kw: Any,
) -> tuple[QueryRecord, ToolSession]:
    config = ModelConfig(name=model, litellm_model=f"openai/{model}", **model_kw)
    client = LLMClient(config, retry, api_base=provider.base_url, seed=1)
    session = ToolSession(searcher, spill_dir=spill)
    record = asyncio.run(
        run_query(
            sample.query(QUESTION_ID),
            session,
            client,
            agent,
            tool_schemas(),
            run_id="test",
            config_hash="h",
        )
    )
    return record, session


def _chat_requests(provider) -> list:
    return [r for r in provider.requests if r.status == 200]


# ---------------------------------------------------------------- the loop


def test_full_conversation_record(searcher, provider, sample) -> None:
    record, _ = _run(searcher, provider, sample, "test/scripted")
    assert record.status == "completed" and record.termination == "answer"
    assert record.exact_answer == "G. Stanley Hall" and record.confidence == 80
    assert record.confidence_missing is False
    assert record.cited == ["msq-7976b1e35e0a"]  # the unknown docid is not kept
    assert record.tool_call_counts == {"search": 1, "read_document": 1, "read_search_results": 1}
    assert [len(t.tool_calls) for t in record.trajectory] == [1, 2, 0]
    second = record.trajectory[1].tool_calls
    assert [c.name for c in second] == ["read_document", "read_search_results"]  # in order
    assert record.opened == ["msq-7976b1e35e0a"] and record.behavior == ["msq-7976b1e35e0a"]
    assert len(record.surfaced) == len(searcher.search("psychotherapy integration"))
    assert len(record.previewed) == 15


def test_history_is_append_only(searcher, provider, sample) -> None:
    _run(searcher, provider, sample, "offline/heuristic")
    seen = [r.messages for r in _chat_requests(provider)]
    assert len(seen) >= 3
    for before, after in pairwise(seen):
        assert after[: len(before)] == before  # every request extends the previous one


def test_token_totals_equal_the_servers_counts(searcher, provider, sample) -> None:
    record, _ = _run(searcher, provider, sample, "offline/heuristic")
    served = _chat_requests(provider)
    assert record.usage == Usage(
        input_tokens=sum(r.usage.prompt_tokens for r in served),
        output_tokens=sum(r.usage.completion_tokens for r in served),
        cached_tokens=sum(r.usage.cached_tokens for r in served),
    )
    assert record.usage.cached_tokens > 0  # the append-only history hits the prefix cache
    assert [t.usage.input_tokens for t in record.trajectory] == [
        r.usage.prompt_tokens for r in served
    ]


def test_heuristic_exercises_every_tool_and_the_answer_format(searcher, provider, sample) -> None:
    record, _ = _run(searcher, provider, sample, "offline/heuristic")
    assert record.status == "completed"
    assert set(record.tool_call_counts) == {"search", "read_search_results", "read_document"}
    assert record.exact_answer and not record.confidence_missing


def test_long_horizon_makes_its_planned_number_of_calls(searcher, provider, sample) -> None:
    """The paper's conversation shape: 10-40 tool calls, one per turn, then an answer; a long
    history is mostly a cached prefix."""
    record, _ = _run(searcher, provider, sample, "offline/long-horizon")
    planned = planned_calls(sample.query(QUESTION_ID).query)
    assert MIN_CALLS <= planned <= MAX_CALLS
    assert record.status == "completed" and record.exact_answer
    assert sum(record.tool_call_counts.values()) == planned == len(record.trajectory) - 1
    assert set(record.tool_call_counts) == {"search", "read_search_results", "read_document"}
    searches = [c.arguments for t in record.trajectory for c in t.tool_calls if c.name == "search"]
    assert len(set(searches)) > 1  # each search tries another window of the question
    assert record.usage.cached_tokens / record.usage.input_tokens > 0.9
    spread = {planned_calls(q.query) for q in sample.queries}
    assert min(spread) == MIN_CALLS and max(spread) == MAX_CALLS  # the whole range is used


# ---------------------------------------------------------------- budget


def test_steer_blocks_tools_and_budget_stops_the_query(searcher, sample) -> None:
    latency = OfflineConfig(latency=LatencyConfig(kind="fixed", seconds=0.3))
    with EmulatedProvider(latency, POLICIES) as provider:
        record, session = _run(
            searcher, provider, sample, "test/stubborn", agent=AgentConfig(budget_seconds=3)
        )
        assert record.status == "timeout" and record.termination == "budget"
        assert record.steered and session.blocked
        assert record.charged_seconds >= 3.0
        steer_turn = next(t for t in record.trajectory if t.steered)
        assert steer_turn.started_at_charged >= 2.0  # floor(0.7 * 3)
        before = [c for t in record.trajectory if t.index < steer_turn.index for c in t.tool_calls]
        after = [c for t in record.trajectory if t.index >= steer_turn.index for c in t.tool_calls]
        assert before and all(c.ok for c in before[:1])
        assert after and all(not c.ok and "Tools are blocked" in c.observation for c in after)
        steer_requests = [
            r for r in provider.requests if {"role": "user", "content": STEER_MESSAGE} in r.messages
        ]
        assert steer_requests  # the model was told to submit now
        assert record.final_answer is None and record.exact_answer is None


def test_steer_then_answer_completes(searcher, sample) -> None:
    latency = OfflineConfig(latency=LatencyConfig(kind="fixed", seconds=0.3))
    with EmulatedProvider(latency, POLICIES) as provider:
        record, _ = _run(
            searcher, provider, sample, "test/steerable", agent=AgentConfig(budget_seconds=2)
        )
    assert record.status == "completed" and record.steered
    assert record.exact_answer == "G. Stanley Hall"


def test_hung_call_is_cancelled_at_the_budget(searcher, provider, sample) -> None:
    provider.script(Scripted(kind="hang", seconds=600))
    record, _ = _run(
        searcher, provider, sample, "test/scripted", agent=AgentConfig(budget_seconds=2)
    )
    assert record.status == "timeout" and record.termination == "budget"
    assert record.trajectory[0].model_output is None


def test_iteration_cap(searcher, provider, sample) -> None:
    agent = AgentConfig(termination="iterations", max_iterations=3)
    record, _ = _run(searcher, provider, sample, "test/stubborn", agent=agent)
    assert record.status == "timeout" and record.termination == "iterations"
    assert len(record.trajectory) == 3 and not record.steered
    assert "3 model turns" in (record.error or "")


# ---------------------------------------------------------------- retries


def test_429_storm_is_waited_not_charged(searcher, provider, sample) -> None:
    provider.script(*[Scripted(kind="rate_limit", retry_after=0.5)] * 3)
    # A 1.5 s budget survives 1.5 s of Retry-After waits because waits are not charged.
    record, _ = _run(
        searcher, provider, sample, "test/scripted", agent=AgentConfig(budget_seconds=1.5)
    )
    assert record.status == "completed"
    first = record.trajectory[0]
    assert first.attempts == 4 and len(first.retries) == 3
    assert all("rate_limit, waiting 0.50 s" in r for r in first.retries)  # Retry-After honoured
    assert record.waited_seconds >= 1.5
    # One reading of the clock: the identity holds up to the records' rounding (4 digits).
    assert abs(record.charged_seconds + record.waited_seconds - record.wall_seconds) <= 2e-4


def test_wall_clock_mode_charges_the_waits(searcher, provider, sample) -> None:
    provider.script(*[Scripted(kind="rate_limit", retry_after=0.5)] * 3)
    agent = AgentConfig(budget_seconds=10, budget_clock="wall")
    record, _ = _run(searcher, provider, sample, "test/scripted", agent=agent)
    assert record.budget_clock == "wall" and record.charged_seconds >= 1.5


def test_transient_errors_are_retried(searcher, provider, sample) -> None:
    provider.script(
        Scripted(kind="http_error", status=503), Scripted(kind="http_error", status=500)
    )
    record, _ = _run(searcher, provider, sample, "test/scripted")
    assert record.status == "completed" and record.trajectory[0].attempts == 3
    assert all(r.startswith("transient") for r in record.trajectory[0].retries)


def test_a_failed_call_shows_every_attempt_on_its_turn(searcher, provider, sample) -> None:
    provider.script(*[Scripted(kind="http_error", status=503)] * FAST_RETRY.max_attempts)
    record, _ = _run(searcher, provider, sample, "test/scripted")
    assert record.status == "failed" and "after 6 attempt(s)" in (record.error or "")
    turn = record.trajectory[-1]
    assert turn.attempts == 6 and len(turn.retries) == 5 and turn.model_seconds > 0


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("context_window", "context window exceeded"), ("bad_request", "BadRequestError")],
)
def test_permanent_errors_fail_fast(searcher, provider, sample, kind: str, reason: str) -> None:
    provider.script(Scripted(kind=kind))
    record, _ = _run(searcher, provider, sample, "test/scripted")
    assert record.status == "failed" and reason in (record.error or "")
    assert "after 1 attempt" in (record.error or "")
    assert len(provider.requests) == 1


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("auth_error", "AuthenticationError"), ("insufficient_quota", "quota exhausted")],
)
def test_a_refusal_of_the_whole_run_is_no_query_failure(
    searcher, provider, sample, kind: str, reason: str
) -> None:
    """A bad key or an exhausted quota would fail every query alike: the query gets no failed
    record (a resume after the fix runs it); the engines stop starting queries."""
    provider.script(Scripted(kind=kind))
    with pytest.raises(ProviderRefused, match=reason):
        _run(searcher, provider, sample, "test/scripted")
    assert len(provider.requests) == 1


def test_a_call_timeout_is_transient(searcher, provider, sample) -> None:
    provider.script(Scripted(kind="hang", seconds=30))
    record, _ = _run(searcher, provider, sample, "test/scripted", call_timeout=0.5)
    assert record.status == "completed" and record.trajectory[0].attempts == 2


# ---------------------------------------------------------------- malformed replies


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("malformed_arguments", "the arguments are not valid JSON"),
        ("unknown_tool", "Unknown tool"),
        ("missing_fields", "missing reason"),
    ],
)
def test_malformed_tool_calls_become_observations(
    searcher, provider, sample, kind, message
) -> None:
    provider.script(Scripted(kind=kind))
    record, _ = _run(searcher, provider, sample, "test/scripted")
    first = record.trajectory[0].tool_calls[0]
    assert not first.ok and message in first.observation
    assert record.status == "completed"  # the agent carried on


def test_empty_reply_is_kept_verbatim(searcher, provider, sample) -> None:
    provider.script(Scripted(kind="empty_reply"))
    record, _ = _run(searcher, provider, sample, "test/scripted")
    assert record.status == "completed" and record.final_answer in ("", None)
    assert record.exact_answer is None and record.confidence_missing


# ---------------------------------------------------------------- secrets


def test_no_key_value_is_written_anywhere(searcher, provider, sample, tmp_path: Path) -> None:
    secret = "sk-test-DO-NOT-LEAK-0123456789"
    os.environ["PISERINI_TEST_KEY"] = secret
    try:
        config = RunConfig(
            model=ModelConfig(
                name="test/scripted",
                litellm_model="openai/test/scripted",
                api_key_env="PISERINI_TEST_KEY",
            )
        )
        with RunStore(tmp_path / "run", config) as store:
            record, _ = _run(
                searcher,
                provider,
                sample,
                "test/scripted",
                api_key_env="PISERINI_TEST_KEY",
                spill=store.spill_dir(QUESTION_ID),
            )
            store.append(record.model_copy(update={"config_hash": store.config_hash}))
            provider.script(Scripted(kind="bad_request"))
            failed, _ = _run(
                searcher, provider, sample, "test/scripted", api_key_env="PISERINI_TEST_KEY"
            )
            assert failed.status == "failed"
            store.append(
                failed.model_copy(update={"config_hash": store.config_hash, "query_id": "other"})
            )
        files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
        assert files
        for path in files:
            assert secret not in path.read_text(errors="replace"), path
        assert "PISERINI_TEST_KEY" in (tmp_path / "run" / "manifest.json").read_text()
    finally:
        del os.environ["PISERINI_TEST_KEY"]


def test_missing_key_variable_stops_the_run_instead_of_failing_the_query(
    searcher, provider, sample
) -> None:
    """A configuration failure is never a query failure (issue 25): the loop raises the run's
    refusal, so no `failed` record is written that a resume would then skip for good."""
    from piserini_ray.errors import ProviderRefused

    os.environ.pop("PISERINI_UNSET_KEY", None)
    with pytest.raises(ProviderRefused) as refused:
        _run(searcher, provider, sample, "test/scripted", api_key_env="PISERINI_UNSET_KEY")
    assert "environment variable PISERINI_UNSET_KEY (model.api_key_env) is not set" in str(
        refused.value
    )
    assert provider.requests == []
