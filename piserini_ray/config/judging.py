"""The `judge` and `pricing` sections: what happens after a run (its judge or judge panel, and
where its prices come from). Neither is part of a run's identity."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from piserini_ray.config.base import StrictModel
from piserini_ray.config.model import ModelConfig

DEFAULT_JUDGE = "gpt-5.3-codex"
OFFLINE_JUDGE = "offline/exact-match-judge"


class JudgeConfig(StrictModel):
    """The LLM judge of docs/spec.md §6. `model: null` picks the default: the offline exact-match
    judge for the embedded sample or an offline model, `gpt-5.3-codex` (low reasoning effort)
    otherwise."""

    # Not identity: judging is after the run: a second judge adds verdicts to the same run.
    IDENTITY = ()
    NOT_IDENTITY = (
        "model",
        "models",
        "panel_ties",
        "max_parse_retries",
        "concurrency",
        "seed",
        "batch_poll_seconds",
        "template",
    )

    model: ModelConfig | None = None
    #: A panel: every answer is judged by each of these models and the verdict is their
    #: majority (`reports/panel.py`); the first is the run's own judge. Empty: `model` alone.
    models: list[ModelConfig] = Field(default_factory=list)
    #: What a tied panel counts as (it is flagged in the report either way).
    panel_ties: Literal["incorrect", "correct"] = "incorrect"
    #: Extra calls when a reply does not parse as a complete judgement.
    max_parse_retries: int = Field(2, ge=0)
    concurrency: int = Field(16, ge=1)
    seed: int = 0  # bootstrap intervals of the report
    #: How often a judge at `service_tier: batch` asks whether its batch has finished.
    batch_poll_seconds: float = Field(30.0, gt=0)
    #: The judge's prompt and reply format: ours (JSON, docs/spec.md §6), or BrowseComp-Plus's
    #: grader verbatim, its reply parsed as their evaluate_run.py parses it
    #: (`judging/templates.py`). Each verdict records its template; a verdict already given is
    #: not judged again when this changes.
    template: Literal["piserini", "browsecomp-plus"] = "piserini"

    @model_validator(mode="after")
    def _one_way_to_name_the_judge(self) -> JudgeConfig:
        if self.models and self.model is not None:
            raise ValueError(
                "set judge.model (one judge) or judge.models (a panel), not both: the panel's "
                "first model is the run's own judge"
            )
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"judge.models names a model twice: {names}")
        return self


class PricingConfig(StrictModel):
    """Where prices come from (docs/spec.md §8). A model missing from the table stops a run
    before any work, unless `allow_litellm_prices` lets litellm's price map fill in (the report
    says so)."""

    # Not identity: what a run costs, not what it answers.
    IDENTITY = ()
    NOT_IDENTITY = ("table", "allow_litellm_prices", "max_cost_usd")

    table: Path | None = None  # default: the package's own table (configs/pricing.yaml)
    allow_litellm_prices: bool = False
    #: Spend at most this on the agent's calls (USD; resumed records count): no query starts
    #: once spent + the projected cost of those in flight would pass it. Not identity: resume
    #: with a higher cap continues the same run.
    max_cost_usd: float | None = Field(None, gt=0)
