"""The shipped config files stay valid."""

from pathlib import Path

from piserini_ray.config import RunConfig, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_default_yaml_equals_the_built_in_defaults() -> None:
    assert load_config(CONFIGS / "default.yaml") == RunConfig()


def test_browsecomp_plus_example_is_valid() -> None:
    cfg = load_config(CONFIGS / "browsecomp-plus.yaml")
    assert cfg.benchmark.source == "browsecomp-plus" and cfg.benchmark.canary
    data = Path.home() / "piserini_ray_data" / "browsecomp-plus"
    assert cfg.benchmark.queries == data / "queries.parquet"  # a node path, not in the checkout
    assert cfg.slice.ids is not None and len(cfg.slice.ids) == 9
