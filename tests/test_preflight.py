"""Config errors stop a run before any work, with the field and the fix."""

from pathlib import Path

import pytest

from piserini_ray.config import load_config
from piserini_ray.errors import ConfigError
from piserini_ray.preflight import preflight
from piserini_ray.sweep import expand_sweep

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_pass() -> None:
    preflight(load_config(None))


def test_unpriced_model(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"'mystery-model' is not in the pricing table"):
        preflight(load_config(None, {"model.name": "mystery-model", "model.api_base": "http://x"}))


def test_missing_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PISERINI_NO_SUCH_KEY", raising=False)
    config = load_config(None, {"model.name": "gpt-5", "model.api_key_env": "PISERINI_NO_SUCH_KEY"})
    with pytest.raises(ConfigError, match="export PISERINI_NO_SUCH_KEY="):
        preflight(config)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        preflight(load_config(None, {"model.name": "gpt-5"}))


def test_missing_data_file(tmp_path: Path) -> None:
    config = load_config(
        None,
        {
            "benchmark.source": "jsonl",
            "benchmark.queries": str(tmp_path / "q.jsonl"),
            "benchmark.corpus": str(tmp_path / "c.jsonl"),
        },
    )
    with pytest.raises(ConfigError, match=r"benchmark\.queries: .*q\.jsonl does not exist"):
        preflight(config)


def test_shipped_sweeps_and_cluster_file(tmp_path: Path) -> None:
    from piserini_ray.sweep import reference_run

    runs = expand_sweep(ROOT / "configs" / "sweep_offline.yaml", tmp_path)
    assert len(runs) == 4
    reference = reference_run(ROOT / "configs" / "sweep_offline.yaml", runs)
    assert reference is not None and reference.name.startswith("name=offline_heuristic-")
    assert "budget_seconds=300" in reference.name
    # Agent policies only: the exact-match judge as an agent answers without searching.
    assert {c.model.name for c, _ in runs} == {"offline/heuristic", "offline/long-horizon"}
    for config, _ in runs:
        preflight(config)
    paper = expand_sweep(ROOT / "configs" / "sweep_models_timeouts.yaml", tmp_path)
    assert {(c.model.name, c.agent.budget_seconds) for c, _ in paper} == {
        ("gpt-5", 300),
        ("gpt-5", 3600),
        ("gpt-5.5", 300),
        ("gpt-5.5", 3600),
    }
    assert all(
        c.retrieval.bm25.k1 == 25 and c.benchmark.source == "browsecomp-plus" for c, _ in paper
    )


def test_litellm_prices_only_when_allowed() -> None:
    from piserini_ray.metrics.cost import pricing_for

    config = load_config(None, {"model.name": "gpt-4o", "model.api_base": "http://x"})
    with pytest.raises(ConfigError, match="allow_litellm_prices"):
        preflight(config)
    allowed = load_config(
        None,
        {
            "model.name": "gpt-4o",
            "model.api_base": "http://x",
            "pricing.allow_litellm_prices": True,
        },
    )
    preflight(allowed)
    table = pricing_for(allowed)
    assert table.price("gpt-4o").input > 0 and "litellm" in table.source("gpt-4o")
    assert table.source("gpt-5").startswith("table ")
    assert allowed.config_hash() == config.config_hash()  # pricing is not a run's identity


def test_the_judge_is_checked_too_and_free_rehearsals_get_a_free_judge(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "q.jsonl").write_text('{"query_id": "1", "query": "q", "answer": "a"}\n')
    (tmp_path / "c.jsonl").write_text('{"docid": "d", "text": "t"}\n')
    data = {
        "benchmark.source": "jsonl",
        "benchmark.queries": str(tmp_path / "q.jsonl"),
        "benchmark.corpus": str(tmp_path / "c.jsonl"),
    }
    rehearsal = load_config(None, data)
    assert rehearsal.judge_model().name == "offline/exact-match-judge"
    preflight(rehearsal)
    monkeypatch.setenv("MY_KEY", "x")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    paid = load_config(None, data | {"model.name": "gpt-5", "model.api_key_env": "MY_KEY"})
    assert paid.judge_model().name == "gpt-5.3-codex"
    with pytest.raises(ConfigError, match=r"judge\.model 'gpt-5\.3-codex' needs OPENAI_API_KEY"):
        preflight(paid)


def test_a_sweep_reference_must_name_one_run_of_the_grid(tmp_path: Path) -> None:
    from piserini_ray.sweep import reference_run

    sweep = tmp_path / "s.yaml"
    grid = "grid:\n  model.name: [offline/heuristic, offline/long-horizon]\n"
    sweep.write_text(grid + "reference: {model.name: gpt-5}\n")
    with pytest.raises(ConfigError, match=r"reference\.model\.name: 'gpt-5' is not among"):
        expand_sweep(sweep, tmp_path)
    sweep.write_text(grid + "reference: {agent.budget_seconds: 300}\n")
    with pytest.raises(ConfigError, match=r"reference\.agent\.budget_seconds is not a swept field"):
        expand_sweep(sweep, tmp_path)
    sweep.write_text(
        grid + "  agent.budget_seconds: [150, 300]\nreference: {model.name: offline/heuristic}\n"
    )
    with pytest.raises(ConfigError, match="matches 2 runs, not one"):
        reference_run(sweep, expand_sweep(sweep, tmp_path))


def test_the_termination_sweeps_are_the_papers_rows(tmp_path: Path) -> None:
    from piserini_ray.sweep import reference_run

    for name, short, long in (
        ("sweep_termination.yaml", 300, 3600),
        ("sweep_termination_offline.yaml", 9, 108),
    ):
        runs = expand_sweep(ROOT / "configs" / name, tmp_path)
        policies = [
            (c.agent.termination, c.agent.budget_seconds, c.agent.max_iterations) for c, _ in runs
        ]
        assert policies == [("time", short, 100), ("iterations", 300, 100), ("time", long, 100)]
        assert reference_run(ROOT / "configs" / name, runs) == runs[0][1]
        assert len({d for _, d in runs}) == 3
