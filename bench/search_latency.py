"""Search latency at depth 1000: piserini_ray's fast path against pyserini's LuceneSearcher and
Anserini's Java searcher called directly; the other two tools; the memory of one replica.

Usage:
    python bench/search_latency.py                      # the embedded sample
    python bench/search_latency.py --synthetic 20000    # plus a synthetic corpus of N documents
    python bench/search_latency.py --corpus bench/out/corpus   # plus `bench/corpus.py`'s corpus

Prints a markdown table and appends it to bench/RESULTS.md with the machine, date and command.
All paths run in one process on the same index and queries, interleaved, after a warm-up, so
the ratios are comparable even on a noisy machine. Import times and the replica's memory are
measured in fresh processes.

"Anserini direct" is `SimpleSearcher.batch_search` (the Java searcher that pyserini wraps) called
with one query at a time: one JNI call whose result stays in Java, so its time is Java's own.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from _common import append_results, header, percentile

from piserini_ray.config import (
    BenchmarkConfig,
    RetrievalConfig,
    ToolsConfig,
    default_home,
    load_config,
)
from piserini_ray.data import load_benchmark
from piserini_ray.data.loaders import jsonl_corpus
from piserini_ray.retrieval import BM25Searcher, build_index, open_searcher, read_index_info
from piserini_ray.retrieval.jvm import autoclass
from piserini_ray.retrieval.searcher import PyseriniReference
from piserini_ray.tools import ToolResult, ToolSession


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


def measure(index: Path, queries: list[str], rounds: int) -> dict[str, list[float]]:
    ours = BM25Searcher(index)
    reference = PyseriniReference(index)
    lucene = ours._searcher  # the Lucene IndexSearcher alone: the floor under every path
    generator, analyzer, sort = ours._generator, ours._analyzer, ours._sort
    java_list = autoclass("java.util.ArrayList")
    anserini = reference.searcher.object  # io.anserini.search.SimpleSearcher

    def lucene_only(q: str) -> None:
        lucene.search(generator.buildQuery("contents", analyzer, q), 1000, sort, True)

    def anserini_direct(q: str) -> None:
        batch, qid = java_list(), java_list()
        batch.add(q)
        qid.add("q")
        anserini.batch_search(batch, qid, 1000, 1)

    def tool(q: str) -> None:
        ToolSession(ours, ToolsConfig()).call("search", {"reason": "bench", "query": q})

    paths = {
        "lucene IndexSearcher only (no hits read)": lucene_only,
        "Anserini SimpleSearcher, direct (Java)": anserini_direct,
        "piserini_ray BM25Searcher.search": lambda q: ours.search(q),
        "piserini_ray search tool (ranking + page 1)": tool,
        "pyserini LuceneSearcher.search": lambda q: reference.searcher.search(q, 1000),
    }
    for q in queries[:20]:  # JIT warm-up
        for fn in paths.values():
            fn(q)
    times: dict[str, list[float]] = {name: [] for name in paths}
    times |= {"read_search_results (page 2)": [], "read_document (first page, top hit)": []}
    for _ in range(rounds):
        for q in queries:
            for name, fn in paths.items():
                started = time.perf_counter()
                fn(q)
                times[name].append((time.perf_counter() - started) * 1000)
            session = ToolSession(ours, ToolsConfig())
            search_id, docid = _first_search(session.call("search", {"reason": "b", "query": q}))
            follow_ups = {
                "read_search_results (page 2)": (
                    "read_search_results",
                    {"search_id": search_id, "offset": 6},
                ),
                "read_document (first page, top hit)": ("read_document", {"docid": docid}),
            }
            for name, (tool_name, arguments) in follow_ups.items():
                if None in arguments.values():
                    continue
                started = time.perf_counter()
                session.call(tool_name, {"reason": "bench", **arguments})
                times[name].append((time.perf_counter() - started) * 1000)
    return times


def _first_search(result: ToolResult) -> tuple[str | None, str | None]:
    """The search id and the top hit's docid in a search tool's output."""
    search = re.search(r"^Search (s\d+) for ", result.output, re.M)
    hit = re.search(r"^\[1\] docid: (\S+)", result.output, re.M)
    return (search[1] if search else None), (hit[1] if hit else None)


def probe_memory(index: Path, queries: list[str]) -> dict[str, int]:
    """Run in a fresh process (`--memory-probe`): open the index as a replica does (its JVM heap
    cap included), run 1,000 searches each followed by opening its top hit, and read this
    process's /proc smaps_rollup and JVM heap figures."""
    searcher = open_searcher(index, RetrievalConfig())
    for i in range(1000):
        session = ToolSession(searcher, ToolsConfig())
        _, docid = _first_search(
            session.call("search", {"reason": "m", "query": queries[i % len(queries)]})
        )
        if docid:
            session.call("read_document", {"reason": "m", "docid": docid})
    rollup = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":")
        rollup[key] = int(value.split()[0]) * 1024
    runtime = autoclass("java.lang.Runtime").getRuntime()
    rollup["jvm_heap_used"] = runtime.totalMemory() - runtime.freeMemory()
    rollup["jvm_heap_committed"] = runtime.totalMemory()
    return rollup


def replica_memory(index: Path, queries: list[str]) -> dict[str, int]:
    """`probe_memory` in a fresh process, so that nothing this one loaded is counted."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "queries.json").write_text(json.dumps(queries))
        command = [sys.executable, __file__, "--memory-probe", str(index), f"{tmp}/queries.json"]
        out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_corpus_queries(folder: Path, count: int, seed: int = 0) -> list[str]:
    """`bench/corpus.py`'s rare-term queries, plus as many BrowseComp-like long queries: 8-20
    words of the Zipfian vocabulary's middle ranks."""
    rare = [orjson.loads(x)["query"] for x in (folder / "queries.jsonl").read_bytes().splitlines()]
    rng = random.Random(seed)
    long = [
        " ".join(f"w{rng.randint(50, 20_000)}" for _ in range(rng.randint(8, 20)))
        for _ in range(count // 2)
    ]
    return [q for pair in zip(rare[: count // 2], long, strict=False) for q in pair]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", type=int, default=0, help="also bench N synthetic docs")
    parser.add_argument("--corpus", type=Path, help="also bench a `bench/corpus.py` folder")
    parser.add_argument("--queries", type=int, default=300, help="queries on --corpus")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-probe", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        index, queries = args.memory_probe
        print(json.dumps(probe_memory(index, json.loads(queries.read_text()))))
        return
    root = default_home() / "indexes"
    sample = load_benchmark(BenchmarkConfig())
    targets = [("embedded sample (1,890 docs)", build_index(sample.corpus, root),
                [q.query for q in sample.queries], args.rounds)]  # fmt: skip
    if args.synthetic:
        path, queries = synthetic_corpus(args.synthetic, default_home())
        started = time.perf_counter()
        index = build_index(jsonl_corpus(path, name=f"synthetic-{args.synthetic}"), root)
        print(f"synthetic index ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        targets.append((f"synthetic ({args.synthetic:,} docs)", index, queries, args.rounds))
    if args.corpus:
        corpus = load_benchmark(load_config(args.corpus / "config.yaml").benchmark).corpus
        index = build_index(corpus, root, log=lambda m: print(m, file=sys.stderr))
        queries = bench_corpus_queries(args.corpus, args.queries)
        docs = read_index_info(index).num_docs
        targets.append((f"bench/corpus.py ({docs:,} docs)", index, queries, 1))

    java_version = autoclass("java.lang.System").getProperty("java.version")
    lines = [
        *header("Search latency at depth 1000", f"Java {java_version}."),
        "| corpus | path | queries | p50 ms | p90 ms | p50 / Anserini direct p50 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    goals = []
    for label, index, queries, rounds in targets:
        times = measure(index, queries, rounds)
        base = statistics.median(times["Anserini SimpleSearcher, direct (Java)"])
        for name, values in times.items():
            p50 = statistics.median(values)
            lines.append(
                f"| {label} | {name} | {len(values)} | {p50:.2f} | "
                f"{percentile(values, 0.9):.2f} | {p50 / base:.2f} |"
            )
        ours_p50 = statistics.median(times["piserini_ray search tool (ranking + page 1)"])
        ratio = ours_p50 / base
        goals.append(
            f"- {label}: our search tool p50 {ours_p50:.2f} ms = {ratio:.2f}x the direct Java "
            f"p50 {base:.2f} ms (goal <= 2.0x: {'met' if ratio <= 2.0 else 'MISSED'})"
        )
    lines += ["", *goals]
    label, index, queries, _ = targets[-1]
    memory = replica_memory(index, queries)
    gib = 2**30
    private = memory["Anonymous"]
    lines += [
        "",
        f"One replica's memory after 1,000 searches (each opening its top hit) on {label}, "
        "from /proc/self/smaps_rollup of a fresh process with a replica's settings "
        "(JVM heap cap 1g):",
        "",
        "| memory | GiB |",
        "|---|---:|",
        f"| private (anonymous: Python, JVM heap and native) | {private / gib:.3f} |",
        f"| file-backed resident (index and docstore pages, shared page cache) | "
        f"{(memory['Rss'] - private) / gib:.3f} |",
        f"| RSS | {memory['Rss'] / gib:.3f} |",
        f"| JVM heap used / committed | {memory['jvm_heap_used'] / gib:.3f} / "
        f"{memory['jvm_heap_committed'] / gib:.3f} |",
        "",
        f"Private memory goal <= 1.0 GiB: {'met' if private <= gib else 'MISSED'}.",
    ]
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
    ]
    append_results(lines)


if __name__ == "__main__":
    main()
