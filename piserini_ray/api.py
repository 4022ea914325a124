"""The public API: load a run config, run it, judge, report and analyse runs, tune and
evaluate retrieval, ask one query, watch and stop runs, from Python.

These functions do what the commands of the same name do (`piserini-ray run`, `judge`,
`report`, `compare`, `tune-bm25`, ...): the command line is a client of this module and
reaches the engines, the pipeline and the reports only through it. `piserini_ray/__init__.py`
exports them lazily, so `import piserini_ray` stays cheap; this module loads Ray, the JVM,
litellm and the reports' libraries only when a call needs them (what the results hold is
typed here, for the type checker only).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from piserini_ray.config import ModelConfig, RunConfig
from piserini_ray.config import load_config as _load_config
from piserini_ray.errors import ConfigError

if TYPE_CHECKING:
    from piserini_ray.data import Benchmark, Query
    from piserini_ray.engine_contract import Log, RunSummary
    from piserini_ray.estimate import Estimate
    from piserini_ray.importer import ImportSummary
    from piserini_ray.importers.files import Format
    from piserini_ray.metrics.cost import PriceDifference
    from piserini_ray.monitor.status import StatusView
    from piserini_ray.monitor.web import Watch
    from piserini_ray.pipeline import Report
    from piserini_ray.records import QueryRecord
    from piserini_ray.report.leaderboard import Leaderboard
    from piserini_ray.report.paired import PairedComparison, PilotPower
    from piserini_ray.retrieval.backends import SearchBackend
    from piserini_ray.retrieval.index import IndexInfo
    from piserini_ray.tools import ToolSession
    from piserini_ray.tuning import BackendScores, CellResult

__all__ = [
    "BM25Grid",
    "BuiltIndex",
    "ImportReport",
    "LeaderboardReport",
    "PairedReport",
    "PilotEstimate",
    "PowerReport",
    "PricingCheck",
    "RetrievalEval",
    "ask",
    "backends_at_best",
    "build_dense_index",
    "build_index",
    "check_models",
    "compare",
    "estimate",
    "evidence_ranks",
    "export",
    "import_runs",
    "judge",
    "leaderboard",
    "load_config",
    "power",
    "pricing_check",
    "read_records",
    "report",
    "request_stop",
    "retrieval_eval",
    "run",
    "run_status",
    "run_sweep",
    "serve_offline",
    "tool_session",
    "tune_bm25",
    "wait_until_stopped",
    "watch",
]


def _stderr(message: str) -> None:
    print(f"[piserini-ray] {message}", file=sys.stderr, flush=True)


def load_config(
    path: str | Path | None = None, overrides: Mapping[str, object] | None = None
) -> RunConfig:
    """Read and validate a run config.

    Args:
        path: a YAML run config; `None` reads the embedded default (the bundled sample benchmark,
            the offline heuristic model and judge: it runs with no key and no network).
        overrides: dotted keys set after the file is read, e.g.
            `{"slice.sample": 3, "retrieval.index_root": "/tmp/indexes"}`.

    Returns:
        The validated `RunConfig`.

    Raises:
        ConfigError: the file, or a key in it, is invalid; the message names it and the fix.

    Example:
        ```python
        from piserini_ray import load_config

        config = load_config(overrides={"slice.sample": 3})
        assert config.model.name.startswith("offline/")
        ```
    """
    return _load_config(Path(path) if path is not None else None, dict(overrides or {}))


def run(
    config: RunConfig,
    run_dir: str | Path | None = None,
    engine: Literal["ray", "local"] = "ray",
    *,
    concurrency: int = 4,
    retry_failed: bool = False,
    log: Log | None = None,
    on_summary: Callable[[RunSummary], None] | None = None,
    on_report: Callable[[Report], None] | None = None,
) -> Path:
    """Run (or resume) an evaluation, judge its answers and write its reports: what
    `piserini-ray run` does.

    Everything that can be checked is checked before the first paid token (pricing, key
    variables, data files, qrels, one tiny request per hosted model). A run directory that
    holds records of the same config resumes: only queries without a record run, and failed
    queries that were not their own fault run again. The cost cap (`pricing.max_cost_usd`)
    and the run's budgets hold as on the command line.

    Args:
        config: the run config (`load_config`).
        run_dir: where the run's files go; `None`: `<runs root>/<benchmark>-<model>-<hash>`,
            so the same config finds the same directory (and resumes).
        engine: `"ray"`: searcher replicas on a Ray cluster (`runtime.address`, else a local
            Ray); `"local"`: this process only, `concurrency` queries at once.
        concurrency: queries at once with the local engine.
        retry_failed: run every failed query again, not only those that failed through no
            fault of their own.
        log: where progress lines go (default: standard error).
        on_summary: called with each run's `RunSummary` once its queries ran, before judging
            (`RunSummary.exit_status()` is what the command line exits with).
        on_report: called with the `Report` once the run is judged and its reports written.

    Returns:
        The run directory (absolute): `records.jsonl`, the judgements, `manifest.json`,
        `summary.json`, `report.md` and `report.html` (see the record files' reference).

    Raises:
        PiseriniRayError: the run was refused before it started (a config, key, model,
            endpoint or data problem); the message names the input and the fix.

    Example:
        ```python
        from piserini_ray import load_config, run

        config = load_config(overrides={"slice.sample": 3})
        run_dir = run(config, engine="local")
        print((run_dir / "report.md").read_text())
        ```
    """
    from piserini_ray import pipeline

    directory = (
        Path(run_dir) if run_dir is not None else pipeline.default_run_dir(config)
    ).absolute()
    result, _status = pipeline.run_and_report(
        [(config, directory)],
        pipeline.make_engine(engine, concurrency, release_ray=True),
        log or _stderr,
        on_summary or (lambda _summary: None),
        retry_failed=retry_failed,
    )
    if on_report is not None:
        on_report(result)
    return directory


def run_sweep(
    path: str | Path,
    runs_root: str | Path | None = None,
    engine: Literal["ray", "local"] = "ray",
    *,
    concurrency: int = 4,
    epochs: int | None = None,
    extend: bool = False,
    log: Log | None = None,
    on_summary: Callable[[RunSummary], None] | None = None,
) -> tuple[Report, int]:
    """Run (or resume) every run of a sweep file together, judge them and write each run's
    reports and the combined one (with the paired comparison against the sweep's `reference`):
    what `piserini-ray sweep` does.

    With `stop_when_decided` in the sweep file, the runs take their queries in one shared
    seeded order and each stops once its comparison with the reference is decided by an
    anytime-valid test (`decision.json` in its directory says where and why).

    Args:
        path: the sweep file (`configs/sweep_offline.yaml`).
        runs_root: where the sweep's folder goes (default: each run's `runtime.runs_root`).
        engine: `"ray"` (default) or `"local"` (this process, `concurrency` queries at once
            per run).
        concurrency: queries at once per run with the local engine.
        epochs: run each query this many times (`run.epochs`).
        extend: decided runs go on past their decision, in the same order, to the end.
        log: where progress lines go (default: standard error).
        on_summary: called with each run's `RunSummary` once its queries ran.

    Returns:
        The `Report` (each run's metrics, the combined report's files) and the exit status
        the command line exits with (the worst of the runs').

    Raises:
        ConfigError: the sweep file is invalid (a reference that matches no run, an alpha
            outside (0, 0.5], runs that do not share a query set); nothing was run.

    Example:
        ```python
        from piserini_ray import run_sweep

        report, status = run_sweep("configs/sweep_offline.yaml", engine="local")
        print(report.paired)
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.sweep import expand_sweep, load_sweep, reference_run

    file = Path(path)
    runs = expand_sweep(file, Path(runs_root) if runs_root is not None else None)
    if epochs is not None:
        more = {"epochs": epochs}
        runs = [(c.model_copy(update={"run": c.run.model_copy(update=more)}), d) for c, d in runs]
    reference = reference_run(file, runs)  # a bad reference stops before any work
    settings = load_sweep(file).stop_when_decided
    decide = None
    if settings is not None and reference is not None:
        decide = pipeline.Decide(settings, reference.absolute(), extend)
    elif extend:
        raise ConfigError(
            f"sweep file {file}: --extend goes on past the decisions of `stop_when_decided`, "
            "which this sweep does not have"
        )
    say = log or _stderr
    say(f"sweep of {len(runs)} runs: " + ", ".join(str(d) for _, d in runs))
    return pipeline.run_and_report(
        list(runs),
        pipeline.make_engine(engine, concurrency, release_ray=True),
        say,
        on_summary or (lambda _summary: None),
        reference,
        decide=decide,
    )


def _paths(run_dirs: str | Path | Sequence[str | Path]) -> list[Path]:
    if isinstance(run_dirs, str | Path):
        return [Path(run_dirs)]
    return [Path(d) for d in run_dirs]


def judge(
    run_dirs: str | Path | Sequence[str | Path],
    *,
    judges: Sequence[str] = (),
    engine: Literal["ray", "local"] = "local",
    log: Log | None = None,
) -> Report:
    """Judge the answers of one or more runs that have no verdict yet, then write each run's
    reports: what `piserini-ray judge` does. Resumable: judged answers are not sent again.

    Args:
        run_dirs: a run directory, or several (each read with its own manifest's config).
        judges: more judge models (e.g. `"offline/lenient-judge"`): their verdicts go beside
            the run's own judge's, and the report shows the judges' agreement and kappa.
        engine: `"local"`: judge from this process; `"ray"`: under the cluster-wide limiters.
        log: where progress lines go (default: standard error).

    Returns:
        The `Report`: each run's `RunMetrics` (also written to its `summary.json`), the
        markdown table, and the combined report's files when several runs were given.

    Example:
        ```python
        from piserini_ray import judge

        report = judge("runs/sample-offline_heuristic-1a2b3c4d")
        print(report.metrics[0].accuracy)
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.store import manifest_config

    runs = [(manifest_config(d), d) for d in _paths(run_dirs)]
    return pipeline.report_runs(
        runs,
        log or _stderr,
        pipeline.make_engine(engine, release_ray=True),
        extra_judges=[ModelConfig(name=name) for name in judges],
    )


def report(
    run_dirs: str | Path | Sequence[str | Path],
    out: str | Path | None = None,
    *,
    log: Log | None = None,
) -> Report:
    """Report runs side by side from the verdicts they hold (no model is called): what
    `piserini-ray report` does.

    Args:
        run_dirs: a run directory, or several.
        out: a folder for the combined report (`report.md`, `report.html`, plots); `None`:
            beside the first run when there are several runs, else none.
        log: where progress lines go (default: standard error).

    Returns:
        The `Report`: each run's `RunMetrics` (each run's own `summary.json`, `report.md` and
        `report.html` are written again), the markdown table, the combined report's files.

    Example:
        ```python
        from piserini_ray import report

        result = report(["runs/a", "runs/b"], out="runs/a-vs-b")
        print(result.table)
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.store import manifest_config

    runs = [(manifest_config(d), d) for d in _paths(run_dirs)]
    return pipeline.report_runs(runs, log or _stderr, out=Path(out) if out is not None else None)


def check_models(config: RunConfig, *, log: Log | None = None) -> None:
    """Send one tiny request to each model of a run, offline models included, and run
    nothing: what `piserini-ray run --check` does, to learn that a key, a model name or an
    endpoint is wrong before a run is started.

    Args:
        config: the run config (`load_config`): its agent and judge models are checked.
        log: where progress lines go (default: standard error).

    Returns:
        Nothing: every model answered.

    Raises:
        PiseriniRayError: a model did not answer; the message names it and why.

    Example:
        ```python
        from piserini_ray import check_models, load_config

        check_models(load_config())  # the offline models answer with no key
        ```
    """
    from piserini_ray import pipeline

    pipeline.check_models([config], log or _stderr, include_offline=True)


@dataclass
class PilotEstimate:
    """What `estimate` projected, and where it wrote it (`estimate.json` in the run directory).

    Args:
        estimate: the whole slice's cost, tokens, model calls and makespan, projected.
        text: the projection in words (what `piserini-ray estimate` prints).
        file: the `estimate.json` written.
        pilot: the pilot's queries, run now.
        queries: the slice's queries (the full run runs `queries - pilot` more).

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import estimate, load_config

        print(estimate(load_config(), engine="local", pilot=3).text)
        ```
    """

    estimate: Estimate
    text: str
    file: Path
    pilot: int
    queries: int


def estimate(
    config: RunConfig,
    run_dir: str | Path | None = None,
    engine: Literal["ray", "local"] = "ray",
    *,
    pilot: int = 10,
    concurrency: int = 4,
    log: Log | None = None,
) -> PilotEstimate:
    """Run a seeded pilot of the slice in the run's own directory and project the whole slice's
    cost, tokens and makespan: what `piserini-ray estimate` does. The pilot is paid once: the
    full run (`run` with the same config and directory) resumes after it.

    Args:
        config: the run config (`load_config`).
        run_dir: the run directory (default: the one `run` would use for this config).
        engine: `"ray"` (default) or `"local"` (this process, `concurrency` queries at once).
        pilot: how many queries of the slice the pilot runs, drawn with `slice.seed`.
        concurrency: queries at once with the local engine (also the makespan's concurrency).
        log: where progress lines go (default: standard error).

    Returns:
        A `PilotEstimate`: the projection, in figures and in words, and its file.

    Raises:
        PiseriniRayError: the pilot was refused before it started (as `run`).

    Example:
        ```python
        from piserini_ray import estimate, load_config

        result = estimate(load_config(), engine="local", pilot=3)
        print(result.estimate.cost_usd, result.file)
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.data import load_benchmark
    from piserini_ray.estimate import describe, pilot_ids, project
    from piserini_ray.metrics.cost import pricing_for
    from piserini_ray.report.writers import write_estimate
    from piserini_ray.store import RunStore

    say = log or _stderr
    benchmark = load_benchmark(config.benchmark)
    ids = [q.query_id for q in benchmark.select(**config.slice.model_dump())]
    chosen = set(pilot_ids(ids, pilot, config.slice.seed))
    runner = pipeline.make_engine(engine, concurrency, release_ray=True)
    directory = Path(run_dir) if run_dir is not None else None
    try:
        (summary,) = pipeline.execute([(config, directory)], runner, say, only=chosen)
    finally:
        runner.close()
    with RunStore(Path(summary.run_dir), config) as store:
        records = [r for r in store.iter_records(trajectory=False) if r.query_id in chosen]
    runtime = config.runtime
    at_once = runtime.replicas * runtime.max_concurrency
    if engine == "local":
        at_once = concurrency
    price = pricing_for(config).model_price(config.model)
    projected = project(records, len(ids), config, price, at_once)
    text = describe(projected)
    path = write_estimate(projected, Path(summary.run_dir))
    return PilotEstimate(projected, text, path, len(chosen), len(ids))


@dataclass
class PairedReport:
    """What `compare` found and wrote.

    Args:
        comparisons: each run against the reference, over the queries they share.
        table: the comparisons in markdown (what `piserini-ray compare` prints).
        files: `compare.md` and `compare.json` when an `out` folder was given, else none.

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import compare

        print(compare("runs/a", ["runs/b"]).table)
        ```
    """

    comparisons: list[PairedComparison]
    table: str
    files: list[Path] = field(default_factory=list)


def compare(
    reference: str | Path,
    others: Sequence[str | Path],
    *,
    seed: int = 0,
    out: str | Path | None = None,
    log: Log | None = None,
) -> PairedReport:
    """Paired comparisons of runs against a reference run, over the queries they share, from
    each run's own judge's verdicts (no model is called): what `piserini-ray compare` does.

    Args:
        reference: the reference run's directory.
        others: the directories of the runs compared with it.
        seed: the bootstrap's seed (the intervals are reproducible).
        out: a folder for `compare.md` and `compare.json`; `None`: nothing is written.
        log: where progress lines go (default: standard error).

    Returns:
        A `PairedReport`: the comparisons, their markdown table and the files written.

    Example:
        ```python
        from piserini_ray import compare

        result = compare("runs/a", ["runs/b", "runs/c"], out="runs/a-vs-others")
        print(result.table)
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.report.paired import paired_markdown

    comparisons = pipeline.compare(Path(reference), [Path(d) for d in others], log or _stderr, seed)
    result = PairedReport(comparisons, paired_markdown(comparisons))
    if out is not None:
        from piserini_ray.report.writers import write_comparison

        result.files = list(write_comparison(comparisons, result.table, Path(out)))
    return result


@dataclass
class LeaderboardReport:
    """What `leaderboard` ranked and wrote.

    Args:
        board: the rows, best first, each tested against the top row.
        table: the leaderboard in markdown (what `piserini-ray leaderboard` prints).
        files: the files written when an `out` folder was given, else none.

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import leaderboard

        print(leaderboard(["runs/a", "runs/b"]).table)
        ```
    """

    board: Leaderboard
    table: str
    files: list[Path] = field(default_factory=list)


def leaderboard(
    run_dirs: Sequence[str | Path],
    *,
    seed: int = 0,
    out: str | Path | None = None,
    log: Log | None = None,
) -> LeaderboardReport:
    """Rank runs of one benchmark (ours and imported), each tested against the top one by
    the exact McNemar test, Holm-corrected, from what is judged already (no model is called):
    what `piserini-ray leaderboard` does.

    Args:
        run_dirs: the runs' directories.
        seed: the bootstrap's seed (the intervals are reproducible).
        out: a folder for the leaderboard's markdown, HTML and JSON; `None`: nothing written.
        log: where progress lines go (default: standard error).

    Returns:
        A `LeaderboardReport`: the rows, their markdown table and the files written.

    Raises:
        ConfigError: the runs cannot be ranked together (e.g. not of one benchmark).

    Example:
        ```python
        from piserini_ray import leaderboard

        result = leaderboard(["runs/a", "runs/b"], out="runs/board")
        print(result.board.rows[0].model)
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.report import leaderboard as board

    say = log or _stderr
    try:
        ranked = board.leaderboard([pipeline.run_figures(Path(d), say) for d in run_dirs], seed)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    result = LeaderboardReport(ranked, board.leaderboard_markdown(ranked))
    if out is not None:
        result.files = board.write_leaderboard(ranked, Path(out))
    return result


@dataclass
class PowerReport:
    """What `power` sized.

    Args:
        pilot: the pilot's accuracy, the discordance assumed and the queries each effect needs.
        table: the sizing in markdown (what `piserini-ray power` prints).

    Returns:
        A plain dataclass: read its attributes (`pilot.figures.discordance` is `None` when
        nothing could be sized: pass a `discordance`).

    Example:
        ```python
        from piserini_ray import power

        print(power("runs/pilot").table)
        ```
    """

    pilot: PilotPower
    table: str


def power(
    run_dir: str | Path,
    *,
    effects: Sequence[float] = (),
    discordance: float | None = None,
    log: Log | None = None,
) -> PowerReport:
    """Size a run from one pilot run: the queries each assumed accuracy difference needs to be
    detected (exact McNemar, 80 % power): what `piserini-ray power` does.

    Args:
        run_dir: the pilot run's directory (judged).
        effects: accuracy differences to detect, fractions in (0, 1] (0.02 = 2 points);
            empty: 1, 2 and 5 points.
        discordance: the fraction of queries two runs disagree on, when known; `None`: assumed
            from the pilot's accuracy (the output says so).
        log: where progress lines go (default: standard error).

    Returns:
        A `PowerReport`: the figures and their markdown.

    Raises:
        ConfigError: an effect or the discordance is outside (0, 1].

    Example:
        ```python
        from piserini_ray import power

        print(power("runs/pilot", effects=[0.02, 0.05]).table)
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.report.paired import EFFECTS, pilot_power, power_markdown

    sizes = list(effects) or list(EFFECTS)
    if any(not 0 < e <= 1 for e in sizes) or not (discordance is None or 0 < discordance <= 1):
        raise ConfigError("--effect and --discordance are fractions in (0, 1]: 0.02 = 2 points")
    pilot = pilot_power(pipeline.run_facts(Path(run_dir), log or _stderr), sizes, discordance)
    return PowerReport(pilot, power_markdown(pilot))


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

    path = ensure_index(load_corpus(config.benchmark), config.retrieval, log or _stderr)
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
    from piserini_ray.runtime.ray_env import start_ray

    say = log or _stderr
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

    backend = _searcher(config, load_benchmark(config.benchmark), log or _stderr)
    return ToolSession(backend, config.tools, Path(spill_dir) if spill_dir is not None else None)


def _searcher(config: RunConfig, benchmark: Benchmark, log: Log) -> SearchBackend:
    """The configured backend over the config's index (`pipeline.index_for`: built if
    missing, its qrels checked)."""
    from piserini_ray.pipeline import index_for
    from piserini_ray.retrieval.backends import open_backend

    return open_backend(index_for(config, benchmark, log), config.retrieval)


def read_records(run_dir: str | Path) -> list[QueryRecord]:
    """The records a run holds (`records.jsonl`, as its store reads it), under its own
    manifest's config.

    Args:
        run_dir: the run directory.

    Returns:
        Each recorded query's `QueryRecord`.

    Example:
        ```python
        from piserini_ray import read_records

        print([r.status for r in read_records("runs/sample-offline_heuristic-1a2b3c4d")])
        ```
    """
    from piserini_ray.store import RunStore, manifest_config

    with RunStore(Path(run_dir), manifest_config(Path(run_dir))) as store:
        return list(store.records())


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
    from piserini_ray.local_run import local_client
    from piserini_ray.tools import ToolSession, tool_schemas

    if isinstance(query, str):
        query = Query(query_id="ask", query=query, answer="")
    benchmark = benchmark if benchmark is not None else load_benchmark(config.benchmark)
    searcher = _searcher(config, benchmark, log or _stderr)
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
        from piserini_ray.report.writers import write_record

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
    from piserini_ray.report.tuning import write_grid_outputs
    from piserini_ray.runtime import ensure_ray
    from piserini_ray.tuning import DEFAULT_B, DEFAULT_K1, OBJECTIVES

    if objective not in OBJECTIVES:
        raise ConfigError(f"--objective must be one of {', '.join(OBJECTIVES)}")
    say = log or _stderr
    ensure_ray(config, say)
    from piserini_ray.runtime.tuning import tune_on_ray

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
    from piserini_ray.report.writers import write_backends_table

    k1, b = grid.best.k1, grid.best.b
    retrieval = config.retrieval.model_copy(update={"bm25": BM25Params(k1=k1, b=b)})
    config = config.model_copy(update={"retrieval": retrieval})
    scored = _floor(config, list(BACKENDS), log or _stderr)
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

    result = _floor(config, list(backends) if backends else list(BACKENDS), log or _stderr)
    if out is not None:
        from piserini_ray.report.writers import write_retrieval_eval

        result.files = write_retrieval_eval(result.results, config.retrieval, Path(out))
    return result


def _floor(config: RunConfig, backends: list[str], log: Log) -> RetrievalEval:
    """The slice's raw questions ranked by `backends` over the config's index (the dense one
    built when a backend needs it) and scored."""
    from piserini_ray.data import load_benchmark
    from piserini_ray.pipeline import index_for
    from piserini_ray.report.tuning import backends_table
    from piserini_ray.tuning import evaluate_backends

    benchmark = load_benchmark(config.benchmark)
    index = index_for(config, benchmark, log, dense=any(b != "bm25" for b in backends))
    queries = benchmark.select(**config.slice.model_dump())
    results = evaluate_backends(index, config.retrieval, queries, benchmark, backends)
    return RetrievalEval(results, len(queries), "\n".join(backends_table(results)))


def export(
    run_dir: str | Path, format: str, out: str | Path, *, log: Log | None = None
) -> list[Path]:
    """Write a run in another harness's format: what `piserini-ray export` does.

    Args:
        run_dir: the run directory (read with its own manifest's config).
        format: `browsecomp-plus`, `pi-serini` or `trec`.
        out: the folder the files go to.
        log: where progress lines go (default: standard error).

    Returns:
        The files written.

    Raises:
        ConfigError: the format is not one of those above.

    Example:
        ```python
        from piserini_ray import export

        print(export("runs/sample-offline_heuristic-1a2b3c4d", "trec", "runs/trec"))
        ```
    """
    from piserini_ray.exports import export_run

    return export_run(Path(run_dir), format, Path(out), log or _stderr)


@dataclass
class ImportReport:
    """What `import_runs` imported, and what the format could not say.

    Args:
        summary: the import's counts, statuses, notes, settings and cost as the files state
            them (`ImportSummary`).
        unavailable: each part the format lacks, with what is n/a in the report for it (never
            0), in `summary.unavailable`'s order.

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import import_runs, load_config

        result = import_runs("peer-runs", "pi-serini", load_config())
        print(result.summary.imported, list(result.unavailable))
        ```
    """

    summary: ImportSummary
    unavailable: dict[str, str]


def import_runs(
    folder: str | Path,
    format: Format,
    config: RunConfig,
    run_dir: str | Path | None = None,
    *,
    log: Log | None = None,
) -> ImportReport:
    """Import another harness's run files as a run directory over the config's benchmark, to
    judge and report as any run: what `piserini-ray import` does. Queries the directory holds
    already are skipped.

    Args:
        folder: a folder of run files (or one file).
        format: the files' format (`browsecomp-plus` or `pi-serini`).
        config: the run config whose benchmark and slice the files answer.
        run_dir: the run directory (default: the one `run` would use for this config).
        log: where progress lines go (default: standard error).

    Returns:
        An `ImportReport`: what was imported and what the format lacks.

    Raises:
        ConfigError: an unknown format, or a config with several epochs.

    Example:
        ```python
        from piserini_ray import import_runs, judge, load_config

        result = import_runs("peer-runs", "pi-serini", load_config())
        judge(result.summary.run_dir)
        ```
    """
    from piserini_ray.importer import MEANING
    from piserini_ray.importer import import_runs as import_files

    directory = Path(run_dir) if run_dir is not None else None
    summary = import_files(Path(folder), format, config, directory, log or _stderr)
    return ImportReport(summary, {part: MEANING[part] for part in summary.unavailable})


def evidence_ranks(run_dir: str | Path, *, log: Log | None = None) -> Path:
    """Where a run's evidence documents sat in its rankings (best rank, previewed, opened),
    written beside the run's reports: what `piserini-ray evidence-ranks` does.

    Args:
        run_dir: the run directory (read with its own manifest's config).
        log: where progress lines go (default: standard error).

    Returns:
        The markdown summary written (`evidence_ranks.md`; `evidence_ranks.csv` and
        `evidence_ranks.png` beside it).

    Example:
        ```python
        from piserini_ray import evidence_ranks

        print(evidence_ranks("runs/sample-offline_heuristic-1a2b3c4d").read_text())
        ```
    """
    from piserini_ray.data import load_benchmark
    from piserini_ray.report.evidence import evidence_ranks as ranks
    from piserini_ray.report.evidence import write_evidence_ranks
    from piserini_ray.store import RunStore, manifest_config

    config = manifest_config(Path(run_dir))
    benchmark = load_benchmark(config.benchmark)
    with RunStore(Path(run_dir), config, log=log or _stderr) as store:
        rows = ranks(store.records(), store.rankings(), benchmark)
    return write_evidence_ranks(rows, Path(run_dir))


@dataclass
class PricingCheck:
    """What `pricing_check` compared.

    Args:
        table: the pricing table's file.
        differences: each model and price where the table and litellm disagree (USD per
            million tokens; `field == "model"`: litellm does not know the model).

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import pricing_check

        print(len(pricing_check().differences))
        ```
    """

    table: str
    differences: list[PriceDifference]


def pricing_check(table: str | Path | None = None) -> PricingCheck:
    """The pricing table against litellm's bundled price map: what `piserini-ray pricing
    check` does (in a run the table wins; this says where litellm disagrees).

    Args:
        table: a pricing table (default: the package's own, `configs/pricing.yaml`).

    Returns:
        A `PricingCheck`: the table's file and every difference.

    Example:
        ```python
        from piserini_ray import pricing_check

        for d in pricing_check().differences:
            print(d.model, d.field, d.ours, d.litellm)
        ```
    """
    from piserini_ray.metrics.cost import load_pricing, price_differences

    pricing = load_pricing(Path(table) if table is not None else None)
    return PricingCheck(pricing.path, price_differences(pricing))


def serve_offline(config: RunConfig, port: int | None = None) -> None:
    """Serve the offline models on 127.0.0.1 (an OpenAI-compatible endpoint) until Ctrl-C or
    SIGTERM, printing the base URL: what `piserini-ray offline-provider` does.

    Args:
        config: the run config: its `offline` settings (models, aliases, port).
        port: the port (default: `offline.port`; 0: any free port).

    Returns:
        Nothing, once interrupted.

    Example:
        ```python
        from piserini_ray import load_config, serve_offline

        serve_offline(load_config(), port=8000)
        ```
    """
    from piserini_ray.offline import serve

    serve(config.offline, host="127.0.0.1", port=port)


def run_status(path: str | Path) -> list[tuple[Path, StatusView | None]]:
    """Each run's live status under a path, from the status file its driver keeps: what
    `piserini-ray status` shows. Read from any process or host that sees the files.

    Args:
        path: a run directory, a sweep's folder or a runs root.

    Returns:
        Each run directory under `path` with its `StatusView` (`None`: no status yet):
        `.state` (`"stale"` when its driver stopped writing: it died or was killed),
        `.status` (counts, cost, accuracy so far, ETA, replicas) and `.age_seconds`.

    Raises:
        PiseriniRayError: there is no run under `path`.

    Example:
        ```python
        from piserini_ray import run_status

        for run_dir, seen in run_status("runs"):
            print(run_dir, seen.state if seen else "no status yet")
        ```
    """
    from piserini_ray.monitor.status import read_status, run_dirs_under

    return [(run_dir, read_status(run_dir)) for run_dir in run_dirs_under(Path(path))]


def watch(path: str | Path, host: str = "127.0.0.1", port: int = 8765) -> Watch:
    """Serve a live web view of the runs under a path on a thread of its own: what
    `piserini-ray watch` does. Off loopback, every request needs the token in its URL.

    Args:
        path: a run directory, a sweep's folder or a runs root.
        host: the address to listen on (default loopback).
        port: the port (0: any free port).

    Returns:
        A `Watch`: its `url` (with the token), its `thread`, and `close()` to stop it.

    Raises:
        PiseriniRayError: no run under `path`, or the port is taken.

    Example:
        ```python
        from piserini_ray import watch

        view = watch("runs", port=0)
        print(view.url)
        view.close()
        ```
    """
    from piserini_ray.monitor.web import start_watch

    return start_watch(Path(path), host, port)


def request_stop(run_dir: str | Path) -> Path:
    """Ask a run's driver to stop that run cleanly (the other runs of its sweep go on), from
    any process: what `piserini-ray stop` does first. The run resumes when run again.

    Args:
        run_dir: the run directory.

    Returns:
        The request's file (the driver stops the run within a second of seeing it).

    Raises:
        PiseriniRayError: the run is not running.

    Example:
        ```python
        from piserini_ray import request_stop, wait_until_stopped

        request_stop("runs/sweep/a")
        print(wait_until_stopped("runs/sweep/a"))
        ```
    """
    from piserini_ray.monitor.status import request_stop as request

    return request(Path(run_dir))


#: How often `wait_until_stopped` looks whether the run has stopped.
STOP_POLL_SECONDS = 0.5


def wait_until_stopped(run_dir: str | Path, timeout: float = 120.0) -> StatusView | None:
    """Wait until a run asked to stop has stopped (or is judging: its queries are done and
    its answers are left to be judged): what `piserini-ray stop` does next.

    Args:
        run_dir: the run directory.
        timeout: seconds to wait at most.

    Returns:
        The run's `StatusView` once it stopped; `None` when its status still said running at
        the timeout.

    Example:
        ```python
        from piserini_ray import request_stop, wait_until_stopped

        request_stop("runs/sweep/a")
        seen = wait_until_stopped("runs/sweep/a", timeout=30)
        print("still running" if seen is None else seen.state)
        ```
    """
    import time

    from piserini_ray.monitor.status import LIVE_STATES, read_status

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = read_status(Path(run_dir))
        if seen is not None and (seen.stale or seen.status.state not in LIVE_STATES):
            return seen
        if seen is not None and seen.status.state == "judging":
            return seen  # its queries are done: judging the answers is left to finish
        time.sleep(STOP_POLL_SECONDS)
    return None
