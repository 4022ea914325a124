"""The LLM judge (docs/spec.md §6): one verdict per query per judge model, through the same LLM
client.

Strict: a reply that is not a JSON object with `correct` (bool), `confidence` (0-100), a
non-empty `reasoning` and a non-empty `correct_answer` is a parse error; the judge is asked
again (`judge.max_parse_retries`), and a query that still has no verdict is `judge_failed`:
reported as such, never scored as wrong. A query that ended without an answer (timeout, failed)
is incorrect by rule and costs no call. Verdicts are written as they come, so judging resumes.

`judge.template: browsecomp-plus` sends BrowseComp-Plus's grader prompt verbatim instead and
reads the reply as their evaluator does (`parse_browsecomp_plus`): there, the `confidence` is
the one the judge extracts from the response, and only a missing `correct` is a parse error.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Callable
from typing import Any, Literal

import orjson

from piserini_ray.config import ModelConfig, RunConfig
from piserini_ray.data import Query
from piserini_ray.llm.batches import BatchRequest, ProviderBatches, batches_for, chat_body, split
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.failures import RetryError
from piserini_ray.records import Judgement, QueryRecord, Usage
from piserini_ray.store import RunStore

JUDGE_PROMPT = """\
Decide whether the [response] below answers the [question] correctly, given the [correct_answer].

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}
{accepted}
Reply with one JSON object and nothing else, with these fields:
"extracted_final_answer": the exact final answer taken from the response, or null if it has none;
"correct_answer": the correct answer as given above;
"reasoning": why the extracted answer does or does not match the correct answer. Semantic
equivalence counts as correct; harmless differences of wording or format, added correct detail
and small differences of numeric formatting are allowed. No extractable answer is incorrect;
"correct": true or false;
"confidence": your confidence in this verdict, from 0 to 100."""

_FENCE = re.compile(r"^\s*```(?:json)?\s*|\s*```\s*$", re.I)

#: BrowseComp-Plus's grader prompt, verbatim (a raw string keeps their `\%`): `GRADER_TEMPLATE`
#: of scripts_evaluation/evaluate_run.py in github.com/texttron/BrowseComp-Plus at 97c637c
#: (identical at b90a68c). Their evaluator fills it with .format(question, response,
#: correct_answer) and sends it as the one user message, with no response format.
BROWSECOMP_PLUS_GRADER = r"""
Judge whether the following [response] to [question] is correct or not based on the precise and unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. 

[correct_answer]: Repeat the [correct_answer] given above.

reasoning: Explain why the extracted_final_answer is correct or incorrect based on [correct_answer], in the context of this [question]. You should judge whether the extracted_final_answer is semantically equivalent to [correct_answer], allowing the extracted_final_answer to be string variations of [correct_answer]. You should also allow the extracted_final_answer to be more precise or verbose than [correct_answer], as long as its additional details are correct. Do not comment on any background to the problem, do not attempt to solve the problem, do not argue for any answer different than [correct_answer], focus only on whether the answers are semantically equivalent.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is within a small margin of error for numerical problems. Answer 'no' otherwise, i.e. if there if there is any inconsistency, ambiguity, non-equivalency, or if the extracted answer is incorrect.


confidence: The extracted confidence score between 0|\%| and 100|\%| from [response]. Put 100 if there is no confidence score available.
""".strip()  # noqa: E501, W291 (their text, verbatim)

Template = Literal["piserini", "browsecomp-plus"]

# Their parse_judge_response's patterns, in their order (bold first, then plain), same flags.
_BCP_ANSWER = [
    re.compile(r"\*\*extracted_final_answer:\*\*\s*(.*?)(?=\n|$)", re.I | re.S),
    re.compile(r"\*\*extracted_final_answer\*\*:\s*(.*?)(?=\n|$)", re.I | re.S),
    re.compile(r"extracted_final_answer:\s*(.*?)(?=\n|$)", re.I | re.S),
]
_BCP_REASONING = [
    re.compile(
        r"\*\*reasoning:\*\*\s*(.*?)(?=\n\*\*correct:\*\*|\n\*\*correct\*\*:|\ncorrect:|$)",
        re.I | re.S,
    ),
    re.compile(
        r"\*\*reasoning\*\*:\s*(.*?)(?=\n\*\*correct:\*\*|\n\*\*correct\*\*:|\ncorrect:|$)",
        re.I | re.S,
    ),
    re.compile(r"reasoning:\s*(.*?)(?=\ncorrect:|$)", re.I | re.S),
]
_BCP_CORRECT = [
    re.compile(r"\*\*correct:\*\*\s*(yes|no)", re.I),
    re.compile(r"\*\*correct\*\*:\s*(yes|no)", re.I),
    re.compile(r"correct:\s*(yes|no)", re.I),
]
_BCP_CONFIDENCE = [
    re.compile(r"\*\*confidence:\*\*\s*(\d+(?:\.\d+)?)\s*%?", re.I),
    re.compile(r"\*\*confidence\*\*:\s*(\d+(?:\.\d+)?)\s*%?", re.I),
    re.compile(r"confidence:\s*(\d+(?:\.\d+)?)\s*%?", re.I),
]


def _first(patterns: list[re.Pattern[str]], text: str) -> re.Match[str] | None:
    return next((m for p in patterns if (m := p.search(text))), None)


def parse_browsecomp_plus(content: str | None, correct_answer: str) -> dict[str, Any]:
    """A reply to `BROWSECOMP_PLUS_GRADER` read as their `parse_judge_response` reads it
    (evaluate_run.py, 97c637c): the first bold or plain `extracted_final_answer:`, `reasoning:`
    (up to the `correct:` line), `correct: yes|no` and `confidence: N` (capped at 100). As
    theirs, only a missing `correct` is a parse error; a missing confidence is kept as None
    (their calibration leaves such an answer out). `correct_answer` is the gold we gave: their
    parser does not read the judge's repetition of it."""
    text = content or ""
    correct = _first(_BCP_CORRECT, text)
    if not text or correct is None:
        raise JudgeParseError(f"no `correct: yes|no` line: {text[:200]!r}")
    answer = _first(_BCP_ANSWER, text)
    reasoning = _first(_BCP_REASONING, text)
    confidence = _first(_BCP_CONFIDENCE, text)
    return {
        "correct": correct.group(1).lower() == "yes",
        "confidence": None if confidence is None else min(100.0, float(confidence.group(1))),
        "reasoning": None if reasoning is None else reasoning.group(1).strip(),
        "correct_answer": correct_answer,
        "extracted_final_answer": None if answer is None else answer.group(1).strip(),
        "template": "browsecomp-plus",
    }


def response_format(template: Template) -> dict[str, Any] | None:
    """Ours asks for JSON; their evaluator sends its prompt with no response format."""
    return {"type": "json_object"} if template == "piserini" else None


def _format_field(template: Template) -> dict[str, Any]:
    wanted = response_format(template)
    return {} if wanted is None else {"response_format": wanted}


def parse_verdict(content: str | None, template: Template, query: Query) -> dict[str, Any]:
    """The verdict fields of a reply to `template`'s prompt, or `JudgeParseError`."""
    if template == "browsecomp-plus":
        return parse_browsecomp_plus(content, query.answer)
    return parse_judgement(content)


class JudgeParseError(ValueError):
    pass


def judge_messages(
    query: Query, response: str, template: Template = "piserini"
) -> list[dict[str, Any]]:
    if template == "browsecomp-plus":  # theirs, filled as their create_judge_prompt does
        prompt = BROWSECOMP_PLUS_GRADER.format(
            question=query.query, response=response, correct_answer=query.answer
        )
        return [{"role": "user", "content": prompt}]
    accepted = f"[accepted_answers]: {' | '.join(query.aliases)}\n" if query.aliases else ""
    prompt = JUDGE_PROMPT.format(
        question=query.query, response=response, correct_answer=query.answer, accepted=accepted
    )
    return [{"role": "user", "content": prompt}]


def parse_judgement(content: str | None) -> dict[str, Any]:
    """The verdict fields, or `JudgeParseError` saying what is wrong."""
    text = _FENCE.sub("", content or "").strip()
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise JudgeParseError(f"not JSON ({e}): {text[:200]!r}") from None
    if not isinstance(data, dict):
        raise JudgeParseError(f"not a JSON object: {text[:200]!r}")
    if not isinstance(data.get("correct"), bool):
        raise JudgeParseError("`correct` is missing or not true/false")
    confidence = data.get("confidence")
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        raise JudgeParseError("`confidence` is missing or not a number")
    for field in ("reasoning", "correct_answer"):
        if not isinstance(data.get(field), str) or not data[field].strip():
            raise JudgeParseError(f"`{field}` is missing or empty")
    extracted = data.get("extracted_final_answer")
    if extracted is not None and not isinstance(extracted, str):
        extracted = str(extracted)
    return {
        "correct": data["correct"],
        "confidence": min(100.0, max(0.0, float(confidence))),
        "reasoning": data["reasoning"],
        "correct_answer": data["correct_answer"],
        "extracted_final_answer": extracted,
    }


async def judge_one(
    client: LLMClient,
    query: Query,
    record: QueryRecord,
    max_parse_retries: int,
    template: Template = "piserini",
) -> Judgement:
    model = client.model.name
    if record.status != "completed" or not record.final_answer:
        return Judgement(
            query_id=query.query_id,
            judge_model=model,
            status="judged",
            correct=False,
            correct_answer=query.answer,
            confidence=100.0,
            reasoning=f"no response to judge: the query ended as {record.status}",
            template=template,
        )
    usage = Usage()
    problems: list[str] = []
    attempts = 0
    for _ in range(max_parse_retries + 1):
        attempts += 1
        try:
            completion = await client.complete(
                judge_messages(query, record.final_answer, template),
                response_format=response_format(template),
            )
        except RetryError as e:
            problems.append(str(e))
            break  # transport failures were already retried by the client
        usage = usage + completion.usage
        try:
            verdict = parse_verdict(completion.content, template, query)
        except JudgeParseError as e:
            problems.append(f"parse error: {e}")
            continue
        return Judgement(
            query_id=query.query_id,
            judge_model=model,
            status="judged",
            attempts=attempts,
            usage=usage,
            **verdict,
        )
    return Judgement(
        query_id=query.query_id,
        judge_model=model,
        status="judge_failed",
        attempts=attempts,
        usage=usage,
        error="; ".join(problems)[-1000:],
        template=template,
    )


async def judge_many(
    client: LLMClient,
    items: list[tuple[Query, QueryRecord]],
    max_parse_retries: int,
    concurrency: int,
    template: Template = "piserini",
) -> AsyncGenerator[Judgement, None]:
    """Judge every (query, record), `concurrency` at once, yielding each verdict as it comes
    (both engines use this: the caller writes each one before the next is awaited)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(query: Query, record: QueryRecord) -> Judgement:
        async with gate:
            return await judge_one(client, query, record, max_parse_retries, template)

    tasks = [asyncio.ensure_future(one(q, r)) for q, r in items]
    try:
        for next_done in asyncio.as_completed(tasks):
            yield await next_done
    finally:  # a caller that stops early (Ctrl-C) leaves no call running
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def judge_records(
    config: RunConfig,
    store: RunStore,
    records: list[QueryRecord],
    queries: dict[str, Query],
    client: LLMClient,
    log: Callable[[str], None] = lambda _m: None,
) -> dict[str, Judgement]:
    """Judge every record that has no verdict from `config`'s judge yet (or only a failed
    one) with `client` (the judge model's, under its quota key's limiter: the engine builds
    it); write each verdict as it comes; return all verdicts."""
    model: ModelConfig = config.judge_model()
    done = store.judgements(model.name)
    todo = to_judge(records, done)
    if model.service_tier == "batch":
        await judge_in_batches(config, store, todo, queries, client, log)
        return store.judgements(model.name)
    if todo:
        log(f"judging {len(todo)} answers with {model.name} ({len(done)} judged before)")
        items = [(queries[r.query_id], r) for r in todo]
        async for judgement in judge_many(
            client,
            items,
            config.judge.max_parse_retries,
            config.judge.concurrency,
            config.judge.template,
        ):
            store.append_judgement(judgement)
            done[judgement.query_id] = judgement
    return done


def to_judge(records: list[QueryRecord], done: dict[str, Judgement]) -> list[QueryRecord]:
    """Records without a verdict, or whose verdict is a judge failure (judged again:
    docs/spec.md §7)."""
    return [
        r for r in records if r.query_id not in done or done[r.query_id].status == "judge_failed"
    ]


async def judge_in_batches(
    config: RunConfig,
    store: RunStore,
    todo: list[QueryRecord],
    queries: dict[str, Query],
    client: LLMClient,
    log: Callable[[str], None],
) -> None:
    """`judge.model.service_tier: batch`: every answer without a verdict judged through the
    provider's Batch API (`llm/batches.py`) at half price. Each batch is written to the run's
    `batches.jsonl` before it is polled: a driver killed while waiting polls the same batch
    again, never pays twice. A request that errored or expired goes into the next batch (up to
    `retry.max_attempts` batches), a reply that does not parse too (up to
    `judge.max_parse_retries` more); what is left is `judge_failed`, never scored wrong."""
    api = batches_for(client.provider, client.api_base, client.api_key())
    try:
        await _judge_in_batches(config, store, todo, queries, client, api, log)
    finally:
        await api.close()


async def _judge_in_batches(
    config: RunConfig,
    store: RunStore,
    todo: list[QueryRecord],
    queries: dict[str, Query],
    client: LLMClient,
    api: ProviderBatches,
    log: Callable[[str], None],
) -> None:
    model = client.model
    batch = _BatchJudging(config, store, queries, api, log)
    for record in todo:
        if record.status != "completed" or not record.final_answer:  # wrong by rule, no call
            store.append_judgement(
                await judge_one(client, queries[record.query_id], record, 0, config.judge.template)
            )
        else:
            batch.pending[record.query_id] = record
    for batch_id, ids in store.judge_batches.open_batches(model.name).items():
        log(f"batch {batch_id} of {model.name} ({len(ids)} answers) was sent before: polling it")
        await batch.collect(batch_id, ids)
    for round_ in range(1, config.retry.max_attempts + 1):
        if not batch.pending:
            break
        log(f"judging {len(batch.pending)} answers with {model.name} in a batch (round {round_})")
        sent = []
        requests = [
            BatchRequest(
                custom_id=f"r{round_}-{n}",
                body=chat_body(
                    model,
                    judge_messages(
                        queries[query_id], record.final_answer or "", config.judge.template
                    ),
                    **_format_field(config.judge.template),
                ),
            )
            for n, (query_id, record) in enumerate(batch.pending.items())
        ]
        ids = {r.custom_id: query_id for r, query_id in zip(requests, batch.pending, strict=True)}
        for chunk in split(requests):
            chunk_ids = {r.custom_id: ids[r.custom_id] for r in chunk}
            batch_id = await api.submit(chunk, {"run_id": store.run_id, "judge": model.name})
            store.judge_batches.note_batch(model.name, batch_id, chunk_ids)
            sent.append((batch_id, chunk_ids))
        for batch_id, chunk_ids in sent:
            await batch.collect(batch_id, chunk_ids)
    for query_id in list(batch.pending):
        batch.fail(query_id, f"no verdict after {config.retry.max_attempts} batch(es)")


class _BatchJudging:
    """The state of one batch judging: answers still without a verdict, and why."""

    def __init__(
        self,
        config: RunConfig,
        store: RunStore,
        queries: dict[str, Query],
        api: ProviderBatches,
        log: Callable[[str], None],
    ) -> None:
        self.config, self.store, self.queries, self.api, self.log = config, store, queries, api, log
        self.model = config.judge_model().name
        self.pending: dict[str, QueryRecord] = {}
        self.problems: dict[str, list[str]] = {}
        self.attempts: dict[str, int] = {}
        self.usage: dict[str, Usage] = {}

    async def collect(self, batch_id: str, ids: dict[str, str]) -> None:
        """Wait for the batch to end, then write a verdict for each request that has one."""
        state = await self.api.wait(
            batch_id,
            self.config.judge.batch_poll_seconds,
            lambda status: self.log(f"batch {batch_id}: {status}"),
        )
        results = await self.api.results(state)
        answered = {r.custom_id for r in results}
        for custom_id, query_id in ids.items():
            if custom_id not in answered and query_id in self.pending:
                self.problems.setdefault(query_id, []).append(
                    f"batch {batch_id} {state.status} without a result"
                    + (f": {state.errors}" if state.errors else "")
                )
        for result in results:
            if ids.get(result.custom_id) not in self.pending:
                continue  # judged already (a result seen before the driver was stopped)
            query_id = ids[result.custom_id]
            if result.error is not None:
                self.problems.setdefault(query_id, []).append(result.error)  # the next batch
                continue
            self.attempts[query_id] = self.attempts.get(query_id, 0) + 1
            self.usage[query_id] = self.usage.get(query_id, Usage()) + result.usage
            try:
                verdict = parse_verdict(
                    result.content, self.config.judge.template, self.queries[query_id]
                )
            except JudgeParseError as e:
                self.problems.setdefault(query_id, []).append(f"parse error: {e}")
                if self.attempts[query_id] > self.config.judge.max_parse_retries:
                    self.fail(query_id, "the reply never parsed")
                continue
            self.store.append_judgement(
                Judgement(
                    query_id=query_id,
                    judge_model=self.model,
                    status="judged",
                    attempts=self.attempts[query_id],
                    usage=self.usage[query_id],
                    **verdict,
                )
            )
            del self.pending[query_id]
        self.store.judge_batches.close_batch(self.model, batch_id)

    def fail(self, query_id: str, why: str) -> None:
        """No verdict for this answer: a judge failure (the next `judge` tries it again)."""
        problems = "; ".join([why, *self.problems.get(query_id, [])])
        self.store.append_judgement(
            Judgement(
                query_id=query_id,
                judge_model=self.model,
                status="judge_failed",
                attempts=self.attempts.get(query_id, 0),
                usage=self.usage.get(query_id, Usage()),
                error=problems[-1000:],
                template=self.config.judge.template,
            )
        )
        self.pending.pop(query_id, None)
