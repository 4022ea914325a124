"""The judge over HTTP against the offline provider: verdicts, strict parsing, failures, resume."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from piserini_ray.config import ModelConfig, RetryConfig, load_config
from piserini_ray.data import Benchmark
from piserini_ray.judging.grader import judge_one, judge_records
from piserini_ray.judging.templates import parse_judgement
from piserini_ray.llm.client import LLMClient
from piserini_ray.offline import OfflineConfig, PolicyReply, default_policies
from piserini_ray.records import QueryRecord, now_iso
from piserini_ray.store import RunStore
from piserini_ray_testkit import EmulatedProvider, Scripted

QID = "2hop__150763_14904"
GOOD = (
    '{"extracted_final_answer": "x", "correct_answer": "y", "reasoning": "r", '
    '"correct": false, "confidence": 70}'
)


def _record(answer: str | None, status: str = "completed", query_id: str = QID) -> QueryRecord:
    return QueryRecord(
        run_id="r",
        config_hash="h",
        query_id=query_id,
        model="m",
        status=status,
        final_answer=answer,
        started_at=now_iso(),
        finished_at=now_iso(),
    )


REPLIES: list[str] = []


def scripted_judge(_request: dict[str, Any]) -> PolicyReply:
    return PolicyReply(content=REPLIES.pop(0) if REPLIES else GOOD)


@pytest.fixture
def provider():
    with EmulatedProvider(
        OfflineConfig(), default_policies() | {"test/judge": scripted_judge}
    ) as p:
        yield p


def _client(provider, name: str = "offline/exact-match-judge", **kw: Any) -> LLMClient:
    model = ModelConfig(name=name, litellm_model=f"openai/{name}", **kw)
    return LLMClient(
        model, RetryConfig(max_attempts=2, backoff_base=0.01), api_base=provider.base_url
    )


def test_offline_judge_verdicts(provider, sample: Benchmark) -> None:
    query = sample.query(QID)
    right = "Explanation: [msq-da9107f33838]\nExact Answer: **Stanley Hall**\nConfidence: 80%"
    wrong = "Explanation: x\nExact Answer: Wilhelm Wundt\nConfidence: 80%"
    yes = asyncio.run(judge_one(_client(provider), query, _record(right), 2))
    no = asyncio.run(judge_one(_client(provider), query, _record(wrong), 2))
    assert (yes.status, yes.correct, yes.extracted_final_answer) == ("judged", True, "Stanley Hall")
    assert (no.status, no.correct) == ("judged", False)
    assert yes.usage.input_tokens > 0 and yes.reasoning
    prompt = provider.requests[0].messages[0]["content"]
    assert (
        "[accepted_answers]: Stanley Hall" in prompt
        and "[correct_answer]: G. Stanley Hall" in prompt
    )


def test_no_answer_is_incorrect_without_a_call(provider, sample: Benchmark) -> None:
    verdict = asyncio.run(
        judge_one(_client(provider), sample.query(QID), _record(None, "timeout"), 2)
    )
    assert (
        verdict.status == "judged" and verdict.correct is False and "timeout" in verdict.reasoning
    )
    assert provider.requests == []


@pytest.mark.parametrize(
    "bad",
    [
        "not json at all",
        '{"correct_answer": "y", "reasoning": "r", "confidence": 70}',  # no `correct`
        '{"correct_answer": "y", "reasoning": "r", "correct": true}',  # no `confidence`
        '{"correct_answer": "y", "reasoning": "  ", "correct": true, "confidence": 9}',
        '{"correct_answer": "", "reasoning": "r", "correct": true, "confidence": 9}',
        '["a list"]',
    ],
)
def test_broken_replies_are_retried_then_judge_failed(
    provider, sample: Benchmark, bad: str
) -> None:
    REPLIES[:] = [bad, bad, bad]
    verdict = asyncio.run(
        judge_one(_client(provider, "test/judge"), sample.query(QID), _record("a"), 2)
    )
    assert verdict.status == "judge_failed" and verdict.correct is None
    assert verdict.attempts == 3 and "parse error" in (verdict.error or "")
    REPLIES[:] = [bad]  # one bad reply, then a good one: judged on the retry
    verdict = asyncio.run(
        judge_one(_client(provider, "test/judge"), sample.query(QID), _record("a"), 2)
    )
    assert verdict.status == "judged" and verdict.attempts == 2


def test_a_judge_that_times_out_is_a_judge_failure(provider, sample: Benchmark) -> None:
    provider.script(Scripted(kind="hang", seconds=30), Scripted(kind="hang", seconds=30))
    client = _client(provider, call_timeout=0.5)
    verdict = asyncio.run(judge_one(client, sample.query(QID), _record("Exact Answer: x"), 0))
    assert verdict.status == "judge_failed" and "transient" in (verdict.error or "")


def test_parse_tolerates_fences_and_clamps() -> None:
    verdict = parse_judgement("```json\n" + GOOD.replace("70", "170") + "\n```")
    assert verdict["confidence"] == 100.0 and verdict["correct"] is False


def test_judging_resumes(provider, sample: Benchmark, tmp_path: Path) -> None:
    config = load_config(
        None, {"judge.model": {"name": "offline/exact-match-judge", "api_base": provider.base_url}}
    )
    records = [
        _record("Exact Answer: G. Stanley Hall"),
        _record("no", query_id=sample.queries[1].query_id),
    ]
    queries = {q.query_id: q for q in sample.queries}
    with RunStore(tmp_path / "run", config) as store:
        client = LLMClient(config.judge_model(), config.retry, provider.base_url)
        first = asyncio.run(judge_records(config, store, records[:1], queries, client))
        assert len(first) == 1 and len(provider.requests) == 1
        both = asyncio.run(judge_records(config, store, records, queries, client))
        assert len(both) == 2 and len(provider.requests) == 2  # only the new one was judged
        assert store.judgements("offline/exact-match-judge")[QID].correct is True
