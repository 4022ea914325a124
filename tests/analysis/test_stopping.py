"""`analysis/stopping.py`: the decisions of a `stop_when_decided` sweep as the verdicts come,
checked against an independent computation (`metrics.sequential.paired_sequential_test` over the
outcomes in the shared order), whatever order the verdicts arrive in; the rules (the
reference stops last, `extend` stops nothing, a query that runs again is no outcome); and the
sweep file's errors."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
import yaml
from oracle_provider import OracleProvider

from piserini_ray.analysis.stopping import (
    DecisionWatch,
    StopWhenDecided,
    read_decision,
    shared_order,
)
from piserini_ray.api import run_sweep
from piserini_ray.data import Benchmark
from piserini_ray.errors import ConfigError
from piserini_ray.metrics.sequential import paired_sequential_test
from piserini_ray.records import Judgement, QueryRecord
from piserini_ray.sweep import load_sweep
from piserini_ray.tools.spill import safe_component

JUDGE = "offline/exact-match-judge"
IDS = [f"q{i:03d}" for i in range(200)]


def _verdict(query_id: str, correct: bool, judge: str = JUDGE) -> Judgement:
    return Judgement(query_id=query_id, judge_model=judge, status="judged", correct=correct)


def _record(query_id: str, status: str = "completed", retryable: bool = False) -> QueryRecord:
    return QueryRecord.model_validate(
        {
            "query_id": query_id,
            "run_id": "r",
            "config_hash": "h",
            "model": "offline/heuristic",
            "started_at": "2026-12-07T00:00:00Z",
            "finished_at": "2026-12-07T00:00:01Z",
            "status": status,
            "retryable": retryable,
            "termination": "answered" if status == "completed" else "stopped",
        }
    )


def _watch(tmp_path: Path, settings: StopWhenDecided, extend: bool = False) -> DecisionWatch:
    runs = [tmp_path / "ref", tmp_path / "a", tmp_path / "b"]
    for run in runs:
        run.mkdir(exist_ok=True)
    judges = {str(r): JUDGE for r in runs}
    return DecisionWatch(settings, runs[0], runs, IDS, judges, lambda _m: None, extend=extend)


def test_the_shared_order_depends_on_the_set_and_the_seed_only() -> None:
    shuffled = list(IDS)
    random.Random(5).shuffle(shuffled)
    assert shared_order(IDS, 0) == shared_order(shuffled, 0)
    assert sorted(shared_order(IDS, 0)) == sorted(IDS)
    assert shared_order(IDS, 0) != shared_order(IDS, 1)
    assert shared_order(IDS, 0) != sorted(IDS)


@pytest.mark.parametrize("seed", range(12))
def test_decisions_as_verdicts_come_equal_the_test_over_the_shared_order(
    tmp_path: Path, seed: int
) -> None:
    """Verdicts arrive in any interleaving of the runs; the watch decides exactly where the
    test over the paired outcomes in the shared order does, with the same evidence."""
    rng = random.Random(seed)
    settings = StopWhenDecided(alpha=rng.choice([0.05, 0.1, 0.2]), min_queries=rng.choice([0, 30]))
    watch = _watch(tmp_path, settings)
    accuracy = {"ref": 0.5, "a": rng.choice([0.5, 0.3, 0.7]), "b": rng.choice([0.5, 0.6])}
    truth = {run: {q: rng.random() < p for q in IDS} for run, p in accuracy.items()}
    arrivals = [(run, q) for run in truth for q in IDS]
    rng.shuffle(arrivals)
    for run, query in arrivals:
        watch.judged(str(tmp_path / run), _verdict(query, truth[run][query]))
    order = watch.order
    for run in ("a", "b"):
        expected = paired_sequential_test(
            [truth["ref"][q] for q in order],
            [truth[run][q] for q in order],
            settings.alpha,
            settings.min_queries,
        )
        decision = watch.decision(tmp_path / run)
        assert decision.decided_at == expected.decided_at
        assert decision.direction == expected.direction
        assert (decision.wins, decision.losses) == (expected.wins, expected.losses)
        assert decision.e_value == pytest.approx(expected.e_value)
        halted = watch.halted(tmp_path / run)
        assert (halted is not None) == expected.decided


def test_the_reference_stops_only_once_every_run_is_decided(tmp_path: Path) -> None:
    watch = _watch(tmp_path, StopWhenDecided())
    ref, a, b = (str(tmp_path / n) for n in ("ref", "a", "b"))
    for query in watch.order[:12]:  # a wins all twelve: E = 2^12 / 13 = 315 >= 20
        watch.judged(ref, _verdict(query, False))
        watch.judged(a, _verdict(query, True))
        watch.judged(b, _verdict(query, False))
    assert watch.decision(tmp_path / "a").direction == "better"
    assert watch.halted(tmp_path / "a") is not None
    assert watch.halted(tmp_path / "b") is None  # ties: no evidence either way
    assert watch.halted(tmp_path / "ref") is None  # b still needs it
    for query in watch.order[12:30]:
        watch.judged(ref, _verdict(query, True))
        watch.judged(b, _verdict(query, False))
    assert watch.decision(tmp_path / "b").direction == "worse"
    assert "every run compared with it is decided" in str(watch.halted(tmp_path / "ref"))
    assert watch.decision(tmp_path / "ref").compared == {a: True, b: True}


def test_extend_decides_the_same_but_stops_nothing(tmp_path: Path) -> None:
    watch = _watch(tmp_path, StopWhenDecided(), extend=True)
    for query in watch.order[:12]:
        watch.judged(str(tmp_path / "ref"), _verdict(query, False))
        watch.judged(str(tmp_path / "a"), _verdict(query, True))
    for query in watch.order[12:40]:  # past the decision, the other way: the evidence stays
        watch.judged(str(tmp_path / "ref"), _verdict(query, True))
        watch.judged(str(tmp_path / "a"), _verdict(query, False))
    decision = watch.decision(tmp_path / "a")
    assert (decision.decided_at, decision.direction, decision.wins) == (8, "better", 8)
    assert decision.extended
    assert all(watch.halted(tmp_path / n) is None for n in ("ref", "a", "b"))


def test_a_query_that_runs_again_is_no_outcome_and_blocks_the_prefix(tmp_path: Path) -> None:
    """A stopped or infrastructure-failed query runs again: its verdict (wrong, for an answer
    there is not) must not count, and the pairs after it wait for its real verdict."""
    watch = _watch(tmp_path, StopWhenDecided())
    ref, a = str(tmp_path / "ref"), str(tmp_path / "a")
    first = watch.order[0]
    watch.recorded(a, _record(first, "failed", retryable=True))
    for query in watch.order[:12]:
        watch.judged(ref, _verdict(query, True))
        watch.judged(a, _verdict(query, query != first))
    assert watch.decision(tmp_path / "a").paired == 0  # the first pair is not final
    watch.recorded(a, _record(first))  # run again, answered
    watch.judged(a, _verdict(first, True))
    assert watch.decision(tmp_path / "a").paired == 12
    other = _verdict(watch.order[12], False, judge="offline/lenient-judge")
    watch.judged(ref, other)  # another judge's verdict is not the run's outcome
    watch.judged(a, _verdict(watch.order[12], True))
    assert watch.decision(tmp_path / "a").paired == 12


def test_a_resumed_watch_reaches_the_same_decision_and_writes_it(tmp_path: Path) -> None:
    said: list[str] = []
    runs = [tmp_path / "ref", tmp_path / "a"]
    for run in runs:
        run.mkdir()
    judges = {str(r): JUDGE for r in runs}
    first = DecisionWatch(StopWhenDecided(), runs[0], runs, IDS, judges, said.append)
    verdicts = {
        "ref": {q: True for q in first.order[:20]},
        "a": {q: i % 5 == 0 for i, q in enumerate(first.order[:20])},
    }
    for name, outcomes in verdicts.items():
        for query, correct in outcomes.items():
            first.judged(str(tmp_path / name), _verdict(query, correct))
    assert first.decision(runs[1]).decided_at is not None
    assert len(said) == 1 and "decided worse" in said[0]
    written = read_decision(runs[1])
    assert written is not None and written == first.decision(runs[1])
    again = DecisionWatch(StopWhenDecided(), runs[0], runs, IDS, judges, said.append)
    for name, outcomes in verdicts.items():
        stored = {q: _verdict(q, c) for q, c in outcomes.items()}
        again.load(tmp_path / name, [_record(q) for q in outcomes], stored)
    assert again.decision(runs[1]) == first.decision(runs[1])
    assert again.halted(runs[1]) is not None


SWEEP = """
name: s
grid:
  model.name: [offline/heuristic, offline/long-horizon]
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("stop_when_decided: {alpha: 0.05}\n", "names none: give `reference:"),
        (
            "reference: {model.name: offline/heuristic}\nstop_when_decided: {alpha: 0.6}\n",
            "alpha 0.6 is outside (0, 0.5]",
        ),
        (
            "reference: {model.name: offline/heuristic}\nstop_when_decided: {alpha: 0}\n",
            "alpha 0.0 is outside (0, 0.5]",
        ),
        (
            "reference: {model.name: offline/heuristic}\nstop_when_decided: {metric: recall}\n",
            "metric 'recall' is not a paired binary outcome",
        ),
        (
            "reference: {model.name: offline/heuristic}\n"
            "stop_when_decided: {reference: {model.name: offline/long-horizon}}\n",
            "is not the sweep's reference",
        ),
        (
            "stop_when_decided: {reference: {model.name: gpt-5}}\n",
            "gpt-5' is not among",
        ),
    ],
)
def test_a_bad_stop_when_decided_is_a_clear_error(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP + extra)
    with pytest.raises(ConfigError) as error:
        load_sweep(path)
    assert message in str(error.value)
    assert str(path) in str(error.value)


# ------------------------------------------------------------------ a sweep, end to end

QUERIES = 40


def _oracle_sweep(path: Path, index_root: Path, base_url: str, decide: bool) -> Path:
    """A sweep of three runs over `QUERIES` sample queries: the reference and a copy of it (a model
    that knows the answers, over real HTTP), and the offline heuristic (a few percent right):
    clearly worse."""
    oracle = {"model.name": "gpt-5.4-mini", "model.api_base": base_url}
    sweep = {
        "name": "decide",
        "set": {"retrieval.index_root": str(index_root), "slice.sample": QUERIES},
        "variants": [
            {**oracle, "agent.budget_seconds": 300},
            {"model.name": "offline/heuristic", "agent.budget_seconds": 300},
            {**oracle, "agent.budget_seconds": 200},
        ],
        "reference": {"model.name": "gpt-5.4-mini", "agent.budget_seconds": 300},
    }
    if decide:
        sweep["stop_when_decided"] = {"alpha": 0.05}
    path.write_text(yaml.safe_dump(sweep))
    return path


def _lines(run_dir: Path) -> list[dict]:
    return [orjson.loads(line) for line in (run_dir / "records.jsonl").read_bytes().splitlines()]


def _verdicts(run_dir: Path) -> dict[str, bool]:
    path = run_dir / "judgements" / f"{safe_component(JUDGE)}.jsonl"
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return {r["query_id"]: r["correct"] for r in rows}


@pytest.mark.slow
def test_a_clearly_worse_run_stops_early_and_resumes_in_the_same_order(
    sample: Benchmark, sample_index: Path, index_root: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-oracle")
    logs: list[str] = []
    oracle = OracleProvider(sample.queries)
    with oracle:
        _a_worse_run_stops_early(oracle, index_root, tmp_path, logs)


def _a_worse_run_stops_early(
    oracle: OracleProvider, index_root: Path, tmp_path: Path, logs: list[str]
) -> None:
    path = _oracle_sweep(tmp_path / "sweep.yaml", index_root, oracle.base_url, decide=True)
    report, status = run_sweep(path, tmp_path / "runs", "local", log=logs.append)
    plain = _oracle_sweep(tmp_path / "plain.yaml", index_root, oracle.base_url, False)
    unstopped, _ = run_sweep(plain, tmp_path / "plain", "local", log=lambda _m: None)
    assert status == 0
    reference, worse, copy = (Path(m.run_dir) for m in report.metrics)
    assert "heuristic" in worse.name and "budget_seconds=200" in copy.name

    # The worse run stopped early, decided worse, and ran a prefix of the shared order.
    decision = read_decision(worse)
    assert decision is not None and decision.direction == "worse"
    assert decision.decided_at is not None and decision.decided_at < QUERIES // 2
    ran = [r["query_id"] for r in _lines(worse)]
    order = shared_order(list(_verdicts(reference)), 0)
    assert decision.decided_at <= len(ran) < QUERIES
    assert set(ran) == set(order[: len(ran)])
    assert any(f"{worse}: decided worse than the reference at" in m for m in logs)
    status_file = orjson.loads((worse / "status.json").read_bytes())
    assert status_file["state"] == "decided" and "decided worse" in status_file["stopped"]

    # The reference and the undecided copy ran to the end, exactly as without the option.
    (copy_decision, reference_decision) = (read_decision(copy), read_decision(reference))
    assert copy_decision is not None and copy_decision.decided_at is None
    assert reference_decision is not None and reference_decision.role == "reference"
    by_name = {Path(m.run_dir).name: Path(m.run_dir) for m in unstopped.metrics}
    for run in (reference, copy):
        assert len(_lines(run)) == QUERIES
        assert _verdicts(run) == _verdicts(by_name[run.name])
        answers = {r["query_id"]: r["exact_answer"] for r in _lines(run)}
        assert answers == {r["query_id"]: r["exact_answer"] for r in _lines(by_name[run.name])}
    baseline = _verdicts(by_name[worse.name])
    assert {q: baseline[q] for q in ran} == _verdicts(worse)

    # The reports say where it was decided, what that saved, and the interval valid there.
    figures = next(m.decision for m in report.metrics if m.run_dir == str(worse))
    assert figures is not None and figures.queries_saved == QUERIES - len(ran)
    assert figures.accuracy_interval is not None
    combined = (tmp_path / "runs" / "decide" / "report.md").read_text()
    assert "## Stopped when decided" in combined
    assert f"| {worse} | compared | {decision.decided_at} | worse |" in combined
    assert "Stop when decided: decided worse" in (worse / "report.md").read_text()

    # Run again: nothing more runs. --extend: the rest of the slice, in the same order.
    before, answered = (worse / "records.jsonl").read_bytes(), oracle.answered
    run_sweep(path, tmp_path / "runs", "local", log=logs.append)
    assert (worse / "records.jsonl").read_bytes() == before
    assert oracle.answered == answered
    assert any(f"run {worse}: decided worse" in m for m in logs[-20:])
    _, status = run_sweep(path, tmp_path / "runs", "local", extend=True, log=logs.append)
    assert status == 0 and oracle.answered == answered
    after = (worse / "records.jsonl").read_bytes()
    assert after.startswith(before) and len(_lines(worse)) == QUERIES
    again_decision = read_decision(worse)
    assert again_decision is not None and again_decision.extended
    assert again_decision.decided_at == decision.decided_at


@pytest.mark.parametrize(
    ("differs", "message"),
    [
        ({"slice.sample": 5}, "the runs do not share a query set (6 queries: "),
        (
            {"judge.model": {"name": "gpt-5.3-codex", "service_tier": "batch"}},
            "at the batch tier, which judges after the run",
        ),
        (
            {"judge.models": [{"name": JUDGE}, {"name": "offline/lenient-judge"}]},
            "is judged by a panel",
        ),
        ({"run.epochs": 2}, "has 2 epochs"),
    ],
)
def test_runs_that_cannot_be_compared_as_they_go_stop_before_any_work(
    tmp_path: Path, index_root: Path, differs: dict, message: str, monkeypatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # the batch-tier judge's key is checked first
    sweep = {
        "name": "s",
        "set": {"retrieval.index_root": str(index_root), "slice.sample": 6},
        "variants": [
            {"model.name": "offline/heuristic"},
            {"model.name": "offline/long-horizon", **differs},
        ],
        "reference": {"model.name": "offline/heuristic"},
        "stop_when_decided": {},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    with pytest.raises(ConfigError, match="stop_when_decided: ") as error:
        run_sweep(path, tmp_path / "runs", "local", log=lambda _m: None)
    assert message in str(error.value)
    assert not (tmp_path / "runs").exists()  # nothing was made, nothing was run


def test_extend_without_stop_when_decided_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    with pytest.raises(ConfigError, match="--extend goes on past the decisions"):
        run_sweep(path, tmp_path / "runs", "local", extend=True)
