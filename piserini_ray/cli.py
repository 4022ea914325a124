"""Command line: `piserini-ray COMMAND`. Thin: parse, call the package, print."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from piserini_ray.config import RunConfig, load_config
from piserini_ray.data import Benchmark, load_benchmark
from piserini_ray.errors import PiseriniRayError


def _log(message: str) -> None:
    print(f"[piserini-ray] {message}", file=sys.stderr, flush=True)


def _config(args: argparse.Namespace) -> RunConfig:
    overrides: dict[str, object] = {}
    if getattr(args, "k1", None) is not None:
        overrides["retrieval.bm25.k1"] = args.k1
    if getattr(args, "b", None) is not None:
        overrides["retrieval.bm25.b"] = args.b
    if getattr(args, "preset", None) is not None:
        overrides["retrieval.preset"] = args.preset
    if getattr(args, "index_root", None) is not None:
        overrides["retrieval.index_root"] = str(args.index_root)
    return load_config(args.config, overrides)


def _index(cfg: RunConfig, benchmark: Benchmark) -> Path:
    from piserini_ray.retrieval import build_index

    return build_index(
        benchmark.corpus,
        cfg.retrieval.resolved_index_root(),
        threads=cfg.retrieval.index_threads,
        heap=cfg.retrieval.jvm_heap,
        log=_log,
    )


def _searcher(cfg: RunConfig, benchmark: Benchmark):  # -> BM25Searcher (lazy import: JVM)
    from piserini_ray.retrieval import BM25Searcher

    return BM25Searcher(
        _index(cfg, benchmark), cfg.retrieval.bm25, cfg.retrieval.depth, cfg.retrieval.jvm_heap
    )


def cmd_index(args: argparse.Namespace) -> int:
    cfg = _config(args)
    benchmark = load_benchmark(cfg.benchmark)
    from piserini_ray.retrieval import read_index_info

    path = _index(cfg, benchmark)
    info = read_index_info(path)
    print(f"{path}\n{info.num_docs} documents, corpus {info.corpus}, built {info.built_at}")
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
    """The main job as far as it exists: index the benchmark, then search and read with the
    tools for a few queries, showing what an agent would see and how fast it was."""
    from piserini_ray.tools import ToolSession

    cfg = _config(args)
    benchmark = load_benchmark(cfg.benchmark)
    queries = benchmark.select(**cfg.slice.model_dump())
    _log(f"benchmark {benchmark.name}: {len(queries)} queries selected")
    searcher = _searcher(cfg, benchmark)
    _log(
        f"searcher ready: {searcher.num_docs} documents, BM25 k1={cfg.retrieval.bm25.k1} "
        f"b={cfg.retrieval.bm25.b}, depth {cfg.retrieval.depth}"
    )
    for query in queries[: args.show]:
        session = ToolSession(searcher, cfg.tools, args.spill_dir)
        print(f"\n=== {query.query_id}: {query.query}\n    gold answer: {query.answer}\n")
        print(session.call("search", {"reason": "raw question", "query": query.query}).output)
        print(session.call("read_search_results", {"reason": "browse", "search_id": "s1"}).output)
        if session.previewed:
            top = next(iter(session.previewed))
            read = {"reason": "open the top hit", "docid": top, "limit": 20}
            print(session.call("read_document", read).output)
        evidence = set(benchmark.evidence.get(query.query_id, {}))
        found = {name: len(evidence & set(getattr(session, name))) for name in
                 ("surfaced", "previewed", "opened")}  # fmt: skip
        print(f"evidence documents: {len(evidence)}; " + ", ".join(
            f"{name} {n}" for name, n in found.items()))  # fmt: skip
    # Raw-question retrieval over the whole slice: latency and surfaced evidence recall.
    latencies, recalls = [], []
    for query in queries:
        started = time.perf_counter()
        ranking = searcher.search(query.query)
        latencies.append((time.perf_counter() - started) * 1000)
        evidence = set(benchmark.evidence.get(query.query_id, {}))
        if evidence:
            surfaced = {searcher.docid(int(o)) for o in ranking.ordinals}
            recalls.append(len(evidence & surfaced) / len(evidence))
    latencies.sort()
    print(
        f"\n{len(queries)} raw-question searches at depth {cfg.retrieval.depth}: "
        f"p50 {statistics.median(latencies):.2f} ms, "
        f"p90 {latencies[int(0.9 * (len(latencies) - 1))]:.2f} ms; "
        f"surfaced evidence recall (macro) {100 * statistics.fmean(recalls):.1f} %"
    )
    print("The agent, scheduler and reports arrive with the next issues (see README).")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="piserini-ray", description="Distributed batch evaluation of agentic search."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--config", type=Path, help="YAML config (default: the embedded sample)")
        p.add_argument("--index-root", type=Path, help="where indexes live (overrides config)")
        p.add_argument("--preset", help="BM25 preset: piserini (25/1.0) or pyserini-default")
        p.add_argument("--k1", type=float, help="BM25 k1 (overrides config)")
        p.add_argument("--b", type=float, help="BM25 b (overrides config)")
        return p

    p = add("index", "Build (or find) the Lucene index of the benchmark's corpus.")
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
    p = add("run", "The main job on the configured benchmark (default: the embedded sample).")
    p.add_argument("--show", type=int, default=3, help="queries to show tool by tool")
    p.add_argument("--spill-dir", type=Path)
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
