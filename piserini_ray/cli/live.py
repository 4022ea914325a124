"""One query live in this process (`ask`), and the offline provider on its own."""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING, Any

from piserini_ray.cli.common import config_from, log
from piserini_ray.data import Query, load_benchmark
from piserini_ray.errors import ConfigError
from piserini_ray.store import manifest_config

if TYPE_CHECKING:
    from piserini_ray.records import QueryRecord


def cmd_ask(args: argparse.Namespace) -> int:
    """One query, in this process, with its trajectory printed as it happens."""
    from piserini_ray import api

    cfg = manifest_config(args.run_dir) if args.run_dir else config_from(args)
    benchmark = load_benchmark(cfg.benchmark)
    if args.query_id:
        query = benchmark.query(args.query_id)
    elif args.question:
        query = Query(query_id="ask", query=args.question, answer="")
    else:
        raise ConfigError("give a QUESTION or --query-id ID")
    if args.run_dir:
        stored = [r for r in api.read_records(args.run_dir) if r.query_id == query.query_id]
        if stored:
            print(
                f"(the run holds a record for {query.query_id}: {stored[0].status}, "
                f"answer {stored[0].exact_answer!r}; running it again here, not saved)\n"
            )
    print(f"Question: {query.query}\n")
    show = functools.partial(_show_event, lines=args.lines)
    record = api.ask(
        cfg,
        query,
        benchmark=benchmark,
        spill_dir=args.spill_dir,
        on_event=show,
        save=args.save,
        log=log,
    )
    _print_outcome(record, query)
    return 0 if record.status == "completed" else 1


def _show_event(kind: str, data: dict[str, Any], lines: int) -> None:
    """One event of the trajectory as it happens: a model turn and its tool calls, a tool's
    observation (its first `lines` lines), a steer."""
    if kind == "model":
        if data["content"]:
            print(f"--- model (turn {data['turn']}):\n{data['content']}\n")
        for call in data["tool_calls"]:
            fn = call["function"]
            print(f"--- turn {data['turn']} calls {fn['name']} {fn['arguments']}")
    elif kind == "tool":
        observation = data["observation"].splitlines()
        more = (
            f"\n    ... ({len(observation) - lines} more lines)" if len(observation) > lines else ""
        )
        print("    " + "\n    ".join(observation[:lines]) + more + "\n")
    elif kind == "steer":
        print(f"--- steer: submit now (at {data['charged']:.1f} s charged)\n")


def _print_outcome(record: QueryRecord, query: Query) -> None:
    """The query's outcome: status, answers, tool calls, tokens, time and documents."""
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


def cmd_offline_provider(args: argparse.Namespace) -> int:
    """The offline models on 127.0.0.1 until interrupted."""
    from piserini_ray import api

    api.serve_offline(config_from(args), args.port)
    return 0
