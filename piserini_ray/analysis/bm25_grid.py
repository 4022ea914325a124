"""BM25 tuning and the no-LLM retrieval baseline: each query's raw question, searched at depth
1000, scored against evidence and gold qrels (the paper's Figure 3 grid, plus more objectives).

Plain functions over a searcher; `engines/ray/bm25_grid.py` fans the grid's cells out to replicas.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from piserini_ray.config import BM25Params, RetrievalConfig
from piserini_ray.data import Benchmark, Query
from piserini_ray.metrics.ranking import average_precision, mean, ndcg_at, recall_at
from piserini_ray.retrieval.searcher import BM25Searcher

#: Objectives in tie-break order: the chosen one first, then the others as listed here.
OBJECTIVES = ("evidence_recall@1000", "evidence_recall@100", "gold_recall@1000", "ndcg@10", "map")
DEFAULT_K1 = [round(0.3 + 0.1 * i, 1) for i in range(13)] + [
    2.0,
    4.0,
    8.0,
    12.0,
    16.0,
    20.0,
    25.0,
    30.0,
]
DEFAULT_B = [round(0.1 * i, 1) for i in range(11)]
PYSERINI_DEFAULT = (0.9, 0.4)


class CellResult(BaseModel):
    k1: float
    b: float
    queries: int
    metrics: dict[str, float | None]


def score_rankings(
    rankings: dict[str, list[str]], benchmark: Benchmark, depths: Iterable[int] = (10, 100, 1000)
) -> dict[str, float | None]:
    """Every objective, plus recall at the given depths, averaged over queries with qrels."""

    def relevant(table: dict, qid: str) -> set[str]:
        return {d for d, r in table.get(qid, {}).items() if r > 0}

    ev = {q: relevant(benchmark.evidence, q) for q in rankings}
    gold = {q: relevant(benchmark.gold, q) for q in rankings}
    out: dict[str, float | None] = {}
    for k in sorted(set(depths) | {100, 1000}):
        out[f"evidence_recall@{k}"] = mean([recall_at(r, ev[q], k) for q, r in rankings.items()])
        out[f"gold_recall@{k}"] = mean([recall_at(r, gold[q], k) for q, r in rankings.items()])
    out["ndcg@10"] = mean([ndcg_at(r, ev[q], 10) for q, r in rankings.items()])
    out["map"] = mean([average_precision(r, ev[q]) for q, r in rankings.items()])
    return out


def evaluate_cell(
    searcher: BM25Searcher,
    queries: Sequence[Query],
    benchmark: Benchmark,
    k1: float,
    b: float,
    depth: int = 1000,
) -> CellResult:
    """Re-set BM25 on this replica (no index rebuild) and score the raw questions."""
    searcher.set_bm25(BM25Params(k1=k1, b=b))
    rankings = {q.query_id: [d for d, _ in searcher.search_docids(q.query, depth)] for q in queries}
    return CellResult(k1=k1, b=b, queries=len(queries), metrics=score_rankings(rankings, benchmark))


class BackendScores(BaseModel):
    """The no-LLM floor of one retrieval backend: its rankings of the raw questions, scored."""

    backend: str
    queries: int
    metrics: dict[str, float | None]
    rankings: dict[str, list[str]]


EVAL_DEPTHS = (5, 10, 20, 50, 100, 200, 500, 1000)


def evaluate_backends(
    index_dir: Path,
    retrieval: RetrievalConfig,
    queries: Sequence[Query],
    benchmark: Benchmark,
    backends: Sequence[str],
) -> list[BackendScores]:
    """Each backend's floor on the same queries at the configured depth; one BM25 searcher
    and one query encoder serve them all (each query is encoded once)."""
    from piserini_ray.retrieval.backends import QueryEncoder, local_query_encoder, open_backend
    from piserini_ray.retrieval.searcher import open_searcher

    bm25 = open_searcher(index_dir, retrieval)
    encode: QueryEncoder | None = None
    if any(b != "bm25" for b in backends):
        model = local_query_encoder(retrieval)
        vectors: dict[str, np.ndarray] = {}

        def encode(text: str) -> np.ndarray:
            if text not in vectors:  # (setdefault would run the model every time)
                vectors[text] = model(text)
            return vectors[text]

    out = []
    for backend in backends:
        searcher = open_backend(index_dir, retrieval.for_backend(backend), encode, bm25=bm25)
        rankings = {q.query_id: [d for d, _ in searcher.search_docids(q.query)] for q in queries}
        metrics = score_rankings(rankings, benchmark, depths=EVAL_DEPTHS)
        out.append(
            BackendScores(backend=backend, queries=len(queries), metrics=metrics, rankings=rankings)
        )
    return out


def best_cell(cells: Sequence[CellResult], objective: str) -> CellResult:
    """The argmax of `objective`; ties go to the next objectives, then to smaller k1 and b."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    order = [objective, *[o for o in OBJECTIVES if o != objective]]

    def key(cell: CellResult) -> tuple:
        values = tuple(-(cell.metrics.get(o) or 0.0) for o in order)
        return (*values, cell.k1, cell.b)

    return min(cells, key=key)


class GridStore:
    """`cells.jsonl` in the output folder: finished cells are never recomputed. Crash-safe like
    a run's files (`store.JsonlFile`): a torn last line is cut off and that cell runs again."""

    def __init__(self, folder: Path, log: Callable[[str], None] | None = None) -> None:
        from piserini_ray.store import JsonlFile

        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "cells.jsonl"
        self._file = JsonlFile(self.path, log or (lambda m: print(m, file=sys.stderr)))

    def done(self) -> dict[tuple[float, float], CellResult]:
        cells = (CellResult.model_validate(row) for row in self._file.read())
        return {(cell.k1, cell.b): cell for cell in cells}

    def add(self, cell: CellResult) -> None:
        self._file.append(cell.model_dump())
