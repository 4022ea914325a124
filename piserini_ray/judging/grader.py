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
from collections.abc import AsyncGenerator, Callable

from piserini_ray.config import ModelConfig, RunConfig
from piserini_ray.data import Query
from piserini_ray.judging.templates import (
    JudgeParseError,
    Template,
    format_field,
    judge_messages,
    parse_verdict,
    response_format,
)
from piserini_ray.llm.batches import BatchRequest, ProviderBatches, batches_for, chat_body, split
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.failures import RetryError
from piserini_ray.records import Judgement, QueryRecord, Usage
from piserini_ray.store import RunStore


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
                    **format_field(config.judge.template),
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
