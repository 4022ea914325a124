"""Retrieval without the agent: the index, one search or read, the BM25 grid, every
backend's no-LLM floor."""

from __future__ import annotations

import argparse
from pathlib import Path

from piserini_ray.cli.common import config_from, encoder_label, log, searcher
from piserini_ray.config import BACKENDS, RunConfig, load_config
from piserini_ray.data import load_benchmark, load_corpus
from piserini_ray.errors import ConfigError


def cmd_index(args: argparse.Namespace) -> int:
    """The Lucene index; with a dense backend, its dense index too, encoded on Ray's encoder
    actors (a local Ray unless runtime.address names a cluster)."""
    from piserini_ray.pipeline import ensure_dense_index
    from piserini_ray.retrieval import ensure_index, read_index_info

    cfg = config_from(args)
    path = ensure_index(load_corpus(cfg.benchmark), cfg.retrieval, log)
    info = read_index_info(path)
    print(f"{path}\n{info.num_docs} documents, corpus {info.corpus}, built {info.built_at}")
    if cfg.retrieval.uses_dense:
        from piserini_ray.runtime.ray_env import start_ray

        start_ray(cfg.runtime, log)
        dense = ensure_dense_index(path, cfg.retrieval, log)
        print(f"{dense}\ndense index, encoder {encoder_label(cfg)}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    """The search tool once, as the agent would see it (then a page of it, `--offset`)."""
    from piserini_ray.tools import ToolSession

    cfg = config_from(args)
    session = ToolSession(searcher(cfg, load_benchmark(cfg.benchmark)), cfg.tools, args.spill_dir)
    result = session.call("search", {"reason": "command line", "query": args.query})
    print(result.output)
    if result.ok and (args.offset or args.limit):
        page = {"reason": "command line", "search_id": "s1"}
        page |= {k: v for k, v in (("offset", args.offset), ("limit", args.limit)) if v}
        print(session.call("read_search_results", page).output)
    return 0 if result.ok else 1


def cmd_read(args: argparse.Namespace) -> int:
    """read_document once, as the agent would see it."""
    from piserini_ray.tools import ToolSession

    cfg = config_from(args)
    session = ToolSession(searcher(cfg, load_benchmark(cfg.benchmark)), cfg.tools, args.spill_dir)
    call = {"reason": "command line", "docid": args.docid}
    call |= {k: v for k, v in (("offset", args.offset), ("limit", args.limit)) if v}
    result = session.call("read_document", call)
    print(result.output)
    return 0 if result.ok else 1


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
    ensure_ray(config, log)
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
        log,
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
    from piserini_ray.pipeline import index_for
    from piserini_ray.report.tuning import backends_table
    from piserini_ray.report.writers import write_backends_table
    from piserini_ray.tuning import evaluate_backends

    retrieval = config.retrieval.model_copy(update={"bm25": BM25Params(k1=k1, b=b)})
    config = config.model_copy(update={"retrieval": retrieval})
    benchmark = load_benchmark(config.benchmark)
    index = index_for(config, benchmark, log, dense=True)
    queries = benchmark.select(**config.slice.model_dump())
    results = evaluate_backends(index, retrieval, queries, benchmark, list(BACKENDS))
    title = (
        f"No-LLM floor of every backend at the best BM25 (k1={k1:g} b={b:g}), depth "
        f"{retrieval.depth}, {len(queries)} queries; dense: {encoder_label(config)}"
    )
    table = "\n".join([title, "", *backends_table(results)])
    write_backends_table(table, out)
    print(table)


def cmd_retrieval_eval(args: argparse.Namespace) -> int:
    """The no-LLM floor: the raw questions ranked by every backend (or `--backend`) at the
    configured depth, recall@k, nDCG@10 and MAP side by side."""
    from piserini_ray.pipeline import index_for
    from piserini_ray.report.tuning import backends_table
    from piserini_ray.tuning import evaluate_backends

    config = config_from(args)
    benchmark = load_benchmark(config.benchmark)
    backends = [args.backend] if args.backend else list(BACKENDS)
    retrieval = config.retrieval
    index = index_for(config, benchmark, log, dense=any(b != "bm25" for b in backends))
    queries = benchmark.select(**config.slice.model_dump())
    results = evaluate_backends(index, retrieval, queries, benchmark, backends)
    print(
        f"raw questions, {len(queries)} queries, depth {retrieval.depth}; BM25 "
        f"k1={retrieval.bm25.k1:g} b={retrieval.bm25.b:g}"
        + (f"; dense: {encoder_label(config)}" if backends != ["bm25"] else "")
    )
    print("\n".join(backends_table(results)))
    if args.out:
        from piserini_ray.report.writers import write_retrieval_eval

        write_retrieval_eval(results, retrieval, args.out)
        print(f"wrote run.<backend>.trec and retrieval_eval.json in {args.out}")
    return 0
