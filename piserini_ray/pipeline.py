"""One run pipeline for both engines: `prepare()` checks everything that can be checked before a
token is paid for, then opens the run stores and lists what is left to run; an engine (local or
Ray) runs the todo lists; `finish()` judges, reduces and writes the reports (`report/`).

`prepare` goes in this order, so that a mistake never leaves a half-made run directory behind:
1. preflight of every run (pricing, API key variables, data files exist): a sweep is checked
   whole before any of it starts; then the engine starts (Ray and its replicas come up while
   the rest is checked), and one tiny request goes to each hosted model (`llm/check.py`);
2. the data: queries, qrels and the slice are loaded and checked, and the index is built or
   found (which reads, and so validates, the whole corpus: a torn line or a duplicate docid
   names its file and line);
3. qrels against the corpus and the queries: unusable qrels are an error, partly matching ones
   a warning with counts;
4. only then the run directory (created, locked, writable) and its todo list.

The engines sit below this module and never import it: they receive `PreparedRun`s and the
`Engine` protocol from `engine_contract.py`. Judging goes through the engine too
(`Engine.judge`), so a run is judged under the same limiters wherever it ran. The reports'
modules (matplotlib, SciPy) and the model check (litellm) load when used: a Ray engine starts
booting before they do.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from piserini_ray.config import ModelConfig, RetrievalConfig, RunConfig
from piserini_ray.data import Benchmark, Query, load_benchmark
from piserini_ray.data.benchmark import Qrels
from piserini_ray.engine_contract import Engine, Log, PreparedRun, RunSummary
from piserini_ray.errors import ConfigError, DataError
from piserini_ray.metrics.cost import CostGuard, PricingTable, pricing_for
from piserini_ray.monitor.board import STOPPED, StatusBoard, final_status
from piserini_ray.monitor.otlp import traces_endpoint
from piserini_ray.preflight import preflight_judge, preflight_runs
from piserini_ray.records import Judgement, QueryRecord
from piserini_ray.stopping import DecisionWatch, StopWhenDecided
from piserini_ray.store import RunStore, manifest_config, read_served, write_report_file

if TYPE_CHECKING:
    from piserini_ray.report.decided import DecisionFigures
    from piserini_ray.report.epochs import EpochsReport
    from piserini_ray.report.facts import QueryFacts
    from piserini_ray.report.paired import PairedComparison, RunFacts
    from piserini_ray.report.run_metrics import RunMetrics
    from piserini_ray.report.viewer import ViewerWriter

__all__ = [
    "Engine",
    "Log",
    "PreparedRun",
    "Report",
    "RunSummary",
    "execute",
    "finish",
    "index_for",
    "judge_run",
    "make_engine",
    "prepare",
    "report_runs",
    "run_and_report",
    "run_local",
    "run_on_ray",
]


def make_engine(name: str, concurrency: int = 4, release_ray: bool = False) -> Engine:
    """The engine a command names: `ray` (searcher replicas on Ray; `release_ray`: let a Ray
    this process started go when the engine closes) or `local` (this process, `concurrency`
    queries at once)."""
    if name == "local":
        from piserini_ray.local_run import LocalEngine

        return LocalEngine(concurrency)
    from piserini_ray.runtime import RayEngine

    return RayEngine(release_ray=release_ray)


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


@contextlib.contextmanager
def _closing(engine: Engine) -> Iterator[Engine]:
    try:
        yield engine
    finally:
        engine.close()


def run_local(
    config: RunConfig,
    run_dir: Path | None = None,
    concurrency: int = 4,
    log: Log = lambda m: print(m, file=sys.stderr, flush=True),
    only: set[str] | None = None,
) -> RunSummary:
    """Run (or resume) the configured slice in this process (`only`: just those queries of
    it); its summary."""
    with _closing(make_engine("local", concurrency)) as engine:
        return execute([(config, run_dir)], engine, log, only)[0]


def run_on_ray(
    configs: list[tuple[RunConfig, Path | None]],
    log: Log,
    only: set[str] | None = None,
) -> list[RunSummary]:
    """Run (or resume) one or more runs concurrently on one Ray cluster (`only`: just those
    queries of their slices); one summary each."""
    with _closing(make_engine("ray")) as engine:
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


def default_run_dir(config: RunConfig, root: Path | None = None) -> Path:
    """`<runs_root>/<benchmark>-<model>-<config hash>`: the same config finds the same run
    directory wherever the command runs from (a resubmitted job resumes). A run named by the
    hash of an earlier version (a hosted model's hash counted the offline settings) is found
    under its old name, so it resumes instead of being paid for again."""
    import re

    model = re.sub(r"[^A-Za-z0-9._-]+", "_", config.model.name)
    root = root if root is not None else config.runtime.resolved_runs_root()
    prefix = f"{config.benchmark.display_name()}-{model}-"
    path = root / f"{prefix}{config.config_hash()[:8]}"
    earlier = root / f"{prefix}{config.config_hash(with_offline=True)[:8]}"
    return earlier if not path.exists() and (earlier / "manifest.json").exists() else path


def epoch_dir(run_dir: Path, epoch: int) -> Path:
    """Where epoch `epoch` of the run in `run_dir` lives: epoch 1 is the run directory."""
    return run_dir if epoch == 1 else run_dir / "epochs" / str(epoch)


def with_epochs(runs: Sequence[tuple[RunConfig, Path | None]]) -> list[tuple[RunConfig, Path]]:
    """Each run as the runs of its epochs (`run.epochs`), every one in its own directory
    (`epoch_dir`); a run without epochs, or one epoch's own config, as itself."""
    expanded = []
    for config, run_dir in runs:
        base = run_dir or default_run_dir(config)
        if config.run.epoch != 1:  # one epoch, resumed or reported on its own
            expanded.append((config, base))
            continue
        for epoch in range(1, config.run.epochs + 1):
            expanded.append((config.for_epoch(epoch), epoch_dir(base, epoch)))
    return expanded


def check_models(
    configs: list[RunConfig], log: Log, include_offline: bool = False, agents: bool = True
) -> None:
    """One tiny request to each distinct model of the runs (`llm/check.py`); offline models
    too with `include_offline` (`run --check`); the judges only with `agents=False`."""
    from piserini_ray.endpoints import ModelEndpoints
    from piserini_ray.llm import check

    with ModelEndpoints() as endpoints:
        check.check_models(configs, endpoints.api_base, log, include_offline, agents)


def prepare(
    runs: Sequence[tuple[RunConfig, Path | None]],
    log: Log,
    stack: contextlib.ExitStack,
    only: set[str] | None = None,
    priced: list[PricingTable] | None = None,
    retry_failed: bool = False,
    check_agents: bool = True,
) -> list[PreparedRun]:
    """Check and open every run; the stores close with `stack`. `priced`: the runs' pricing
    tables, when the caller made `preflight_runs` already. Failed queries that were not their
    own fault (`QueryRecord.retryable`) run again; with `retry_failed`, every failed one.
    `check_agents=False`: the engine checks the agent models itself, where its queries run."""
    if priced is None:
        priced = preflight_runs([config for config, _ in runs])
    # One tiny request per hosted model: a wrong key or model name stops here, in seconds.
    check_models([config for config, _ in runs], log, agents=check_agents)
    loaded = []
    for config, _ in runs:
        benchmark = load_benchmark(config.benchmark)
        queries = benchmark.select(**config.slice.model_dump())
        loaded.append((benchmark, queries, index_for(config, benchmark, log)))
    prepared = []
    for (config, run_dir), table, (benchmark, queries, index) in zip(
        runs, priced, loaded, strict=True
    ):
        run_dir = run_dir or default_run_dir(config)
        store = stack.enter_context(RunStore(run_dir, config, log=log))
        wanted = {q.query_id for q in queries}
        again = store.failed(retryable_only=not retry_failed) & wanted
        if store.release(again):
            log(
                f"run {store.run_dir}: {len(again)} failed quer{'y' if len(again) == 1 else 'ies'} "
                + (
                    "run again (--retry-failed)"
                    if retry_failed
                    else "not the query's fault run again"
                )
                + " (their records moved to records.retried.jsonl)"
            )
        done = store.done()
        todo = [
            q for q in queries if q.query_id not in done and (only is None or q.query_id in only)
        ]
        recorded = sum(1 for q in queries if q.query_id in done)
        later = len(queries) - recorded - len(todo)
        log(
            f"run {store.run_dir}: {len(queries)} queries, {recorded} already recorded, "
            f"{len(todo)} to run with {config.model.name}"
            + (f" (a pilot: {later} left for the full run)" if later else "")
        )
        guard = _cost_guard(config, table, store)
        run = PreparedRun(
            config, store.run_dir, benchmark, queries, index, store, table, todo, guard
        )
        run.board = _status_board(run, stack, log)
        _send_traces(run, stack, log)
        prepared.append(run)
    return prepared


def _send_traces(run: PreparedRun, stack: contextlib.ExitStack, log: Log) -> None:
    """When traces are on (`monitor/otlp.py`), each query of the run as an OpenTelemetry trace,
    made from its record by a store listener; what waits goes out when the execution ends."""
    endpoint = traces_endpoint(run.config)
    if endpoint is None:
        return  # off: OpenTelemetry is not even imported
    from piserini_ray.monitor.traces import TraceExporter

    exporter = TraceExporter(
        run.run_dir.name,
        run.config,
        run.pricing.model_price(run.config.model),
        run.wanted,
        endpoint,
        log,
    )
    run.store.listeners.append(exporter)
    stack.callback(exporter.close)


def _status_board(run: PreparedRun, stack: contextlib.ExitStack, log: Log) -> StatusBoard:
    """The run's live status (`status.json`), told of every record and verdict by its store
    and rewritten on its own thread; closed as `interrupted` if the execution never says how it
    ended (`PreparedRun.close_status`)."""
    board = StatusBoard(
        run.store,
        run.config,
        run.pricing.model_price(run.config.model),
        run.wanted,
        len(run.todo),
        log,
        every=run.config.runtime.status_seconds,
    )
    run.store.listeners.append(board)
    stack.callback(board.close, "interrupted")  # the first close counts: a no-op after one
    return board.start()


def _cost_guard(config: RunConfig, pricing: PricingTable, store: RunStore) -> CostGuard:
    """The run's cost cap, counting what its records already spent (a resumed run)."""
    price = pricing.model_price(config.model)
    cap = config.pricing.max_cost_usd
    if cap is None or price is None:
        return CostGuard(None, price)
    usages = [r.usage for r in store.iter_records(trajectory=False)]
    paid = [*usages, *store.retried_usage()]  # retried records were paid too
    spent, estimated = (sum(f(u) for u in paid) for f in (price.cost, price.estimated_cost))
    return CostGuard(cap, price, spent, len(usages), estimated)


def index_for(config: RunConfig, benchmark: Benchmark, log: Log, dense: bool | None = None) -> Path:
    """The one owner of "the index for a config": the Lucene index of the benchmark's corpus
    (built if missing), its qrels checked against it (`check_qrels`: unusable qrels stop here,
    partly matching ones are a warning), and the dense index beside it when `dense` (default:
    when the configured backend uses one)."""
    from piserini_ray.retrieval import ensure_index
    from piserini_ray.retrieval.docstore import read_docids

    index = ensure_index(benchmark.corpus, config.retrieval, log)
    for problem in check_qrels(benchmark, set(read_docids(index)), config):
        log(f"warning: {problem}")
    if config.retrieval.uses_dense if dense is None else dense:
        ensure_dense_index(index, config.retrieval, log)
    return index


def ensure_dense_index(index: Path, retrieval: RetrievalConfig, log: Log) -> Path:
    """The dense index beside a Lucene index, built if missing: on encoder actors when Ray is
    up (`piserini-ray index --backend dense` starts it), else in this process. (Encoder actors
    start only if a shard is missing.)"""
    from piserini_ray.retrieval.dense_index import build_dense_index
    from piserini_ray.runtime.encoders import shard_encoder_if_ray

    encode = shard_encoder_if_ray(retrieval.dense, log)
    return build_dense_index(index, retrieval.dense, encode, log)


def check_qrels(benchmark: Benchmark, docids: set[str], config: RunConfig) -> list[str]:
    """Qrels that cannot mean what they say: an error when none of their ids match (every
    recall would be n/a or 0), a warning with counts when some do not."""
    warnings = []
    query_ids = {q.query_id for q in benchmark.queries}
    for label, qrels, path in (
        ("evidence", benchmark.evidence, config.benchmark.qrels_evidence),
        ("gold", benchmark.gold, config.benchmark.qrels_gold),
    ):
        if not qrels:
            continue
        source = str(path) if path is not None else f"the {label} lists of the query file"
        warnings += _check_one(label, qrels, source, query_ids, docids)
    return warnings


def _check_one(
    label: str, qrels: Qrels, source: str, query_ids: set[str], docids: set[str]
) -> list[str]:
    foreign = sorted(set(qrels) - query_ids)
    if len(foreign) == len(qrels):
        raise DataError(
            source,
            f"none of the {len(qrels)} query ids of these {label} qrels is a query of the "
            f"benchmark (e.g. {foreign[0]!r}); every {label} recall would be n/a. Point "
            f"benchmark.qrels_{label} at the qrels of these queries",
        )
    pairs = [(q, d) for q, docs in qrels.items() if q in query_ids for d in docs]
    missing = [d for _, d in pairs if d not in docids]
    if pairs and len(missing) == len(pairs):
        raise DataError(
            source,
            f"none of the {len(pairs)} documents of these {label} qrels is in the corpus (e.g. "
            f"{missing[0]!r}); every {label} recall would be 0. Check that the qrels and the "
            "corpus come from the same release (and that docids are spelled alike)",
        )
    warnings = []
    if foreign:
        warnings.append(
            f"{source}: {len(foreign)} of {len(qrels)} query ids in the {label} qrels are not "
            f"queries of the benchmark (e.g. {foreign[0]!r}); they are ignored"
        )
    if missing:
        warnings.append(
            f"{source}: {len(missing)} of {len(pairs)} {label} qrels name documents that are "
            f"not in the corpus (e.g. {missing[0]!r}); recall counts them as never found"
        )
    return warnings


def judge_run(
    config: RunConfig,
    run_dir: Path,
    engine: Engine,
    log: Log,
    extra_judges: Sequence[ModelConfig] = (),
) -> list[QueryRecord]:
    """Verdicts for every answer of the run that has none yet, from the primary judge (every
    judge of a panel, `judge.models`) and each of `extra_judges`, through `engine` (under its
    limiters). Returns the slice's records
    (without trajectories or rankings: the judge reads the answers only)."""
    benchmark = load_benchmark(config.benchmark)
    wanted = {q.query_id: q for q in benchmark.select(**config.slice.model_dump())}
    with RunStore(run_dir, config, log=log) as store:
        records = _answers(store, wanted)
        judges = {m.name: m for m in (*config.judge_panel(), *extra_judges)}
        for model in judges.values():  # the run's own judge (or panel) first, each once
            judged = config.judged_by(model)
            preflight_judge(judged)
            engine.judge(judged, store, records, wanted, log)
    return records


def _answers(store: RunStore, wanted: dict[str, Query]) -> list[QueryRecord]:
    return [r for r in store.iter_records(trajectory=False) if r.query_id in wanted]


def finish(
    config: RunConfig,
    run_dir: Path,
    log: Log,
    judge: bool = True,
    on_ray: bool = False,
    extra_judges: Sequence[ModelConfig] = (),
) -> RunMetrics:
    """The pipeline's last step for one run: judge what is not judged yet (`judge_run`, on a
    local or, `on_ray`, a Ray engine; none unless `judge`), reduce, and write the reports
    (`reduce`); return the metrics."""
    if judge:
        with _closing(make_engine("ray" if on_ray else "local")) as engine:
            judge_run(config, run_dir, engine, log, extra_judges)
    return reduce(config, run_dir, log)


def reduce(config: RunConfig, run_dir: Path, log: Log) -> RunMetrics:
    """Reduce a run from what is judged already and write `summary.json`, `report.md`, the
    plots and `report.html` into its directory; return the metrics. The report shows each pair
    of judges' agreement (every judge with verdicts in the run counts)."""
    from piserini_ray.report import write_run_reports
    from piserini_ray.report.agreement import judge_agreement
    from piserini_ray.report.run_metrics import aggregate, judge_calibration
    from piserini_ray.report.viewer import ViewerWriter

    benchmark = load_benchmark(config.benchmark)
    wanted = {q.query_id: q for q in benchmark.select(**config.slice.model_dump())}
    primary = config.judge_model()
    with RunStore(run_dir, config, log=log) as store:
        judgements, verdicts = _verdicts(config, store)
        others = [m for m in verdicts if m != primary.name]
        panel = None
        if config.judge.models:
            from piserini_ray.report.panel import panel_summary

            names = [m.name for m in config.judge.models]
            panel = panel_summary(verdicts, names, config.judge.panel_ties)
        records = _answers(store, wanted)
        answers = {r.query_id: r.exact_answer for r in records}
        queries = [q for q in wanted.values() if q.query_id in answers]
        agreement = [
            judge_agreement(first, second, verdicts, queries, answers, config.judge.seed)
            for first, second in itertools.combinations([primary.name, *others], 2)
        ]
        viewer = ViewerWriter(store.run_dir, benchmark, judgements)
        facts = _facts(store, benchmark, wanted, judgements, viewer)
        pricing = pricing_for(config)
        metrics = aggregate(config, store.run_dir, facts, judgements, pricing, store.served())
        viewer.write_index(facts, pricing.model_price(config.model))
        # The live status's last word: the report's counts and interval (`monitor/board.py`).
        judged = metrics.accuracy_judged or metrics.accuracy
        final_status(
            store, config, pricing.model_price(config.model), set(wanted), judged.ci95, log
        )
    metrics = metrics.model_copy(
        update={
            "judge_agreement": agreement,
            "panel": panel,
            "judge_calibration": judge_calibration(primary.name, agreement, panel),
            "decision": _decision(metrics, run_dir, len(wanted), len(facts)),
        }
    )
    write_run_reports(metrics, Path(run_dir), viewer=True)
    return metrics


def _decision(
    metrics: RunMetrics, run_dir: Path, in_slice: int, run: int
) -> DecisionFigures | None:
    """The run's part in a `stop_when_decided` sweep, if it had one."""
    from piserini_ray.report.decided import decision_figures

    accuracy = metrics.accuracy_judged or metrics.accuracy
    n = accuracy.queries
    correct = round((accuracy.value or 0.0) * n)
    return decision_figures(Path(run_dir), in_slice, run, (correct, n), metrics.cost_usd)


def _verdicts(
    config: RunConfig, store: RunStore
) -> tuple[dict[str, Judgement], dict[str, dict[str, Judgement]]]:
    """The run's verdict on each judged query (its judge's, or its panel's majority), and
    every judge's verdicts by judge."""
    primary = config.judge_model().name
    names = [primary, *(m for m in store.judge_models() if m != primary)]
    verdicts = {name: store.judgements(name) for name in names}
    if not config.judge.models:
        return verdicts[primary], verdicts
    from piserini_ray.report.panel import panel_verdicts

    panel = [m.name for m in config.judge.models]
    return panel_verdicts(verdicts, panel, config.judge.panel_ties), verdicts


@dataclass
class Report:
    """What `report_runs` wrote (and what `judge` and `report` return): each run's metrics,
    the markdown table, and the combined report's files (several runs, or an `out` folder).

    Args:
        metrics: each run's `RunMetrics`, also in its `summary.json`.
        table: the runs side by side, in markdown.
        paired: the paired comparison against a sweep's reference run, in markdown.
        combined: the combined report's files (`report.md`, `report.html`).
        epochs: the epochs report of each run with several epochs.

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import report

        result = report(["runs/a", "runs/b"])
        print(result.table, [m.accuracy.value for m in result.metrics])
        ```
    """

    metrics: list[RunMetrics]
    table: str
    paired: str | None = None
    combined: list[Path] = field(default_factory=list)
    #: The epochs report of each run with epochs (`report_epochs`).
    epochs: list[EpochsReport] = field(default_factory=list)


def report_epochs(config: RunConfig, run_dir: Path, log: Log) -> EpochsReport:
    """Accuracy over the epochs of the run in `run_dir` (`metrics/epochs.py`), from each
    epoch's verdicts (nothing is called), written to `epochs.json` and `epochs.md` there."""
    from piserini_ray.metrics.epochs import epoch_stats
    from piserini_ray.report.epochs import EpochsReport, epoch_outcomes, write_epochs_report

    benchmark = load_benchmark(config.benchmark)
    wanted = {q.query_id for q in benchmark.select(**config.slice.model_dump())}
    outcomes: list[dict[str, bool | None]] = []
    dirs = []
    for epoch in range(1, config.run.epochs + 1):
        folder = epoch_dir(run_dir, epoch)
        dirs.append(str(folder))
        if not (folder / "manifest.json").exists():
            outcomes.append({})
            continue
        # The verdicts and which queries have a record (the store knows at open): no facts,
        # no rankings.
        with RunStore(folder, config.for_epoch(epoch), log=log) as store:
            verdicts = _verdicts(config, store)[0]
            outcomes.append(epoch_outcomes(verdicts, store.done() & wanted))
    report = EpochsReport(
        run_dir=str(run_dir),
        model=config.model.name,
        stats=epoch_stats(outcomes, config.judge.seed),
        epoch_dirs=dirs,
        seeds=[config.for_epoch(e).run.request_seed() for e in range(1, config.run.epochs + 1)],
    )
    write_epochs_report(report, run_dir)
    return report


def report_runs(
    runs: list[tuple[RunConfig, Path]],
    log: Log,
    engine: Engine | None = None,
    out: Path | None = None,
    extra_judges: Sequence[ModelConfig] = (),
    reference: Path | None = None,
) -> Report:
    """Judge every run through `engine` (None: judge nothing), close the engine (a Ray it
    started goes down while the reports are written), then reduce each run and, for several
    runs (or `out`), write a combined report with a paired comparison of every run against
    `reference` when one is named."""
    from piserini_ray.report import markdown_report, write_html_report

    # An epoch not started yet (epochs raised, not resumed) has nothing to judge or report.
    every = [(c, d) for c, d in with_epochs(runs) if c.run.epoch == 1 or d.exists()]
    if engine is not None:
        with _closing(engine):
            for config, run_dir in every:
                judge_run(config, run_dir, engine, log, extra_judges)
    metrics = [reduce(config, run_dir, log) for config, run_dir in every]
    report = Report(metrics, markdown_report(metrics))
    report.epochs = [
        report_epochs(config, Path(run_dir), log)
        for config, run_dir in runs
        if config.run.epochs > 1 and config.run.epoch == 1
    ]
    if out is not None or len(runs) > 1:
        folder = out or Path(runs[0][1]).parent
        folder.mkdir(parents=True, exist_ok=True)
        table = report.table
        if reference is not None:
            from piserini_ray.report.paired import paired_markdown

            others = [Path(d) for _, d in runs if Path(d).absolute() != reference.absolute()]
            report.paired = paired_markdown(compare(reference, others, log))
            table += "\n" + report.paired
        write_report_file(folder / "report.md", table)
        report.combined = [folder / "report.md", write_html_report(metrics, folder, pareto=True)]
    return report


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
    with _closing(engine):
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


def compare(
    reference: Path, others: Sequence[Path], log: Log, seed: int = 0
) -> list[PairedComparison]:
    """Paired comparisons of each run against `reference` over the queries they share, from
    each run's own judge's verdicts (nothing is called)."""
    from piserini_ray.report.paired import compare_runs

    base = run_facts(reference, log)
    return [compare_runs(base, run_facts(d, log), seed) for d in others]


def _facts(
    store: RunStore,
    benchmark: Benchmark,
    wanted: dict[str, Query],
    judgements: dict[str, Judgement],
    viewer: ViewerWriter | None = None,
) -> list[QueryFacts]:
    """The map step, streaming the records one at a time, each with its rankings, in this
    process on either engine: shipping a run's records to Ray tasks costs more than the
    arithmetic (bench/reducers.py), and this way a run is never held whole in memory. With a
    `viewer`, each record (trajectory included) also becomes its query's viewer file."""
    streamed = store.iter_records(rankings=True, trajectory=viewer is not None)
    records: Iterator[QueryRecord] = (r for r in streamed if r.query_id in wanted)
    if viewer is not None:
        records = viewer.observe(records)
    from piserini_ray.report.facts import facts_for

    return facts_for(records, benchmark, None, judgements)


def run_facts(run_dir: Path, log: Log) -> RunFacts:
    """A finished run's per-query facts under its primary judge, from its own manifest and
    what is judged already (nothing is called): the input of a paired comparison."""
    return _read_run(run_dir, log)[2]


def run_figures(run_dir: Path, log: Log) -> tuple[RunMetrics, RunFacts]:
    """A finished run's figures and per-query facts from what is judged already, written
    nowhere (nothing is called): the input of a leaderboard row."""
    from piserini_ray.report.run_metrics import aggregate

    config, judgements, facts, in_slice = _read_run(run_dir, log)
    pricing = pricing_for(config)
    metrics = aggregate(
        config, Path(facts.run_dir), facts.facts, judgements, pricing, read_served(run_dir, log)
    )
    decision = _decision(metrics, Path(facts.run_dir), in_slice, len(facts.facts))
    return metrics.model_copy(update={"decision": decision}), facts


def _read_run(run_dir: Path, log: Log) -> tuple[RunConfig, dict[str, Judgement], RunFacts, int]:
    """A finished run's config, verdicts and facts, and the size of its slice."""
    config = manifest_config(run_dir)
    benchmark = load_benchmark(config.benchmark)
    wanted = {q.query_id: q for q in benchmark.select(**config.slice.model_dump())}
    judge = config.judge_model().name
    if config.judge.models:
        from piserini_ray.report.panel import panel_name

        judge = panel_name([m.name for m in config.judge.models])
    with RunStore(run_dir, config, log=log) as store:
        judgements = _verdicts(config, store)[0]
        facts = _facts(store, benchmark, wanted, judgements)
        directory = str(store.run_dir)
    price = pricing_for(config).model_price(config.model)
    from piserini_ray.report.paired import RunFacts

    return (
        config,
        judgements,
        RunFacts(run_dir=directory, model=config.model.name, judge=judge, facts=facts, price=price),
        len(wanted),
    )
