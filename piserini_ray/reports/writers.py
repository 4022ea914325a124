"""The writer of the files the commands produce besides a run's own reports: a paired
comparison (`compare --out`), the no-LLM floor of the backends (`retrieval-eval --out`,
`tune-bm25 --backends`), a cost and makespan estimate (`estimate`) and one saved record
(`ask --save`). The command line only prints: every file it leaves goes through here, and
from here through the store's one report writer (`store/report_files.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson

from piserini_ray.analysis.bm25_grid import BackendScores
from piserini_ray.analysis.estimate import Estimate
from piserini_ray.config import RetrievalConfig
from piserini_ray.formats.peer_writers import write_trec
from piserini_ray.records import QueryRecord
from piserini_ray.reports.comparison import PairedComparison
from piserini_ray.store.report_files import write_report_file


def _json(data: object) -> bytes:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2)


def write_comparison(
    comparisons: Sequence[PairedComparison], table: str, out: Path
) -> tuple[Path, Path]:
    """`compare.md` (the paired table, `table`) and `compare.json` (every comparison) in `out`,
    created if missing; their paths."""
    markdown = write_report_file(out / "compare.md", table)
    data = write_report_file(
        out / "compare.json", _json([c.model_dump(mode="json") for c in comparisons])
    )
    return markdown, data


def write_backends_table(table: str, out: Path) -> Path:
    """`backends.md` in `out` (beside a BM25 grid's outputs): every backend's floor."""
    return write_report_file(out / "backends.md", table + "\n")


def write_retrieval_eval(
    results: Sequence[BackendScores], retrieval: RetrievalConfig, out: Path
) -> list[Path]:
    """Each backend's rankings as `run.<backend>.trec` (BM25's tagged with its k1 and b) and
    every backend's scores in `retrieval_eval.json`, in `out`; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    bm25 = retrieval.bm25
    paths = []
    for r in results:
        tag = f"bm25-k1={bm25.k1:g}-b={bm25.b:g}" if r.backend == "bm25" else r.backend
        paths.append(write_trec(r.rankings, out / f"run.{r.backend}.trec", tag))
    scores = out / "retrieval_eval.json"
    write_report_file(scores, _json({r.backend: r.metrics for r in results}))
    return [*paths, scores]


def write_estimate(estimate: Estimate, run_dir: Path) -> Path:
    """`estimate.json` in the run directory of the pilot it projects from."""
    return write_report_file(run_dir / "estimate.json", estimate.model_dump_json(indent=2))


def write_record(record: QueryRecord, path: Path) -> Path:
    """One record as indented JSON at `path` (`ask --save`)."""
    return write_report_file(path, record.model_dump_json(indent=2))
