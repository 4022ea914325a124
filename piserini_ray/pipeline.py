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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from piserini_ray.config import ModelConfig, RetrievalConfig, RunConfig
from piserini_ray.data import Benchmark, Query, load_benchmark
from piserini_ray.data.benchmark import Qrels
from piserini_ray.errors import DataError
from piserini_ray.llm.check import check_models
from piserini_ray.metrics.cost import CostGuard, PricingTable, pricing_for
from piserini_ray.preflight import preflight_judge, preflight_runs
from piserini_ray.records import Judgement, QueryRecord
from piserini_ray.report import write_run_reports
from piserini_ray.report.agreement import judge_agreement
from piserini_ray.report.metrics import QueryFacts, RunMetrics, aggregate, facts_for
from piserini_ray.report.paired import RunFacts
from piserini_ray.report.viewer import ViewerWriter
from piserini_ray.store import RunStore, manifest_config

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

    @property
    def wanted(self) -> set[str]:
        return {q.query_id for q in self.queries}


class RunSummary(BaseModel):
    """What `run` prints when the engine is done, before judging."""

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
    #: Why the run stopped before its todo list was done (the cost cap), if it did.
    stopped: str | None = None


class Engine(Protocol):
    """Runs prepared runs' todo lists, writing each record through its run's store as it
    comes (`local_run.LocalEngine`, `runtime.RayEngine`). `start` may begin bringing up its
    workers while `prepare` runs (idempotent); `close` lets go of what `run` never took."""

    def start(self, configs: list[RunConfig], log: Log) -> None: ...

    def run(self, runs: list[PreparedRun], log: Log) -> None: ...

    def close(self) -> None: ...


def execute(
    runs: list[tuple[RunConfig, Path | None]],
    engine: Engine,
    log: Log,
    only: set[str] | None = None,
    priced: list[PricingTable] | None = None,
) -> list[RunSummary]:
    """prepare -> engine -> a summary per run (the judging and reports are `finish`).
    `only`: run just these queries of the slice now (a pilot: `estimate`); the rest stay to do.
    `priced`: the runs' pricing tables when the caller made `preflight_runs` already."""
    with contextlib.ExitStack() as stack:
        stack.callback(engine.close)
        prepared = prepare(runs, log, stack, only=only, engine=engine, priced=priced)
        engine.run(prepared, log)
        return [
            summarize(
                [r for r in run.store.iter_records(trajectory=False) if r.query_id in run.wanted],
                run.config,
                run.run_dir,
                run.ran,
            ).model_copy(update={"stopped": run.guard.stop_reason()})
            for run in prepared
        ]


def summarize(records: list[QueryRecord], config: RunConfig, run_dir: Path, ran: int) -> RunSummary:
    """The console summary of a run's records (statuses, tools, tokens, cost)."""
    price = pricing_for(config).price(config.model.name)
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
        cost_usd=round(sum(price.cost(r.usage) for r in records), 4) if price else None,
        calls_without_usage=sum(r.calls_without_usage for r in records),
    )


def default_run_dir(config: RunConfig, root: Path | None = None) -> Path:
    """`<runs_root>/<benchmark>-<model>-<config hash>`: the same config finds the same run
    directory wherever the command runs from (a resubmitted job resumes)."""
    import re

    model = re.sub(r"[^A-Za-z0-9._-]+", "_", config.model.name)
    root = root if root is not None else config.runtime.resolved_runs_root()
    return root / f"{config.benchmark.display_name()}-{model}-{config.config_hash()[:8]}"


def prepare(
    runs: list[tuple[RunConfig, Path | None]],
    log: Log,
    stack: contextlib.ExitStack,
    only: set[str] | None = None,
    engine: Engine | None = None,
    priced: list[PricingTable] | None = None,
) -> list[PreparedRun]:
    """Check and open every run; the stores close with `stack`. `engine`: started once the
    configs pass their checks (`preflight_runs`, unless the caller made them: `priced`), before
    the data is read."""
    if priced is None:
        priced = preflight_runs([config for config, _ in runs])
    if engine is not None:  # its workers come up while the data is checked
        engine.start([config for config, _ in runs], log)
    # One tiny request per hosted model: a wrong key or model name stops here, in seconds.
    check_models([config for config, _ in runs], log)
    loaded = []
    for config, _ in runs:
        benchmark = load_benchmark(config.benchmark)
        queries = benchmark.select(**config.slice.model_dump())
        loaded.append((benchmark, queries, _index_for(config, benchmark, log)))
    prepared = []
    for (config, run_dir), table, (benchmark, queries, index) in zip(
        runs, priced, loaded, strict=True
    ):
        run_dir = run_dir or default_run_dir(config)
        store = stack.enter_context(RunStore(run_dir, config, log=log))
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
        prepared.append(
            PreparedRun(config, store.run_dir, benchmark, queries, index, store, table, todo, guard)
        )
    return prepared


def _cost_guard(config: RunConfig, pricing: PricingTable, store: RunStore) -> CostGuard:
    """The run's cost cap, counting what its records already spent (a resumed run)."""
    price = pricing.price(config.model.name)
    cap = config.pricing.max_cost_usd
    if cap is None or price is None:
        return CostGuard(None, price)
    usages = [r.usage for r in store.iter_records(trajectory=False)]
    return CostGuard(cap, price, sum(price.cost(u) for u in usages), len(usages))


def _index_for(config: RunConfig, benchmark: Benchmark, log: Log) -> Path:
    from piserini_ray.retrieval import ensure_index
    from piserini_ray.retrieval.docstore import read_docids

    index = ensure_index(benchmark.corpus, config.retrieval, log)
    for problem in check_qrels(benchmark, set(read_docids(index)), config):
        log(f"warning: {problem}")
    if config.retrieval.uses_dense:
        ensure_dense_index(index, config.retrieval, log)
    return index


def ensure_dense_index(index: Path, retrieval: RetrievalConfig, log: Log) -> Path:
    """The dense index beside a Lucene index, built if missing: on encoder actors when Ray is
    up (`piserini-ray index --backend dense` starts it), else in this process."""
    import ray

    from piserini_ray.retrieval.dense_index import build_dense_index

    encode = None  # (encoder actors start only if a shard is missing)
    if ray.is_initialized():
        from piserini_ray.runtime.encoders import ray_shard_encoder

        encode = ray_shard_encoder(retrieval.dense, log)
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
    log: Log,
    on_ray: bool = False,
    extra_judges: Sequence[ModelConfig] = (),
) -> list[QueryRecord]:
    """Verdicts for every answer of the run that has none yet, from the primary judge and each
    of `extra_judges`. `on_ray`: under the cluster-wide limiters. Returns the slice's records
    (without trajectories or rankings: the judge reads the answers only)."""
    if on_ray:
        from piserini_ray.runtime import ensure_ray

        ensure_ray(config, log)
    benchmark = load_benchmark(config.benchmark)
    wanted = {q.query_id: q for q in benchmark.select(**config.slice.model_dump())}
    primary = config.judge_model()
    with RunStore(run_dir, config, log=log) as store:
        records = _answers(store, wanted)
        for model in (primary, *(m for m in extra_judges if m.name != primary.name)):
            judged = config.model_copy(
                update={"judge": config.judge.model_copy(update={"model": model})}
            )
            preflight_judge(judged)
            _judge(judged, store, records, wanted, on_ray, log)
    return records


def _answers(store: RunStore, wanted: dict[str, Query]) -> list[QueryRecord]:
    return [r for r in store.iter_records(trajectory=False) if r.query_id in wanted]


def finish(
    config: RunConfig,
    run_dir: Path,
    log: Callable[[str], None],
    judge: bool = True,
    on_ray: bool = False,
    extra_judges: Sequence[ModelConfig] = (),
) -> RunMetrics:
    """The pipeline's last step for one run: judge what is not judged yet (`judge_run`, unless
    `judge` is False), reduce, and write `summary.json`, `report.md`, the plots and
    `report.html` into the run directory; return the metrics. The report shows each pair of
    judges' agreement (every judge with verdicts in the run counts, not only `extra_judges`)."""
    records = judge_run(config, run_dir, log, on_ray, extra_judges) if judge else None
    benchmark = load_benchmark(config.benchmark)
    wanted = {q.query_id: q for q in benchmark.select(**config.slice.model_dump())}
    primary = config.judge_model()
    with RunStore(run_dir, config, log=log) as store:
        judgements = store.judgements(primary.name)
        others = [m for m in store.judge_models() if m != primary.name]
        verdicts = {name: store.judgements(name) for name in others} | {primary.name: judgements}
        records = _answers(store, wanted) if records is None else records
        answers = {r.query_id: r.exact_answer for r in records}
        queries = [q for q in wanted.values() if q.query_id in answers]
        agreement = [
            judge_agreement(first, second, verdicts, queries, answers, config.judge.seed)
            for first, second in itertools.combinations([primary.name, *others], 2)
        ]
        viewer = ViewerWriter(store.run_dir, benchmark, judgements)
        facts = _facts(store, benchmark, wanted, judgements, viewer)
        pricing = pricing_for(config)
        metrics = aggregate(config, store.run_dir, facts, judgements, pricing)
        viewer.write_index(facts, pricing.price(config.model.name))
    metrics = metrics.model_copy(update={"judge_agreement": agreement})
    write_run_reports(metrics, Path(run_dir), viewer=True)
    return metrics


def _judge(
    config: RunConfig,
    store: RunStore,
    records: list[QueryRecord],
    wanted: dict[str, Query],
    on_ray: bool,
    log: Log,
) -> None:
    """Verdicts of `config`'s judge for every record without one, written as they arrive."""
    from piserini_ray.judge import judge_records
    from piserini_ray.local_run import endpoint_for

    with endpoint_for(config.judge_model(), config) as api_base:
        if on_ray:
            from piserini_ray.runtime.reporting import judge_on_ray

            judge_on_ray(config, store, records, wanted, api_base, log)
        else:
            asyncio.run(judge_records(config, store, records, wanted, api_base, log))


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
    return facts_for(records, benchmark, None, judgements)


def run_facts(run_dir: Path, log: Log) -> RunFacts:
    """A finished run's per-query facts under its primary judge, from its own manifest and
    what is judged already (nothing is called): the input of a paired comparison."""
    config = manifest_config(run_dir)
    benchmark = load_benchmark(config.benchmark)
    wanted = {q.query_id: q for q in benchmark.select(**config.slice.model_dump())}
    judge = config.judge_model().name
    with RunStore(run_dir, config, log=log) as store:
        facts = _facts(store, benchmark, wanted, store.judgements(judge))
        directory = str(store.run_dir)
    price = pricing_for(config).price(config.model.name)
    return RunFacts(
        run_dir=directory, model=config.model.name, judge=judge, facts=facts, price=price
    )
