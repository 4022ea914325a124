"""`judge.template: browsecomp-plus`: the judge reads BrowseComp-Plus's grader prompt verbatim
and its reply is parsed as their evaluator parses it; the offline exact-match judge answers in
whichever format the prompt asks. End to end over HTTP against the offline provider."""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest

from piserini_ray.config import load_config
from piserini_ray.data import Benchmark
from piserini_ray.judging.grader import judge_records
from piserini_ray.judging.templates import (
    BROWSECOMP_PLUS_GRADER,
    JudgeParseError,
    parse_browsecomp_plus,
)
from piserini_ray.llm.client import LLMClient
from piserini_ray.offline import OfflineConfig, OfflineProvider, PolicyReply, default_policies
from piserini_ray.offline.judge_policy import exact_match_judge_policy
from piserini_ray.records import QueryRecord, now_iso
from piserini_ray.store import RunStore

QID = "2hop__150763_14904"  # gold "G. Stanley Hall", alias "Stanley Hall"
SEEN: list[dict[str, Any]] = []


def recording_judge(request: dict[str, Any]) -> PolicyReply:
    """The offline exact-match judge, keeping each request body as it arrived."""
    SEEN.append(request)
    return exact_match_judge_policy(request)


@pytest.fixture
def provider():
    policies = default_policies() | {"test/recording-judge": recording_judge}
    with OfflineProvider(OfflineConfig(), policies) as p:
        SEEN.clear()
        yield p


def _record(query_id: str, answer: str | None, status: str = "completed") -> QueryRecord:
    return QueryRecord(
        run_id="r", config_hash="h", query_id=query_id, model="m", status=status,
        final_answer=answer, started_at=now_iso(), finished_at=now_iso(),
    )  # fmt: skip


def test_their_prompt_is_verbatim() -> None:
    # sha256 of GRADER_TEMPLATE.strip() as their evaluate_run.py defines it (97c637c, b90a68c).
    digest = hashlib.sha256(BROWSECOMP_PLUS_GRADER.encode()).hexdigest()
    assert digest == "71fb29f51a56cea9fe647331d525648474195fa4816f7d05632459d572419d90"


def _judge(provider, sample: Benchmark, tmp_path: Path, template: str, records):  # type: ignore[no-untyped-def]
    config = load_config(
        None,
        {
            "judge.model": {
                "name": "test/recording-judge",
                "litellm_model": "openai/test/recording-judge",
                "api_base": provider.base_url,
            },
            "judge.template": template,
        },
    )
    queries = {q.query_id: q for q in sample.queries}
    with RunStore(tmp_path / template, config) as store:
        client = LLMClient(config.judge_model(), config.retry, provider.base_url)
        return asyncio.run(judge_records(config, store, records, queries, client))


def test_browsecomp_plus_template_end_to_end(provider, sample: Benchmark, tmp_path: Path) -> None:
    other = sample.queries[1]  # gold "35"
    answers = {
        QID: "Explanation: [msq-da9107f33838]\nExact Answer: **G. Stanley Hall**\nConfidence: 80%",
        other.query_id: "Explanation: counted\nExact Answer: 34",  # no Confidence line
    }
    records = [_record(q, a) for q, a in answers.items()]
    records.append(_record(sample.queries[2].query_id, None, "timeout"))
    verdicts = _judge(provider, sample, tmp_path, "browsecomp-plus", records)

    # Their prompt, filled as their create_judge_prompt fills it, alone in one user message,
    # and no JSON response format (they send none).
    assert len(SEEN) == 2
    by_prompt = {r["messages"][0]["content"]: r for r in SEEN}
    for query_id, answer in answers.items():
        query = sample.query(query_id)
        prompt = BROWSECOMP_PLUS_GRADER.format(
            question=query.query, response=answer, correct_answer=query.answer
        )
        request = by_prompt[prompt]
        assert len(request["messages"]) == 1 and request["messages"][0]["role"] == "user"
        assert "response_format" not in request

    right, wrong = verdicts[QID], verdicts[other.query_id]
    assert (right.status, right.correct, right.template) == ("judged", True, "browsecomp-plus")
    assert right.extracted_final_answer == "G. Stanley Hall"
    assert right.confidence == 80.0  # the response's confidence, extracted by the judge
    assert right.correct_answer == "G. Stanley Hall" and right.reasoning
    assert (wrong.correct, wrong.confidence) == (False, 100.0)  # none stated: 100, as asked
    timeout = verdicts[sample.queries[2].query_id]
    assert timeout.correct is False and timeout.attempts == 0  # no call, as before

    # The same answers under our template: JSON asked and answered, the judge's own confidence.
    SEEN.clear()
    ours = _judge(provider, sample, tmp_path, "piserini", records[:1])
    assert SEEN[0]["response_format"] == {"type": "json_object"}
    assert ours[QID].template == "piserini" and ours[QID].correct is True
    assert ours[QID].confidence == 100.0  # the exact-match judge is sure of its verdict


# --- A reference written from their code: `parse_judge_response` of
# scripts_evaluation/evaluate_run.py, github.com/texttron/BrowseComp-Plus at 97c637c.
def their_parse(judge_response: str) -> dict:
    result: dict[str, Any] = {
        "extracted_final_answer": None, "reasoning": None, "correct": None,
        "confidence": None, "parse_error": False,
    }  # fmt: skip
    if not judge_response:
        result["parse_error"] = True
        return result
    flags = re.IGNORECASE | re.DOTALL
    m = (
        re.search(r"\*\*extracted_final_answer:\*\*\s*(.*?)(?=\n|$)", judge_response, flags)
        or re.search(r"\*\*extracted_final_answer\*\*:\s*(.*?)(?=\n|$)", judge_response, flags)
        or re.search(r"extracted_final_answer:\s*(.*?)(?=\n|$)", judge_response, flags)
    )
    if m:
        result["extracted_final_answer"] = m.group(1).strip()
    tail = r"(?=\n\*\*correct:\*\*|\n\*\*correct\*\*:|\ncorrect:|$)"
    m = (
        re.search(r"\*\*reasoning:\*\*\s*(.*?)" + tail, judge_response, flags)
        or re.search(r"\*\*reasoning\*\*:\s*(.*?)" + tail, judge_response, flags)
        or re.search(r"reasoning:\s*(.*?)(?=\ncorrect:|$)", judge_response, flags)
    )
    if m:
        result["reasoning"] = m.group(1).strip()
    m = (
        re.search(r"\*\*correct:\*\*\s*(yes|no)", judge_response, re.IGNORECASE)
        or re.search(r"\*\*correct\*\*:\s*(yes|no)", judge_response, re.IGNORECASE)
        or re.search(r"correct:\s*(yes|no)", judge_response, re.IGNORECASE)
    )
    if m:
        result["correct"] = m.group(1).lower() == "yes"
    number = r"\s*(\d+(?:\.\d+)?)\s*%?"
    m = (
        re.search(r"\*\*confidence:\*\*" + number, judge_response, re.IGNORECASE)
        or re.search(r"\*\*confidence\*\*:" + number, judge_response, re.IGNORECASE)
        or re.search(r"confidence:" + number, judge_response, re.IGNORECASE)
    )
    if m:
        result["confidence"] = min(float(m.group(1)), 100)
    if result["correct"] is None:
        result["parse_error"] = True
    return result


REPLIES = [
    "extracted_final_answer: Paris\n\n[correct_answer]: Paris\n\nreasoning: same city.\n\n"
    "correct: yes\n\nconfidence: 85%",
    "**extracted_final_answer:** 1,000 people\n**reasoning:** off by one\nthe next line\n"
    "**correct:** no\n**confidence:** 140",
    "**extracted_final_answer**: None\n**reasoning**: no answer given\n**correct**: No\n",
    "Extracted_Final_Answer: x\nREASONING: fine\nCorrect: YES\nConfidence: 12.5",
    "extracted_final_answer: y\nreasoning: the answer is wrong\ncorrect: maybe\nconfidence: 9",
    "",
]


@pytest.mark.parametrize("reply", REPLIES)
def test_replies_parse_as_their_evaluator_parses_them(reply: str) -> None:
    theirs = their_parse(reply)
    if theirs["parse_error"]:
        with pytest.raises(JudgeParseError):
            parse_browsecomp_plus(reply, "gold")
        return
    ours = parse_browsecomp_plus(reply, "gold")
    for field in ("extracted_final_answer", "reasoning", "correct", "confidence"):
        assert ours[field] == theirs[field], field
    assert ours["correct_answer"] == "gold" and ours["template"] == "browsecomp-plus"


def test_the_batch_judge_asks_and_reads_their_format_too(sample: Benchmark, tmp_path: Path) -> None:
    """`service_tier: batch` under their template: the same prompt in each batch line, no
    JSON response format, the replies parsed their way: the standard tier's verdicts."""
    from piserini_ray.config.offline import BatchConfig

    answers = {
        QID: "Exact Answer: Stanley Hall\nConfidence: 65%",
        sample.queries[1].query_id: "Exact Answer: 35\nConfidence: 90",
        sample.queries[3].query_id: "Exact Answer: nobody",
    }
    records = [_record(q, a) for q, a in answers.items()]
    queries = {q.query_id: q for q in sample.queries}
    served = OfflineConfig(
        model_aliases={"gpt-5": "offline/exact-match-judge"},
        batch=BatchConfig(completion_seconds=0.1),
    )
    verdicts = {}
    with OfflineProvider(served) as provider:
        for tier in ("standard", "batch"):
            config = load_config(
                None,
                {
                    "judge.model": {
                        "name": "gpt-5", "litellm_model": "openai/gpt-5",
                        "api_base": provider.base_url, "service_tier": tier,
                    },
                    "judge.template": "browsecomp-plus",
                    "judge.batch_poll_seconds": 0.05,
                },
            )  # fmt: skip
            with RunStore(tmp_path / tier, config) as store:
                client = LLMClient(config.judge_model(), config.retry, provider.base_url)
                verdicts[tier] = asyncio.run(judge_records(config, store, records, queries, client))
        batched = [r for r in provider.requests if r.batch_id is not None]
    assert len(batched) == len(answers)
    for request in batched:
        assert (request.messages or [{}])[0]["content"].startswith("Judge whether the following")
    fields = ("correct", "confidence", "extracted_final_answer", "template")
    assert {q: [getattr(v, f) for f in fields] for q, v in verdicts["batch"].items()} == {
        q: [getattr(v, f) for f in fields] for q, v in verdicts["standard"].items()
    }
    assert [verdicts["batch"][q].confidence for q in answers] == [65.0, 90.0, 100.0]
