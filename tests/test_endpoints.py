"""Which address serves a model, and who pays a served judge (`piserini_ray/endpoints.py`):
its servers start on first use where the engine places them, stop when the endpoints close,
and their hours are charged to the runs the judge judged, shared equally, as judge cost."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from piserini_ray.config import ModelConfig, RunConfig, load_config
from piserini_ray.config.serving import ServeConfig
from piserini_ray.endpoints import ModelEndpoints, StopServers
from piserini_ray.errors import ConfigError
from piserini_ray.pipeline import reduce
from piserini_ray.store import RunStore, read_served

GRADER = ModelConfig(
    name="grader",
    serve=ServeConfig(engine="vllm", model="Qwen/Qwen3-32B", price_per_replica_hour=4.0),
)
AGENT = ModelConfig(name="agent", serve=ServeConfig(engine="llama.cpp", model="m.gguf"))


class Placed:
    """Where a test's served models go: an address each, and their stops as they come."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.stopped: list[str] = []

    def __call__(self, model: ModelConfig) -> tuple[str, StopServers]:
        self.started.append(model.name)

        def stop() -> tuple[float, int]:
            self.stopped.append(model.name)
            return 900.0, 2  # two servers, up 15 minutes

        return f"http://10.0.0.9:800{len(self.started)}/v1", stop


def test_a_served_judges_hours_are_shared_by_the_runs_it_judged_as_their_judge_cost(
    finished_run: tuple[Path, RunConfig], tmp_path: Path
) -> None:
    source, config = finished_run
    config = config.model_copy(update={"judge": config.judge.model_copy(update={"model": GRADER})})
    first, second = tmp_path / "first", tmp_path / "second"
    for run_dir in (first, second):
        shutil.copytree(source, run_dir)
    placed = Placed()
    with RunStore(first, config) as one, RunStore(second, config) as two:
        with ModelEndpoints(place=placed) as endpoints:
            base = endpoints.api_base(GRADER, config.offline, one)
            assert endpoints.api_base(GRADER, config.offline, two) == base  # started once
            assert endpoints.api_base(GRADER, config.offline, two) == base
            endpoints.api_base(AGENT, config.offline)  # an agent's hours: its engine's to charge
            assert placed.started == ["grader", "agent"] and not placed.stopped
        assert placed.stopped == ["grader", "agent"]
    # 2 servers x 900 s, shared by the two runs it judged; nothing for the agent here.
    expected = [("grader", "vllm", "judge", 2, 900.0, 4.0)]
    for run_dir in (first, second):
        lines = read_served(run_dir)
        assert [
            (s.model, s.engine, s.role, s.replicas, s.seconds, s.price_per_replica_hour)
            for s in lines
        ] == expected
    metrics = reduce(config, first, lambda _m: None)
    assert metrics.judge_cost_usd == pytest.approx(1.0)  # 900 s x $4 per hour; tokens free
    assert metrics.served is None and metrics.judge_served is not None
    assert metrics.cost_usd == reduce(config, source, lambda _m: None).cost_usd  # unchanged
    report = (first / "report.md").read_text()
    assert "(+ judge $1.0000, served by vllm: 0.2500 server-hours x $4 = $1.0000" in report


def test_an_agents_served_time_is_the_runs_cost_and_old_lines_are_the_agents(
    finished_run: tuple[Path, RunConfig], tmp_path: Path
) -> None:
    source, config = finished_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    before = reduce(config, run_dir, lambda _m: None)
    with (run_dir / "served.jsonl").open("w") as lines:  # as a run wrote it before `role`
        lines.write(
            '{"model": "agent", "engine": "llama.cpp", "replicas": 1, "seconds": 3600.0, '
            '"price_per_replica_hour": 2.0, "at": "2026-12-07T00:00:00Z"}\n'
        )
    after = reduce(config, run_dir, lambda _m: None)
    assert read_served(run_dir)[0].role == "agent"
    assert after.cost_usd == pytest.approx((before.cost_usd or 0.0) + 2.0)
    assert after.judge_cost_usd == before.judge_cost_usd and after.judge_served is None


def test_a_served_judge_runs_one_server() -> None:
    judge = {"name": "grader", "serve": {"engine": "vllm", "model": "m", "replicas": 2}}
    with pytest.raises(
        ConfigError, match=r"judge 'grader': serve.replicas is 2.*judge.concurrency"
    ):
        load_config(None, {"judge.model": judge})
