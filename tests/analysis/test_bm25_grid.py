"""BM25 tuning pieces without Ray (the grid on Ray is in tests/engines/ray/test_scheduler.py)
and the where-the-evidence-sits analysis on a hand-made run."""

from pathlib import Path

import pytest

from piserini_ray.analysis.bm25_grid import CellResult, best_cell
from piserini_ray.data import Benchmark, Query
from piserini_ray.data.benchmark import Corpus
from piserini_ray.metrics.ranking import average_precision, ndcg_at, recall_at
from piserini_ray.records import QueryRecord, RankingLog, now_iso
from piserini_ray.reports.evidence import evidence_ranks, write_evidence_ranks


def test_ranking_metrics_by_hand() -> None:
    ranking = ["a", "x", "b", "y"]
    assert recall_at(ranking, {"a", "b", "c"}, 2) == pytest.approx(1 / 3)
    assert recall_at(ranking, set(), 2) is None
    # DCG = 1/log2(2) + 1/log2(4) = 1.5; ideal for 3 relevant in top 4 = 1 + 0.6309 + 0.5
    assert ndcg_at(ranking, {"a", "b", "c"}, 4) == pytest.approx(1.5 / (1 + 1 / 1.5849625 + 0.5))
    # AP = (1/1 + 2/3) / 3
    assert average_precision(ranking, {"a", "b", "c"}) == pytest.approx((1 + 2 / 3) / 3)


def _cell(k1: float, b: float, r1000: float, r100: float) -> CellResult:
    metrics = {
        "evidence_recall@1000": r1000,
        "evidence_recall@100": r100,
        "gold_recall@1000": 0.5,
        "ndcg@10": 0.1,
        "map": 0.1,
    }
    return CellResult(k1=k1, b=b, queries=10, metrics=metrics)


def test_best_cell_breaks_ties_by_next_objective_then_smaller_parameters() -> None:
    cells = [
        _cell(2, 0.5, 0.9, 0.5),
        _cell(1, 0.5, 0.9, 0.7),
        _cell(3, 0.1, 0.8, 0.9),
        _cell(0.5, 0.5, 0.9, 0.7),
    ]
    assert (
        best_cell(cells, "evidence_recall@1000").k1,
        best_cell(cells, "evidence_recall@1000").b,
    ) == (0.5, 0.5)
    assert best_cell(cells, "evidence_recall@100").k1 == 3
    with pytest.raises(ValueError, match="unknown objective"):
        best_cell(cells, "precision")


def test_where_the_evidence_sits(tmp_path: Path) -> None:
    bench = Benchmark(
        "toy",
        [Query(query_id="q1", query="q", answer="a")],
        {"q1": {"e1": 1, "e2": 1, "e3": 1, "e4": 1}},
        {"q1": {"e1": 1}},
        Corpus("toy", (), lambda: iter(())),
    )
    filler = [f"x{i}" for i in range(600)]
    rankings = {
        "q1": [
            RankingLog(search_id="s1", query="a", docids=["e1", *filler[:6], "e2", *filler[6:]]),
            RankingLog(search_id="s2", query="b", docids=[*filler[:499], "e3", "e2"]),
        ]
    }
    record = QueryRecord(
        run_id="r",
        config_hash="h",
        query_id="q1",
        model="m",
        status="completed",
        previewed=["e1"],
        opened=["e1"],
        started_at=now_iso(),
        finished_at=now_iso(),
    )
    rows = evidence_ranks([record], rankings, bench)
    best = {(r.kind, r.docid): r.best_rank for r in rows}
    assert best == {
        ("evidence", "e1"): 1,
        ("evidence", "e2"): 8,
        ("evidence", "e3"): 500,
        ("evidence", "e4"): None,
        ("gold", "e1"): 1,
    }
    text = write_evidence_ranks(rows, tmp_path).read_text()
    assert "4 evidence documents: 3 surfaced, 1 previewed, 1 opened, 1 never surfaced" in text
    assert "| 6-10 | 1 |" in text and "| 201-500 | 1 |" in text and "| 1-5 | 0 |" in text
    assert (tmp_path / "evidence_ranks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
