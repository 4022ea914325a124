"""Metrics of a hand-made run, and the files a report writes."""

from pathlib import Path

import pytest

from piserini_ray.config import RunConfig, load_config
from piserini_ray.data import Benchmark, Query
from piserini_ray.data.benchmark import Corpus
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.records import Judgement, QueryRecord, RankingLog, Usage, now_iso
from piserini_ray.reports.markdown import markdown_report
from piserini_ray.reports.run_metrics import compute_metrics
from piserini_ray.store import RunStore


def _bench() -> Benchmark:
    queries = [Query(query_id=q, query=q, answer="a") for q in ("q1", "q2", "q3")]
    evidence = {"q1": {"d1": 1, "d2": 1}, "q2": {"d3": 1}, "q3": {"d9": 1}}
    gold = {"q1": {"d1": 1}, "q2": {}, "q3": {}}
    return Benchmark("toy", queries, evidence, gold, Corpus("toy", (), lambda: iter(())))


def _record(qid: str, status: str, conf: float, **sets: list[str]) -> QueryRecord:
    return QueryRecord(
        run_id="r",
        config_hash="h",
        query_id=qid,
        model="gpt-5",
        status=status,
        confidence=conf,
        usage=Usage(input_tokens=1_000_000, cached_tokens=500_000, output_tokens=1000),
        tool_call_counts={"search": 2},
        started_at=now_iso(),
        finished_at=now_iso(),
        **sets,
    )


def test_metrics_of_a_hand_made_run(tmp_path: Path) -> None:
    config = load_config(None, {"model.name": "gpt-5", "judge.model": {"name": "gpt-5.3-codex"}})
    records = [
        _record(
            "q1",
            "completed",
            90,
            surfaced=["d1", "d2", "x"],
            previewed=["d1"],
            opened=["d1"],
            cited=["d1"],
            behavior=["d1"],
        ),
        _record(
            "q2", "completed", 40, surfaced=["d3"], previewed=[], opened=[], cited=[], behavior=[]
        ),
        _record("q3", "timeout", 100, surfaced=[], previewed=[], opened=[], cited=[], behavior=[]),
    ]
    judgements = {
        "q1": Judgement(
            query_id="q1", judge_model="gpt-5.3-codex", status="judged", correct=True, confidence=95
        ),
        "q2": Judgement(query_id="q2", judge_model="gpt-5.3-codex", status="judge_failed"),
        "q3": Judgement(
            query_id="q3",
            judge_model="gpt-5.3-codex",
            status="judged",
            correct=False,
            confidence=100,
        ),
    }
    rankings = {"q1": [RankingLog(search_id="s1", query="x", docids=["x", "d2", "d1"])]}
    m = compute_metrics(
        config,
        tmp_path,
        _bench(),
        records,
        rankings,
        judgements,
        load_pricing(),
    )
    assert m.statuses == {"completed": 2, "timeout": 1} and m.judge_failed == 1
    # docs/spec.md §7: correct / all (the timeout is wrong); the judge failure is neither, so the
    # accuracy is not final and correct / judged stands beside it.
    assert m.accuracy.value == pytest.approx(1 / 3) and m.accuracy.queries == 3
    assert not m.accuracy_final and m.pending_verdicts == 1
    assert m.accuracy_judged is not None and m.accuracy_judged.value == 0.5
    assert m.accuracy_completed.value == 0.5 and m.accuracy_completed.queries == 2
    # piserini: the completed queries with a verdict only (q1: 0.9, right; the timeout is out).
    assert m.calibration_queries == 1
    assert m.calibration_error["piserini"] == pytest.approx(10.0)
    assert m.calibration_error["browsecomp-plus"] is None
    surfaced = m.recall["surfaced"]
    assert surfaced["evidence"].macro.value == pytest.approx((1 + 1 + 0) / 3)
    assert surfaced["evidence"].micro.value == pytest.approx(3 / 4)
    assert surfaced["gold"].macro.queries == 1  # empty gold sets are left out
    assert m.recall["behavior"]["evidence"].macro.value == pytest.approx((0.5 + 0 + 0) / 3)
    assert m.depth_curve["evidence"][5] == pytest.approx((1 + 0 + 0) / 3)
    # 3 x (0.5M x 1.25 + 0.5M x 0.125 + 1000 x 10) / 1M
    assert m.cost_usd == pytest.approx(3 * (0.625 + 0.0625 + 0.01), abs=1e-4)
    assert m.tool_calls_per_query == {"search": 2.0, "total": 2.0}
    text = markdown_report([m])
    assert "| gpt-5 | gpt-5.3-codex | 3 | 33.3" in text and "(paper)" not in text
    assert "(not final) |" in text and "**not final**: 1 queries have no verdict" in text
    assert "prints it only from 100 queries" in text
    bcp = m.model_copy(update={"benchmark": "browsecomp-plus"})
    assert "gpt-5.5 (paper) | 83.1" in markdown_report([bcp])


def test_rankings_travel_in_the_record_line(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        record = _record("q1", "completed", 50).model_copy(
            update={
                "config_hash": store.config_hash,
                "rankings": [RankingLog(search_id="s1", query="a b", docids=["d1", "d2"])],
            }
        )
        store.append(record)
        assert store.rankings() == {"q1": record.rankings}
        assert store.records()[0].rankings == []  # left out unless asked: most of the size
        assert store.records(rankings=True)[0].rankings == record.rankings
    assert not (tmp_path / "run" / "rankings.jsonl").exists()  # one line holds the query


def test_calls_without_usage_make_the_cost_a_stated_lower_bound(tmp_path: Path) -> None:
    from piserini_ray.pipeline import finish

    with RunStore(tmp_path / "run", RunConfig()) as store:
        for qid, missing in (("2hop__150763_14904", 0), ("2hop__6584_6587", 2)):
            record = _record(qid, "completed", 50).model_copy(
                update={"config_hash": store.config_hash, "calls_without_usage": missing}
            )
            store.append(record)
    metrics = finish(RunConfig(), tmp_path / "run", lambda _m: None, judge=False)
    assert metrics.calls_without_usage == 2
    assert (
        "Warning: 2 calls reported no usage; cost is a lower bound"
        in (tmp_path / "run" / "report.md").read_text()
    )


def test_exports(tmp_path: Path) -> None:
    from piserini_ray.formats.peer_writers import (
        export_browsecomp_plus,
        export_trec,
        merged_ranking,
    )
    from piserini_ray.records import ToolCallRecord, Turn

    call = ToolCallRecord(
        id="c1",
        name="search",
        arguments='{"query": "x"}',
        ok=True,
        observation="Search s1 ...",
        seconds=0.01,
    )
    record = _record("q1", "completed", 80, previewed=["d1", "d2"], opened=["d3", "d1"]).model_copy(
        update={
            "final_answer": "Exact Answer: a",
            "trajectory": [
                Turn(index=1, model_output="thinking", tool_calls=[call]),
                Turn(index=2, model_output="A"),
            ],
        }
    )
    (path,) = export_browsecomp_plus([record], tmp_path / "bcp")
    import orjson

    run = orjson.loads(path.read_bytes())
    assert {
        "query_id",
        "tool_call_counts",
        "status",
        "retrieved_docids",
        "result",
        "metadata",
        "usage",
    } <= set(run)
    assert [r["type"] for r in run["result"]] == ["reasoning", "tool_call", "output_text"]
    assert run["result"][-1]["output"] == "Exact Answer: a" and run["metadata"]["model"] == "gpt-5"
    assert run["retrieved_docids"] == ["d1", "d2", "d3"]
    searches = [
        RankingLog(search_id="s1", query="a", docids=["x", "y"]),
        RankingLog(search_id="s2", query="b", docids=["y", "z"]),
    ]
    assert merged_ranking(searches) == ["x", "y", "z"]
    first, merged = export_trec({"q1": searches}, tmp_path / "trec", tag="t")
    assert first.read_text().splitlines() == ["q1 Q0 x 1 2 t", "q1 Q0 y 2 1 t"]
    assert [line.split()[2] for line in merged.read_text().splitlines()] == ["x", "y", "z"]


def test_the_cost_says_how_much_of_it_is_estimated() -> None:
    """Calls cut at the budget or failed after sending: their prompts are in the cost, and the
    metrics and the report say how much of it is estimated, for how many calls."""
    config = load_config(None, {"model.name": "gpt-5", "judge.model": {"name": "gpt-5.3-codex"}})
    cut = Usage(input_tokens=400_000, estimated_input_tokens=400_000)
    records = [
        _record("q1", "completed", 90),
        _record("q2", "timeout", 50).model_copy(
            update={
                "usage": Usage(input_tokens=1_000_000, cached_tokens=500_000, output_tokens=1000)
                + cut,
                "calls_usage_estimated": 2,
            }
        ),
    ]
    pricing = load_pricing()
    m = compute_metrics(config, Path("/tmp/x"), _bench(), records, {}, {}, pricing)
    price = pricing.price("gpt-5")
    assert price is not None
    assert m.cost_usd == pytest.approx(2 * (0.625 + 0.0625 + 0.01) + 0.5, abs=1e-4)
    assert m.cost_estimated_usd == pytest.approx(0.4 * price.input, abs=1e-4) == 0.5
    assert m.calls_usage_estimated == 2 and m.tokens_total.estimated_input_tokens == 400_000
    text = markdown_report([m])
    assert (
        f"Cost ${m.cost_usd:,.4f} (of which $0.5000 estimated for 2 calls cut at the budget or "
        "failed after sending)"
    ) in text
    plain = compute_metrics(config, Path("/tmp/x"), _bench(), records[:1], {}, {}, pricing)
    assert plain.cost_estimated_usd == 0 and "estimated for" not in markdown_report([plain])
