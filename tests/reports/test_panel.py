"""A panel of judges: the majority verdict, ties counted as configured and flagged, a query no
judge could judge left unscored, and Fleiss' kappa against an independent computation."""

from __future__ import annotations

import itertools
import random

import pytest

from piserini_ray.metrics.paired import cohens_kappa, fleiss_kappa
from piserini_ray.records import Judgement
from piserini_ray.reports.panel import panel_name, panel_summary, panel_verdicts

JUDGES = ["exact", "strict", "lenient"]


def _verdict(judge: str, query_id: str, correct: bool | None) -> Judgement:
    if correct is None:
        return Judgement(query_id=query_id, judge_model=judge, status="judge_failed")
    return Judgement(
        query_id=query_id, judge_model=judge, status="judged", correct=correct, correct_answer="g"
    )


def _fleiss_by_pairs(table: list[list[bool]]) -> float:
    """Fleiss' kappa the other way round: observed agreement as the share of agreeing ordered
    rater pairs per item, chance from the pooled category shares."""
    n = len(table[0])
    agree = [
        sum(a == b for a, b in itertools.permutations(row, 2)) / (n * (n - 1)) for row in table
    ]
    pooled = [v for row in table for v in row]
    p_yes = sum(pooled) / len(pooled)
    chance = p_yes**2 + (1 - p_yes) ** 2
    return (sum(agree) / len(agree) - chance) / (1 - chance)


def test_fleiss_kappa_equals_an_independent_formula() -> None:
    rng = random.Random(7)
    for raters in (2, 3, 5):
        table = [[rng.random() < 0.6 for _ in range(raters)] for _ in range(40)]
        assert fleiss_kappa(table) == pytest.approx(_fleiss_by_pairs(table))
    assert fleiss_kappa([[True, True], [False, False]]) == pytest.approx(1.0)
    assert fleiss_kappa([[True, True], [True, True]]) is None  # one category: undefined
    assert fleiss_kappa([]) is None


def test_with_two_raters_fleiss_is_close_to_cohen() -> None:
    rng = random.Random(3)
    a = [rng.random() < 0.5 for _ in range(400)]
    b = [x if rng.random() < 0.8 else not x for x in a]
    fleiss, cohen = fleiss_kappa(list(zip(a, b, strict=True))), cohens_kappa(a, b)
    assert fleiss is not None and cohen is not None and abs(fleiss - cohen) < 0.01


@pytest.mark.parametrize("ties", ["incorrect", "correct"])
def test_the_panel_verdict_is_the_majority_and_ties_are_flagged(ties: str) -> None:
    rng = random.Random(11)
    votes = {f"q{i}": [rng.choice([True, False, None]) for _ in JUDGES] for i in range(60)}
    verdicts = {
        j: {q: _verdict(j, q, v[i]) for q, v in votes.items()} for i, j in enumerate(JUDGES)
    }
    panel = panel_verdicts(verdicts, JUDGES, ties)  # type: ignore[arg-type]
    for query_id, cast in votes.items():
        counted = [v for v in cast if v is not None]
        got = panel[query_id]
        assert got.judge_model == panel_name(JUDGES)
        if not counted:
            assert got.status == "judge_failed" and got.correct is None
            continue
        yes, no = counted.count(True), counted.count(False)
        expected = (ties == "correct") if yes == no else yes > no
        assert got.status == "judged" and got.correct is expected
        assert (got.reasoning or "").startswith("tie") == (yes == no)

    summary = panel_summary(verdicts, JUDGES, ties)  # type: ignore[arg-type]
    full = [q for q, cast in votes.items() if None not in cast]
    assert summary.queries == len(full)
    table = [[bool(c) for c in votes[q]] for q in sorted(full)]
    assert summary.fleiss_kappa == pytest.approx(_fleiss_by_pairs(table))
    assert summary.split == [q for q in sorted(full) if len(set(votes[q])) > 1]
    for i, judge in enumerate(JUDGES):
        assert summary.accuracy[judge] == pytest.approx(sum(r[i] for r in table) / len(table))
    majority = [sum(r) >= 2 for r in table]
    assert summary.accuracy[panel_name(JUDGES)] == pytest.approx(sum(majority) / len(majority))


def test_three_offline_judges_judge_a_run_as_a_panel(finished_run, tmp_path) -> None:
    """The exact, strict and lenient offline judges each judge every answer of a run (its copy,
    so the shared run is left alone); the run's accuracy is their majority, computed here from
    the verdicts they wrote."""
    import shutil

    from piserini_ray.config import ModelConfig
    from piserini_ray.pipeline import make_engine, report_runs
    from piserini_ray.store import RunStore

    source, config = finished_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    names = ["offline/exact-match-judge", "offline/strict-judge", "offline/lenient-judge"]
    judge = config.judge.model_copy(update={"models": [ModelConfig(name=n) for n in names]})
    panel_config = config.model_copy(update={"judge": judge})
    report = report_runs([(panel_config, run_dir)], lambda _m: None, make_engine("local"))
    (metrics,) = report.metrics
    with RunStore(run_dir, panel_config) as store:
        verdicts = {n: store.judgements(n) for n in names}
    assert all(len(v) == 12 for v in verdicts.values())
    majority = {
        q: sum(bool(verdicts[n][q].correct) for n in names) >= 2 for q in verdicts[names[0]]
    }
    assert metrics.panel is not None and metrics.panel.queries == 12
    assert metrics.accuracy.value == pytest.approx(sum(majority.values()) / 12)
    assert metrics.panel.accuracy[panel_name(names)] == metrics.accuracy.value
    assert "### Judge panel" in (run_dir / "report.md").read_text()
