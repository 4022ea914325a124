"""The ReAct loop for one query under its time budget (docs/spec.md §4).

The loop alternates model calls and tool calls over an append-only message history. A watchdog
runs beside it on the budget clock: at floor(0.7 T) of charged time it blocks the tools (from
that instant) and asks the loop to add the steer message at the next turn boundary; at T it
cancels the loop wherever it is, an in-flight model call included, and the query ends as
`timeout`. A call cut there, or failed for good after it was sent, keeps the prompt of its last
request as an estimate (`Turn.usage_estimated`): the provider bills what it received. With
`termination: iterations` (or `both`), a cap on model turns applies instead of (or as well as)
the clock; reaching it ends the query as `timeout` too.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from piserini_ray.agent.answer import ParsedAnswer, parse_final_answer
from piserini_ray.agent.budget import BudgetClock
from piserini_ray.agent.prompt import STEER_MESSAGE, SYSTEM_PROMPT, question_message
from piserini_ray.config import AgentConfig
from piserini_ray.data.benchmark import Query
from piserini_ray.errors import InfrastructureError, ProviderRefused
from piserini_ray.llm.client import CallTrace, Completion, LLMClient
from piserini_ray.llm.failures import FailureKind, RetryError
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


class _IterationCap(Exception):
    pass


@dataclass(frozen=True)
class Ending:
    """How a query ended: its status, why (`answer`, `budget`, `iterations`, `error`), the
    error text of a failure or a cap, and whether that failure was not the query's fault."""

    status: Status
    termination: str
    error: str | None = None
    #: The provider stayed down (or kept refusing with 429s) through every retry: `resume`
    #: runs the query again.
    retryable: bool = False


#: A query cut by a stop request of its run: not its fault, so `resume` runs it again; its
#: spend so far is on its record (the cut call's prompt estimated, as at the budget).
STOPPED_ENDING = Ending(
    "failed", "stopped", "stopped on request (piserini-ray stop) before it ended", retryable=True
)


def ending_of(
    exc: BaseException | None,
    budget_ran_out: bool,
    max_iterations: int,
    scrub: Callable[[str], str] = lambda text: text,
) -> Ending:
    """The status mapping (docs/spec.md §4), a pure function of how the loop stopped: the
    budget first, then the loop's own exception (None: it answered). Raises instead of ending
    the query for what is not the query's fault: an `InfrastructureError` (no record; it runs
    again) and a refusal of the whole run (`ProviderRefused`: every query would fail alike)."""
    if budget_ran_out:
        return Ending("timeout", "budget")
    if exc is None:
        return Ending("completed", "answer")
    if isinstance(exc, _IterationCap):
        return Ending("timeout", "iterations", f"reached the cap of {max_iterations} model turns")
    if isinstance(exc, InfrastructureError):
        raise exc
    if isinstance(exc, RetryError) and exc.failure.stops_run:
        raise ProviderRefused(scrub(str(exc))) from None
    if isinstance(exc, RetryError):
        outage = exc.failure.kind in (FailureKind.TRANSIENT, FailureKind.RATE_LIMIT)
        return Ending("failed", "error", str(exc), retryable=outage)
    return Ending("failed", "error", scrub(f"{type(exc).__name__}: {exc}"))


@dataclass(frozen=True)
class ToolEvidence:
    """What the tools saw during a query, in the order they saw it (the document sets of
    docs/spec.md §5), with every search's ranking and the spilled outputs."""

    surfaced: list[str]
    previewed: list[str]
    opened: list[str]
    rankings: list[RankingLog]
    spills: dict[str, str]

    @staticmethod
    def of(session: ToolSession) -> ToolEvidence:
        backend = session.backend
        return ToolEvidence(
            surfaced=list(session.surfaced),
            previewed=list(session.previewed),
            opened=list(session.opened),
            rankings=[
                RankingLog(
                    search_id=s.search_id,
                    query=s.query,
                    docids=[backend.docid(int(o)) for o in s.ranking.ordinals],
                    backend=backend.name,
                )
                for s in session.history
            ],
            spills=dict(session.spills),
        )


@dataclass(frozen=True)
class Timing:
    charged: float
    waited: float
    wall: float
    clock: str  # `agent.budget_clock`


def build_record(
    *,
    query_id: str,
    model: str,
    run_id: str,
    config_hash: str,
    ending: Ending,
    final: str | None,
    parsed: ParsedAnswer,
    turns: list[Turn],
    steered: bool,
    evidence: ToolEvidence,
    timing: Timing,
    started_at: str,
    finished_at: str,
) -> QueryRecord:
    """A query's record, a pure function of what happened: only a completed query keeps its
    answer and citations; its behavior set is what it opened plus what it cited."""
    completed = ending.status == "completed"
    behavior = dict.fromkeys(evidence.opened + parsed.cited)
    return QueryRecord(
        run_id=run_id,
        config_hash=config_hash,
        query_id=query_id,
        model=model,
        status=ending.status,
        error=ending.error,
        termination=ending.termination,
        retryable=ending.retryable,
        final_answer=final if completed else None,
        explanation=parsed.explanation,
        exact_answer=parsed.exact_answer if completed else None,
        confidence=parsed.confidence,
        confidence_missing=parsed.confidence_missing,
        cited=parsed.cited if completed else [],
        trajectory=turns,
        turns=len(turns),
        tool_call_counts=dict(Counter(c.name for t in turns for c in t.tool_calls)),
        usage=sum((t.usage for t in turns), Usage()),
        calls_without_usage=sum(1 for t in turns if not t.usage_reported and not t.usage_estimated),
        calls_usage_estimated=sum(1 for t in turns if t.usage_estimated),
        charged_seconds=round(timing.charged, 4),
        waited_seconds=round(timing.waited, 4),
        wall_seconds=round(timing.wall, 4),
        budget_clock=timing.clock,
        steered=steered,
        surfaced=evidence.surfaced,
        previewed=evidence.previewed,
        opened=evidence.opened,
        behavior=list(behavior) if completed else evidence.opened,
        started_at=started_at,
        finished_at=finished_at,
        rankings=evidence.rankings,
        spills=evidence.spills,
    )


class _QueryRun:
    """One query's loop and watchdog over explicit state: the message history, the turns so
    far, the final answer and the steer flags. The watchdog sets `steer_requested` (and blocks
    the tools); the loop adds the steer message at its next turn boundary."""

    def __init__(
        self,
        query: Query,
        session: ToolSession,
        client: LLMClient,
        config: AgentConfig,
        tools: list[dict[str, Any]],
        tool_runner: ToolRunner,
        emit: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self.session = session
        self.client = client
        self.config = config
        self.tools = tools
        self.tool_runner = tool_runner
        self.emit = emit
        self.clock = BudgetClock(config.budget_seconds, config.steer_fraction, config.budget_clock)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question_message(query.query)},
        ]
        self.turns: list[Turn] = []
        self.final: str | None = None
        self.steer_requested = False
        self.steered = False

    async def run(self, stop: asyncio.Event | None = None) -> Ending:
        """Run the loop (and, on the clock, the watchdog) until one ends; how the query ended.
        `stop` set (`piserini-ray stop`) cuts the loop as the budget would, and the query ends
        as a retryable failure (`resume` runs it again)."""
        use_clock = self.config.termination in ("time", "both")
        loop_task = asyncio.ensure_future(self.loop())
        guard = asyncio.ensure_future(self.watchdog()) if use_clock else None
        stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            waiting = {t for t in (loop_task, guard, stopper) if t is not None}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            cut = loop_task not in done
            if cut:  # stop wherever the loop is, an in-flight call included
                loop_task.cancel()
                await asyncio.gather(loop_task, return_exceptions=True)
            if cut and stopper is not None and stopper in done:
                return STOPPED_ENDING
            exc = None if cut else loop_task.exception()
            return ending_of(exc, cut, self.config.max_iterations, self.client.scrub)
        finally:
            for helper in (guard, stopper):
                if helper is not None:
                    helper.cancel()
                    await asyncio.gather(helper, return_exceptions=True)
            if not loop_task.done():  # our own caller was cancelled
                loop_task.cancel()
                await asyncio.gather(loop_task, return_exceptions=True)

    async def watchdog(self) -> None:
        await self.clock.until_charged(self.clock.steer_at)
        self.session.block()  # tools are blocked from this instant
        self.steer_requested = True
        await self.clock.until_charged(self.clock.budget)

    async def loop(self) -> None:
        use_cap = self.config.termination in ("iterations", "both")
        while True:
            if use_cap and len(self.turns) >= self.config.max_iterations:
                raise _IterationCap
            completion = await self.model_turn(self.new_turn())
            if not completion.tool_calls:
                self.final = completion.content
                return
            for call in completion.tool_calls:
                await self.tool_call(self.turns[-1], call)

    def new_turn(self) -> Turn:
        steered_now = False
        if self.steer_requested and not self.steered:
            self.messages.append({"role": "user", "content": STEER_MESSAGE})
            self.steered = steered_now = True
            self.emit("steer", {"charged": self.clock.charged()})
        turn = Turn(
            index=len(self.turns) + 1,
            model_output=None,
            started_at_charged=round(self.clock.charged(), 4),
            steered=steered_now,
        )
        self.turns.append(turn)
        return turn

    async def model_turn(self, turn: Turn) -> Completion:
        trace = CallTrace()
        turn.started_at = round(time.time(), 3)
        try:
            completion = await self.client.complete(
                self.messages, self.tools, waits=self.clock, trace=trace
            )
        except (RetryError, asyncio.CancelledError):  # failed for good, or cut at the budget
            cut_call(turn, trace)
            raise
        self.messages.append(completion.message)
        turn.usage_reported = completion.usage_reported
        turn.model_output = completion.content
        turn.reasoning = completion.reasoning
        turn.usage = completion.usage
        turn.model_seconds = round(completion.model_seconds, 4)
        turn.waited_seconds = round(completion.waited_seconds, 4)
        turn.attempts = completion.attempts
        turn.retries = completion.failures
        turn.finish_reason = completion.finish_reason
        self.emit(
            "model",
            {
                "turn": turn.index,
                "content": completion.content,
                "tool_calls": completion.tool_calls,
            },
        )
        return completion

    async def tool_call(self, turn: Turn, call: dict[str, Any]) -> None:
        function = call.get("function", {})
        name = str(function.get("name") or "")
        arguments = function.get("arguments")
        arguments = arguments if isinstance(arguments, str) else str(arguments or "")
        tool_started, started_at = time.monotonic(), round(time.time(), 3)
        result = await self.tool_runner(self.session, name, arguments)
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
            started_at=started_at,
            docids=result.docids,
        )
        turn.tool_calls.append(record)
        self.messages.append(
            {"role": "tool", "tool_call_id": call.get("id"), "content": result.output}
        )
        self.emit("tool", record.model_dump())


def cut_call(turn: Turn, trace: CallTrace) -> None:
    """The turn of a call that ended without a reply (failed for good, or cancelled at the
    budget): every attempt it made, and, when its last request reached the provider, that
    request's prompt as estimated (`CallTrace.estimate`): providers bill what they received."""
    turn.attempts, turn.retries = trace.attempts, list(trace.failures)
    turn.model_seconds = round(trace.model_seconds, 4)
    turn.waited_seconds = round(trace.waited_seconds, 4)
    if trace.estimate is not None:
        turn.usage = trace.estimate
        turn.usage_reported = False
        turn.usage_estimated = True
        turn.estimate_method = trace.estimate_method


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
    stop: asyncio.Event | None = None,
) -> QueryRecord:
    """Run one query to an answer, a timeout or a failure; always return its record. `stop`:
    set when the query's run is stopped (`piserini-ray stop`): it ends at once, retryable."""
    started_at = now_iso()
    emit = on_event or (lambda _kind, _data: None)
    run = _QueryRun(query, session, client, config, tools, tool_runner, emit)
    ending = await run.run(stop)
    parsed = parse_final_answer(run.final, lambda d: session.backend.ordinal(d) is not None)
    clock = run.clock
    return build_record(
        query_id=query.query_id,
        model=client.model.name,
        run_id=run_id,
        config_hash=config_hash,
        ending=ending,
        final=run.final,
        parsed=parsed,
        turns=run.turns,
        steered=run.steered,
        evidence=ToolEvidence.of(session),
        timing=Timing(*clock.reading(), config.budget_clock),
        started_at=started_at,
        finished_at=now_iso(),
    )
