"""Sweeps: one base config and a grid of field values, expanded into runs (models x timeouts x
BM25 presets, or any other listed field). Each run gets its own run directory, named by its
values and config hash, so the whole sweep resumes by running it again."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from piserini_ray.config import RunConfig, load_config, read_yaml
from piserini_ray.errors import ConfigError, describe_validation_error


class SweepConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The base run config (a path relative to the sweep file), or none for the defaults.
    base: str | None = None
    #: Dotted field -> values, e.g. `model.name: [offline/heuristic, gpt-5]`,
    #: `agent.budget_seconds: [150, 300]`, `retrieval.preset: [piserini, pyserini-default]`.
    grid: dict[str, list[Any]] = Field(min_length=1)
    #: Other overrides applied to every run.
    set: dict[str, Any] = Field(default_factory=dict)
    name: str = "sweep"


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(value)).strip("_")


def expand_sweep(path: Path, root: Path | None = None) -> list[tuple[RunConfig, Path]]:
    """The runs of a sweep file with their run directories under `root/<sweep name>/` (default:
    each run's `runtime.runs_root`)."""
    data = read_yaml(path, "sweep file")
    try:
        sweep = SweepConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"sweep file {path} is invalid: {describe_validation_error(e)}") from None
    base = (Path(path).resolve().parent / sweep.base) if sweep.base else None
    fields = list(sweep.grid)
    runs = []
    for values in itertools.product(*(sweep.grid[f] for f in fields)):
        overrides = dict(sweep.set) | dict(zip(fields, values, strict=True))
        config = load_config(base, overrides)
        label = "-".join(
            f"{f.rsplit('.', 1)[-1]}={_slug(v)}" for f, v in zip(fields, values, strict=True)
        )
        folder = root if root is not None else config.runtime.resolved_runs_root()
        runs.append((config, folder / sweep.name / f"{label}-{config.config_hash()[:8]}"))
    return runs
