"""Retrieval without the agent: build indexes, tune BM25, evaluate backends, the tools by hand and
one query asked here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from piserini_ray.api._common import stderr_log
from piserini_ray.config import RunConfig
from piserini_ray.errors import ConfigError

if TYPE_CHECKING:
    from piserini_ray.analysis.bm25_grid import BackendScores, CellResult
    from piserini_ray.data import Benchmark, Query
    from piserini_ray.engines.contract import Log
    from piserini_ray.records import QueryRecord
    from piserini_ray.retrieval.backends import SearchBackend
    from piserini_ray.retrieval.index import IndexInfo
    from piserini_ray.tools import ToolSession


@dataclass
class BuiltIndex:
    """A Lucene index `build_index` built or found.

    Args:
        path: the index's folder.
        info: what it holds (`num_docs`, `corpus`, `built_at`), from its `index.json`.

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import build_index, load_config

        print(build_index(load_config()).info.num_docs)
        ```
    """

    path: Path
    info: IndexInfo


def build_index(config: RunConfig, *, log: Log | None = None) -> BuiltIndex:
    """Build the Lucene index of the config's corpus, or find it built: what
    `piserini-ray index` does first.

    Args:
        config: the run config: its benchmark's corpus and `retrieval` settings (index root,
            threads, heap).
        log: where progress lines go (default: standard error).

    Returns:
        A `BuiltIndex`: the index's folder and what it holds.

    Raises:
        DataError: the corpus is invalid (a torn line, a duplicate docid: file and line named).

    Example:
        ```python
        from piserini_ray import build_index, load_config

        print(build_index(load_config()).path)
        ```
    """
    from piserini_ray.data import load_corpus
    from piserini_ray.retrieval import ensure_index, read_index_info

    path = ensure_index(load_corpus(config.benchmark), config.retrieval, log or stderr_log)
    return BuiltIndex(path, read_index_info(path))


def build_dense_index(config: RunConfig, index: str | Path, *, log: Log | None = None) -> Path:
    """Build the dense index beside a Lucene index, or find it built, encoded on Ray's encoder
    actors (a local Ray unless `runtime.address` names a cluster): what
    `piserini-ray index --backend dense` does after `build_index`.

    Args:
        config: the run config: its `retrieval.dense` encoder and `runtime` (Ray).
        index: the Lucene index (`build_index(config).path`).
        log: where progress lines go (default: standard error).

    Returns:
        The dense index's folder.

    Example:
        ```python
        from piserini_ray import build_dense_index, build_index, load_config

        config = load_config(overrides={"retrieval.backend": "dense"})
        print(build_dense_index(config, build_index(config).path))
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.engines.ray.ray_env import start_ray

    say = log or stderr_log
    start_ray(config.runtime, say)
    return pipeline.ensure_dense_index(Path(index), config.retrieval, say)


def tool_session(
    config: RunConfig, spill_dir: str | Path | None = None, *, log: Log | None = None
) -> ToolSession:
    """The agent's three tools over the config's index (built if missing, its qrels checked),
    to call by hand: what `piserini-ray search` and `read` use.

    Args:
        config: the run config: its benchmark, `retrieval` backend and `tools` settings.
        spill_dir: where over-long outputs are saved (default: none are).
        log: where progress lines go (default: standard error).

    Returns:
        A `ToolSession`: `session.call("search", {"reason": ..., "query": ...})` returns what
        the agent would see (`.output`) and whether the call succeeded (`.ok`).

    Example:
        ```python
        from piserini_ray import load_config, tool_session

        session = tool_session(load_config())
        print(session.call("search", {"reason": "try", "query": "publisher"}).output)
        ```
    """
    from piserini_ray.data import load_benchmark
    from piserini_ray.tools import ToolSession

    backend = _searcher(config, load_benchmark(config.benchmark), log or stderr_log)
    return ToolSession(backend, config.tools, Path(spill_dir) if spill_dir is not None else None)


def _searcher(config: RunConfig, benchmark: Benchmark, log: Log) -> SearchBackend:
    """The configured backend over the config's index (`pipeline.index_for`: built if
    missing, its qrels checked)."""
    from piserini_ray.pipeline import index_for
    from piserini_ray.retrieval.backends import open_backend

    return open_backend(index_for(config, benchmark, log), config.retrieval)


def ask(
    config: RunConfig,
    query: Query | str,
    *,
    benchmark: Benchmark | None = None,
    spill_dir: str | Path | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    save: str | Path | None = None,
    log: Log | None = None,
) -> QueryRecord:
    """Run one query in this process with the config's agent, model and tools, under the
    model's rate limit, and record nothing: what `piserini-ray ask` does.

    Args:
        config: the run config (`load_config`, or a run's `manifest_config`).
        query: a query of the benchmark (`benchmark.query(id)`), or a question of your own
            (no gold answer: it is not judged).
        benchmark: the config's benchmark when it is loaded already (else it is loaded).
        spill_dir: where the tools save over-long outputs (default: nowhere).
        on_event: called as the trajectory happens, with `"model"` (a turn), `"tool"` (an
            observation) or `"steer"` (the agent told to submit) and the event's data.
        save: a file to write the record to, as indented JSON (default: none).
        log: where progress lines go (default: standard error).

    Returns:
        The query's `QueryRecord` (status, answer, trajectory, usage), in no run's records.

    Example:
        ```python
        from piserini_ray import ask, load_config

        record = ask(load_config(), "Who published the Journal of Psychotherapy Integration?")
        print(record.status, record.exact_answer)
        ```
    """
    import asyncio

    from piserini_ray.agent.loop import run_query
    from piserini_ray.data import Query, load_benchmark
    from piserini_ray.endpoints import ModelEndpoints
    from piserini_ray.engines.local import local_client
    from piserini_ray.tools import ToolSession, tool_schemas

    if isinstance(query, str):
        query = Query(query_id="ask", query=query, answer="")
    benchmark = benchmark if benchmark is not None else load_benchmark(config.benchmark)
    searcher = _searcher(config, benchmark, log or stderr_log)
    spill = Path(spill_dir) if spill_dir is not None else None
    with ModelEndpoints() as endpoints:
        client = local_client(config.model, config, endpoints)  # model.rate_limit holds
        session = ToolSession(searcher, config.tools, spill)
        record = asyncio.run(
            run_query(
                query,
                session,
                client,
                config.agent,
                tool_schemas(config.tools),
                run_id="ask",
                config_hash=config.config_hash(),
                on_event=on_event,
            )
        )
    if save is not None:
        from piserini_ray.reports.writers import write_record

        write_record(record, Path(save))
    return record


@dataclass
class BM25Grid:
    """What `tune_bm25` computed and wrote in its folder.

    Args:
        cells: every (k1, b) cell's scores.
        best: the best cell by the objective.
        seconds: the grid's wall time.
        folder: where `grid.csv`, `grid.md`, `heatmap.png` and `best.yaml` are.
        summary: the grid's heading and its best cell in words (what the command prints).

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import load_config, tune_bm25

        grid = tune_bm25(load_config(), k1=[0.9, 25.0], b=[0.4, 1.0])
        print(grid.best.k1, grid.best.b)
        ```
    """

    cells: list[CellResult]
    best: CellResult
    seconds: float
    folder: Path
    summary: str


def tune_bm25(
    config: RunConfig,
    *,
    k1: Sequence[float] | None = None,
    b: Sequence[float] | None = None,
    objective: str = "evidence_recall@1000",
    out: str | Path | None = None,
    replicas: int | None = None,
    log: Log | None = None,
) -> BM25Grid:
    """Grid-search BM25's (k1, b) on Ray (the configured cluster, else a local Ray), resuming
    the cells a previous grid in `out` computed: what `piserini-ray tune-bm25` does.

    Args:
        config: the run config: its benchmark, slice, retrieval and runtime.
        k1: the k1 values (default: 0.3..1.5, 2..30).
        b: the b values (default: 0..1 by 0.1).
        objective: the score that picks the best cell (`evidence_recall@1000`,
            `evidence_recall@100`, `gold_recall@1000`, `ndcg@10` or `map`).
        out: the grid's folder (default: `<runs root>/tune-bm25-<benchmark>`).
        replicas: searcher replicas (default: `runtime.replicas`).
        log: where progress lines go (default: standard error).

    Returns:
        A `BM25Grid`: every cell, the best, the wall time and the folder of its outputs.

    Raises:
        ConfigError: the objective is not one of those above.

    Example:
        ```python
        from piserini_ray import load_config, tune_bm25

        grid = tune_bm25(load_config(), objective="ndcg@10", out="runs/grid")
        print(grid.summary)
        ```
    """
    from piserini_ray.analysis.bm25_grid import DEFAULT_B, DEFAULT_K1, OBJECTIVES
    from piserini_ray.engines.ray import ensure_ray
    from piserini_ray.reports.bm25_grid import write_grid_outputs

    if objective not in OBJECTIVES:
        raise ConfigError(f"--objective must be one of {', '.join(OBJECTIVES)}")
    say = log or stderr_log
    ensure_ray(config, say)
    from piserini_ray.engines.ray.bm25_grid import tune_on_ray

    folder = Path(out) if out is not None else None
    folder = folder or (
        config.runtime.resolved_runs_root() / f"tune-bm25-{config.benchmark.display_name()}"
    )
    cells, wall = tune_on_ray(
        config,
        list(DEFAULT_K1 if k1 is None else k1),
        list(DEFAULT_B if b is None else b),
        folder,
        replicas or config.runtime.replicas,
        say,
    )
    best = write_grid_outputs(cells, objective, folder)
    summary = (folder / "grid.md").read_text().split("\n\n| k1")[0]
    return BM25Grid(cells, best, wall, folder, summary)


def backends_at_best(config: RunConfig, grid: BM25Grid, *, log: Log | None = None) -> str:
    """Every retrieval backend's no-LLM floor at a grid's best BM25 (hybrid and rerank use it
    too), written to `backends.md` in the grid's folder: what `tune-bm25 --backends` adds.

    Args:
        config: the run config the grid was computed for.
        grid: the grid (`tune_bm25`).
        log: where progress lines go (default: standard error).

    Returns:
        The table in markdown, with its title (what `backends.md` holds).

    Example:
        ```python
        from piserini_ray import backends_at_best, load_config, tune_bm25

        config = load_config()
        print(backends_at_best(config, tune_bm25(config)))
        ```
    """
    from piserini_ray.config import BACKENDS, BM25Params
    from piserini_ray.reports.writers import write_backends_table

    k1, b = grid.best.k1, grid.best.b
    retrieval = config.retrieval.model_copy(update={"bm25": BM25Params(k1=k1, b=b)})
    config = config.model_copy(update={"retrieval": retrieval})
    scored = _floor(config, list(BACKENDS), log or stderr_log)
    from piserini_ray.retrieval.encoder import encoder_label

    title = (
        f"No-LLM floor of every backend at the best BM25 (k1={k1:g} b={b:g}), depth "
        f"{retrieval.depth}, {scored.queries} queries; dense: {encoder_label(retrieval.dense)}"
    )
    table = "\n".join([title, "", scored.table])
    write_backends_table(table, grid.folder)
    return table


@dataclass
class RetrievalEval:
    """What `retrieval_eval` scored and wrote.

    Args:
        results: each backend's rankings and scores (recall@k, nDCG@10, MAP).
        queries: the slice's queries, ranked by their raw question.
        table: the backends side by side, in markdown.
        files: each backend's `run.<backend>.trec` and `retrieval_eval.json` when an `out`
            folder was given, else none.

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import load_config, retrieval_eval

        print(retrieval_eval(load_config(), ["bm25"]).table)
        ```
    """

    results: list[BackendScores]
    queries: int
    table: str
    files: list[Path] = field(default_factory=list)


def retrieval_eval(
    config: RunConfig,
    backends: Sequence[str] | None = None,
    *,
    out: str | Path | None = None,
    log: Log | None = None,
) -> RetrievalEval:
    """The no-LLM floor: the slice's raw questions ranked by each backend at the configured
    depth, and their recall@k, nDCG@10 and MAP: what `piserini-ray retrieval-eval` does.

    Args:
        config: the run config: its benchmark, slice and `retrieval` settings.
        backends: the backends to rank with (default: every one: `bm25`, `dense`, `hybrid`,
            `rerank`); the dense index is built if one of them needs it.
        out: a folder for the rankings (TREC run files) and the scores; `None`: none written.
        log: where progress lines go (default: standard error).

    Returns:
        A `RetrievalEval`: each backend's scores, the table and the files written.

    Example:
        ```python
        from piserini_ray import load_config, retrieval_eval

        print(retrieval_eval(load_config(), ["bm25"], out="runs/floor").table)
        ```
    """
    from piserini_ray.config import BACKENDS

    result = _floor(config, list(backends) if backends else list(BACKENDS), log or stderr_log)
    if out is not None:
        from piserini_ray.reports.writers import write_retrieval_eval

        result.files = write_retrieval_eval(result.results, config.retrieval, Path(out))
    return result


def _floor(config: RunConfig, backends: list[str], log: Log) -> RetrievalEval:
    """The slice's raw questions ranked by `backends` over the config's index (the dense one
    built when a backend needs it) and scored."""
    from piserini_ray.analysis.bm25_grid import evaluate_backends
    from piserini_ray.data import load_benchmark
    from piserini_ray.pipeline import index_for
    from piserini_ray.reports.bm25_grid import backends_table

    benchmark = load_benchmark(config.benchmark)
    index = index_for(config, benchmark, log, dense=any(b != "bm25" for b in backends))
    queries = benchmark.select(**config.slice.model_dump())
    results = evaluate_backends(index, config.retrieval, queries, benchmark, backends)
    return RetrievalEval(results, len(queries), "\n".join(backends_table(results)))
