"""Sweeps: one base config and a grid of field values, expanded into runs (models x timeouts x
BM25 presets, or any other listed field). Each run gets its own run directory, named by its
values and config hash, so the whole sweep resumes by running it again."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from piserini_ray.analysis.stopping import StopWhenDecided
from piserini_ray.config import RunConfig, load_config, read_yaml
from piserini_ray.errors import ConfigError, describe_validation_error


class SweepConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The base run config (a path relative to the sweep file), or none for the defaults.
    base: str | None = None
    #: Dotted field -> values, e.g. `model.name: [offline/heuristic, gpt-5]`,
    #: `agent.budget_seconds: [150, 300]`, `retrieval.preset: [piserini, pyserini-default]`.
    grid: dict[str, list[Any]] | None = Field(None, min_length=1)
    #: Or the runs one by one, each a dict of dotted overrides (rows that are not a product,
    #: e.g. the paper's 300 s, 100 iterations, 3600 s: `configs/sweep_termination.yaml`).
    variants: list[dict[str, Any]] | None = Field(None, min_length=1)
    #: Other overrides applied to every run.
    set: dict[str, Any] = Field(default_factory=dict)
    name: str = "sweep"
    #: The grid (or variant) values of the run the others are compared with, e.g.
    #: `{model.name: offline/heuristic, agent.budget_seconds: 300}`: the combined report then
    #: holds a paired comparison (`piserini-ray compare`) of every run against it.
    reference: dict[str, Any] | None = None
    #: Stop each run once its comparison with the reference is decided (`analysis/stopping.py`):
    #: `{alpha: 0.05, metric: accuracy, min_queries: 0, seed: 0, reference: ...}`.
    stop_when_decided: StopWhenDecided | None = None

    @model_validator(mode="after")
    def _one_kind_and_a_known_reference(self) -> SweepConfig:
        if (self.grid is None) == (self.variants is None):
            raise ValueError("a sweep takes either `grid` or `variants`, not both or neither")
        values: dict[str, list[Any]] = {}
        for variant in self.runs():
            for field, value in variant.items():
                values.setdefault(field, []).append(value)
        stop = self.stop_when_decided
        if stop is not None:
            if stop.reference is None and self.reference is None:
                raise ValueError(
                    "stop_when_decided compares every run with a reference run, and the sweep "
                    "names none: give `reference: {<swept field>: <value>, ...}`"
                )
            if stop.reference is not None and self.reference not in (None, stop.reference):
                raise ValueError(
                    f"stop_when_decided.reference {stop.reference} is not the sweep's "
                    f"reference {self.reference}: give one of them"
                )
            if len(self.runs()) < 2:
                raise ValueError(
                    "stop_when_decided needs at least two runs: a reference and another"
                )
        for field, value in (self.comparison_reference or {}).items():
            if field not in values:
                raise ValueError(f"reference.{field} is not a swept field ({', '.join(values)})")
            if value not in values[field]:
                raise ValueError(f"reference.{field}: {value!r} is not among {values[field]}")
        return self

    @property
    def comparison_reference(self) -> dict[str, Any] | None:
        """The reference run's values: the sweep's, or `stop_when_decided`'s."""
        if self.stop_when_decided is not None and self.stop_when_decided.reference is not None:
            return dict(self.stop_when_decided.reference)
        return self.reference

    def runs(self) -> list[dict[str, Any]]:
        """Each run's own values: the grid's product, or the variants as listed."""
        if self.variants is not None:
            return [dict(v) for v in self.variants]
        grid = self.grid or {}
        return [
            dict(zip(grid, values, strict=True))
            for values in itertools.product(*(grid[f] for f in grid))
        ]


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(value)).strip("_")


def load_sweep(path: Path) -> SweepConfig:
    try:
        return SweepConfig.model_validate(read_yaml(path, "sweep file"))
    except ValidationError as e:
        raise ConfigError(f"sweep file {path} is invalid: {describe_validation_error(e)}") from None


def reference_run(path: Path, runs: list[tuple[RunConfig, Path]]) -> Path | None:
    """The run directory of the sweep's `reference` (None when it names none): the run whose
    own swept values include every value the reference gives."""
    sweep = load_sweep(path)
    reference = sweep.comparison_reference
    if not reference:
        return None
    matching = [
        run_dir
        for values, (_, run_dir) in zip(sweep.runs(), runs, strict=True)
        if all(field in values and values[field] == v for field, v in reference.items())
    ]
    if len(matching) != 1:
        raise ConfigError(
            f"sweep file {path}: reference {reference} matches {len(matching)} runs, not one; "
            "give a value for every swept field"
        )
    return matching[0]


def expand_sweep(path: Path, root: Path | None = None) -> list[tuple[RunConfig, Path]]:
    """The runs of a sweep file with their run directories under `root/<sweep name>/` (default:
    each run's `runtime.runs_root`)."""
    sweep = load_sweep(path)
    base = (Path(path).resolve().parent / sweep.base) if sweep.base else None
    runs = []
    for values in sweep.runs():
        config = load_config(base, dict(sweep.set) | values)
        label = "-".join(f"{f.rsplit('.', 1)[-1]}={_slug(v)}" for f, v in values.items())
        folder = root if root is not None else config.runtime.resolved_runs_root()
        runs.append((config, folder / sweep.name / f"{label}-{config.config_hash()[:8]}"))
    return runs
