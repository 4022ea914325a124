"""`export --format browsecomp-plus`'s leaderboard summary (`evaluation_summary.json`) computes
each figure as their evaluate_run.py (b90a68c) does: here the calibration error over enough
answers, against their own `calculate_calibration_error` on the same pairs (recorded by
`tests/fixtures/peers/regenerate.py`). The other figures are checked against their evaluator
reading our export in `tests/formats/test_import_peers.py`."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from piserini_ray.formats.peer_writers import evaluation_summary, run_file_name
from piserini_ray.records import Judgement, QueryRecord, now_iso

RECORDED = Path(__file__).parents[1] / "fixtures" / "peers" / "browsecomp-plus" / "expected"


def _record(qid: str, status: str, confidence: float) -> QueryRecord:
    return QueryRecord(
        run_id="r",
        config_hash="h",
        query_id=qid,
        model="gpt-5",
        status=status,  # type: ignore[arg-type]
        final_answer="Exact Answer: x" if status == "completed" else None,
        confidence=confidence,
        surfaced=["d1", "d2", "d3"],
        previewed=["d1", "d2"],  # what their retrieved_docids carries: shown or opened
        tool_call_counts={"search": 2, "get_document": 1},
        started_at=now_iso(),
        finished_at=now_iso(),
    )


@pytest.mark.parametrize("template", ["piserini", "browsecomp-plus"])
def test_the_calibration_error_is_theirs(template: str) -> None:
    """The response's confidence: our parse of it (piserini template) or the value their
    grader extracted (browsecomp-plus template); queries their evaluator never sends to the
    judge (a failure) stay out of it but count in accuracy, as in theirs."""
    data = orjson.loads((RECORDED / "calibration.json").read_bytes())
    theirs = round(data["calibration_error"], 2)
    ours_template = template == "browsecomp-plus"
    records, judgements = [], {}
    for n, (conf, right) in enumerate(zip(data["confidences"], data["correct"], strict=True)):
        qid = str(n)
        records.append(_record(qid, "completed", 0.0 if ours_template else conf))
        judgements[qid] = Judgement(
            query_id=qid,
            judge_model="j",
            status="judged",
            correct=right,
            confidence=conf if ours_template else 99.0,  # the judge's own: never used
            template=template,  # type: ignore[arg-type]
        )
    for n in range(10):  # failures: judged wrong by rule, outside calibration
        qid = f"f{n}"
        records.append(_record(qid, "failed", 100.0))
        judgements[qid] = Judgement(query_id=qid, judge_model="j", status="judged", correct=False)
    evidence = {r.query_id: {"d1": 1, "d3": 1} for r in records}
    summary = evaluation_summary(records, judgements, evidence, "BM25", today="2026-01-01")
    assert summary["Calibration Error (%)"] == theirs
    right = sum(data["correct"])
    assert summary["Accuracy (%)"] == round(100 * right / len(records), 2)
    assert summary["Recall (%)"] == 50.0
    assert summary["avg_tool_stats"] == {"search": 2.0, "get_document": 1.0}
    assert summary["LLM"] == "gpt-5" and summary["Retriever"] == "BM25"
    assert summary["Link"] == "change me when submitting"


def test_under_100_answers_it_is_0_as_their_script_prints_it() -> None:
    records = [_record(str(n), "completed", 50.0) for n in range(99)]
    judgements = {
        r.query_id: Judgement(query_id=r.query_id, judge_model="j", status="judged", correct=True)
        for r in records
    }
    summary = evaluation_summary(records, judgements, {}, "BM25")
    assert summary["Calibration Error (%)"] == 0.0
    assert summary["Recall (%)"] is None  # no query has evidence qrels
    assert summary["Accuracy (%)"] == 100.0


def test_run_files_are_named_as_their_clients_name_them() -> None:
    assert run_file_name("784", 1) == "run_784.json"
    assert run_file_name("a/b c", 12) == "run_000012.json"
