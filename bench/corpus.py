"""A BrowseComp-shaped synthetic corpus: N documents (default 100,195) with log-normal lengths
(median about 2,000 tokens, 90th percentile about 14,000, mean about 5,179 words), a Zipfian
vocabulary, seeded; plus queries built from rare terms of chosen documents, so their evidence
qrels are known.

    python bench/corpus.py --docs 100195 --queries 830 --out bench/out/corpus
    python bench/corpus.py --index       # also build the index; appends to bench/RESULTS.md
    # or later: piserini-ray index --config bench/out/corpus/config.yaml

Writes corpus.jsonl, queries.jsonl, qrels_evidence.txt, qrels_gold.txt, a config.yaml and
params.json; a folder already holding the same parameters' corpus is not written again. Lengths
are counted in words: the vocabulary's words ("w123") are not English, so a tokenizer's count of
them would say nothing about BrowseComp-Plus; at ~1.33 tokens a word, 1,500 words is ~2,000
tokens.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import numpy as np
import orjson

VOCABULARY = 200_000
# Log-normal word counts: median 1,500 words (~2,000 tokens); sigma = sqrt(2 ln(5179 / 1500))
# makes the mean 5,179 words, which puts the 90th percentile near 11,000 words (~14,500 tokens).
MEDIAN_WORDS, SIGMA = 1500, 1.574


def generate(out: Path, docs: int, queries: int, seed: int) -> tuple[dict[str, float], bool]:
    """Write the corpus (unless this folder holds it already); its length statistics, and
    whether it was written now."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    ranks = np.arange(1, VOCABULARY + 1)
    zipf = 1 / ranks
    zipf /= zipf.sum()
    lengths = np.minimum(
        rng.lognormal(math.log(MEDIAN_WORDS), SIGMA, size=docs).astype(int) + 20, 120_000
    )
    chosen = set(random.Random(seed).sample(range(docs), min(queries * 3, docs)))
    # Each chosen document gets 3 rare terms appended.
    stats = _length_stats(lengths + 3 * np.isin(np.arange(docs), sorted(chosen)))
    params = {"docs": docs, "queries": queries, "seed": seed, "vocabulary": VOCABULARY}
    done = out / "params.json"
    if done.exists() and orjson.loads(done.read_bytes()) == params:
        return stats, False
    rare: dict[int, list[str]] = {}
    vocabulary = [f"w{w}" for w in range(VOCABULARY)]
    cdf = np.cumsum(zipf)
    with open(out / "corpus.jsonl", "wb") as f:
        for i in range(docs):
            # Inverse-CDF sampling: rng.choice(p=...) would rebuild the CDF for every document.
            words = np.searchsorted(cdf, rng.random(int(lengths[i])), side="right")
            text = " ".join(map(vocabulary.__getitem__, np.minimum(words, VOCABULARY - 1).tolist()))
            if i in chosen:
                # Three terms no other document has: a query made of them finds this one.
                marks = [f"r{i}x{j}" for j in range(3)]
                rare[i] = marks
                text = f"{text} {' '.join(marks)}"
            f.write(orjson.dumps({"docid": f"doc{i}", "text": text}) + b"\n")
    picked = sorted(rare)
    with (
        open(out / "queries.jsonl", "wb") as q,
        open(out / "qrels_evidence.txt", "w") as ev,
        open(out / "qrels_gold.txt", "w") as gold,
    ):
        for n in range(queries):
            a, b, c = picked[3 * n : 3 * n + 3]
            text = " ".join([rare[a][0], rare[b][1], rare[c][2], "w1", "w17"])
            q.write(orjson.dumps({"query_id": str(n), "query": text, "answer": f"doc{a}"}) + b"\n")
            for docid in (a, b, c):
                ev.write(f"{n} Q0 doc{docid} 1\n")
            gold.write(f"{n} Q0 doc{a} 1\n")
    (out / "config.yaml").write_text(
        "benchmark:\n  source: jsonl\n  name: synthetic\n  queries: queries.jsonl\n"
        "  corpus: corpus.jsonl\n  qrels_evidence: qrels_evidence.txt\n"
        "  qrels_gold: qrels_gold.txt\n"
    )
    done.write_bytes(orjson.dumps(params))
    return stats, True


def _length_stats(words: np.ndarray) -> dict[str, float]:
    return {
        "docs": len(words),
        "median_words": float(np.median(words)),
        "p90_words": float(np.percentile(words, 90)),
        "mean_words": float(words.mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100_195)
    parser.add_argument("--queries", type=int, default=830)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/out/corpus"))
    parser.add_argument("--index", action="store_true", help="also build the index and time it")
    args = parser.parse_args()
    started = time.monotonic()
    stats, wrote = generate(args.out, args.docs, args.queries, args.seed)
    written = time.monotonic() - started
    print(stats)
    if not args.index:
        return
    from _common import append_results, header

    from piserini_ray.config import load_config
    from piserini_ray.data import load_benchmark
    from piserini_ray.retrieval import ensure_index, read_index_info

    config = load_config(args.out / "config.yaml")
    index = ensure_index(load_benchmark(config.benchmark).corpus, config.retrieval, print)
    info = read_index_info(index)
    lucene = sum(p.stat().st_size for p in (index / "lucene").iterdir())
    everything = sum(p.stat().st_size for p in index.rglob("*") if p.is_file())
    source = (args.out / "corpus.jsonl").stat().st_size
    gib = 2**30
    rows = [
        ("documents", f"{info.num_docs:,}", "100,195"),
        (
            "median length",
            f"{stats['median_words']:,.0f} words (~{1.33 * stats['median_words']:,.0f} tokens)",
            "~2,000 tokens",
        ),
        (
            "90th percentile length",
            f"{stats['p90_words']:,.0f} words (~{1.33 * stats['p90_words']:,.0f} tokens)",
            "~14,000 tokens",
        ),
        ("mean length", f"{stats['mean_words']:,.0f} words", "~5,179 words"),
        (
            "corpus.jsonl",
            f"{source / gib:.2f} GiB"
            + (f" (written in {written:.0f} s)" if wrote else " (already written)"),
            "-",
        ),
        ("index build (Anserini, 2 threads, + docstore)", f"{info.build_seconds:.0f} s", "-"),
        ("Lucene index (positions, raw documents stored)", f"{lucene / gib:.2f} GiB", "-"),
        ("whole index folder (Lucene + docstore + tables)", f"{everything / gib:.2f} GiB", "-"),
    ]
    lines = [
        *header("BrowseComp-shaped corpus", f"Index {index.name}, built {info.built_at}."),
        "| figure | measured | BrowseComp-Plus |",
        "|---|---:|---:|",
        *[f"| {name} | {value} | {target} |" for name, value, target in rows],
    ]
    append_results(lines)


if __name__ == "__main__":
    main()
