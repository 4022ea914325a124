"""`piserini-ray estimate --pilot N`: a seeded pilot in the run's own directory, a projection
of the whole slice, and the full run's actual figures inside the projection's intervals."""

from __future__ import annotations

from pathlib import Path

import orjson

from piserini_ray.cli import main
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.records import Usage

SLICE, PILOT = 30, 10


def _records(run_dir: Path) -> list[dict]:
    return [orjson.loads(x) for x in (run_dir / "records.jsonl").read_bytes().splitlines()]


def test_the_projection_holds_the_full_runs_actual_cost_and_tokens(
    tmp_path: Path, index_root: Path, sample_index: Path, capsys
) -> None:
    with OfflineProvider(OfflineConfig(model_aliases={"gpt-5": "offline/heuristic"})) as p:
        config = tmp_path / "c.yaml"
        config.write_text(
            f"slice: {{sample: {SLICE}, seed: 3}}\n"
            f"retrieval: {{index_root: {index_root}}}\n"
            f"model: {{name: gpt-5, litellm_model: openai/gpt-5, api_base: '{p.base_url}'}}\n"
        )
        run_dir = tmp_path / "run"
        common = ["--config", str(config), "--run-dir", str(run_dir), "--engine", "local"]
        assert main(["estimate", *common, "--pilot", str(PILOT)]) == 0
        out = capsys.readouterr().out
        assert f"a pilot of {PILOT} of {SLICE} queries" in out and "makespan" in out
        assert len(_records(run_dir)) == PILOT  # the pilot ran in the run's own directory
        assert main(["run", *common]) == 0  # the full run: the other 20 only
    estimate = orjson.loads((run_dir / "estimate.json").read_bytes())
    records = _records(run_dir)
    assert len(records) == len({r["query_id"] for r in records}) == SLICE
    price = load_pricing().price("gpt-5")
    assert price is not None
    usages = [Usage.model_validate(r["usage"]) for r in records]
    cost = sum(price.cost(u) for u in usages)
    tokens = sum(u.input_tokens + u.output_tokens for u in usages)
    low, high = estimate["cost_usd"]["ci95"]
    assert low <= cost <= high, (low, cost, high)
    low, high = estimate["tokens"]["ci95"]
    assert low <= tokens <= high
    assert estimate["makespan_bound"] == "agent loops" and estimate["concurrency"] == 4
