"""Command line: `piserini-ray COMMAND`. Thin: parse, call the package, print."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from piserini_ray.config import BACKENDS, RunConfig, load_config
from piserini_ray.data import Benchmark, load_benchmark, load_corpus
from piserini_ray.errors import ConfigError, PiseriniRayError
from piserini_ray.store import manifest_config

if TYPE_CHECKING:
    from piserini_ray.engine import RunSummary
    from piserini_ray.pipeline import Report
    from piserini_ray.retrieval.backends import SearchBackend


def _log(message: str) -> None:
    print(f"[piserini-ray] {message}", file=sys.stderr, flush=True)


def _config(args: argparse.Namespace) -> RunConfig:
    overrides: dict[str, object] = {}
    if getattr(args, "k1", None) is not None:
        overrides["retrieval.bm25.k1"] = args.k1
    if getattr(args, "b", None) is not None:
        overrides["retrieval.bm25.b"] = args.b
    if getattr(args, "backend", None) is not None:
        overrides["retrieval.backend"] = args.backend
    if getattr(args, "preset", None) is not None:
        overrides["retrieval.preset"] = args.preset
    if getattr(args, "index_root", None) is not None:
        overrides["retrieval.index_root"] = str(args.index_root)
    if getattr(args, "runs_root", None) is not None:
        overrides["runtime.runs_root"] = str(args.runs_root.absolute())
    if getattr(args, "epochs", None) is not None:
        overrides["run.epochs"] = args.epochs
    return load_config(args.config, overrides)


def _with_epochs(config: RunConfig, epochs: int | None) -> RunConfig:
    """`config` with `--epochs` applied (more epochs are added to the same run)."""
    if epochs is None:
        return config
    return config.model_copy(update={"run": config.run.model_copy(update={"epochs": epochs})})


def _epochs_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--epochs",
        type=int,
        metavar="K",
        help="run each query K times with distinct seeds (run.epochs); epoch e > 1 goes to "
        "<run dir>/epochs/<e>, and the report adds mean ± sd, pass@k and pass^k",
    )


def _index(cfg: RunConfig, benchmark: Benchmark, dense: bool) -> Path:
    """The Lucene index (built if missing), and the dense one when `dense`."""
    from piserini_ray.pipeline import ensure_dense_index
    from piserini_ray.retrieval import ensure_index

    index = ensure_index(benchmark.corpus, cfg.retrieval, _log)
    if dense:
        ensure_dense_index(index, cfg.retrieval, _log)
    return index


def _searcher(cfg: RunConfig, benchmark: Benchmark) -> SearchBackend:
    from piserini_ray.retrieval.backends import open_backend

    return open_backend(_index(cfg, benchmark, cfg.retrieval.uses_dense), cfg.retrieval)


def cmd_index(args: argparse.Namespace) -> int:
    """The Lucene index; with a dense backend, its dense index too, encoded on Ray's encoder
    actors (a local Ray unless runtime.address names a cluster)."""
    from piserini_ray.pipeline import ensure_dense_index
    from piserini_ray.retrieval import ensure_index, read_index_info

    cfg = _config(args)
    path = ensure_index(load_corpus(cfg.benchmark), cfg.retrieval, _log)
    info = read_index_info(path)
    print(f"{path}\n{info.num_docs} documents, corpus {info.corpus}, built {info.built_at}")
    if cfg.retrieval.uses_dense:
        from piserini_ray.runtime.ray_env import start_ray

        start_ray(cfg.runtime, _log)
        dense = ensure_dense_index(path, cfg.retrieval, _log)
        print(f"{dense}\ndense index, encoder {_encoder_label(cfg)}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from piserini_ray.tools import ToolSession

    cfg = _config(args)
    session = ToolSession(_searcher(cfg, load_benchmark(cfg.benchmark)), cfg.tools, args.spill_dir)
    result = session.call("search", {"reason": "command line", "query": args.query})
    print(result.output)
    if result.ok and (args.offset or args.limit):
        page = {"reason": "command line", "search_id": "s1"}
        page |= {k: v for k, v in (("offset", args.offset), ("limit", args.limit)) if v}
        print(session.call("read_search_results", page).output)
    return 0 if result.ok else 1


def cmd_read(args: argparse.Namespace) -> int:
    from piserini_ray.tools import ToolSession

    cfg = _config(args)
    session = ToolSession(_searcher(cfg, load_benchmark(cfg.benchmark)), cfg.tools, args.spill_dir)
    call = {"reason": "command line", "docid": args.docid}
    call |= {k: v for k, v in (("offset", args.offset), ("limit", args.limit)) if v}
    result = session.call("read_document", call)
    print(result.output)
    return 0 if result.ok else 1


def cmd_run(args: argparse.Namespace) -> int:
    """The main job: the agent over the configured slice (default: the embedded sample with the
    offline heuristic model), records in a run directory, then the summary."""
    from piserini_ray import pipeline

    config = _config(args)
    if args.check:
        pipeline.check_models([config], _log, include_offline=True)
        return 0
    return _run_and_report([(config, args.run_dir)], args.engine, args.concurrency)


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue a run from its own manifest: only queries without a record run."""
    config = _with_epochs(manifest_config(args.run_dir), args.epochs)
    runs: list[tuple[RunConfig, Path | None]] = [(config, args.run_dir)]
    return _run_and_report(runs, args.engine, args.concurrency, retry_failed=args.retry_failed)


def _run_and_report(
    runs: list[tuple[RunConfig, Path | None]],
    engine: str,
    concurrency: int,
    reference: Path | None = None,
    retry_failed: bool = False,
) -> int:
    """Run, print each summary, judge, print the report; the exit status: 0, 1 when queries
    failed, 2 when the run was refused (a key, a model, an endpoint)."""
    from piserini_ray import pipeline

    chosen = pipeline.make_engine(engine, concurrency, release_ray=True)
    report, status = pipeline.run_and_report(
        runs, chosen, _log, _print_summary, reference, retry_failed
    )
    _print_report(report)
    return status


def cmd_judge(args: argparse.Namespace) -> int:
    """Judge a run's answers not judged yet, then write its report. `--judge MODEL` adds that
    judge's verdicts beside the run's own judge's; the report shows their agreement."""
    from piserini_ray import pipeline
    from piserini_ray.config import ModelConfig

    extra = [ModelConfig(name=name) for name in args.judge or []]
    engine = pipeline.make_engine(args.engine, release_ray=True)
    runs = [(manifest_config(d), d) for d in args.run_dirs]
    _print_report(pipeline.report_runs(runs, _log, engine, extra_judges=extra))
    return 0


def cmd_pricing_check(args: argparse.Namespace) -> int:
    """The pricing table against litellm's bundled price map: every difference listed; exit 1
    when there is one (the table wins in a run; this says where litellm disagrees)."""
    from piserini_ray.metrics.cost import load_pricing, price_differences

    table = load_pricing(args.table)
    differences = price_differences(table)
    print(f"pricing table {table.path} against litellm's price map (USD per million tokens):")
    for d in differences:
        if d.field == "model":
            print(f"  {d.model}: not in litellm's map")
        else:
            print(f"  {d.model} {d.field}: table {d.ours}, litellm {d.litellm}")
    print(f"{len(differences)} difference(s)" if differences else "no differences")
    return 1 if differences else 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Paired comparison of runs against the first, over the queries they share (no model is
    called: each run's own judge's verdicts)."""
    from piserini_ray.pipeline import compare
    from piserini_ray.report.paired import paired_markdown

    if len(args.run_dirs) < 2:
        raise ConfigError("compare needs two run directories or more: REFERENCE RUN [RUN ...]")
    comparisons = compare(args.run_dirs[0], args.run_dirs[1:], _log, args.seed)
    table = paired_markdown(comparisons)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compare.md").write_text(table)
        (args.out / "compare.json").write_text(
            orjson_dumps([c.model_dump(mode="json") for c in comparisons])
        )
        print(f"wrote {(args.out / 'compare.md').absolute()} and compare.json")
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    """Rank runs of one benchmark, each tested against the top (report/leaderboard.py)."""
    from piserini_ray.pipeline import run_figures
    from piserini_ray.report.leaderboard import leaderboard, leaderboard_markdown, write_leaderboard

    try:
        board = leaderboard([run_figures(d, _log) for d in args.run_dirs], args.seed)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    print(leaderboard_markdown(board))
    if args.out is not None:
        print("wrote " + ", ".join(str(p.absolute()) for p in write_leaderboard(board, args.out)))
    return 0


def cmd_power(args: argparse.Namespace) -> int:
    """Size a run from one pilot: the queries each assumed effect needs (exact McNemar)."""
    from piserini_ray.pipeline import run_facts
    from piserini_ray.report.paired import EFFECTS, pilot_power, power_markdown

    effects = args.effect or list(EFFECTS)
    if any(not 0 < e <= 1 for e in effects) or not (
        args.discordance is None or 0 < args.discordance <= 1
    ):
        raise ConfigError("--effect and --discordance are fractions in (0, 1]: 0.02 = 2 points")
    pilot = pilot_power(run_facts(args.run_dir, _log), effects, args.discordance)
    print(power_markdown(pilot))
    return 2 if pilot.figures.discordance is None else 0  # nothing sized: --discordance asked


def cmd_report(args: argparse.Namespace) -> int:
    """Report runs side by side from what is judged already (no model is called)."""
    from piserini_ray.pipeline import report_runs

    runs = [(manifest_config(d), d) for d in args.run_dirs]
    _print_report(report_runs(runs, _log, out=args.out))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from piserini_ray.report.export import export_browsecomp_plus, export_pi_serini, export_trec
    from piserini_ray.store import RunStore

    config = manifest_config(args.run_dir)
    with RunStore(args.run_dir, config, log=_log) as store:
        if args.format == "browsecomp-plus":  # with their leaderboard's evaluation_summary
            from piserini_ray.report.imported import read_imported

            imported = read_imported(args.run_dir)
            paths = export_browsecomp_plus(
                store.records(),
                args.out,
                store.judgements(config.judge_model().name),
                load_benchmark(config.benchmark).evidence,
                imported.retriever if imported else config.retrieval.describe(),
            )
        elif args.format == "pi-serini":  # it needs the questions and qrels too
            paths = export_pi_serini(store.records(), load_benchmark(config.benchmark), args.out)
        else:
            paths = export_trec(store.rankings(), args.out, tag=store.run_id)
    print(f"wrote {len(paths)} file(s) to {args.out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Another harness's run files as a run directory over the config's benchmark
    (`importer.py`); what their format lacks is n/a in the report, never 0."""
    from piserini_ray.importer import MEANING, import_runs

    s = import_runs(args.dir, args.format, _config(args), args.run_dir, _log)
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items()))
    print(
        f"imported {s.imported} quer{'y' if s.imported == 1 else 'ies'} from {s.source} "
        f"({s.format}) into {s.run_dir}" + (f": {statuses}" if statuses else "")
    )
    print(f"skipped {s.skipped} already recorded")
    print(f"read {s.files_read} file(s); {len(s.skipped_files)} run(s) skipped")
    for skip in s.skipped_files:
        print(f"  skipped {skip.file}: {skip.reason}")
    for note in s.notes:
        print(f"note: {note}")
    print(f"as the files state it: {s.settings}")
    print(f"cost: {s.cost}")
    if s.without_file:
        print(f"{s.without_file} queries of the config's slice have no run file in the folder")
    if s.unavailable:
        print(f"not in the {s.format} format, reported as n/a (never 0):")
        for part in s.unavailable:
            print(f"  {part}: {MEANING[part]}")
    print(f"next: piserini-ray judge {s.run_dir}\n      piserini-ray report {s.run_dir}")
    return 0


def _floats(text: str | None, default: list[float]) -> list[float]:
    if not text:
        return default
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"expected comma-separated numbers, got {text!r}") from None


def cmd_tune_bm25(args: argparse.Namespace) -> int:
    """The (k1, b) grid on Ray: table, heatmap and the best config snippet."""
    from piserini_ray.report.tuning import write_grid_outputs
    from piserini_ray.runtime import ensure_ray
    from piserini_ray.tuning import DEFAULT_B, DEFAULT_K1, OBJECTIVES

    if args.objective not in OBJECTIVES:
        raise ConfigError(f"--objective must be one of {', '.join(OBJECTIVES)}")
    config = load_config(args.config_file or args.config)
    ensure_ray(config, _log)
    from piserini_ray.runtime.tuning import tune_on_ray

    out = args.out or (
        config.runtime.resolved_runs_root() / f"tune-bm25-{config.benchmark.display_name()}"
    )
    cells, wall = tune_on_ray(
        config,
        _floats(args.k1, DEFAULT_K1),
        _floats(args.b, DEFAULT_B),
        out,
        args.replicas or config.runtime.replicas,
        _log,
    )
    best = write_grid_outputs(cells, args.objective, out)
    print((out / "grid.md").read_text().split("\n\n| k1")[0])
    print(
        f"{len(cells)} cells in {wall:.1f} s; outputs in {out}: grid.csv, grid.md, "
        "heatmap.png, best.yaml"
    )
    print(f"best: k1={best.k1:g} b={best.b:g}")
    if args.backends:
        _backends_at_best(config, best.k1, best.b, out)
    return 0


def _backends_at_best(config: RunConfig, k1: float, b: float, out: Path) -> None:
    """Every backend's no-LLM floor at the grid's best BM25 (hybrid and rerank use it too),
    printed and written to `backends.md` beside the grid."""
    from piserini_ray.config import BM25Params
    from piserini_ray.report.tuning import backends_table
    from piserini_ray.tuning import evaluate_backends

    retrieval = config.retrieval.model_copy(update={"bm25": BM25Params(k1=k1, b=b)})
    config = config.model_copy(update={"retrieval": retrieval})
    benchmark = load_benchmark(config.benchmark)
    index = _index(config, benchmark, dense=True)
    queries = benchmark.select(**config.slice.model_dump())
    results = evaluate_backends(index, retrieval, queries, benchmark, list(BACKENDS))
    title = (
        f"No-LLM floor of every backend at the best BM25 (k1={k1:g} b={b:g}), depth "
        f"{retrieval.depth}, {len(queries)} queries; dense: {_encoder_label(config)}"
    )
    table = "\n".join([title, "", *backends_table(results)])
    (out / "backends.md").write_text(table + "\n")
    print(table)


def cmd_retrieval_eval(args: argparse.Namespace) -> int:
    """The no-LLM floor: the raw questions ranked by every backend (or `--backend`) at the
    configured depth, recall@k, nDCG@10 and MAP side by side."""
    from piserini_ray.report.tuning import backends_table
    from piserini_ray.tuning import evaluate_backends

    config = _config(args)
    benchmark = load_benchmark(config.benchmark)
    backends = [args.backend] if args.backend else list(BACKENDS)
    retrieval = config.retrieval
    index = _index(config, benchmark, dense=any(b != "bm25" for b in backends))
    queries = benchmark.select(**config.slice.model_dump())
    results = evaluate_backends(index, retrieval, queries, benchmark, backends)
    print(
        f"raw questions, {len(queries)} queries, depth {retrieval.depth}; BM25 "
        f"k1={retrieval.bm25.k1:g} b={retrieval.bm25.b:g}"
        + (f"; dense: {_encoder_label(config)}" if backends != ["bm25"] else "")
    )
    print("\n".join(backends_table(results)))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        from piserini_ray.report.export import write_trec

        bm25 = retrieval.bm25
        for r in results:
            tag = f"bm25-k1={bm25.k1:g}-b={bm25.b:g}" if r.backend == "bm25" else r.backend
            write_trec(r.rankings, args.out / f"run.{r.backend}.trec", tag)
        scores = {r.backend: r.metrics for r in results}
        (args.out / "retrieval_eval.json").write_text(orjson_dumps(scores))
        print(f"wrote run.<backend>.trec and retrieval_eval.json in {args.out}")
    return 0


def _encoder_label(config: RunConfig) -> str:
    from piserini_ray.retrieval.encoder import encoder_label

    return encoder_label(config.retrieval.dense)


def orjson_dumps(data: object) -> str:
    import orjson

    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


def cmd_evidence_ranks(args: argparse.Namespace) -> int:
    from piserini_ray.report.evidence import evidence_ranks, write_evidence_ranks
    from piserini_ray.store import RunStore

    config = manifest_config(args.run_dir)
    benchmark = load_benchmark(config.benchmark)
    with RunStore(args.run_dir, config, log=_log) as store:
        rows = evidence_ranks(store.records(), store.rankings(), benchmark)
    path = write_evidence_ranks(rows, Path(args.run_dir))
    print(path.read_text())
    print(f"also {Path(args.run_dir) / 'evidence_ranks.png'} and evidence_ranks.csv")
    return 0


def _print_report(report: Report) -> None:
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
    from piserini_ray.report.epochs import epochs_markdown

    for epochs in report.epochs:
        print("\n" + epochs_markdown(epochs))
        print(f"epochs report: {Path(epochs.run_dir).absolute() / 'epochs.md'}")


def cmd_estimate(args: argparse.Namespace) -> int:
    """Run a seeded pilot of the slice in the run's own directory (paid once: the full run
    resumes after it) and project the whole slice's cost, tokens and makespan."""
    from piserini_ray import pipeline
    from piserini_ray.estimate import describe, pilot_ids, project
    from piserini_ray.metrics.cost import pricing_for
    from piserini_ray.store import RunStore

    args.config = args.config_file or args.config
    config = _config(args)
    benchmark = load_benchmark(config.benchmark)
    ids = [q.query_id for q in benchmark.select(**config.slice.model_dump())]
    pilot = set(pilot_ids(ids, args.pilot, config.slice.seed))
    engine = pipeline.make_engine(args.engine, args.concurrency, release_ray=True)
    try:
        (summary,) = pipeline.execute([(config, args.run_dir)], engine, _log, only=pilot)
    finally:
        engine.close()
    with RunStore(Path(summary.run_dir), config) as store:
        records = [r for r in store.iter_records(trajectory=False) if r.query_id in pilot]
    runtime = config.runtime
    at_once = runtime.replicas * runtime.max_concurrency
    if args.engine == "local":
        at_once = args.concurrency
    price = pricing_for(config).model_price(config.model)
    estimate = project(records, len(ids), config, price, at_once)
    print(describe(estimate))
    path = Path(summary.run_dir) / "estimate.json"
    path.write_text(estimate.model_dump_json(indent=2))
    rest = len(ids) - len(pilot)
    print(f"wrote {path}; `piserini-ray run` with the same config runs the other {rest}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Every run of a sweep, concurrently on one Ray cluster; resumes as a whole."""
    from piserini_ray.sweep import expand_sweep, reference_run

    runs = [(_with_epochs(c, args.epochs), d) for c, d in expand_sweep(args.config, args.runs_root)]
    reference = reference_run(args.config, runs)  # a bad reference stops before any work
    _log(f"sweep of {len(runs)} runs: " + ", ".join(str(d) for _, d in runs))
    return _run_and_report(list(runs), "ray", 0, reference=reference)


def _print_summary(summary: RunSummary) -> None:
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


def cmd_ask(args: argparse.Namespace) -> int:
    """One query, in this process, with its trajectory printed as it happens."""
    import asyncio

    from piserini_ray.agent.loop import run_query
    from piserini_ray.data import Query
    from piserini_ray.endpoints import ModelEndpoints
    from piserini_ray.local_run import local_client
    from piserini_ray.tools import ToolSession, tool_schemas

    cfg = manifest_config(args.run_dir) if args.run_dir else _config(args)
    benchmark = load_benchmark(cfg.benchmark)
    if args.query_id:
        query = benchmark.query(args.query_id)
    elif args.question:
        query = Query(query_id="ask", query=args.question, answer="")
    else:
        raise ConfigError("give a QUESTION or --query-id ID")
    if args.run_dir:
        from piserini_ray.store import RunStore

        with RunStore(args.run_dir, cfg) as store:
            stored = [r for r in store.records() if r.query_id == query.query_id]
        if stored:
            print(
                f"(the run holds a record for {query.query_id}: {stored[0].status}, "
                f"answer {stored[0].exact_answer!r}; running it again here, not saved)\n"
            )
    print(f"Question: {query.query}\n")

    def show(kind: str, data: dict) -> None:
        if kind == "model":
            if data["content"]:
                print(f"--- model (turn {data['turn']}):\n{data['content']}\n")
            for call in data["tool_calls"]:
                fn = call["function"]
                print(f"--- turn {data['turn']} calls {fn['name']} {fn['arguments']}")
        elif kind == "tool":
            lines = data["observation"].splitlines()
            more = (
                f"\n    ... ({len(lines) - args.lines} more lines)"
                if len(lines) > args.lines
                else ""
            )
            print("    " + "\n    ".join(lines[: args.lines]) + more + "\n")
        elif kind == "steer":
            print(f"--- steer: submit now (at {data['charged']:.1f} s charged)\n")

    searcher = _searcher(cfg, benchmark)
    with ModelEndpoints() as endpoints:
        client = local_client(cfg.model, cfg, endpoints)  # model.rate_limit holds
        session = ToolSession(searcher, cfg.tools, args.spill_dir)
        record = asyncio.run(
            run_query(
                query,
                session,
                client,
                cfg.agent,
                tool_schemas(cfg.tools),
                run_id="ask",
                config_hash=cfg.config_hash(),
                on_event=show,
            )
        )
    print(f"status: {record.status}" + (f" ({record.error})" if record.error else ""))
    print(
        f"exact answer: {record.exact_answer!r}  confidence: {record.confidence:g}"
        + (" (missing, taken as 100)" if record.confidence_missing else "")
    )
    if query.answer:
        print(f"gold answer: {query.answer!r}")
    print(f"tool calls: {record.tool_call_counts}; tokens: {record.usage.model_dump()}")
    print(
        f"charged {record.charged_seconds:.2f} s, waited {record.waited_seconds:.2f} s; "
        f"surfaced {len(record.surfaced)}, previewed {len(record.previewed)}, "
        f"opened {len(record.opened)}, cited {record.cited}"
    )
    if args.save:
        args.save.write_text(record.model_dump_json(indent=2))
    return 0 if record.status == "completed" else 1


def cmd_offline_provider(args: argparse.Namespace) -> int:
    from piserini_ray.offline import serve

    serve(_config(args).offline, host="127.0.0.1", port=args.port)
    return 0


def _engine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=("ray", "local"),
        default="ray",
        help="ray: searcher replicas on a Ray cluster (default); local: this process only",
    )
    p.add_argument("--concurrency", type=int, default=4, help="queries at once (local engine)")


_Add = Callable[[str, str], argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="piserini-ray", description="Distributed batch evaluation of agentic search."
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
    ):
        commands(sub, add)
    return parser


def _tool_commands(sub: Any, add: _Add) -> None:
    """The index and the tools, once, from the command line."""
    p = add("index", "Build (or find) the benchmark's Lucene index (and dense, --backend).")
    p.set_defaults(func=cmd_index)
    p = add("search", "Run the search tool once and print what the agent would see.")
    p.add_argument("query")
    p.add_argument("--offset", type=int, help="then browse from this rank")
    p.add_argument("--limit", type=int, help="browse this many hits")
    p.add_argument("--spill-dir", type=Path, help="where over-long outputs are saved")
    p.set_defaults(func=cmd_search)
    p = add("read", "Run read_document once and print what the agent would see.")
    p.add_argument("docid")
    p.add_argument("--offset", type=int)
    p.add_argument("--limit", type=int)
    p.add_argument("--spill-dir", type=Path)
    p.set_defaults(func=cmd_read)


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
    _epochs_argument(p)
    _engine_arguments(p)
    p.set_defaults(func=cmd_run)
    p = add("estimate", "Project a run's cost and makespan from a seeded pilot of its slice.")
    p.add_argument("config_file", nargs="?", type=Path, help="run config (default: the sample)")
    p.add_argument("--pilot", type=int, default=10, help="pilot queries (default 10)")
    p.add_argument("--run-dir", type=Path, help="default: the run's own directory")
    _engine_arguments(p)
    p.set_defaults(func=cmd_estimate)
    p = sub.add_parser("resume", help="Continue a run from its manifest.")
    p.add_argument("run_dir", type=Path)
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="run every failed query again (failures that were not the query's fault, such as "
        "a lost node or a provider outage, always run again)",
    )
    _epochs_argument(p)
    _engine_arguments(p)
    p.set_defaults(func=cmd_resume)
    p = sub.add_parser("sweep", help="Expand a sweep file into runs and execute them together.")
    p.add_argument(
        "config", type=Path, help="a sweep file (see configs/sweep_models_timeouts.yaml)"
    )
    p.add_argument("--runs-root", type=Path, help="default: runtime.runs_root")
    _epochs_argument(p)
    p.set_defaults(func=cmd_sweep)


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
    p.set_defaults(func=cmd_judge)
    p = sub.add_parser("pricing", help="Check the pricing table against litellm's price map.")
    p.add_argument("action", choices=("check",))
    p.add_argument("--table", type=Path, help="default: configs/pricing.yaml")
    p.set_defaults(func=cmd_pricing_check)
    p = sub.add_parser("compare", help="Paired comparison of runs against the first one.")
    p.add_argument("run_dirs", type=Path, nargs="+", help="REFERENCE RUN [RUN ...]")
    p.add_argument("--out", type=Path, help="also write compare.md and compare.json here")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("leaderboard", help="Rank runs of one benchmark, each against the top.")
    p.add_argument("run_dirs", type=Path, nargs="+", help="RUN [RUN ...]")
    p.add_argument("--out", type=Path, help="also write leaderboard.md, .html and .json here")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.set_defaults(func=cmd_leaderboard)
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
    p.set_defaults(func=cmd_power)
    p = sub.add_parser("report", help="Report runs side by side from their judgements.")
    p.add_argument("run_dirs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, help="folder for the combined report (md, html, plots)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("export", help="Write a run in another format.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--format", choices=("browsecomp-plus", "pi-serini", "trec"), required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_export)
    p = add("import", "Bring another harness's run files into a run directory (then judge it).")
    p.add_argument("dir", type=Path, metavar="DIR", help="the folder of run files")
    p.add_argument("--format", choices=("browsecomp-plus", "pi-serini"), required=True)
    p.add_argument(
        "--run-dir",
        type=Path,
        help="default: <runs root>/imported-<format>-<DIR name>; importing again skips the "
        "queries it holds",
    )
    p.set_defaults(func=cmd_import)


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
    p.set_defaults(func=cmd_tune_bm25)
    p = add("retrieval-eval", "No-LLM floor of every backend: recall@k, nDCG@10, MAP.")
    p.add_argument("--out", type=Path, help="also write run.trec and retrieval_eval.json here")
    p.set_defaults(func=cmd_retrieval_eval)
    p = sub.add_parser("evidence-ranks", help="Where a run's evidence sat in its rankings.")
    p.add_argument("run_dir", type=Path)
    p.set_defaults(func=cmd_evidence_ranks)


def _live_commands(sub: Any, add: _Add) -> None:
    """One query live, and the offline provider on its own."""
    p = add("ask", "Run one query in this process and print its trajectory as it happens.")
    p.add_argument("question", nargs="?", help="a question (or use --query-id)")
    p.add_argument("--query-id", help="a query of the benchmark")
    p.add_argument("--run-dir", type=Path, help="use this run's config (nothing is saved in it)")
    p.add_argument("--spill-dir", type=Path)
    p.add_argument("--lines", type=int, default=12, help="lines of each tool output to show")
    p.add_argument("--save", type=Path, help="write the record as JSON here")
    p.set_defaults(func=cmd_ask)
    p = add("offline-provider", "Serve the offline models on 127.0.0.1 (OpenAI-compatible).")
    p.add_argument("--port", type=int, help="default: from config (0 = any free port)")
    p.set_defaults(func=cmd_offline_provider)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Ctrl-C and SIGTERM (what cluster schedulers send) both stop a run cleanly. Installed
    # explicitly: a process started in the background inherits an ignored SIGINT.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return args.func(args)
    except PiseriniRayError as e:
        print(f"piserini-ray: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("piserini-ray: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
