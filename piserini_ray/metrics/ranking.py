"""Ranking metrics of one ranked list against binary qrels: recall@k, nDCG@k, average precision.

Written out (a dozen lines) rather than pulling in ranx or ir-measures for three textbook
formulas; `tests/analysis/test_bm25_grid.py` checks them on hand-computed lists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def recall_at(ranking: Sequence[str], relevant: set[str], k: int) -> float | None:
    return len(relevant & set(ranking[:k])) / len(relevant) if relevant else None


def ndcg_at(ranking: Sequence[str], relevant: set[str], k: int) -> float | None:
    if not relevant:
        return None
    dcg = sum(1 / math.log2(i + 2) for i, d in enumerate(ranking[:k]) if d in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    return dcg / ideal


def average_precision(ranking: Sequence[str], relevant: set[str]) -> float | None:
    if not relevant:
        return None
    hits, total = 0, 0.0
    for i, docid in enumerate(ranking, start=1):
        if docid in relevant:
            hits += 1
            total += hits / i
    return total / len(relevant)


def mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
