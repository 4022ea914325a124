"""Exports of a run for other tools: BrowseComp-Plus run files and TREC runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from piserini_ray.records import QueryRecord, RankingLog


def browsecomp_plus_run(record: QueryRecord) -> dict[str, Any]:
    """One query in the BrowseComp-Plus run format (SPEC §5), so their scripts read our runs.

    `retrieved_docids` are the documents the agent was shown (previewed) or opened, the closest
    match to what their search tool returns; every tool call becomes a `tool_call` item with its
    observation, model text between calls a `reasoning` item, and the final answer `output_text`.
    """
    result: list[dict[str, Any]] = []
    for turn in record.trajectory:
        if turn.tool_calls and turn.model_output:
            result.append(
                {
                    "type": "reasoning",
                    "tool_name": None,
                    "arguments": None,
                    "output": turn.model_output,
                }
            )
        for call in turn.tool_calls:
            result.append(
                {
                    "type": "tool_call",
                    "tool_name": call.name,
                    "arguments": call.arguments,
                    "output": call.observation,
                }
            )
    result.append(
        {
            "type": "output_text",
            "tool_name": None,
            "arguments": None,
            "output": record.final_answer or "",
        }
    )
    retrieved = list(dict.fromkeys(record.previewed + record.opened))
    return {
        "query_id": record.query_id,
        "tool_call_counts": record.tool_call_counts,
        "status": record.status,
        "retrieved_docids": retrieved,
        "result": result,
        "metadata": {
            "model": record.model,
            "run_id": record.run_id,
            "config_hash": record.config_hash,
            "framework": "piserini_ray",
        },
        "usage": {
            "input_tokens": record.usage.input_tokens,
            "input_tokens_cached": record.usage.cached_tokens,
            "output_tokens": record.usage.output_tokens,
            "reasoning_tokens": record.usage.reasoning_tokens,
        },
    }


def export_browsecomp_plus(records: list[QueryRecord], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for record in records:
        path = out / f"{record.query_id}.json"
        path.write_bytes(orjson.dumps(browsecomp_plus_run(record), option=orjson.OPT_INDENT_2))
        paths.append(path)
    return paths


def merged_ranking(searches: list[RankingLog]) -> list[str]:
    """A query's searches as one ranking: each document at its best rank in any search (ties
    go to the earlier search), so trec_eval / ranx see what the agent could have reached."""
    best: dict[str, tuple[int, int]] = {}
    for order, search in enumerate(searches):
        for rank, docid in enumerate(search.docids, start=1):
            key = (rank, order)
            if docid not in best or key < best[docid]:
                best[docid] = key
    return sorted(best, key=lambda d: best[d])


def export_trec(rankings: dict[str, list[RankingLog]], out: Path, tag: str) -> list[Path]:
    """`first-search.trec` (each query's first ranking, as issued) and `merged.trec`."""
    out.mkdir(parents=True, exist_ok=True)
    runs = {
        "first-search.trec": {q: s[0].docids for q, s in rankings.items() if s},
        "merged.trec": {q: merged_ranking(s) for q, s in rankings.items() if s},
    }
    paths = []
    for name, ranked in runs.items():
        lines = [
            f"{qid} Q0 {docid} {rank} {len(docids) - rank + 1} {tag}"
            for qid, docids in sorted(ranked.items())
            for rank, docid in enumerate(docids, start=1)
        ]
        (out / name).write_text("\n".join(lines) + "\n")
        paths.append(out / name)
    return paths
