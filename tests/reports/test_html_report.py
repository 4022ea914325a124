"""The HTML report opens from disk in headless Chromium and shows its plots.

Needs Debian's `chromium`, which `.ci/run` installs; on a machine without it the test is
skipped (and says so), since no other browser may be downloaded here.
"""

from pathlib import Path

from chromium_page import dump_dom, needs_chromium

from piserini_ray.config import load_config
from piserini_ray.data import Benchmark, Query
from piserini_ray.data.benchmark import Corpus
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.records import Judgement, QueryRecord, RankingLog, now_iso
from piserini_ray.reports.html import write_html_report
from piserini_ray.reports.plots import pareto_front
from piserini_ray.reports.run_metrics import compute_metrics


def _metrics(tmp_path: Path, model: str, budget: float):
    config = load_config(None, {"model.name": model, "agent.budget_seconds": budget})
    bench = Benchmark(
        "toy",
        [Query(query_id="q1", query="q", answer="a")],
        {"q1": {"d1": 1}},
        {"q1": {"d1": 1}},
        Corpus("toy", (), lambda: iter(())),
    )
    record = QueryRecord(
        run_id="r",
        config_hash="h",
        query_id="q1",
        model=model,
        status="completed",
        surfaced=["d1"],
        tool_call_counts={"search": 3},
        started_at=now_iso(),
        finished_at=now_iso(),
    )
    verdict = Judgement(
        query_id="q1", judge_model="j", status="judged", correct=True, confidence=90
    )
    rankings = {"q1": [RankingLog(search_id="s1", query="q", docids=["x", "d1"])]}
    return compute_metrics(
        config, tmp_path / model, bench, [record], rankings, {"q1": verdict}, load_pricing()
    )


def test_pareto_front() -> None:
    # (cost, accuracy): the second point is dominated by the first.
    assert pareto_front([(1.0, 50.0), (2.0, 40.0), (3.0, 70.0), (0.5, 10.0)]) == [3, 0, 2]


@needs_chromium
def test_report_html_opens_with_its_plots(tmp_path: Path) -> None:
    runs = [_metrics(tmp_path, "gpt-5", 300), _metrics(tmp_path, "gpt-5.5", 300)]
    page = write_html_report(runs, tmp_path / "report", pareto=True)
    plots = {"pareto", "depth", "tools", "answer_times", "accuracy_budget"}
    assert {p.stem for p in page.parent.glob("*.png")} == plots
    dom = dump_dom(page.as_uri(), tmp_path / "profile")
    assert 'data-images-loaded="5"' in dom and 'data-images-total="5"' in dom
    assert "gpt-5.5" in dom and 'src="pareto.png"' in dom
