"""One query live in this process (`ask`), and the offline provider on its own."""

from __future__ import annotations

import argparse

from piserini_ray.cli.common import config_from
from piserini_ray.cli.common import searcher as open_searcher
from piserini_ray.data import load_benchmark
from piserini_ray.errors import ConfigError
from piserini_ray.store import manifest_config


def cmd_ask(args: argparse.Namespace) -> int:
    """One query, in this process, with its trajectory printed as it happens."""
    import asyncio

    from piserini_ray.agent.loop import run_query
    from piserini_ray.data import Query
    from piserini_ray.endpoints import ModelEndpoints
    from piserini_ray.local_run import local_client
    from piserini_ray.tools import ToolSession, tool_schemas

    cfg = manifest_config(args.run_dir) if args.run_dir else config_from(args)
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

    searcher = open_searcher(cfg, benchmark)
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
        from piserini_ray.report.writers import write_record

        write_record(record, args.save)
    return 0 if record.status == "completed" else 1


def cmd_offline_provider(args: argparse.Namespace) -> int:
    """The offline models on 127.0.0.1 until interrupted."""
    from piserini_ray.offline import serve

    serve(config_from(args).offline, host="127.0.0.1", port=args.port)
    return 0
