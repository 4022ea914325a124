"""Running, resuming, sweeping, estimating, judging and reporting runs: each command calls
the API (`piserini_ray.api`) and prints."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from piserini_ray import api
from piserini_ray.cli.common import config_from, log, with_epochs
from piserini_ray.config import RunConfig
from piserini_ray.store import manifest_config

if TYPE_CHECKING:
    from piserini_ray import Report, RunSummary


def cmd_run(args: argparse.Namespace) -> int:
    """The main job: the agent over the configured slice (default: the embedded sample with the
    offline heuristic model), records in a run directory, then the summary."""
    config = config_from(args)
    if args.check:
        api.check_models(config, log=log)
        return 0
    return _run(config, args.run_dir, args)


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue a run from its own manifest: only queries without a record run."""
    config = with_epochs(manifest_config(args.run_dir), args.epochs)
    return _run(config, args.run_dir, args, retry_failed=args.retry_failed)


def _run(
    config: RunConfig, run_dir: Path | None, args: argparse.Namespace, retry_failed: bool = False
) -> int:
    """`api.run`, printing each summary and the report; the exit status: 0, 1 when queries
    failed, 2 when the run was refused (a key, a model, an endpoint)."""
    statuses: list[int] = []

    def summary(s: RunSummary) -> None:
        statuses.append(s.exit_status())
        print_summary(s)

    api.run(
        config,
        run_dir,
        args.engine,
        concurrency=args.concurrency,
        retry_failed=retry_failed,
        log=log,
        on_summary=summary,
        on_report=print_report,
    )
    return max(statuses, default=0)


def cmd_judge(args: argparse.Namespace) -> int:
    """Judge a run's answers not judged yet, then write its report. `--judge MODEL` adds that
    judge's verdicts beside the run's own judge's; the report shows their agreement."""
    report = api.judge(args.run_dirs, judges=args.judge or (), engine=args.engine, log=log)
    print_report(report)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Report runs side by side from what is judged already (no model is called)."""
    print_report(api.report(args.run_dirs, out=args.out, log=log))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    """Run a seeded pilot of the slice in the run's own directory (paid once: the full run
    resumes after it) and project the whole slice's cost, tokens and makespan."""
    args.config = args.config_file or args.config
    result = api.estimate(
        config_from(args),
        args.run_dir,
        args.engine,
        pilot=args.pilot,
        concurrency=args.concurrency,
        log=log,
    )
    print(result.text)
    rest = result.queries - result.pilot
    print(f"wrote {result.file}; `piserini-ray run` with the same config runs the other {rest}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Every run of a sweep, concurrently on one engine, then the combined report; resumes
    as a whole (`api.run_sweep`)."""
    report, status = api.run_sweep(
        args.config,
        args.runs_root,
        args.engine,
        concurrency=args.concurrency,
        epochs=args.epochs,
        extend=args.extend,
        log=log,
        on_summary=print_summary,
    )
    print_report(report)
    return status


def print_summary(summary: RunSummary) -> None:
    """A run's console summary: statuses, tool calls, tokens, cost, why it stopped."""
    data = summary.model_dump()
    print(f"\nrun {data['run_dir']} (config {data['config_hash']}, model {data['model']})")
    print(
        f"queries: {data['queries']} ({data['ran_now']} run now); "
        + ", ".join(f"{k}: {v}" for k, v in sorted(data["statuses"].items()))
    )
    print(
        "tool calls per query: "
        + ", ".join(f"{k} {v}" for k, v in data["tool_calls_per_query"].items())
    )
    tokens = data["tokens_total"]
    print(
        f"tokens: input {tokens.get('input_tokens', 0):,}, output "
        f"{tokens.get('output_tokens', 0):,}, cached {tokens.get('cached_tokens', 0):,} "
        f"(cached ratio {100 * data['cached_token_ratio']:.1f} %), median per query "
        f"{data['tokens_median_per_query']:,.0f}"
    )
    from piserini_ray.metrics.cost import cost_text

    cost = cost_text(data["cost_usd"], data["cost_estimated_usd"], data["calls_usage_estimated"])
    if data["calls_without_usage"]:
        cost += f" (a lower bound: {data['calls_without_usage']} calls reported no usage)"
    print(f"cost: {cost}")
    if data["stopped"]:
        print(f"stopped: {data['stopped']}")


def print_report(report: Report) -> None:
    """The report's table (up to its first section) and where each report was written."""
    print("\n" + report.table.split("\n\n## ", 1)[0])
    for metrics in report.metrics:
        run = Path(metrics.run_dir).absolute()
        print(
            f"report: {run / 'report.md'}  {run / 'report.html'}  summary: {run / 'summary.json'}"
        )
    if report.paired:
        print("\n" + report.paired)
    if report.combined:
        print("combined report: " + "  ".join(str(p) for p in report.combined))
    from piserini_ray.reports.epochs import epochs_markdown

    for epochs in report.epochs:
        print("\n" + epochs_markdown(epochs))
        print(f"epochs report: {Path(epochs.run_dir).absolute() / 'epochs.md'}")
