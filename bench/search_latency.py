"""Search latency at depth 1000: piserini_ray's fast path against pyserini's LuceneSearcher.

Usage:
    python bench/search_latency.py                      # the embedded sample
    python bench/search_latency.py --synthetic 20000    # plus a synthetic corpus of N documents

Prints a markdown table and appends it to bench/RESULTS.md with the machine, date and command.
All paths run in one process on the same index and queries, interleaved, after a warm-up, so
the ratios are comparable even on a noisy machine. Import times are measured in fresh processes.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson

from piserini_ray.config import BenchmarkConfig, ToolsConfig, default_home
from piserini_ray.data import load_benchmark
from piserini_ray.data.loaders import jsonl_corpus
from piserini_ray.retrieval import BM25Searcher, build_index
from piserini_ray.retrieval.jvm import autoclass
from piserini_ray.retrieval.searcher import PyseriniReference
from piserini_ray.tools import ToolSession

RESULTS = Path(__file__).parent / "RESULTS.md"


def import_seconds(code: str) -> float:
    """Wall time of `code` in a fresh interpreter (what a new actor pays)."""
    script = f"import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    return float(out.stdout.strip().splitlines()[-1])


def synthetic_corpus(n: int, folder: Path, seed: int = 0) -> tuple[Path, list[str]]:
    """N documents of Zipf-distributed words with log-normal lengths (a rough BrowseComp shape)."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(50_000)]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    path = folder / f"synthetic-{n}.jsonl"
    queries = []
    if not path.exists():
        with open(path, "wb") as f:
            for i in range(n):
                length = min(int(rng.lognormvariate(7.0, 0.9)), 20_000)
                words = rng.choices(vocab, weights, k=length)
                f.write(orjson.dumps({"docid": f"syn{i}", "text": " ".join(words)}) + b"\n")
    for _ in range(200):
        queries.append(" ".join(rng.choices(vocab[50:5000], k=rng.randint(2, 8))))
    return path, queries


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * (len(values) - 1) + 0.5))]


def measure(index: Path, queries: list[str], rounds: int) -> dict[str, list[float]]:
    ours = BM25Searcher(index)
    reference = PyseriniReference(index)
    lucene = ours._searcher  # the Lucene IndexSearcher alone: the floor under every path
    generator, analyzer, sort = ours._generator, ours._analyzer, ours._sort

    def lucene_only(q: str) -> None:
        lucene.search(generator.buildQuery("contents", analyzer, q), 1000, sort, True)

    def tool(q: str) -> None:
        ToolSession(ours, ToolsConfig()).call("search", {"reason": "bench", "query": q})

    paths = {
        "lucene IndexSearcher only (no hits read)": lucene_only,
        "piserini_ray BM25Searcher.search": lambda q: ours.search(q),
        "piserini_ray search tool (ranking + page 1)": tool,
        "pyserini LuceneSearcher.search": lambda q: reference.searcher.search(q, 1000),
    }
    for q in queries[:20]:  # JIT warm-up
        for fn in paths.values():
            fn(q)
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for q in queries:
            for name, fn in paths.items():
                started = time.perf_counter()
                fn(q)
                times[name].append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", type=int, default=0, help="also bench N synthetic docs")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = default_home() / "indexes"
    sample = load_benchmark(BenchmarkConfig())
    targets = [("embedded sample (1,890 docs)", build_index(sample.corpus, root),
                [q.query for q in sample.queries])]  # fmt: skip
    if args.synthetic:
        path, queries = synthetic_corpus(args.synthetic, default_home())
        started = time.perf_counter()
        index = build_index(jsonl_corpus(path, name=f"synthetic-{args.synthetic}"), root)
        print(f"synthetic index ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        targets.append((f"synthetic ({args.synthetic:,} docs)", index, queries))

    java_version = autoclass("java.lang.System").getProperty("java.version")
    lines = [
        f"## Search latency at depth 1000 ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, Java {java_version}. "
        f"Command: `python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}`",
        "",
        "| corpus | path | p50 ms | p90 ms | speed-up of p50 over LuceneSearcher |",
        "|---|---|---:|---:|---:|",
    ]
    for label, index, queries in targets:
        times = measure(index, queries, args.rounds)
        base = statistics.median(times["pyserini LuceneSearcher.search"])
        for name, values in times.items():
            p50 = statistics.median(values)
            lines.append(
                f"| {label} | {name} | {p50:.2f} | {percentile(values, 0.9):.2f} | "
                f"{base / p50:.1f}x |"
            )
    ours = import_seconds(
        "from piserini_ray.retrieval import jvm; jvm.boot_jvm(); "
        "from piserini_ray.retrieval import BM25Searcher"
    )
    theirs = import_seconds(
        "from piserini_ray.retrieval import jvm; jvm.boot_jvm(); jvm.import_lucene_searcher()"
    )
    lines += [
        "",
        "| import (fresh process, JVM boot included) | seconds |",
        "|---|---:|",
        f"| piserini_ray BM25Searcher | {ours:.2f} |",
        f"| pyserini LuceneSearcher (pulls torch + transformers) | {theirs:.2f} |",
        "",
    ]
    table = "\n".join(lines)
    print(table)
    with open(RESULTS, "a") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
