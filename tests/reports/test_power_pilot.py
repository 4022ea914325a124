"""`power` from a pilot at 0 % or 100 % accuracy: 2p(1-p) = 0 says nothing of how often another
run would disagree, so the discordance is unknown: the command says so and asks for
`--discordance` (never "out of reach" for every effect); with it, the figures are computed."""

from __future__ import annotations

from pathlib import Path

import pytest

from piserini_ray.cli import main
from piserini_ray.config import RunConfig
from piserini_ray.data import load_benchmark
from piserini_ray.metrics.power import minimum_detectable_difference, queries_needed
from piserini_ray.records import Judgement, QueryRecord, now_iso
from piserini_ray.store import RunStore


def _pilot(tmp_path: Path, right: bool, mixed: int = 0) -> Path:
    """A run of the sample's first 20 queries, every answer judged `right` (or wrong) but the
    first `mixed`, judged the other way."""
    config = RunConfig()
    run_dir = tmp_path / f"{right}-{mixed}"
    queries = load_benchmark(config.benchmark).select(**config.slice.model_dump())[:20]
    judge = config.judge_model().name
    with RunStore(run_dir, config) as store:
        for i, q in enumerate(queries):
            store.append(
                QueryRecord(
                    run_id=store.run_id, config_hash=store.config_hash, query_id=q.query_id,
                    model=config.model.name, status="completed", final_answer="Exact Answer: x",
                    started_at=now_iso(), finished_at=now_iso(),
                )
            )  # fmt: skip
            store.append_judgement(
                Judgement(
                    query_id=q.query_id, judge_model=judge, status="judged",
                    correct=right if i >= mixed else not right,
                    confidence=100.0, attempts=1,
                )
            )  # fmt: skip
    return run_dir


@pytest.mark.parametrize("right", [False, True])
def test_a_pilot_at_0_or_100_percent_asks_for_the_discordance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], right: bool
) -> None:
    run_dir = _pilot(tmp_path, right)
    assert main(["power", str(run_dir), "--effect", "0.05"]) == 2
    out = capsys.readouterr().out
    assert f"accuracy is {100 if right else 0} %" in out and "the discordance is unknown" in out
    assert "| 5 | unknown (pass --discordance) |" in out and "| 5 | out of reach" not in out
    assert "detect: unknown without a discordance (pass --discordance)" in out
    # Given a discordance, the same pilot is sized.
    assert main(["power", str(run_dir), "--effect", "0.05", "--discordance", "0.2"]) == 0
    out = capsys.readouterr().out
    assert f"| 5 | {queries_needed(0.05, 0.2):,} |" in out
    mde = minimum_detectable_difference(20, 0.2)
    assert ("out of reach at this size" if mde is None else f"{100 * mde:.1f} points") in out


def test_a_mixed_pilot_assumes_2p_1_minus_p(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _pilot(tmp_path, False, mixed=5)  # 5 of 20 right: p = 0.25, 2p(1-p) = 0.375
    assert main(["power", str(run_dir), "--effect", "0.05", "--effect", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "Discordance assumed 2p(1-p) = 0.375 at the pilot's accuracy p = 0.250" in out
    assert f"| 5 | {queries_needed(0.05, 0.375):,} |" in out
    assert "| 50 | out of reach |" in out  # above the discordance: no run wins that often
