"""The shipped config files stay valid."""

import os
from pathlib import Path

import pytest
import yaml

from piserini_ray.config import RunConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


#: The head of `configs/default.yaml`; the rest is `RunConfig()` dumped, every field.
DEFAULT_HEADER = """\
# Every default of a run config, written out: generated from the built-in defaults (RunConfig())
# by tests/config/test_configs_dir.py, which fails when they differ (UPDATE_GOLDEN=1 pytest
# tests/config/test_configs_dir.py writes it again). Each key is described in the configuration
# reference (docs/reference/configuration.md). `piserini-ray run --config configs/default.yaml`
# is the same as `piserini-ray run`; copy the sections you change into a config of your own.
"""


def default_yaml() -> str:
    data = RunConfig().model_dump(mode="json")
    return DEFAULT_HEADER + yaml.safe_dump(data, sort_keys=False, width=100)


def test_default_yaml_writes_out_every_built_in_default() -> None:
    path = CONFIGS / "default.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(default_yaml())
    assert path.read_text() == default_yaml(), (
        f"{path} is not the built-in defaults written out: run "
        "UPDATE_GOLDEN=1 pytest tests/config/test_configs_dir.py and review the difference"
    )
    assert load_config(path) == RunConfig()
    written = yaml.safe_load(path.read_text())
    assert set(written) == set(RunConfig.model_fields)  # every section, none left out


def test_browsecomp_plus_example_is_valid() -> None:
    cfg = load_config(CONFIGS / "browsecomp-plus.yaml")
    assert cfg.benchmark.source == "browsecomp-plus" and cfg.benchmark.canary
    data = Path.home() / "piserini_ray_data" / "browsecomp-plus"
    assert cfg.benchmark.queries == data / "queries.parquet"  # a node path, not in the checkout
    assert cfg.slice.ids is not None and len(cfg.slice.ids) == 9


def test_the_paper_models_have_their_routes_keys_and_prices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from piserini_ray.metrics.cost import load_pricing
    from piserini_ray.preflight import preflight
    from piserini_ray.sweep import expand_sweep, reference_run

    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "DEEPSEEK_API_KEY"):
        monkeypatch.setenv(key, "set-for-the-test")
    files = sorted((CONFIGS / "models").glob("*.yaml"))
    sweep = CONFIGS / "sweep_paper_models.yaml"
    runs = expand_sweep(sweep, tmp_path)
    assert sorted(c.model.name for c, _ in runs) == sorted(f.stem for f in files)
    table = load_pricing()
    for config, _ in runs:
        model = config.model
        route = model.resolved_litellm_model().split("/")[0]
        assert route in {"openai", "anthropic", "deepseek"} and model.api_key_env
        assert model.reasoning_effort is not None and table.price(model.name) is not None
        if route == "anthropic":  # above litellm's thinking budget, or Anthropic refuses
            assert (model.max_output_tokens or 0) > 4096
        config_with_data = config.model_copy(update={"benchmark": RunConfig().benchmark})
        preflight(config_with_data)  # priced, keys named and set
    reference = reference_run(sweep, runs)
    assert reference is not None and "gpt-5.yaml" in reference.name
    one = load_config(None, {"model": str(CONFIGS / "models" / "claude-haiku-4.5.yaml")})
    assert one.model.litellm_model == "anthropic/claude-haiku-4-5"


def test_the_decided_sweep_compares_every_model_with_gpt5(tmp_path: Path) -> None:
    from piserini_ray.sweep import expand_sweep, load_sweep, reference_run

    sweep = CONFIGS / "sweep_decided.yaml"
    settings = load_sweep(sweep).stop_when_decided
    assert settings is not None and settings.alpha == 0.05 and settings.metric == "accuracy"
    runs = expand_sweep(sweep, tmp_path)
    reference = reference_run(sweep, runs)
    assert reference is not None and "gpt-5.yaml" in reference.name
    assert len({config.slice.model_dump_json() for config, _ in runs}) == 1  # comparable


def test_the_batch_configs_are_valid_and_priced_at_the_batch_tier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`configs/models/batch/` (the paper's OpenAI and Anthropic models at the batch tier) and
    `configs/batch_offline.yaml` (the sample at the batch tier, rehearsed on the offline
    provider under real names and prices) pass preflight; the rehearsal's standard twin
    differs only in the tier."""
    from piserini_ray.metrics.cost import load_pricing
    from piserini_ray.preflight import preflight

    monkeypatch.setenv("OPENAI_API_KEY", "set-for-the-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "set-for-the-test")
    table = load_pricing()
    for path in sorted((CONFIGS / "models" / "batch").glob("*.yaml")):
        config = load_config(None, {"model": str(path), "agent": {"termination": "iterations"}})
        assert config.model.service_tier == "batch"
        assert table.model_price(config.model) == table.price(config.model.name, "batch")
        preflight(config)
    rehearsal = load_config(CONFIGS / "batch_offline.yaml")
    assert rehearsal.offline.serves(rehearsal.model)
    assert rehearsal.offline.serves(rehearsal.judge_model())
    preflight(rehearsal)  # no key needed: the run's offline provider serves both
    standard = load_config(
        CONFIGS / "batch_offline.yaml",
        {"model.service_tier": "standard", "judge.model.service_tier": "standard"},
    )
    preflight(standard)
    price, batch = table.model_price(standard.model), table.model_price(rehearsal.model)
    assert price is not None and batch is not None and batch.input == 0.5 * price.input
