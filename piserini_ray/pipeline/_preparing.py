"""Preparing runs (the package's steps 1-4): the engine by name, run directories and epochs, the
model check, the index and the qrels, then each run's store, todo list, status board, traces and
cost guard.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from piserini_ray.config import RetrievalConfig, RunConfig
from piserini_ray.data import Benchmark, load_benchmark
from piserini_ray.data.benchmark import Qrels
from piserini_ray.engines.contract import Engine, Log, PreparedRun
from piserini_ray.errors import DataError
from piserini_ray.metrics.cost import CostGuard, PricingTable
from piserini_ray.monitor.board import StatusBoard
from piserini_ray.monitor.otlp import traces_endpoint
from piserini_ray.preflight import preflight_runs
from piserini_ray.store import RunStore

if TYPE_CHECKING:
    pass


def make_engine(name: str, concurrency: int = 4, release_ray: bool = False) -> Engine:
    """The engine a command names: `ray` (searcher replicas on Ray; `release_ray`: let a Ray
    this process started go when the engine closes) or `local` (this process, `concurrency`
    queries at once)."""
    if name == "local":
        from piserini_ray.engines.local import LocalEngine

        return LocalEngine(concurrency)
    from piserini_ray.engines.ray import RayEngine

    return RayEngine(release_ray=release_ray)


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
    from piserini_ray.engines.ray.encoder_actors import shard_encoder_if_ray
    from piserini_ray.retrieval.dense_index import build_dense_index

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


@contextlib.contextmanager
def closing(engine: Engine) -> Iterator[Engine]:
    try:
        yield engine
    finally:
        engine.close()
