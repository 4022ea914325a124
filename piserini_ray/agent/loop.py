"""The ReAct loop for one query under its time budget (SPEC §4).

The loop alternates model calls and tool calls over an append-only message history. A watchdog
runs beside it on the budget clock: at floor(0.7 T) of charged time it blocks the tools (from
that instant) and asks the loop to add the steer message at the next turn boundary; at T it
cancels the loop wherever it is, an in-flight model call included, and the query ends as
`timeout`. With `termination: iterations` (or `both`), a cap on model turns applies instead of
(or as well as) the clock; reaching it ends the query as `timeout` too.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from piserini_ray.agent.answer import parse_final_answer
from piserini_ray.agent.budget import BudgetClock
from piserini_ray.agent.prompt import STEER_MESSAGE, SYSTEM_PROMPT, question_message
from piserini_ray.config import AgentConfig
from piserini_ray.data.benchmark import Query
from piserini_ray.errors import InfrastructureError, ProviderRefused
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.retry import RetryError
from piserini_ray.records import (
    QueryRecord,
    RankingLog,
    Status,
    ToolCallRecord,
    Turn,
    Usage,
    now_iso,
)
from piserini_ray.tools.session import ToolResult, ToolSession

#: Runs one tool call; Ray actors pass one that moves the blocking JVM call off the event loop.
ToolRunner = Callable[[ToolSession, str, str], Awaitable[ToolResult]]


async def run_inline(session: ToolSession, name: str, arguments: str) -> ToolResult:
    return session.call(name, arguments)


@dataclass
class _State:
    messages: list[dict[str, Any]]
    turns: list[Turn] = field(default_factory=list)
    final: str | None = None
    steer_requested: bool = False
    steered: bool = False


class _IterationCap(Exception):
    pass


async def run_query(
    query: Query,
    session: ToolSession,
    client: LLMClient,
    config: AgentConfig,
    tools: list[dict[str, Any]],
    *,
    run_id: str,
    config_hash: str,
    tool_runner: ToolRunner = run_inline,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
) -> QueryRecord:
    """Run one query to an answer, a timeout or a failure; always return its record."""
    emit = on_event or (lambda _kind, _data: None)
    clock = BudgetClock(config.budget_seconds, config.steer_fraction, config.budget_clock)
    state = _State(
        messages=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question_message(query.query)},
        ]
    )
    started_at = now_iso()
    use_clock = config.termination in ("time", "both")
    use_cap = config.termination in ("iterations", "both")

    async def loop() -> None:
        while True:
            if use_cap and len(state.turns) >= config.max_iterations:
                raise _IterationCap
            steered_now = False
            if state.steer_requested and not state.steered:
                state.messages.append({"role": "user", "content": STEER_MESSAGE})
                state.steered = steered_now = True
                emit("steer", {"charged": clock.charged()})
            turn = Turn(
                index=len(state.turns) + 1,
                model_output=None,
                started_at_charged=round(clock.charged(), 4),
                steered=steered_now,
            )
            state.turns.append(turn)
            try:
                completion = await client.complete(state.messages, tools, waits=clock)
            except RetryError as e:  # the turn shows every attempt the call made
                turn.attempts, turn.retries = e.attempts, e.failures
                turn.model_seconds = round(e.model_seconds, 4)
                turn.waited_seconds = round(e.waited_seconds, 4)
                raise
            state.messages.append(completion.message)
            turn.usage_reported = completion.usage_reported
            turn.model_output = completion.content
            turn.reasoning = completion.reasoning
            turn.usage = completion.usage
            turn.model_seconds = round(completion.model_seconds, 4)
            turn.waited_seconds = round(completion.waited_seconds, 4)
            turn.attempts = completion.attempts
            turn.retries = completion.failures
            emit(
                "model",
                {
                    "turn": turn.index,
                    "content": completion.content,
                    "tool_calls": completion.tool_calls,
                },
            )
            if not completion.tool_calls:
                state.final = completion.content
                return
            for call in completion.tool_calls:
                function = call.get("function", {})
                name = str(function.get("name") or "")
                arguments = function.get("arguments")
                arguments = arguments if isinstance(arguments, str) else str(arguments or "")
                tool_started = time.monotonic()
                result = await tool_runner(session, name, arguments)
                record = ToolCallRecord(
                    id=call.get("id"),
                    name=name,
                    arguments=arguments,
                    reason=result.reason,
                    ok=result.ok,
                    observation=result.output,
                    spill_file=result.spill_file,
                    error=result.error,
                    seconds=round(time.monotonic() - tool_started, 4),
                )
                turn.tool_calls.append(record)
                state.messages.append(
                    {"role": "tool", "tool_call_id": call.get("id"), "content": result.output}
                )
                emit("tool", record.model_dump())

    async def watchdog() -> str:
        await clock.until_charged(clock.steer_at)
        session.block()  # tools are blocked from this instant
        state.steer_requested = True
        await clock.until_charged(clock.budget)
        return "budget"

    status: Status = "completed"
    error: str | None = None
    termination = "answer"
    loop_task = asyncio.ensure_future(loop())
    guard = asyncio.ensure_future(watchdog()) if use_clock else None
    try:
        waiting = {loop_task} | ({guard} if guard else set())
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if loop_task not in done:  # the budget ran out first: stop wherever the loop is
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
            status, termination = "timeout", "budget"
        else:
            exc = loop_task.exception()
            if isinstance(exc, _IterationCap):
                status, termination = "timeout", "iterations"
                error = f"reached the cap of {config.max_iterations} model turns"
            elif isinstance(exc, InfrastructureError):
                raise exc  # not the query's fault: no record, the scheduler runs it again
            elif isinstance(exc, RetryError) and exc.failure.stops_run:
                raise ProviderRefused(client.scrub(str(exc))) from None  # the run's, not ours
            elif isinstance(exc, RetryError):
                status, termination, error = "failed", "error", str(exc)
            elif exc is not None:
                status, termination = "failed", "error"
                error = client.scrub(f"{type(exc).__name__}: {exc}")
    finally:
        if guard is not None:
            guard.cancel()
            await asyncio.gather(guard, return_exceptions=True)
        if not loop_task.done():  # our own caller was cancelled
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)

    parsed = parse_final_answer(state.final, lambda d: session.backend.ordinal(d) is not None)
    counts = Counter(c.name for t in state.turns for c in t.tool_calls)
    behavior = dict.fromkeys(list(session.opened) + parsed.cited)
    return QueryRecord(
        run_id=run_id,
        config_hash=config_hash,
        query_id=query.query_id,
        model=client.model.name,
        status=status,
        error=error,
        termination=termination,
        final_answer=state.final if status == "completed" else None,
        explanation=parsed.explanation,
        exact_answer=parsed.exact_answer if status == "completed" else None,
        confidence=parsed.confidence,
        confidence_missing=parsed.confidence_missing,
        cited=parsed.cited if status == "completed" else [],
        trajectory=state.turns,
        turns=len(state.turns),
        tool_call_counts=dict(counts),
        usage=sum((t.usage for t in state.turns), Usage()),
        calls_without_usage=sum(1 for t in state.turns if not t.usage_reported),
        charged_seconds=round(clock.charged(), 4),
        waited_seconds=round(clock.waited(), 4),
        wall_seconds=round(clock.wall(), 4),
        budget_clock=config.budget_clock,
        steered=state.steered,
        surfaced=list(session.surfaced),
        previewed=list(session.previewed),
        opened=list(session.opened),
        behavior=list(behavior) if status == "completed" else list(session.opened),
        started_at=started_at,
        finished_at=now_iso(),
        rankings=[
            RankingLog(
                search_id=s.search_id,
                query=s.query,
                docids=[session.backend.docid(int(o)) for o in s.ranking.ordinals],
                backend=session.backend.name,
            )
            for s in session.history
        ],
        spills=dict(session.spills),
    )
