"""Running prepared runs on an engine: one call for a run or a sweep (`execute`), a sweep's
decisions watched as its runs go, what a run prints before judging, and the whole of run, judge
and report.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from piserini_ray.analysis.stopping import DecisionWatch, StopWhenDecided
from piserini_ray.config import RunConfig
from piserini_ray.data import Benchmark, load_benchmark
from piserini_ray.engines.contract import Engine, Log, PreparedRun, RunSummary
from piserini_ray.errors import ConfigError
from piserini_ray.metrics.cost import pricing_for
from piserini_ray.monitor.board import STOPPED
from piserini_ray.pipeline._finishing import report_runs
from piserini_ray.pipeline._preparing import (
    closing,
    default_run_dir,
    make_engine,
    prepare,
    with_epochs,
)
from piserini_ray.preflight import preflight_runs
from piserini_ray.records import QueryRecord
from piserini_ray.reports.report import Report
from piserini_ray.store import read_served

if TYPE_CHECKING:
    pass


def execute(
    runs: Sequence[tuple[RunConfig, Path | None]],
    engine: Engine,
    log: Log,
    only: set[str] | None = None,
    retry_failed: bool = False,
    judged_next: bool = False,
    decide: Decide | None = None,
) -> list[RunSummary]:
    """preflight -> engine start -> prepare -> engine run -> a summary per run (the judging and
    reports are `finish`). The engine stays open (the caller closes it: it judges next).
    `only`: run just these queries of the slice now (a pilot: `estimate`); the rest stay to
    do. `retry_failed`: run every failed query again (`prepare`). `judged_next`: the caller
    judges the runs next, so an engine may judge each answer as it comes
    (`PreparedRun.judge_as_they_come`). `decide`: stop each run once its comparison with the
    reference is decided (a sweep's `stop_when_decided`)."""
    # A config mistake stops before the engine starts; then its workers come up while the data
    # is checked.
    priced = preflight_runs([config for config, _ in runs])
    if decide is not None:
        check_comparable(runs, decide)
    engine.start([config for config, _ in runs], log)
    with contextlib.ExitStack() as stack:
        prepared = prepare(
            runs,
            log,
            stack,
            only=only,
            priced=priced,
            retry_failed=retry_failed,
            check_agents=not engine.checks_agent_models,
        )
        for run in prepared:
            run.judge_as_they_come = judged_next
        watch = _watch_decisions(prepared, decide, log) if decide is not None else None
        try:
            engine.run(prepared, log)
        except BaseException:
            for run in prepared:
                run.close_status(interrupted=True)
            raise
        for run in prepared:
            run.close_status()
            if watch is not None:
                watch.write(run.run_dir)
        return [
            summarize(
                [r for r in run.store.iter_records(trajectory=False) if r.query_id in run.wanted],
                run.config,
                run.run_dir,
                run.ran,
            ).model_copy(
                update={
                    "stopped": run.stop_reason(),
                    "refused": run.guard.halted is not None,
                }
            )
            for run in prepared
        ]


@dataclass(frozen=True)
class Decide:
    """A sweep's `stop_when_decided`, with its reference run's directory; `extend`: the
    decided runs go on past their decision, in the same order (`sweep --extend`)."""

    settings: StopWhenDecided
    reference: Path
    extend: bool = False


def check_comparable(runs: Sequence[tuple[RunConfig, Path | None]], decide: Decide) -> None:
    """Before any work: the runs can be compared query by query as they go (one query set,
    one epoch, one judge that judges as the answers come), and the reference is one of them."""
    where = "stop_when_decided"
    dirs = [Path(d or default_run_dir(c)).absolute() for c, d in runs]
    if decide.reference.absolute() not in dirs:
        raise ConfigError(f"{where}: the reference {decide.reference} is not a run of the sweep")
    sets: dict[frozenset[str], list[str]] = {}
    loaded: dict[str, Benchmark] = {}
    for (config, _), run_dir in zip(runs, dirs, strict=True):
        judge = config.judge_model()
        if config.judge.models:
            raise ConfigError(
                f"{where}: {run_dir.name} is judged by a panel (judge.models); the paired test "
                "reads one judge's verdicts: give the runs one judge (judge.model)"
            )
        if judge.service_tier == "batch":
            raise ConfigError(
                f"{where}: {run_dir.name}'s judge {judge.name} is at the batch tier, which "
                "judges after the run; the test needs each verdict as the answer comes: set "
                "the judge's service_tier to standard (the agent may stay at the batch tier)"
            )
        if config.run.epochs > 1:
            raise ConfigError(
                f"{where}: {run_dir.name} has {config.run.epochs} epochs; the paired test "
                "compares one answer per query: set run.epochs to 1"
            )
        source = config.benchmark.model_dump_json()
        if source not in loaded:  # a sweep's runs mostly share one benchmark: read it once
            loaded[source] = load_benchmark(config.benchmark)
        selected = loaded[source].select(**config.slice.model_dump())
        sets.setdefault(frozenset(q.query_id for q in selected), []).append(run_dir.name)
    if len(sets) > 1:
        sizes = "; ".join(f"{len(ids)} queries: {', '.join(names)}" for ids, names in sets.items())
        raise ConfigError(
            f"{where}: the runs do not share a query set ({sizes}), so they cannot be compared "
            "query by query: give every run the same benchmark and slice"
        )


def _watch_decisions(prepared: list[PreparedRun], decide: Decide, log: Log) -> DecisionWatch:
    """The sweep's `DecisionWatch`, told of what each run holds already and of every record
    and verdict to come; each run's todo list in the shared order, judged as it comes."""
    watch = DecisionWatch(
        decide.settings,
        decide.reference.absolute(),
        [run.run_dir for run in prepared],
        [q.query_id for q in prepared[0].queries],
        {str(run.run_dir): run.config.judge_model().name for run in prepared},
        log,
        extend=decide.extend,
    )
    for run in prepared:
        judge = run.config.judge_model().name
        records = [r for r in run.store.iter_records(trajectory=False) if r.query_id in run.wanted]
        watch.load(run.run_dir, records, run.store.judgements(judge))
        run.store.listeners.append(watch.listener(run.run_dir))
        run.todo.sort(key=lambda q: watch.position(q.query_id))
        run.judge_as_they_come = True
        run.decisions = watch
        if run.decided():
            log(f"run {run.run_dir}: {run.decided()}")
    return watch


def run_local(
    config: RunConfig,
    run_dir: Path | None = None,
    concurrency: int = 4,
    log: Log = lambda m: print(m, file=sys.stderr, flush=True),
    only: set[str] | None = None,
) -> RunSummary:
    """Run (or resume) the configured slice in this process (`only`: just those queries of
    it); its summary."""
    with closing(make_engine("local", concurrency)) as engine:
        return execute([(config, run_dir)], engine, log, only)[0]


def run_on_ray(
    configs: list[tuple[RunConfig, Path | None]],
    log: Log,
    only: set[str] | None = None,
) -> list[RunSummary]:
    """Run (or resume) one or more runs concurrently on one Ray cluster (`only`: just those
    queries of their slices); one summary each."""
    with closing(make_engine("ray")) as engine:
        return execute(configs, engine, log, only)


def summarize(records: list[QueryRecord], config: RunConfig, run_dir: Path, ran: int) -> RunSummary:
    """The console summary of a run's records (statuses, tools, tokens, cost: a served
    model's server-hours included)."""
    price = pricing_for(config).model_price(config.model)
    served = sum(s.cost_usd for s in read_served(run_dir))
    n = max(1, len(records))
    tools: Counter[str] = Counter()
    for record in records:
        tools.update(record.tool_call_counts)
    totals: Counter[str] = Counter()
    for record in records:
        totals.update(record.usage.model_dump())
    per_query = [r.usage.input_tokens + r.usage.output_tokens for r in records] or [0]
    return RunSummary(
        run_dir=str(run_dir),
        config_hash=config.config_hash(),
        model=config.model.name,
        queries=len(records),
        ran_now=ran,
        statuses=dict(Counter(r.status for r in records)),
        tool_calls_per_query={k: round(v / n, 2) for k, v in sorted(tools.items())}
        | {"total": round(sum(tools.values()) / n, 2)},
        tokens_total=dict(totals),
        tokens_median_per_query=statistics.median(per_query),
        cached_token_ratio=round(totals["cached_tokens"] / max(1, totals["input_tokens"]), 4),
        cost_usd=round(sum(price.cost(r.usage) for r in records) + served, 4) if price else None,
        calls_without_usage=sum(r.calls_without_usage for r in records),
        cost_estimated_usd=round(sum(price.estimated_cost(r.usage) for r in records), 4)
        if price
        else None,
        calls_usage_estimated=sum(r.calls_usage_estimated for r in records),
        stopped_queries=sum(1 for r in records if r.termination == STOPPED),
    )


def run_and_report(
    runs: list[tuple[RunConfig, Path | None]],
    engine: Engine,
    log: Log,
    on_summary: Callable[[RunSummary], None],
    reference: Path | None = None,
    retry_failed: bool = False,
    decide: Decide | None = None,
) -> tuple[Report, int]:
    """The main job: execute the runs, hand each summary to `on_summary` (before judging,
    which takes a while), judge them on the same engine and report. Returns the report and the
    job's exit status (the worst of its runs': `RunSummary.exit_status`). `decide`: stop each
    run once its comparison with the reference is decided."""
    named = [(config, (run_dir or default_run_dir(config)).absolute()) for config, run_dir in runs]
    with closing(engine):
        summaries = execute(
            with_epochs(named),
            engine,
            log,
            retry_failed=retry_failed,
            judged_next=True,
            decide=decide,
        )
        for summary in summaries:
            on_summary(summary)
        report = report_runs(named, log, engine, reference=reference)
    return report, max((s.exit_status() for s in summaries), default=0)
