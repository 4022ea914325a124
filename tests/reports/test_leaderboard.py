"""`piserini-ray leaderboard`: runs ranked by accuracy, each tested against the top row by the
exact McNemar test over the shared queries (SciPy's binomtest here), Holm-corrected by hand,
with each comparison's minimum detectable difference; a row whose query set differs says so."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from scipy.stats import binomtest

from piserini_ray.cli import main
from piserini_ray.config import RunConfig
from piserini_ray.data import load_benchmark
from piserini_ray.metrics.paired import holm
from piserini_ray.metrics.power import minimum_detectable_difference
from piserini_ray.records import Judgement, QueryRecord, now_iso
from piserini_ray.store import RunStore

N = 60


def _run(root: Path, name: str, right: list[bool], recorded: int = N) -> Path:
    config = RunConfig()
    queries = load_benchmark(config.benchmark).select(**config.slice.model_dump())[:recorded]
    judge = config.judge_model().name
    with RunStore(root / name, config) as store:
        for i, q in enumerate(queries):
            store.append(
                QueryRecord(
                    run_id=store.run_id, config_hash=store.config_hash, query_id=q.query_id,
                    model=config.model.name, status="completed", final_answer="Exact Answer: x",
                    confidence=float(30 + i), confidence_missing=False,
                    started_at=now_iso(), finished_at=now_iso(),
                )
            )  # fmt: skip
            store.append_judgement(
                Judgement(
                    query_id=q.query_id, judge_model=judge, status="judged", correct=right[i],
                    confidence=100.0, attempts=1,
                )
            )  # fmt: skip
    return root / name


def _pattern(both: int, only_first: int, only_second: int) -> tuple[list[bool], list[bool]]:
    """Verdicts of two runs over N queries with these agreement counts (the rest: both wrong)."""
    neither = N - both - only_first - only_second
    first = [True] * both + [True] * only_first + [False] * only_second + [False] * neither
    second = [True] * both + [False] * only_first + [True] * only_second + [False] * neither
    return first, second


def test_a_leaderboard_of_four_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top, weak = _pattern(both=25, only_first=20, only_second=5)  # 45 vs 30 right
    _, close = _pattern(both=41, only_first=4, only_second=2)  # 43 right
    runs = [
        _run(tmp_path, "weak", weak),
        _run(tmp_path, "top", top),
        _run(tmp_path, "close", close),
        _run(tmp_path, "partial", weak, recorded=50),  # 10 queries of the top row missing
    ]
    out = tmp_path / "board"
    assert main(["leaderboard", *map(str, runs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    board = orjson.loads((out / "leaderboard.json").read_bytes())
    rows = {Path(r["run_dir"]).name: r for r in board["rows"]}
    assert [Path(r["run_dir"]).name for r in board["rows"]][:2] == ["top", "close"]
    assert rows["top"]["rank"] == 1 and rows["top"]["p_value"] is None

    # McNemar over the shared queries: (only top right, only this run right).
    discordant = {"weak": (20, 5, N), "close": (4, 2, N), "partial": (20, 5, 50)}
    p = {
        name: binomtest(other, ref + other, 0.5).pvalue
        for name, (ref, other, _) in discordant.items()
    }
    names = list(p)
    # Holm by hand: m = 3; sorted ascending, multiply by 3, 2, 1, running maximum, cap at 1.
    ordered = sorted(names, key=lambda k: p[k])
    expected, running = {}, 0.0
    for rank, name in enumerate(ordered):
        running = max(running, min(1.0, (3 - rank) * p[name]))
        expected[name] = running
    assert holm([p[k] for k in names]) == pytest.approx([expected[k] for k in names])
    for name, (ref, other, shared) in discordant.items():
        row = rows[name]
        assert row["shared_queries"] == shared
        assert row["p_value"] == pytest.approx(p[name], rel=1e-12)
        assert row["p_holm"] == pytest.approx(expected[name], rel=1e-12)
        assert row["differs"] is bool(expected[name] <= 0.05)
        mde = minimum_detectable_difference(shared, (ref + other) / shared)
        assert row["minimum_detectable"] == pytest.approx(mde)
        assert row["difference"] == pytest.approx((other - ref) / shared)
    assert rows["weak"]["differs"] is True and rows["close"]["differs"] is False
    # 6 disagreements in 60: no difference reaches 80 % power at this size.
    assert rows["close"]["minimum_detectable"] is None and "| no | out of reach |" in printed
    assert rows["partial"]["same_queries"] is False and rows["close"]["same_queries"] is True
    assert (
        "query set differs from the top row's: 50 shared, 0 only here, 10 only in the top"
        in (rows["partial"]["notes"][0])
    )
    # Each row's own figures over all of its queries; both calibration conventions named.
    assert rows["partial"]["queries"] == 50 and rows["top"]["accuracy"]["value"] == 0.75
    assert set(rows["top"]["calibration"]) == {"piserini", "browsecomp-plus"}
    assert rows["top"]["calibration"]["browsecomp-plus"] is None  # undefined under 200
    assert "| CE (piserini) | CE (browsecomp-plus) |" in printed
    assert "| 1 | " in printed and "| top |" in printed
    page = (out / "leaderboard.html").read_text()
    assert page.count('<tr data-differs="yes">') == 2 and 'data-differs="top"' in page


def test_runs_of_different_benchmarks_are_refused(tmp_path: Path) -> None:
    from piserini_ray.pipeline import run_figures
    from piserini_ray.reports.leaderboard import leaderboard

    first, second = _pattern(both=10, only_first=5, only_second=5)
    a = run_figures(_run(tmp_path, "a", first), lambda _m: None)
    b = run_figures(_run(tmp_path, "b", second), lambda _m: None)
    other = (b[0].model_copy(update={"benchmark": "browsecomp-plus"}), b[1])
    with pytest.raises(ValueError, match="a leaderboard compares runs of one benchmark"):
        leaderboard([a, other])
    with pytest.raises(ValueError, match="at least one run"):
        leaderboard([])
