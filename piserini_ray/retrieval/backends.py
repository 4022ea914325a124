"""The retrieval backends behind the `search` tool: `bm25`, `dense`, `hybrid` and `rerank`.

Each returns a `Ranking` of docstore ordinals, so the tools, excerpts, spill files and the
document sets of the metrics are the same whatever ranked the hits. Every backend serves
documents from the Lucene index's docstore (`BM25Searcher`), which the dense side shares.

- `dense`: the query vector's `depth` nearest documents in the FAISS index.
- `hybrid`: BM25 and dense each retrieve `hybrid.fusion_depth` hits, fused by reciprocal rank
  (`sum 1 / (rrf_k + rank)`) or linearly (`alpha * dense + (1 - alpha) * bm25` over min-max
  normalised scores, a side that lacks a document giving it 0).
- `rerank`: the BM25 top `depth` reordered by the inner product with each document's stored
  vector (no document is encoded at query time); `rerank.alpha` < 1 interpolates with BM25 as
  `hybrid` does.

Ties go to the smaller docid, as Anserini breaks BM25 ties. `fuse_rrf`, `fuse_linear` and
`rerank_scores` are plain functions of rankings, tested against an independent numpy
computation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from piserini_ray.config import RetrievalConfig
from piserini_ray.retrieval.dense_index import DenseIndex, ShardEncoder, build_dense_index
from piserini_ray.retrieval.searcher import BM25Searcher, Ranking, docid_pairs, open_searcher

#: Text in, one float32 vector out (a local model or a node's encoder actor).
QueryEncoder = Callable[[str], np.ndarray]


def minmax(scores: np.ndarray) -> np.ndarray:
    """Scores mapped onto [0, 1]; all equal scores map to 1."""
    scores = scores.astype(np.float64)
    if len(scores) == 0:
        return scores
    low, high = scores.min(), scores.max()
    if high == low:
        return np.ones_like(scores)
    return (scores - low) / (high - low)


def top_ranking(
    ordinals: np.ndarray, scores: np.ndarray, k: int, docid_order: np.ndarray
) -> Ranking:
    """The `k` best by score (float64 in), ties by docid (`docid_order[o]`: o's rank by docid)."""
    order = np.lexsort((docid_order[ordinals], -scores))[:k]
    return Ranking(ordinals[order].astype(np.int32), scores[order].astype(np.float32))


def _fuse(parts: list[tuple[Ranking, np.ndarray]], k: int, docid_order: np.ndarray) -> Ranking:
    """Each (ranking, per-hit contribution) adds its contributions to its documents' scores;
    the `k` best of the sums."""
    fused: dict[int, float] = {}
    for ranking, contributions in parts:
        for ordinal, value in zip(ranking.ordinals.tolist(), contributions.tolist(), strict=True):
            fused[ordinal] = fused.get(ordinal, 0.0) + value
    ordinals = np.fromiter(fused, dtype=np.int64, count=len(fused))
    scores = np.fromiter(fused.values(), dtype=np.float64, count=len(fused))
    return top_ranking(ordinals, scores, k, docid_order)


def fuse_rrf(rankings: list[Ranking], rrf_k: int, k: int, docid_order: np.ndarray) -> Ranking:
    """Reciprocal rank fusion: each list adds 1 / (rrf_k + rank) for its documents."""
    return _fuse([(r, 1.0 / (rrf_k + np.arange(1, len(r) + 1))) for r in rankings], k, docid_order)


def fuse_linear(
    bm25: Ranking, dense: Ranking, alpha: float, k: int, docid_order: np.ndarray
) -> Ranking:
    """alpha * dense + (1 - alpha) * bm25, over min-max normalised scores (absent side: 0)."""
    parts = [(bm25, (1.0 - alpha) * minmax(bm25.scores)), (dense, alpha * minmax(dense.scores))]
    return _fuse(parts, k, docid_order)


def rerank_scores(
    bm25: Ranking, doc_vectors: np.ndarray, query: np.ndarray, alpha: float
) -> np.ndarray:
    """Each BM25 hit's new score: its vector's inner product with the query's, interpolated
    with its BM25 score when alpha < 1."""
    dense = doc_vectors.astype(np.float64) @ query.astype(np.float64)
    if alpha >= 1.0:
        return dense
    return alpha * minmax(dense) + (1.0 - alpha) * minmax(bm25.scores)


class _Composed:
    """The document side, served by the BM25 searcher's docstore."""

    name: str

    def __init__(self, bm25: BM25Searcher, retrieval: RetrievalConfig) -> None:
        self.bm25 = bm25
        self.retrieval = retrieval
        self.depth = retrieval.depth
        self.docstore = bm25.docstore
        docids = np.asarray(bm25.docstore.docids, dtype=object)
        self.docid_order = np.empty(len(docids), dtype=np.int64)
        self.docid_order[np.argsort(docids, kind="stable")] = np.arange(len(docids))

    @property
    def num_docs(self) -> int:
        return self.bm25.num_docs

    def docid(self, ordinal: int) -> str:
        return self.bm25.docid(ordinal)

    def title(self, ordinal: int) -> str | None:
        return self.bm25.title(ordinal)

    def contents(self, ordinal: int) -> str:
        return self.bm25.contents(ordinal)

    def ordinal(self, docid: str) -> int | None:
        return self.bm25.ordinal(docid)

    def search_docids(self, text: str, k: int | None = None) -> list[tuple[str, float]]:
        return docid_pairs(self.search(text, k), self.docstore.docids)

    def search(self, text: str, k: int | None = None) -> Ranking:
        raise NotImplementedError

    def close(self) -> None:
        self.bm25.close()


class DenseBackend(_Composed):
    name = "dense"

    def __init__(
        self,
        bm25: BM25Searcher,
        retrieval: RetrievalConfig,
        index: DenseIndex,
        encode_query: QueryEncoder,
    ) -> None:
        super().__init__(bm25, retrieval)
        self.index = index
        self.encode_query = encode_query

    def search(self, text: str, k: int | None = None) -> Ranking:
        return self.index.search(self.encode_query(text), self.depth if k is None else k)


class HybridBackend(DenseBackend):
    name = "hybrid"

    def search(self, text: str, k: int | None = None) -> Ranking:
        k = self.depth if k is None else k
        hybrid = self.retrieval.hybrid
        sparse = self.bm25.search(text, hybrid.fusion_depth)
        dense = self.index.search(self.encode_query(text), hybrid.fusion_depth)
        if hybrid.fusion == "rrf":
            return fuse_rrf([sparse, dense], hybrid.rrf_k, k, self.docid_order)
        return fuse_linear(sparse, dense, hybrid.alpha, k, self.docid_order)


class RerankBackend(DenseBackend):
    name = "rerank"

    def search(self, text: str, k: int | None = None) -> Ranking:
        sparse = self.bm25.search(text, self.depth if k is None else k)
        vectors = self.index.vectors(sparse.ordinals)
        scores = rerank_scores(
            sparse, vectors, self.encode_query(text), self.retrieval.rerank.alpha
        )
        return top_ranking(sparse.ordinals.astype(np.int64), scores, len(sparse), self.docid_order)


_BACKENDS: dict[str, type[DenseBackend]] = {
    "dense": DenseBackend,
    "hybrid": HybridBackend,
    "rerank": RerankBackend,
}


SearchBackend = BM25Searcher | DenseBackend


def open_backend(
    index_dir: Path,
    retrieval: RetrievalConfig,
    encode_query: QueryEncoder | None = None,
    bm25: BM25Searcher | None = None,
    build_with: ShardEncoder | None = None,
) -> SearchBackend:
    """The configured backend over a built Lucene index, and its dense index (built with
    `build_with`, default this process, if missing). `encode_query` defaults to a model loaded
    in this process; `bm25` reuses an open searcher."""
    bm25 = bm25 or open_searcher(index_dir, retrieval)
    if retrieval.backend == "bm25":
        return bm25
    dense_dir = build_dense_index(index_dir, retrieval.dense, build_with)
    index = DenseIndex(dense_dir, bm25.docstore)
    return _BACKENDS[retrieval.backend](
        bm25, retrieval, index, encode_query or local_query_encoder(retrieval)
    )


def local_query_encoder(retrieval: RetrievalConfig) -> QueryEncoder:
    """Queries encoded by a model in this process (the local engine, the analyses)."""
    from piserini_ray.retrieval.encoder import TextEncoder

    encoder = TextEncoder(retrieval.dense)

    def encode(text: str) -> np.ndarray:
        return encoder.encode_queries([text])[0]

    return encode
