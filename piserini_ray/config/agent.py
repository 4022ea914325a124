"""The `agent` and `tools` sections: the ReAct loop's budget and termination, and the three
tools' paging, caching, excerpt and spill limits."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from piserini_ray.config.base import StrictModel


class ToolsConfig(StrictModel):
    """Paging, caching, excerpt and spill limits of the three tools (docs/spec.md §3)."""

    IDENTITY = (
        "first_page",
        "browse_offset",
        "browse_limit",
        "max_browse_limit",
        "doc_offset",
        "doc_limit",
        "max_doc_limit",
        "cache_size",
        "excerpt_ranks",
        "excerpt_chars",
        "excerpt_lead",
        "spill_max_lines",
        "spill_max_bytes",
        "reason_max_words",
    )
    NOT_IDENTITY = ()

    first_page: int = Field(5, ge=1)
    browse_offset: int = Field(6, ge=1)
    browse_limit: int = Field(10, ge=1)
    max_browse_limit: int = Field(1000, ge=1)
    doc_offset: int = Field(1, ge=1)
    doc_limit: int = Field(200, ge=1)
    max_doc_limit: int = Field(10_000, ge=1)
    cache_size: int = Field(32, ge=1)
    excerpt_ranks: int = Field(50, ge=0)
    excerpt_chars: int = Field(220, ge=20)
    excerpt_lead: int = Field(55, ge=0)
    spill_max_lines: int = Field(2000, ge=1)
    spill_max_bytes: int = Field(50_000, ge=100)
    reason_max_words: int = Field(100, ge=1)


class AgentConfig(StrictModel):
    """The ReAct loop's budget and termination policy (docs/spec.md §4)."""

    IDENTITY = ("budget_seconds", "steer_fraction", "budget_clock", "termination", "max_iterations")
    NOT_IDENTITY = ()

    budget_seconds: float = Field(300.0, gt=0)
    steer_fraction: float = Field(0.7, gt=0, le=1)
    #: `working`: the budget charges model and tool time only; limiter and back-off waits are
    #: recorded but not charged. `wall`: plain wall-clock.
    budget_clock: Literal["working", "wall"] = "working"
    termination: Literal["time", "iterations", "both"] = "time"
    max_iterations: int = Field(100, ge=1)
