"""Where the evidence sits: the best rank of every evidence and gold document in a run's cached
rankings, and, for evidence that was surfaced but never previewed, how deep it was (is it just
below the first page, or at rank 500?): the measurement the paper names as missing."""

from __future__ import annotations

import csv
import io
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from pydantic import BaseModel

from piserini_ray.data import Benchmark
from piserini_ray.records import QueryRecord, RankingLog
from piserini_ray.reports._format import png
from piserini_ray.store.report_files import write_report_file

BINS = (
    (1, 5),
    (6, 10),
    (11, 15),
    (16, 20),
    (21, 50),
    (51, 100),
    (101, 200),
    (201, 500),
    (501, 1000),
)


class DocRank(BaseModel):
    query_id: str
    docid: str
    kind: str  # evidence | gold
    best_rank: int | None  # best rank over the query's searches; None: never surfaced
    previewed: bool
    opened: bool


def evidence_ranks(
    records: list[QueryRecord], rankings: dict[str, list[RankingLog]], benchmark: Benchmark
) -> list[DocRank]:
    rows = []
    for record in records:
        best: dict[str, int] = {}
        for search in rankings.get(record.query_id, []):
            for rank, docid in enumerate(search.docids, start=1):
                best[docid] = min(rank, best.get(docid, rank))
        for kind, table in (("evidence", benchmark.evidence), ("gold", benchmark.gold)):
            for docid, rel in table.get(record.query_id, {}).items():
                if rel > 0:
                    rows.append(
                        DocRank(
                            query_id=record.query_id,
                            docid=docid,
                            kind=kind,
                            best_rank=best.get(docid),
                            previewed=docid in record.previewed,
                            opened=docid in record.opened,
                        )
                    )
    return rows


def _bin(rank: int) -> str:
    for low, high in BINS:
        if low <= rank <= high:
            return f"{low}-{high}"
    return f">{BINS[-1][1]}"


def write_evidence_ranks(rows: list[DocRank], folder: Path) -> Path:
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(["query_id", "docid", "kind", "best_rank", "previewed", "opened"])
    for r in rows:
        writer.writerow([r.query_id, r.docid, r.kind, r.best_rank, r.previewed, r.opened])
    write_report_file(folder / "evidence_ranks.csv", table.getvalue())
    unseen = [r for r in rows if r.kind == "evidence" and r.best_rank and not r.previewed]
    counts = Counter(_bin(r.best_rank) for r in unseen if r.best_rank)
    labels = [f"{low}-{high}" for low, high in BINS]
    evidence = [r for r in rows if r.kind == "evidence"]
    lines = [
        "# Where the evidence sits",
        "",
        f"{len(evidence)} evidence documents: {sum(1 for r in evidence if r.best_rank)} surfaced, "
        f"{sum(1 for r in evidence if r.previewed)} previewed, "
        f"{sum(1 for r in evidence if r.opened)} opened, "
        f"{sum(1 for r in evidence if r.best_rank is None)} never surfaced.",
        "",
        f"Best rank of the {len(unseen)} evidence documents surfaced but never previewed:",
        "",
        "| best rank | documents |",
        "|---|---:|",
        *[f"| {label} | {counts.get(label, 0)} |" for label in labels],
    ]
    write_report_file(folder / "evidence_ranks.md", "\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(labels, [counts.get(label, 0) for label in labels])
    ax.set_xlabel("best rank in any cached ranking")
    ax.set_ylabel("evidence documents")
    ax.set_title("Surfaced but never previewed evidence: how deep?")
    plt.setp(ax.get_xticklabels(), rotation=45)
    fig.tight_layout()
    write_report_file(folder / "evidence_ranks.png", png(fig), binary=True)
    plt.close(fig)
    return folder / "evidence_ranks.md"
