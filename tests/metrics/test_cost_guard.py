"""`pricing.max_cost_usd`: a run stops within one query of its cost cap, says so, and resumes
with a higher cap, every query recorded once."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from piserini_ray.config import RunConfig, load_config
from piserini_ray.metrics.cost import CostGuard, Price, load_pricing
from piserini_ray.offline import OfflineConfig
from piserini_ray.pipeline import run_local
from piserini_ray.records import Usage
from piserini_ray_testkit import EmulatedProvider, Scripted


def test_the_guard_projects_the_queries_in_flight() -> None:
    price = Price(input=1.0, output=0, cache_read=0)  # $1 per million input tokens
    guard = CostGuard(cap=0.010, price=price)
    assert guard.may_start(in_flight=5)  # nothing known yet: no projection
    for _ in range(3):
        guard.finished(Usage(input_tokens=2000))  # $0.002 each
    assert guard.spent == pytest.approx(0.006)
    assert guard.may_start(in_flight=1)  # 0.006 + 2 x 0.002 = 0.010
    assert not guard.may_start(in_flight=2)  # 0.006 + 3 x 0.002 > 0.010
    assert guard.refused == 1 and "1 queries not started" in (guard.stop_reason() or "")
    assert CostGuard(None, price).may_start(100) and CostGuard(1.0, None).may_start(100)


def _records(run_dir: Path) -> list[dict]:
    return [orjson.loads(x) for x in (run_dir / "records.jsonl").read_bytes().splitlines()]


def test_a_run_stops_within_one_query_of_the_cap_and_resumes_with_a_higher_one(
    tmp_path: Path, index_root: Path, sample_index: Path
) -> None:
    price = load_pricing().price("gpt-5")
    assert price is not None
    with EmulatedProvider(OfflineConfig(model_aliases={"gpt-5": "offline/heuristic"})) as p:

        def config(cap: float | None) -> RunConfig:
            return load_config(None, {
                "slice.sample": 12, "retrieval.index_root": str(index_root),
                "model": {"name": "gpt-5", "litellm_model": "openai/gpt-5",
                          "api_base": p.base_url},
                "pricing.max_cost_usd": cap,
            })  # fmt: skip

        run_dir = tmp_path / "run"
        cap = 0.02
        summary = run_local(config(cap), run_dir, concurrency=1, log=lambda _m: None)
        costs = [price.cost(Usage.model_validate(r["usage"])) for r in _records(run_dir)]
        assert summary.stopped is not None and "cost cap" in summary.stopped
        assert 0 < len(costs) < 12
        assert cap - max(costs) <= sum(costs) <= cap + max(costs)  # within one query
        more = run_local(config(None), run_dir, concurrency=1, log=lambda _m: None)
    assert more.stopped is None and more.ran_now == 12 - len(costs)
    ids = [r["query_id"] for r in _records(run_dir)]
    assert len(ids) == len(set(ids)) == 12


def test_a_provider_refusing_the_run_stops_it_and_a_resume_runs_everything(
    tmp_path: Path, index_root: Path, sample_index: Path
) -> None:
    """A bad key mid-run (after the check before it): the refused query and the rest get no
    record, the summary says why, and a resume after the fix runs every query once."""
    with EmulatedProvider(OfflineConfig()) as p:
        config = load_config(
            None,
            {
                "slice.sample": 6,
                "retrieval.index_root": str(index_root),
                "model.api_base": p.base_url,
            },
        )
        p.script(Scripted(kind="auth_error"))
        stopped = run_local(config, tmp_path / "run", concurrency=1, log=lambda _m: None)
        assert stopped.stopped is not None and "the provider refused the run" in stopped.stopped
        assert "AuthenticationError" in stopped.stopped and stopped.ran_now == 0
        assert not (tmp_path / "run" / "records.jsonl").read_bytes()
        fixed = run_local(config, tmp_path / "run", concurrency=1, log=lambda _m: None)
    assert fixed.stopped is None and fixed.ran_now == 6 and fixed.statuses == {"completed": 6}
