"""The argument parser: every command, its arguments and help (the CLI reference page is
generated from it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import piserini_ray
from piserini_ray.cli import analysis, live, monitor, retrieval, runs
from piserini_ray.cli.common import engine_arguments, epochs_argument
from piserini_ray.config import BACKENDS
from piserini_ray.formats.exporter import EXPORT_FORMATS
from piserini_ray.formats.peer_files import FORMATS as IMPORT_FORMATS

_Add = Callable[[str, str], argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    """The `piserini-ray` parser: each command sets `func`, the function that runs it."""
    parser = argparse.ArgumentParser(
        prog="piserini-ray", description="Distributed batch evaluation of agentic search."
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {piserini_ray.__version__}"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        """A command that reads a run config (and takes the retrieval overrides)."""
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--config", type=Path, help="YAML config (default: the embedded sample)")
        p.add_argument("--index-root", type=Path, help="where indexes live (overrides config)")
        p.add_argument("--preset", help="BM25 preset: piserini (25/1.0) or pyserini-default")
        p.add_argument("--k1", type=float, help="BM25 k1 (overrides config)")
        p.add_argument("--b", type=float, help="BM25 b (overrides config)")
        p.add_argument(
            "--backend", choices=BACKENDS, help="retrieval backend (overrides retrieval.backend)"
        )
        return p

    for commands in (
        _tool_commands,
        _run_commands,
        _analysis_commands,
        _retrieval_commands,
        _live_commands,
        _monitor_commands,
    ):
        commands(sub, add)
    return parser


def _tool_commands(sub: Any, add: _Add) -> None:
    """The index and the tools, once, from the command line."""
    p = add("index", "Build (or find) the benchmark's Lucene index (and dense, --backend).")
    p.set_defaults(func=retrieval.cmd_index)
    p = add("search", "Run the search tool once and print what the agent would see.")
    p.add_argument("query")
    p.add_argument("--offset", type=int, help="then browse from this rank")
    p.add_argument("--limit", type=int, help="browse this many hits")
    p.add_argument("--spill-dir", type=Path, help="where over-long outputs are saved")
    p.set_defaults(func=retrieval.cmd_search)
    p = add("read", "Run read_document once and print what the agent would see.")
    p.add_argument("docid")
    p.add_argument("--offset", type=int)
    p.add_argument("--limit", type=int)
    p.add_argument("--spill-dir", type=Path)
    p.set_defaults(func=retrieval.cmd_read)


def _run_commands(sub: Any, add: _Add) -> None:
    """Running, estimating, resuming and sweeping runs."""
    p = add("run", "The main job: the agent over the configured slice (default: the sample).")
    p.add_argument(
        "--run-dir",
        type=Path,
        help="default: <runs root>/<benchmark>-<model>-<hash>, the runs root being "
        "runtime.runs_root or $PISERINI_RAY_HOME/runs",
    )
    p.add_argument("--runs-root", type=Path, help="where run directories go (runtime.runs_root)")
    p.add_argument(
        "--check",
        action="store_true",
        help="send one tiny request to each model (agent and judge) through its route, then "
        "stop: a wrong key, model or endpoint shows in seconds (every run does this for "
        "hosted models before its first query)",
    )
    epochs_argument(p)
    engine_arguments(p)
    p.set_defaults(func=runs.cmd_run)
    p = add("estimate", "Project a run's cost and makespan from a seeded pilot of its slice.")
    p.add_argument("config_file", nargs="?", type=Path, help="run config (default: the sample)")
    p.add_argument("--pilot", type=int, default=10, help="pilot queries (default 10)")
    p.add_argument("--run-dir", type=Path, help="default: the run's own directory")
    engine_arguments(p)
    p.set_defaults(func=runs.cmd_estimate)
    p = sub.add_parser("resume", help="Continue a run from its manifest.")
    p.add_argument("run_dir", type=Path)
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="run every failed query again (failures that were not the query's fault, such as "
        "a lost node or a provider outage, always run again)",
    )
    epochs_argument(p)
    engine_arguments(p)
    p.set_defaults(func=runs.cmd_resume)
    p = sub.add_parser("sweep", help="Expand a sweep file into runs and execute them together.")
    p.add_argument(
        "config", type=Path, help="a sweep file (see configs/sweep_models_timeouts.yaml)"
    )
    p.add_argument("--runs-root", type=Path, help="default: runtime.runs_root")
    p.add_argument(
        "--extend",
        action="store_true",
        help="with stop_when_decided: the decided runs go on past their decision, in the same "
        "order, to the end of the slice",
    )
    epochs_argument(p)
    engine_arguments(p)
    p.set_defaults(func=runs.cmd_sweep)


def _analysis_commands(sub: Any, add: _Add) -> None:
    """Judging, reporting, comparing and exporting finished runs."""
    p = sub.add_parser("judge", help="Judge runs' answers (resumable), then report them.")
    p.add_argument("run_dirs", type=Path, nargs="+")
    p.add_argument(
        "--judge",
        action="append",
        metavar="MODEL",
        help="also judge with MODEL (repeatable; e.g. offline/lenient-judge): its verdicts go "
        "beside the run's judge's, and the report shows their agreement and kappa",
    )
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: judge from this process (default); ray: under the cluster-wide limiters",
    )
    p.set_defaults(func=runs.cmd_judge)
    p = sub.add_parser("pricing", help="Check the pricing table against litellm's price map.")
    p.add_argument("action", choices=("check",))
    p.add_argument("--table", type=Path, help="default: the package's own (configs/pricing.yaml)")
    p.set_defaults(func=analysis.cmd_pricing_check)
    p = sub.add_parser("compare", help="Paired comparison of runs against the first one.")
    p.add_argument("run_dirs", type=Path, nargs="+", help="REFERENCE RUN [RUN ...]")
    p.add_argument("--out", type=Path, help="also write compare.md and compare.json here")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.set_defaults(func=analysis.cmd_compare)
    p = sub.add_parser("leaderboard", help="Rank runs of one benchmark, each against the top.")
    p.add_argument("run_dirs", type=Path, nargs="+", help="RUN [RUN ...]")
    p.add_argument("--out", type=Path, help="also write leaderboard.md, .html and .json here")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.set_defaults(func=analysis.cmd_leaderboard)
    p = sub.add_parser("power", help="Size a run from a pilot run and an assumed effect.")
    p.add_argument("run_dir", type=Path, help="the pilot run")
    p.add_argument(
        "--effect",
        type=float,
        action="append",
        metavar="DELTA",
        help="accuracy difference to detect, a fraction (repeatable; default 0.01 0.02 0.05)",
    )
    p.add_argument(
        "--discordance",
        type=float,
        help="share of queries two runs disagree on (default: 2p(1-p) at the pilot's accuracy)",
    )
    p.set_defaults(func=analysis.cmd_power)
    p = sub.add_parser("report", help="Report runs side by side from their judgements.")
    p.add_argument("run_dirs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, help="folder for the combined report (md, html, plots)")
    p.set_defaults(func=runs.cmd_report)
    p = sub.add_parser("export", help="Write a run in another format.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--format", choices=tuple(EXPORT_FORMATS), required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=analysis.cmd_export)
    p = add("import", "Bring another harness's run files into a run directory (then judge it).")
    p.add_argument("dir", type=Path, metavar="DIR", help="the folder of run files")
    p.add_argument("--format", choices=IMPORT_FORMATS, required=True)
    p.add_argument(
        "--run-dir",
        type=Path,
        help="default: <runs root>/imported-<format>-<DIR name>; importing again skips the "
        "queries it holds",
    )
    p.set_defaults(func=analysis.cmd_import)


def _retrieval_commands(sub: Any, add: _Add) -> None:
    """Retrieval without the agent: the BM25 grid, backends, evidence ranks."""
    p = sub.add_parser("tune-bm25", help="Grid-search BM25 (k1, b) on Ray; table, heatmap, best.")
    p.add_argument("config_file", nargs="?", type=Path, help="run config (default: the sample)")
    p.add_argument("--config", type=Path, help="same as the positional CONFIG")
    p.add_argument("--k1", help="comma-separated k1 values (default: 0.3..1.5, 2..30)")
    p.add_argument("--b", help="comma-separated b values (default: 0..1 by 0.1)")
    p.add_argument("--objective", default="evidence_recall@1000")
    p.add_argument("--replicas", type=int, help="searcher replicas (default: runtime.replicas)")
    p.add_argument("--out", type=Path, help="default: runs/tune-bm25-<benchmark>")
    p.add_argument(
        "--backends",
        action="store_true",
        help="then every backend's floor at the best cell (builds the dense index if missing)",
    )
    p.set_defaults(func=retrieval.cmd_tune_bm25)
    p = add("retrieval-eval", "No-LLM floor of every backend: recall@k, nDCG@10, MAP.")
    p.add_argument("--out", type=Path, help="also write run.trec and retrieval_eval.json here")
    p.set_defaults(func=retrieval.cmd_retrieval_eval)
    p = sub.add_parser("evidence-ranks", help="Where a run's evidence sat in its rankings.")
    p.add_argument("run_dir", type=Path)
    p.set_defaults(func=analysis.cmd_evidence_ranks)


def _live_commands(sub: Any, add: _Add) -> None:
    """One query live, and the offline provider on its own."""
    p = add("ask", "Run one query in this process and print its trajectory as it happens.")
    p.add_argument("question", nargs="?", help="a question (or use --query-id)")
    p.add_argument("--query-id", help="a query of the benchmark")
    p.add_argument("--run-dir", type=Path, help="use this run's config (nothing is saved in it)")
    p.add_argument("--spill-dir", type=Path)
    p.add_argument("--lines", type=int, default=12, help="lines of each tool output to show")
    p.add_argument("--save", type=Path, help="write the record as JSON here")
    p.set_defaults(func=live.cmd_ask)
    p = add("offline-provider", "Serve the offline models on 127.0.0.1 (OpenAI-compatible).")
    p.add_argument("--port", type=int, help="default: from config (0 = any free port)")
    p.set_defaults(func=live.cmd_offline_provider)


def _monitor_commands(sub: Any, add: _Add) -> None:
    """Watching runs while they go: their status, a live web view, stopping one."""
    p = sub.add_parser("status", help="Each run's live status under PATH (a run or a folder).")
    p.add_argument("path", type=Path, help="a run directory, a sweep's folder or a runs root")
    p.add_argument("--json", action="store_true", help="print the status files as JSON")
    p.set_defaults(func=monitor.cmd_status)
    p = sub.add_parser("watch", help="Serve a live web view of the runs under PATH.")
    p.add_argument("path", type=Path, help="a run directory, a sweep's folder or a runs root")
    p.add_argument("--port", type=int, default=8765, help="default 8765 (0: any free port)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="default 127.0.0.1; another address serves only requests with the printed token",
    )
    p.set_defaults(func=monitor.cmd_watch)
    p = sub.add_parser("stop", help="Stop one run (of a sweep) cleanly; the others go on.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--no-wait", action="store_true", help="return once the request is made")
    p.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for it (default 120)"
    )
    p.set_defaults(func=monitor.cmd_stop)
