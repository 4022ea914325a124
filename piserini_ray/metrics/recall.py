"""Recall of the documents a run touched, against evidence and gold qrels (docs/spec.md §7).

Sets: surfaced (every hit of every cached ranking), previewed (shown on a page), opened (read),
cited (in the final answer), behavior (opened or cited). Macro = mean over queries whose qrels
are non-empty; micro = sum of hits / sum of |qrels|. Plain set arithmetic: ranx and ir-measures
compute ranking metrics, not recall of an unordered set that a behaviour produced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel

DOC_SETS = ("surfaced", "previewed", "opened", "cited", "behavior")
DEPTHS = (5, 10, 20, 50, 100, 200, 500, 1000)


class PerQueryRecall(BaseModel):
    """Hits and |qrels| of one query for one set: what macro and micro are made of."""

    query_id: str
    hits: int
    relevant: int

    @property
    def recall(self) -> float:
        return self.hits / self.relevant


def per_query(
    docs_by_query: Mapping[str, Iterable[str]], qrels: Mapping[str, Mapping[str, int]]
) -> list[PerQueryRecall]:
    """One entry per query whose qrels are non-empty (others are left out of the averages)."""
    rows = []
    for query_id, docs in docs_by_query.items():
        relevant = {d for d, rel in qrels.get(query_id, {}).items() if rel > 0}
        if relevant:
            rows.append(
                PerQueryRecall(
                    query_id=query_id, hits=len(relevant & set(docs)), relevant=len(relevant)
                )
            )
    return rows


def macro(rows: Sequence[PerQueryRecall]) -> float | None:
    return sum(r.recall for r in rows) / len(rows) if rows else None


def micro(rows: Sequence[PerQueryRecall]) -> float | None:
    total = sum(r.relevant for r in rows)
    return sum(r.hits for r in rows) / total if total else None


def best_ranks(docids: Iterable[str], rankings: Sequence[list[str]]) -> dict[str, int]:
    """The best (smallest) 1-based rank of each of `docids` over a query's searches, for those
    surfaced at all: one look answers "surfaced at depth k?" for every k (`rank <= k`). Only
    the few relevant documents are looked up (in C, by `list.index`), not every hit."""
    best: dict[str, int] = {}
    for docid in docids:
        ranks = [ranking.index(docid) + 1 for ranking in rankings if docid in ranking]
        if ranks:
            best[docid] = min(ranks)
    return best


def surfaced_at_depth(rankings: Sequence[Sequence[str]], k: int) -> set[str]:
    """What a query would have surfaced had every search returned only its top k."""
    return {docid for ranking in rankings for docid in ranking[:k]}
