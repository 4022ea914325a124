"""What the pipeline hands an engine, and what every engine promises: a leaf of shared types.

The pipeline (`pipeline/`) prepares runs and an engine (`engines.local.LocalEngine` in this
process, `runtime.RayEngine` on Ray) executes them; both import this module, neither imports
the other. `PreparedRun.complete` is the one way a query ends, in either engine: its record is
written, the cost guard and the progress display learn of it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from piserini_ray.analysis.stopping import DecisionWatch
from piserini_ray.config import RunConfig
from piserini_ray.data import Benchmark, Query
from piserini_ray.metrics.cost import CostGuard, PricingTable
from piserini_ray.monitor.board import STOP_REASON, STOPPED, StatusBoard
from piserini_ray.monitor.status import State
from piserini_ray.progress import Progress
from piserini_ray.records import QueryRecord, ServedTime
from piserini_ray.serving import served_key
from piserini_ray.store import RunStore

#: Where an engine and the pipeline say what they do (one line each, to the user).
Log = Callable[[str], None]


@dataclass
class PreparedRun:
    """A run that passed every check: its data, its index, its open store and its todo list."""

    config: RunConfig
    run_dir: Path
    benchmark: Benchmark
    queries: list[Query]  # the slice
    index: Path
    store: RunStore
    pricing: PricingTable
    todo: list[Query]
    guard: CostGuard
    ran: int = 0  # records written by this execution
    #: The agent's tokens (input + output) in the records written by this execution: a served
    #: model's hours are shared by them.
    tokens: int = 0
    #: Why this execution's failed queries failed (the first words of each error), by count.
    failures: Counter[str] = field(default_factory=Counter)
    #: Set when more than `runtime.max_failure_rate` of the todo list failed: nothing more
    #: starts, and the run exits non-zero.
    failure_stop: str | None = None
    #: Judge each answer as its record is written, while the other queries run (the Ray
    #: engine: `engines/ray/judge_alongside.py`): set when the caller judges next
    #: (`run_and_report`).
    judge_as_they_come: bool = False
    #: The run's live status (`status.json`), told of each record and verdict by the store;
    #: it also carries a stop request (`piserini-ray stop`).
    board: StatusBoard | None = None
    #: The sweep's decisions (`stop_when_decided`): a decided run starts no new query.
    decisions: DecisionWatch | None = None

    @property
    def wanted(self) -> set[str]:
        return {q.query_id for q in self.queries}

    def may_start(self, running: int) -> bool:
        """Whether another query may start with `running` of this run in flight (the cost
        cap, a run halted by a refusal, one past its failure rate and one whose comparison is
        decided start none)."""
        return (
            self.failure_stop is None
            and not self.stop_requested
            and self.decided() is None
            and self.guard.may_start(running)
        )

    def decided(self) -> str | None:
        """Why the run starts no new query under `stop_when_decided`, if it does not."""
        return None if self.decisions is None else self.decisions.halted(self.run_dir)

    @property
    def stop_requested(self) -> bool:
        """`piserini-ray stop` asked for this run to stop: nothing more starts, and its queries
        in flight end as retryable (`agent.loop`: termination `stopped`)."""
        return self.board is not None and self.board.stop_requested

    def show_live(
        self,
        running: int | None = None,
        waiting: int | None = None,
        replicas: dict[str, int] | None = None,
    ) -> None:
        """The engine's gauges for the run's live status (None: unchanged)."""
        if self.board is not None:
            self.board.live(running, waiting, replicas)
            if decided := self.decided():
                self.board.decided(decided)

    def close_status(self, interrupted: bool = False) -> None:
        """The execution ended (`interrupted`: by Ctrl-C or an error): the status's last word
        for it: `stopped` before the slice was done, `judging` when the caller judges next."""
        if self.board is None:
            return
        state: State = "finished"
        if interrupted:
            state = "interrupted"
        elif self.stop_reason() and self.board.incomplete:
            state = "decided" if self.stop_reason() == self.decided() else "stopped"
        elif self.judge_as_they_come:
            state = "judging"
        self.board.close(state, self.stop_reason())

    def complete(self, record: QueryRecord, progress: Progress | None = None) -> None:
        """A query ended: write its record (once: the store refuses a second), count its spend
        against the cost cap, apply the failure policy, and show it."""
        if record.epoch != self.config.run.epoch:
            record = record.model_copy(update={"epoch": self.config.run.epoch})
        self.store.append(record)
        self.guard.finished(record.usage)
        self.ran += 1
        self.tokens += record.usage.input_tokens + record.usage.output_tokens
        if record.status == "failed" and record.termination != STOPPED:  # asked for, not a fault
            self.failures[_cause(record.error)] += 1
            self._apply_failure_policy()
        if progress is not None:
            price = self.pricing.model_price(self.config.model)
            cost = price.cost(record.usage) if price else None
            estimated = price.estimated_cost(record.usage) if price else 0.0
            progress.record(record.status, record.usage, cost, estimated, self.run_dir.name)

    def stop_reason(self) -> str | None:
        """Why the run stopped before its todo list was done, if it did."""
        return (
            self.failure_stop
            or self.guard.stop_reason()
            or (STOP_REASON if self.stop_requested else None)
            or self.decided()
        )

    def _apply_failure_policy(self) -> None:
        failed, rate = sum(self.failures.values()), self.config.runtime.max_failure_rate
        if self.failure_stop is None and failed > rate * len(self.todo):
            causes = "; ".join(f"{n} x {cause}" for cause, n in self.failures.most_common(3))
            self.failure_stop = (
                f"{failed} of {len(self.todo)} queries failed, more than "
                f"runtime.max_failure_rate ({rate:.0%}); no new query was started. Top causes: "
                f"{causes}. Fix the cause, then resume (`resume --retry-failed` runs the failed "
                "ones again)"
            )

    def refused(self, reason: str) -> None:
        """The provider refused the run itself (a wrong key, a model it does not serve): every
        query would fail alike, so none more starts and no record is written for it."""
        self.guard.halt(reason)


def charge_served(runs: list[PreparedRun], seconds: float, replicas: int = 1) -> None:
    """Charge the runs whose agent the run serves (`model.serve`) for its servers' time:
    `replicas` servers up for `seconds`, shared by the runs of one served model by their
    tokens (equally when none has any), each share a line of its `served.jsonl`."""
    groups: dict[str, list[PreparedRun]] = {}
    for run in runs:
        if run.config.model.serve is not None:
            groups.setdefault(served_key(run.config.model), []).append(run)
    for group in groups.values():
        total = sum(run.tokens for run in group)
        for run in group:
            serve = run.config.model.serve
            assert serve is not None
            share = run.tokens / total if total else 1 / len(group)
            run.store.add_served(
                ServedTime(
                    model=run.config.model.name,
                    engine=serve.engine,
                    replicas=replicas,
                    seconds=round(seconds * replicas * share, 3),
                    price_per_replica_hour=serve.price_per_replica_hour,
                )
            )


def in_turn(runs: list[PreparedRun]) -> list[tuple[PreparedRun, Query]]:
    """The order in which an engine starts the runs' queries: run after run, or, for runs
    compared as they go (`stop_when_decided`), side by side along their shared order, so that
    each has answered about the same queries at every moment."""
    queue = [(run, query) for run in runs for query in run.todo]
    watch = next((run.decisions for run in runs if run.decisions is not None), None)
    if watch is not None:
        queue.sort(key=lambda item: watch.position(item[1].query_id))  # stable: run order ties
    return queue


def _cause(error: str | None) -> str:
    """A failure's cause for counting: its first line, without attempt counts and ids."""
    first = (error or "unknown error").splitlines()[0]
    return re.sub(r"\d+", "N", first)[:120]


class RunSummary(BaseModel):
    """What `run` prints when the engine is done, before judging: statuses, tool calls,
    tokens and cost of the run's records (`run(..., on_summary=...)` receives it).

    Args:
        **fields: the summary's fields (the pipeline makes it from the run's records).

    Returns:
        A validated summary; `exit_status()` is the command's exit status.

    Example:
        ```python
        from piserini_ray import RunSummary, load_config, run

        summaries: list[RunSummary] = []
        run(load_config(), engine="local", on_summary=summaries.append)
        print(summaries[0].statuses, summaries[0].cost_usd)
        ```
    """

    run_dir: str
    config_hash: str
    model: str
    queries: int
    ran_now: int
    statuses: dict[str, int]
    tool_calls_per_query: dict[str, float]
    tokens_total: dict[str, int]
    tokens_median_per_query: float
    cached_token_ratio: float
    #: USD from the pricing table; None when the model is not in it.
    cost_usd: float | None
    #: Model calls whose reply had no usage block (cost is then a lower bound).
    calls_without_usage: int = 0
    #: Of `cost_usd`, the estimate for calls cut at the budget or failed after sending.
    cost_estimated_usd: float | None = None
    #: Model calls cut at the budget or failed after sending (their prompt is estimated).
    calls_usage_estimated: int = 0
    #: Why the run stopped before its todo list was done (the cost cap, a refusal, too many
    #: failures), if it did.
    stopped: str | None = None
    #: The provider (or the configuration) refused the run: nothing it could fix by retrying.
    refused: bool = False
    #: Of the failed queries, those cut by a stop request (`piserini-ray stop`): asked for,
    #: so not a failure of the run; they run again when it resumes.
    stopped_queries: int = 0

    def exit_status(self) -> int:
        """0: every query ran to a result, or the cost cap or a stop request stopped the run as
        asked; 1: queries failed (or too many did); 2: the run was refused (a key, a model, an
        endpoint)."""
        if self.refused:
            return 2
        return 1 if self.statuses.get("failed", 0) > self.stopped_queries else 0


class Engine(Protocol):
    """Runs prepared runs' todo lists and judges their answers, writing each record and verdict
    through its run's store as it comes (`engines.local.LocalEngine`, `runtime.RayEngine`).

    `start` may begin bringing up workers while `prepare` checks the data (idempotent); `judge`
    gives every answer without a verdict one from `config`'s judge model, under the limiter of
    that model's quota key; `close` lets go of what `run` never took. `checks_agent_models`:
    the engine sends each hosted agent model the one-word check (`llm/check.py`) itself, from
    every node that will call it, before any query, so `prepare` checks only the judges."""

    checks_agent_models: bool

    def start(self, configs: list[RunConfig], log: Log) -> None: ...

    def run(self, runs: list[PreparedRun], log: Log) -> None: ...

    def judge(
        self,
        config: RunConfig,
        store: RunStore,
        records: list[QueryRecord],
        queries: dict[str, Query],
        log: Log,
    ) -> None: ...

    def close(self) -> None: ...
