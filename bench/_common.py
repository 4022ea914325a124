"""What every bench script shares: the table header, appending to RESULTS.md, percentiles, and
a benchmark of N queries cycling the embedded sample's questions."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from piserini_ray.data.loaders import sample_dir
from piserini_ray.records import Usage

RESULTS = Path(__file__).parent / "RESULTS.md"


def header(title: str, detail: str = "") -> list[str]:
    """A table's heading and its machine, date and command line."""
    script = Path(sys.argv[0]).name
    return [
        f"## {title} ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. Command: `python bench/{script} "
        f"{' '.join(sys.argv[1:])}`.{' ' + detail if detail else ''}",
        "",
    ]


def append_results(lines: list[str]) -> None:
    """Print a table and append it to RESULTS.md."""
    table = "\n".join(lines)
    print(table)
    with open(RESULTS, "a") as f:
        f.write("\n" + table + "\n")


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * (len(values) - 1) + 0.5))]


def cycled_sample(folder: Path, count: int, name: str, prefix: str, model: str = "") -> Path:
    """A JSONL benchmark of `count` queries cycling the sample's questions (ids `prefix0000`...)
    over the sample's corpus; returns its config.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    sample = sample_dir()
    # Each cycled query keeps the evidence of the question it repeats, under its own id.
    evidence: dict[str, list[str]] = {}
    for line in (sample / "qrels_evidence.txt").read_text().splitlines():
        qid, _, docid, rel = line.split()
        evidence.setdefault(qid, []).append(f"{docid} {rel}")
    with open(folder / "queries.jsonl", "wb") as f, open(folder / "qrels.txt", "w") as qrels:
        for query, source in cycled_queries(count, prefix, with_source=True):
            f.write(orjson.dumps(query) + b"\n")
            for row in evidence.get(source, []):
                qrels.write(f"{query['query_id']} Q0 {row}\n")
    (folder / "config.yaml").write_text(
        f"benchmark:\n  source: jsonl\n  name: {name}\n  queries: queries.jsonl\n"
        f"  corpus: {sample / 'corpus.jsonl'}\n"
        "  qrels_evidence: qrels.txt\n" + (f"model:\n  name: {model}\n" if model else "")
    )
    return folder / "config.yaml"


def cycled_queries(count: int, prefix: str, with_source: bool = False) -> Iterator[Any]:
    """`count` queries cycling the sample's (ids `prefix0000`...); with `with_source`, pairs
    (query, the id of the sample question it repeats)."""
    lines = (sample_dir() / "queries.jsonl").read_bytes().splitlines()
    sample = [orjson.loads(x) for x in lines]
    for i in range(count):
        source = sample[i % len(sample)]
        query = dict(source, query_id=f"{prefix}{i:04d}")
        yield (query, source["query_id"]) if with_source else query


def bill_usage(line: Any) -> Usage:
    """The offline provider's usage of a request or a bill line (`prompt_tokens`, ...) as our
    usage record, to price it with the run's table; a missing line bills nothing."""
    if line is None:
        return Usage()
    return Usage(
        input_tokens=line.prompt_tokens,
        cached_tokens=line.cached_tokens,
        cache_write_tokens=line.cache_write_tokens,
        cache_write_1h_tokens=line.cache_write_1h_tokens,
        output_tokens=line.completion_tokens,
    )
