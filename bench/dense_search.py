"""Dense search at depth 1000 against its floor (FAISS alone) and against BM25 on the same
queries; encoding throughput; memory of a process holding the encoder.

Usage:
    python bench/dense_search.py                     # the embedded sample
    python bench/corpus.py --docs 10000 --queries 200 --out bench/out/corpus10k
    python bench/dense_search.py --config bench/out/corpus10k/config.yaml
        # a BrowseComp-shaped corpus of 10K documents (the full 100K would take hours to
        # encode on 2 cores: its documents are long, each encoded up to doc_max_length)

Per query, in one process and interleaved after a warm-up: the query encode (all-MiniLM-L6-v2
in this process), FAISS alone (`IndexFlatIP.search` on the encoded vector: the floor), the
`dense` backend's whole search (FAISS as pyserini's `FaissSearcher` searches it, to ordinals
and scores), the search
tool over it (the formatted page the agent sees), the `hybrid` and `rerank` backends, and BM25
at depth 1000. Prints a markdown table and appends it to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

import numpy as np
from _common import append_results, header, percentile

from piserini_ray.config import RetrievalConfig, RunConfig, load_config
from piserini_ray.data import load_benchmark
from piserini_ray.retrieval import ensure_index
from piserini_ray.retrieval.backends import open_backend
from piserini_ray.retrieval.dense_index import build_dense_index, find_dense_index
from piserini_ray.retrieval.encoder import TextEncoder
from piserini_ray.retrieval.searcher import open_searcher
from piserini_ray.tools import ToolSession


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, help="a run config (default: the sample)")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument(
        "--ray",
        action="store_true",
        help="also the memory of a BM25 replica, a dense replica "
        "and the node's encoder actor on a local Ray",
    )
    args = parser.parse_args()
    config = load_config(args.config)
    benchmark = load_benchmark(config.benchmark)
    corpus = benchmark.corpus
    label = "the embedded sample" if args.config is None else str(args.config)
    retrieval = config.retrieval
    index = ensure_index(corpus, retrieval, print)
    found = find_dense_index(index, retrieval.dense) is not None
    started = time.monotonic()
    build_dense_index(index, retrieval.dense)
    built = time.monotonic() - started
    encoder = TextEncoder(retrieval.dense)
    bm25 = open_searcher(index, retrieval)
    vectors: dict[str, np.ndarray] = {}

    def encode(text: str) -> np.ndarray:
        return vectors[text]

    backends = {
        name: open_backend(index, retrieval.for_backend(name), encode, bm25=bm25)
        for name in ("dense", "hybrid", "rerank")
    }
    faiss_index = backends["dense"].index.index  # type: ignore[union-attr]
    texts = [q.query for q in benchmark.queries][: args.queries]
    times: dict[str, list[float]] = {
        k: [] for k in ("encode", "faiss", "dense", "tool", "hybrid", "rerank", "bm25")
    }
    for round_ in range(2):  # the first round warms up
        for text in texts:
            t0 = time.perf_counter()
            vectors[text] = encoder.encode_queries([text])[0]
            t1 = time.perf_counter()
            faiss_index.search(vectors[text].reshape(1, -1), 1000)
            t2 = time.perf_counter()
            backends["dense"].search(text)
            t3 = time.perf_counter()
            ToolSession(backends["dense"]).call("search", {"reason": "bench", "query": text})
            t4 = time.perf_counter()
            backends["hybrid"].search(text)
            t5 = time.perf_counter()
            backends["rerank"].search(text)
            t6 = time.perf_counter()
            bm25.search(text)
            t7 = time.perf_counter()
            if round_:
                for key, value in zip(
                    times,
                    (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6),
                    strict=True,
                ):
                    times[key].append(value * 1000)
    docs = bm25.num_docs
    lines = header(
        f"Dense search at depth 1000 on {label}",
        f"{docs} documents, {len(texts)} queries, all-MiniLM-L6-v2 on the CPU.",
    )
    lines += [
        "| step (ms per query) | median | p95 |",
        "|---|---:|---:|",
    ]
    names = {
        "encode": "query encode (in process)",
        "faiss": "FAISS alone (the floor)",
        "dense": "dense backend search (ordinals, scores)",
        "tool": "search tool over dense (page formatted)",
        "hybrid": "hybrid (BM25 + dense at 1000 each, RRF)",
        "rerank": "rerank (BM25 top 1000 by stored vectors)",
        "bm25": "BM25 alone, depth 1000",
    }
    for key, values in times.items():
        lines.append(
            f"| {names[key]} | {statistics.median(values):.2f} | {percentile(values, 0.95):.2f} |"
        )
    build = " (found built)" if found else f" ({docs / built:.0f} passages/s, one process)"
    lines += [
        "",
        f"Index build: {built:.1f} s for {docs} documents{build}"
        + f". Peak RSS of this process (JVM, BM25, FAISS, encoder): "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB.",
    ]
    if args.ray:
        lines += ["", *ray_memory(config)]
    append_results(lines)


def _private_mb(pid: int) -> tuple[float, float]:
    """(private, proportional) resident MB of a process, from /proc smaps_rollup."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0])
    private = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return private / 1024, fields.get("Pss", 0) / 1024


def ray_memory(config: RunConfig) -> list[str]:
    """A BM25 replica, a dense replica and the node's encoder actor, each once ready."""
    import ray

    from piserini_ray.engines.ray.encoder_actors import start_node_encoders
    from piserini_ray.engines.ray.ray_env import start_ray
    from piserini_ray.engines.ray.worker import SearchWorker

    start_ray(config.runtime.model_copy(update={"num_cpus": 2}))
    retrieval = config.retrieval.with_resolved_index_root()
    dense = retrieval.for_backend("dense")
    names, handles = start_node_encoders(dense.dense)
    options = {"num_cpus": 0.5}
    bm25 = SearchWorker.options(**options).remote(config.benchmark, retrieval)  # type: ignore[attr-defined]
    replica = SearchWorker.options(**options).remote(config.benchmark, dense, names)  # type: ignore[attr-defined]
    pids = {
        "BM25 replica": ray.get(bm25.info.remote())["pid"],
        "dense replica (FAISS index, no model)": ray.get(replica.info.remote())["pid"],
        "encoder actor (the node's model)": ray.get(handles[0].info.remote())["pid"],
    }
    rows = ["| process (ready, idle) | private MB | PSS MB |", "|---|---:|---:|"]
    for label, pid in pids.items():
        private, pss = _private_mb(pid)
        rows.append(f"| {label} | {private:.0f} | {pss:.0f} |")
    ray.shutdown()
    return rows


if __name__ == "__main__":
    RetrievalConfig()  # fail fast on a broken install
    main()
