"""The two pure parts of the agent loop: how a query ended (status mapping) and the record it
leaves (record building), without a model, a searcher or a clock."""

from __future__ import annotations

import pytest

from piserini_ray.agent.answer import ParsedAnswer
from piserini_ray.agent.loop import (
    Ending,
    Timing,
    ToolEvidence,
    _IterationCap,
    build_record,
    ending_of,
)
from piserini_ray.errors import InfrastructureError, ProviderRefused
from piserini_ray.llm.failures import Failure, FailureKind, RetryError
from piserini_ray.records import RankingLog, ToolCallRecord, Turn, Usage


def _retry_error(kind: FailureKind, reason: str, stops_run: bool = False) -> RetryError:
    return RetryError(Failure(kind, reason, stops_run=stops_run), attempts=2)


@pytest.mark.parametrize(
    ("exc", "budget", "expected"),
    [
        (None, False, Ending("completed", "answer")),
        (None, True, Ending("timeout", "budget")),
        # The budget wins over whatever the cancelled loop was doing.
        (ValueError("x"), True, Ending("timeout", "budget")),
        (
            _IterationCap(),
            False,
            Ending("timeout", "iterations", "reached the cap of 7 model turns"),
        ),
        (ValueError("bad"), False, Ending("failed", "error", "ValueError: bad")),
    ],
)
def test_how_a_query_ended(exc: BaseException | None, budget: bool, expected: Ending) -> None:
    assert ending_of(exc, budget, max_iterations=7) == expected


def test_a_transient_failure_after_retries_fails_the_query_with_its_attempts() -> None:
    error = _retry_error(FailureKind.TRANSIENT, "APIConnectionError: reset")
    ending = ending_of(error, False, 7)
    assert ending.status == "failed" and ending.termination == "error"
    assert ending.retryable  # the provider stayed down: not the query's fault, resume runs it
    assert not ending_of(_retry_error(FailureKind.PERMANENT, "400: bad"), False, 7).retryable
    assert ending.error == str(error) and "reset" in ending.error


def test_what_is_not_the_querys_fault_raises_instead_of_ending_it() -> None:
    with pytest.raises(InfrastructureError):
        ending_of(InfrastructureError("limiter gone"), False, 7)
    refused = _retry_error(FailureKind.PERMANENT, "401: key sk-secret-1 rejected", stops_run=True)
    with pytest.raises(ProviderRefused) as caught:
        ending_of(refused, False, 7, scrub=lambda t: t.replace("sk-secret-1", "[key]"))
    assert "sk-secret-1" not in str(caught.value) and "[key]" in str(caught.value)


def test_an_unexpected_error_is_scrubbed() -> None:
    ending = ending_of(RuntimeError("token sk-abc"), False, 7, lambda t: t.replace("sk-abc", "***"))
    assert ending.error == "RuntimeError: token ***"


def _turn(index: int, tools: list[str], usage: Usage, reported: bool = True) -> Turn:
    turn = Turn(index=index, model_output=None, started_at_charged=0.0, steered=False)
    turn.usage, turn.usage_reported = usage, reported
    for name in tools:
        turn.tool_calls.append(
            ToolCallRecord(id=None, name=name, arguments="{}", ok=True, observation="", seconds=0)
        )
    return turn


def _record(ending: Ending, cited: list[str], extra: list[Turn] | None = None):
    turns = [
        _turn(1, ["search", "read_document"], Usage(input_tokens=100, output_tokens=10)),
        _turn(2, ["read_document"], Usage(input_tokens=150, output_tokens=5), reported=False),
        _turn(3, [], Usage(input_tokens=200, output_tokens=20, cached_tokens=80)),
        *(extra or []),
    ]
    evidence = ToolEvidence(
        surfaced=["d1", "d2", "d3"],
        previewed=["d1", "d2"],
        opened=["d2", "d1"],
        rankings=[RankingLog(search_id="s1", query="q", docids=["d1", "d2", "d3"])],
        spills={"s1.txt": "long output"},
    )
    return build_record(
        query_id="q1",
        model="m",
        run_id="r",
        config_hash="h",
        ending=ending,
        final="Explanation: ...\nExact Answer: Paris\nConfidence: 80%",
        parsed=ParsedAnswer(
            explanation="...",
            exact_answer="Paris",
            confidence=80.0,
            confidence_missing=False,
            cited=cited,
        ),
        turns=turns,
        steered=True,
        evidence=evidence,
        timing=Timing(charged=12.34567, waited=1.5, wall=14.0, clock="working"),
        started_at="t0",
        finished_at="t1",
    )


def test_a_completed_record_keeps_its_answer_and_adds_what_it_cited_to_its_behavior() -> None:
    record = _record(Ending("completed", "answer"), cited=["d3", "d1"])
    assert (record.status, record.termination, record.error) == ("completed", "answer", None)
    assert record.exact_answer == "Paris" and record.final_answer is not None
    assert record.cited == ["d3", "d1"]
    assert record.behavior == ["d2", "d1", "d3"]  # opened, then cited, each once
    assert record.tool_call_counts == {"search": 1, "read_document": 2}
    assert record.usage == Usage(input_tokens=450, output_tokens=35, cached_tokens=80)
    assert record.calls_without_usage == 1 and record.turns == 3
    assert record.charged_seconds == 12.3457 and record.steered
    assert record.surfaced == ["d1", "d2", "d3"] and record.spills == {"s1.txt": "long output"}


@pytest.mark.parametrize("status", ["timeout", "failed"])
def test_an_unfinished_record_keeps_no_answer_and_its_behavior_is_what_it_opened(
    status: str,
) -> None:
    record = _record(Ending(status, "budget", "cut"), cited=["d3"])  # type: ignore[arg-type]
    assert record.final_answer is None and record.exact_answer is None and record.cited == []
    assert record.behavior == ["d2", "d1"]
    assert record.error == "cut" and record.confidence == 80.0  # the parse is kept for analysis


def test_an_estimated_call_is_counted_apart_from_a_reply_without_usage() -> None:
    """A call cut at the budget keeps its estimated prompt in the record's usage and counts in
    `calls_usage_estimated`; only a reply without usage (tokens unknown) is in
    `calls_without_usage`."""
    cut = _turn(4, [], Usage(input_tokens=300, estimated_input_tokens=300), reported=False)
    cut.usage_estimated, cut.estimate_method = True, "tokenizer o200k_base"
    record = _record(Ending("timeout", "budget"), cited=[], extra=[cut])
    assert record.calls_usage_estimated == 1 and record.calls_without_usage == 1
    assert record.usage.input_tokens == 750 and record.usage.estimated_input_tokens == 300
    assert record.trajectory[-1].usage_estimated and record.turns == 4
