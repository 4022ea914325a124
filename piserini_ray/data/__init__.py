"""Benchmarks: queries, qrels and corpus, their loaders and the embedded sample."""

from piserini_ray.data.benchmark import Benchmark, Corpus, Document, Qrels, Query
from piserini_ray.data.loaders import load_benchmark, load_corpus, read_qrels, read_queries_jsonl

__all__ = [
    "Benchmark",
    "Corpus",
    "Document",
    "Qrels",
    "Query",
    "load_benchmark",
    "load_corpus",
    "read_qrels",
    "read_queries_jsonl",
]
