"""Lucene BM25 retrieval: Java boot, index build and the searcher replica."""

from piserini_ray.retrieval.index import build_index, ensure_index, find_index, read_index_info
from piserini_ray.retrieval.searcher import BM25Searcher, Ranking, open_searcher

__all__ = [
    "BM25Searcher",
    "Ranking",
    "build_index",
    "ensure_index",
    "find_index",
    "open_searcher",
    "read_index_info",
]
