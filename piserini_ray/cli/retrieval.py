"""Retrieval without the agent: the index, one search or read, the BM25 grid, every
backend's no-LLM floor."""

from __future__ import annotations

import argparse

from piserini_ray.cli.common import config_from, encoder_label, log
from piserini_ray.config import load_config
from piserini_ray.errors import ConfigError


def cmd_index(args: argparse.Namespace) -> int:
    """The Lucene index; with a dense backend, its dense index too, encoded on Ray's encoder
    actors (a local Ray unless runtime.address names a cluster)."""
    from piserini_ray import api

    cfg = config_from(args)
    built = api.build_index(cfg, log=log)
    info = built.info
    print(f"{built.path}\n{info.num_docs} documents, corpus {info.corpus}, built {info.built_at}")
    if cfg.retrieval.uses_dense:
        dense = api.build_dense_index(cfg, built.path, log=log)
        print(f"{dense}\ndense index, encoder {encoder_label(cfg)}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    """The search tool once, as the agent would see it (then a page of it, `--offset`)."""
    from piserini_ray import api

    session = api.tool_session(config_from(args), args.spill_dir, log=log)
    result = session.call("search", {"reason": "command line", "query": args.query})
    print(result.output)
    if result.ok and (args.offset or args.limit):
        page = {"reason": "command line", "search_id": "s1"}
        page |= {k: v for k, v in (("offset", args.offset), ("limit", args.limit)) if v}
        print(session.call("read_search_results", page).output)
    return 0 if result.ok else 1


def cmd_read(args: argparse.Namespace) -> int:
    """read_document once, as the agent would see it."""
    from piserini_ray import api

    session = api.tool_session(config_from(args), args.spill_dir, log=log)
    call = {"reason": "command line", "docid": args.docid}
    call |= {k: v for k, v in (("offset", args.offset), ("limit", args.limit)) if v}
    result = session.call("read_document", call)
    print(result.output)
    return 0 if result.ok else 1


def _floats(text: str | None) -> list[float] | None:
    """Comma-separated numbers; `None` when none are given (the API's default grid)."""
    if not text:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"expected comma-separated numbers, got {text!r}") from None


def cmd_tune_bm25(args: argparse.Namespace) -> int:
    """The (k1, b) grid on Ray: table, heatmap and the best config snippet."""
    from piserini_ray import api

    config = load_config(args.config_file or args.config)
    grid = api.tune_bm25(
        config,
        k1=_floats(args.k1),
        b=_floats(args.b),
        objective=args.objective,
        out=args.out,
        replicas=args.replicas,
        log=log,
    )
    print(grid.summary)
    print(
        f"{len(grid.cells)} cells in {grid.seconds:.1f} s; outputs in {grid.folder}: grid.csv, "
        "grid.md, heatmap.png, best.yaml"
    )
    print(f"best: k1={grid.best.k1:g} b={grid.best.b:g}")
    if args.backends:
        print(api.backends_at_best(config, grid, log=log))
    return 0


def cmd_retrieval_eval(args: argparse.Namespace) -> int:
    """The no-LLM floor: the raw questions ranked by every backend (or `--backend`) at the
    configured depth, recall@k, nDCG@10 and MAP side by side."""
    from piserini_ray import api

    config = config_from(args)
    backends = [args.backend] if args.backend else None
    result = api.retrieval_eval(config, backends, out=args.out, log=log)
    retrieval = config.retrieval
    print(
        f"raw questions, {result.queries} queries, depth {retrieval.depth}; BM25 "
        f"k1={retrieval.bm25.k1:g} b={retrieval.bm25.b:g}"
        + (f"; dense: {encoder_label(config)}" if backends != ["bm25"] else "")
    )
    print(result.table)
    if args.out:
        print(f"wrote run.<backend>.trec and retrieval_eval.json in {args.out}")
    return 0
