"""`CE (browsecomp-plus)` is BrowseComp-Plus's calibration error: the agent's stated confidence
over the answers their judge reads, with their binning, equal to a port of their own code; the
judge's confidence is a figure of its own (judge calibration), never under a peer's label."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from piserini_ray.config import load_config
from piserini_ray.data import Benchmark, Query
from piserini_ray.data.benchmark import Corpus
from piserini_ray.metrics.calibration import calibration_error
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.records import Judgement, QueryRecord, now_iso
from piserini_ray.reports.agreement import judge_agreement
from piserini_ray.reports.markdown import markdown_report
from piserini_ray.reports.run_metrics import compute_metrics, judge_calibration


# --- A reference written from their code: scripts_evaluation/evaluate_run.py of
# github.com/texttron/BrowseComp-Plus at 97c637c (unchanged at b90a68c): `calib_err` and
# `calculate_calibration_error` as they are (p = "2", beta = 100), and `main`'s choice of the
# records it calibrates (a judge_result without parse_error, whose `correct` and `confidence`
# are set; an incomplete or empty response gets parse_error and no judge call).
def calib_err(confidence, correct, p="2", beta=100):  # type: ignore[no-untyped-def]
    idxs = np.argsort(confidence)
    confidence = confidence[idxs]
    correct = correct[idxs]
    bins = [[i * beta, (i + 1) * beta] for i in range(len(confidence) // beta)]
    bins[-1] = [bins[-1][0], len(confidence)]
    cerr = 0
    total_examples = len(confidence)
    for i in range(len(bins) - 1):
        bin_confidence = confidence[bins[i][0] : bins[i][1]]
        bin_correct = correct[bins[i][0] : bins[i][1]]
        num_examples_in_bin = len(bin_confidence)
        if num_examples_in_bin > 0:
            difference = np.abs(np.nanmean(bin_confidence) - np.nanmean(bin_correct))
            cerr += num_examples_in_bin / total_examples * np.square(difference)
    return np.sqrt(cerr)


def calculate_calibration_error(confidences, correctness, beta=100):  # type: ignore[no-untyped-def]
    confidence = np.array(confidences) / 100.0
    correct = np.array(correctness, dtype=float)
    return calib_err(confidence, correct, p="2", beta=beta) * 100


def their_calibration(results: list[dict]) -> float:
    confidences, correctness = [], []
    for result in results:
        judge_result = result.get("judge_result", {})
        judge_conf = judge_result.get("confidence")
        if not judge_result.get("parse_error", False) and judge_result.get("correct") is not None:  # noqa: SIM102 (their nesting)
            if judge_conf is not None:
                confidences.append(judge_conf)
                correctness.append(judge_result.get("correct"))
    return float(calculate_calibration_error(confidences, correctness))


# --- The run: 260 answered queries with distinct confidences, and 30 that timed out.
N_ANSWERED, N_TIMEOUT = 260, 30
JUDGE = "gpt-5.3-codex"


def _bench(ids: list[str]) -> Benchmark:
    queries = [Query(query_id=q, query=q, answer="a") for q in ids]
    return Benchmark("toy", queries, {}, {}, Corpus("toy", (), lambda: iter(())))


def _run(seed: int = 3) -> tuple[list[QueryRecord], dict[str, Judgement], list[dict]]:
    rng = random.Random(seed)
    records, judgements, theirs = [], {}, []
    confidences = rng.sample(range(1, 10_000), N_ANSWERED)  # distinct: no tie to break
    for i in range(N_ANSWERED + N_TIMEOUT):
        qid = f"q{i:03d}"
        answered = i < N_ANSWERED
        agent = confidences[i] / 100 if answered else 100.0
        right = answered and rng.random() < agent / 100 * 0.6
        records.append(
            QueryRecord(
                run_id="r", config_hash="h", query_id=qid, model="gpt-5",
                status="completed" if answered else "timeout",
                final_answer=f"Exact Answer: x\nConfidence: {agent}%" if answered else None,
                confidence=agent, confidence_missing=not answered,
                started_at=now_iso(), finished_at=now_iso(),
            )
        )  # fmt: skip
        # Our judge's own confidence in its verdict: high and unrelated to the agent's.
        judgements[qid] = Judgement(
            query_id=qid, judge_model=JUDGE, status="judged", correct=right,
            confidence=float(rng.randint(85, 100)) if answered else 100.0,
            attempts=1 if answered else 0,
        )  # fmt: skip
        # Their evaluator's record of the same answer: the grader's `confidence` is the one it
        # extracts from the response; an unanswered query is a parse error there.
        theirs.append(
            {"judge_result": {"correct": right, "confidence": agent, "parse_error": False}}
            if answered
            else {"judge_result": {"parse_error": True}}
        )
    return records, judgements, theirs


def _metrics(tmp_path: Path, records, judgements, **overrides):  # type: ignore[no-untyped-def]
    config = load_config(None, {"model.name": "gpt-5", "judge.model": {"name": JUDGE}, **overrides})
    bench = _bench([r.query_id for r in records])
    return compute_metrics(config, tmp_path, bench, records, {}, judgements, load_pricing())


def test_browsecomp_plus_calibration_is_theirs_on_the_agents_confidence(tmp_path: Path) -> None:
    records, judgements, theirs = _run()
    m = _metrics(tmp_path, records, judgements)
    reference = their_calibration(theirs)
    assert m.calibration_queries_browsecomp_plus == N_ANSWERED  # the timeouts are left out
    assert m.calibration_error["browsecomp-plus"] == pytest.approx(reference, abs=1e-9)
    # The old definition (the judge's confidence over every verdict, timeouts included) is a
    # different number: the one the label must never carry again.
    judged = sorted(records, key=lambda r: r.query_id)
    old = calibration_error(
        [(judgements[r.query_id].confidence or 100.0) / 100 for r in judged],
        [bool(judgements[r.query_id].correct) for r in judged],
        "browsecomp-plus",
    )
    assert old is not None and abs(old - reference) > 5
    assert "judge_calibration" in m.conventions
    assert "agent's stated confidence" in m.conventions["calibration.browsecomp-plus"]
    text = markdown_report([m])
    assert "the judge's confidence)" not in text
    assert "Judge calibration (the judge's confidence in its own verdict" in text
    assert "n/a (no second judge or panel to agree with)" in text


def test_under_their_template_the_judges_extracted_confidence_is_used(tmp_path: Path) -> None:
    records, judgements, theirs = _run(seed=8)
    # Their grader's reply carries the response's confidence; one reply has none and is left
    # out of calibration, as their evaluator leaves it out.
    extracted = {
        r.query_id: (None if r.query_id == "q007" else r.confidence)
        for r in records
        if r.status == "completed"
    }
    for qid, conf in extracted.items():
        judgements[qid] = judgements[qid].model_copy(
            update={"template": "browsecomp-plus", "confidence": conf}
        )
    theirs[7]["judge_result"]["confidence"] = None
    m = _metrics(tmp_path, records, judgements, **{"judge.template": "browsecomp-plus"})
    assert m.calibration_queries_browsecomp_plus == N_ANSWERED - 1
    assert m.calibration_error["browsecomp-plus"] == pytest.approx(
        their_calibration(theirs), abs=1e-9
    )
    assert m.judge_template == "browsecomp-plus"
    assert "n/a (the browsecomp-plus template asks for the response's confidence)" in (
        markdown_report([m])
    )


def test_judge_calibration_is_the_judges_confidence_against_a_second_judge() -> None:
    records, first, _ = _run(seed=5)
    rng = random.Random(11)
    second = {
        q: j.model_copy(
            update={
                "judge_model": "second",
                "correct": j.correct if rng.random() < 0.8 else not j.correct,
                "confidence": float(rng.randint(50, 100)),
            }
        )
        for q, j in first.items()
    }
    queries = [Query(query_id=r.query_id, query="q", answer="a") for r in records]
    pair = judge_agreement(JUDGE, "second", {JUDGE: first, "second": second}, queries, {}, seed=0)
    # Only the answers both judges read (a verdict by rule on a timeout makes no call).
    read = [q.query_id for q in queries if first[q.query_id].attempts > 0]
    agrees = [first[q].correct == second[q].correct for q in read]
    assert pair.calibration_queries == N_ANSWERED
    assert pair.calibration[JUDGE] == pytest.approx(
        calibration_error([(first[q].confidence or 0) / 100 for q in read], agrees)
    )
    assert pair.calibration["second"] == pytest.approx(
        calibration_error([(second[q].confidence or 0) / 100 for q in read], agrees)
    )
    assert judge_calibration(JUDGE, [pair], None) == {f"{JUDGE} vs second": pair.calibration[JUDGE]}
    # Under their template the `confidence` is the response's: no judge calibration.
    theirs = {q: j.model_copy(update={"template": "browsecomp-plus"}) for q, j in first.items()}
    pair = judge_agreement(JUDGE, "second", {JUDGE: theirs, "second": second}, queries, {})
    assert pair.calibration == {JUDGE: None, "second": None} and pair.calibration_queries == 0
