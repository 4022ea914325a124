"""Running: load a config, run (or resume) one run or a sweep, check the models, estimate a slice,
judge and report."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from piserini_ray.api._common import run_paths, stderr_log
from piserini_ray.config import ModelConfig, RunConfig
from piserini_ray.config import load_config as _load_config
from piserini_ray.errors import ConfigError

if TYPE_CHECKING:
    from piserini_ray.analysis.estimate import Estimate
    from piserini_ray.engines.contract import Log, RunSummary
    from piserini_ray.reports.report import Report


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
        log or stderr_log,
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
    say = log or stderr_log
    say(f"sweep of {len(runs)} runs: " + ", ".join(str(d) for _, d in runs))
    return pipeline.run_and_report(
        list(runs),
        pipeline.make_engine(engine, concurrency, release_ray=True),
        say,
        on_summary or (lambda _summary: None),
        reference,
        decide=decide,
    )


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

    runs = [(manifest_config(d), d) for d in run_paths(run_dirs)]
    return pipeline.report_runs(
        runs,
        log or stderr_log,
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

    runs = [(manifest_config(d), d) for d in run_paths(run_dirs)]
    return pipeline.report_runs(runs, log or stderr_log, out=Path(out) if out is not None else None)


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

    pipeline.check_models([config], log or stderr_log, include_offline=True)


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
    from piserini_ray.analysis.estimate import describe, pilot_ids, project
    from piserini_ray.data import load_benchmark
    from piserini_ray.metrics.cost import pricing_for
    from piserini_ray.reports.writers import write_estimate
    from piserini_ray.store import RunStore

    say = log or stderr_log
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
