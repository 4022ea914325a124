"""Finishing runs: judging what is not judged (through the engine), the reduce step (`summary.json`
from records and verdicts) and the reports of one run, its epochs, or several side by side.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from piserini_ray.config import ModelConfig, RunConfig
from piserini_ray.data import load_benchmark
from piserini_ray.engines.contract import Engine, Log
from piserini_ray.metrics.cost import pricing_for
from piserini_ray.monitor.board import final_status
from piserini_ray.pipeline._preparing import closing, epoch_dir, make_engine, with_epochs
from piserini_ray.pipeline._reading import (
    answered_records,
    compare,
    decision_of,
    read_verdicts,
    run_record_facts,
)
from piserini_ray.preflight import preflight_judge
from piserini_ray.records import QueryRecord
from piserini_ray.reports.report import Report
from piserini_ray.store import RunStore, write_report_file

if TYPE_CHECKING:
    from piserini_ray.reports.epochs import EpochsReport
    from piserini_ray.reports.run_metrics import RunMetrics


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
        records = answered_records(store, wanted)
        judges = {m.name: m for m in (*config.judge_panel(), *extra_judges)}
        for model in judges.values():  # the run's own judge (or panel) first, each once
            judged = config.judged_by(model)
            preflight_judge(judged)
            engine.judge(judged, store, records, wanted, log)
    return records


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
        with closing(make_engine("ray" if on_ray else "local")) as engine:
            judge_run(config, run_dir, engine, log, extra_judges)
    return reduce(config, run_dir, log)


def reduce(config: RunConfig, run_dir: Path, log: Log) -> RunMetrics:
    """Reduce a run from what is judged already and write `summary.json`, `report.md`, the
    plots and `report.html` into its directory; return the metrics. The report shows each pair
    of judges' agreement (every judge with verdicts in the run counts)."""
    from piserini_ray.reports import write_run_reports
    from piserini_ray.reports.agreement import judge_agreement
    from piserini_ray.reports.run_metrics import aggregate, judge_calibration
    from piserini_ray.reports.viewer import ViewerWriter

    benchmark = load_benchmark(config.benchmark)
    wanted = {q.query_id: q for q in benchmark.select(**config.slice.model_dump())}
    primary = config.judge_model()
    with RunStore(run_dir, config, log=log) as store:
        judgements, verdicts = read_verdicts(config, store)
        others = [m for m in verdicts if m != primary.name]
        panel = None
        if config.judge.models:
            from piserini_ray.reports.panel import panel_summary

            names = [m.name for m in config.judge.models]
            panel = panel_summary(verdicts, names, config.judge.panel_ties)
        records = answered_records(store, wanted)
        answers = {r.query_id: r.exact_answer for r in records}
        queries = [q for q in wanted.values() if q.query_id in answers]
        agreement = [
            judge_agreement(first, second, verdicts, queries, answers, config.judge.seed)
            for first, second in itertools.combinations([primary.name, *others], 2)
        ]
        viewer = ViewerWriter(store.run_dir, benchmark, judgements)
        facts = run_record_facts(store, benchmark, wanted, judgements, viewer)
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
            "decision": decision_of(metrics, run_dir, len(wanted), len(facts)),
        }
    )
    write_run_reports(metrics, Path(run_dir), viewer=True)
    return metrics


def report_epochs(config: RunConfig, run_dir: Path, log: Log) -> EpochsReport:
    """Accuracy over the epochs of the run in `run_dir` (`metrics/epochs.py`), from each
    epoch's verdicts (nothing is called), written to `epochs.json` and `epochs.md` there."""
    from piserini_ray.metrics.epochs import epoch_stats
    from piserini_ray.reports.epochs import EpochsReport, epoch_outcomes, write_epochs_report

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
            verdicts = read_verdicts(config, store)[0]
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
    from piserini_ray.reports import markdown_report, write_html_report

    # An epoch not started yet (epochs raised, not resumed) has nothing to judge or report.
    every = [(c, d) for c, d in with_epochs(runs) if c.run.epoch == 1 or d.exists()]
    if engine is not None:
        with closing(engine):
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
            from piserini_ray.reports.comparison import paired_markdown

            others = [Path(d) for _, d in runs if Path(d).absolute() != reference.absolute()]
            report.paired = paired_markdown(compare(reference, others, log))
            table += "\n" + report.paired
        write_report_file(folder / "report.md", table)
        report.combined = [folder / "report.md", write_html_report(metrics, folder, pareto=True)]
    return report
