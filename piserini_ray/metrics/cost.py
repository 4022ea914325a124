"""USD cost of token usage from a pricing table (docs/spec.md §8): uncached input = input − cached.

Input counts the prompts of calls cut at the budget or failed after they were sent too (their
`Usage.estimated_input_tokens`, counted locally since no provider reported them): the provider
bills a request it received, so they are priced as uncached input in every cost, and
`estimated_cost` says how much of a cost they are."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from piserini_ray.config import ModelConfig, RunConfig, read_yaml
from piserini_ray.errors import ConfigError, describe_validation_error
from piserini_ray.records import Usage

ServiceTier = Literal["standard", "flex", "batch"]
Tier = Literal["flex", "batch"]


class Price(BaseModel):
    """USD per million tokens."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float = Field(ge=0)
    cache_write: float | None = Field(None, ge=0)
    #: Writing to Anthropic's 1-hour cache; unset, twice the input price (Anthropic's rule).
    cache_write_1h: float | None = Field(None, ge=0)
    #: The prices of other service tiers as a share of these, every component alike (OpenAI's
    #: flex and Batch API, Anthropic's Message Batches: 0.5). A tier missing here is not sold
    #: for the model (a run asking for it stops before any work).
    tiers: dict[Tier, float] = Field(default_factory=dict)

    def at(self, tier: ServiceTier) -> Price | None:
        """These prices at `tier`; None when the table sells no such tier for the model."""
        if tier == "standard":
            return self
        share = self.tiers.get(tier)
        if share is None:
            return None
        return Price(
            input=self.input * share,
            output=self.output * share,
            cache_read=self.cache_read * share,
            cache_write=None if self.cache_write is None else self.cache_write * share,
            cache_write_1h=self.write_1h * share,
        )

    @property
    def write_1h(self) -> float:
        return 2 * self.input if self.cache_write_1h is None else self.cache_write_1h

    def cost(self, usage: Usage) -> float:
        uncached = max(0, usage.input_tokens - usage.cached_tokens - usage.cache_write_tokens)
        write_price = self.input if self.cache_write is None else self.cache_write
        written_5m = usage.cache_write_tokens - usage.cache_write_1h_tokens
        return (
            uncached * self.input
            + usage.cached_tokens * self.cache_read
            + written_5m * write_price
            + usage.cache_write_1h_tokens * self.write_1h
            + usage.output_tokens * self.output
        ) / 1_000_000

    def estimated_cost(self, usage: Usage) -> float:
        """The part of `cost(usage)` that is estimated: the prompts no provider reported
        (`usage.estimated_input_tokens`), at the input price."""
        return usage.estimated_input_tokens * self.input / 1_000_000


def cost_text(cost: float | None, estimated: float | None, calls: int, digits: int = 4) -> str:
    """A run's cost in words: `$X`, and when calls were cut or failed after sending, `$X (of
    which $Y estimated for N calls cut at the budget or failed after sending)`; "not priced"
    without a price."""
    if cost is None:
        return "not priced"
    text = f"${cost:,.{digits}f}"
    if calls:
        text += (
            f" (of which ${estimated or 0.0:,.{digits}f} estimated for {calls} "
            f"call{'s' if calls != 1 else ''} cut at the budget or failed after sending)"
        )
    return text


class PricingTable(BaseModel):
    models: dict[str, Price]
    #: Opt-in: price models missing from the table with litellm's own price map (and say so).
    allow_litellm: bool = False
    path: str = ""

    def price(self, model: str, tier: ServiceTier = "standard") -> Price | None:
        """The model's prices at `tier` (None: unpriced, or no such tier in the table)."""
        if model in self.models:
            return self.models[model].at(tier)
        found = litellm_price(model) if self.allow_litellm else None
        return found.at(tier) if found is not None else None

    def model_price(self, model: ModelConfig) -> Price | None:
        """What a configured model's calls cost: its prices at its `service_tier` (a model the
        run serves: nothing per token; its servers' hours are charged apart, `served.jsonl`)."""
        if model.serve is not None:
            return Price(input=0, output=0, cache_read=0)
        return self.price(model.name, model.service_tier)

    def source(self, model: str, tier: ServiceTier = "standard") -> str:
        """Where a model's prices come from, and at which service tier, for the report."""
        at = ""
        if tier != "standard":
            share = self.models[model].tiers.get(tier) if model in self.models else None
            at = f", {tier} tier" + (f" ({share:g} x standard)" if share is not None else "")
        if model in self.models:
            return f"table {self.path}{at}"
        if self.allow_litellm and litellm_price(model) is not None:
            return f"litellm's price map (not in the table){at}"
        return "unpriced"


def _litellm_entry(model: str) -> dict[str, Any] | None:
    """litellm's price-map entry of a model: its name, without a route prefix, or with
    Anthropic's dashes for our dotted version (`claude-haiku-4.5` is `claude-haiku-4-5`)."""
    import litellm

    bare = model.split("/")[-1]
    for name in (model, bare, bare.replace(".", "-")):
        entry = litellm.model_cost.get(name)
        if entry and entry.get("input_cost_per_token") is not None:
            return dict(entry)
    return None


def litellm_price(model: str) -> Price | None:
    """A price from litellm's bundled map (per-token costs, scaled to per million)."""
    entry = _litellm_entry(model)
    if entry is None:
        return None
    per_million = 1_000_000
    cache_read = entry.get("cache_read_input_token_cost", entry["input_cost_per_token"])
    cache_write = entry.get("cache_creation_input_token_cost")
    cache_write_1h = entry.get("cache_creation_input_token_cost_above_1hr")
    return Price(
        input=entry["input_cost_per_token"] * per_million,
        output=(entry.get("output_cost_per_token") or 0) * per_million,
        cache_read=(cache_read or 0) * per_million,
        cache_write=None if cache_write is None else cache_write * per_million,
        cache_write_1h=None if cache_write_1h is None else cache_write_1h * per_million,
    )


class PriceDifference(BaseModel):
    model: str
    field: str  # input | output | cache_read | cache_write, or "model" when litellm lacks it
    ours: float | None
    litellm: float | None


def price_differences(table: PricingTable) -> list[PriceDifference]:
    """Where the table and litellm's bundled price map disagree (USD per million tokens), for
    every model of the table but the offline ones: `piserini-ray pricing check`."""
    found = []
    for model, ours in sorted(table.models.items()):
        if model.startswith("offline/"):
            continue
        theirs = litellm_price(model)
        if theirs is None:
            found.append(PriceDifference(model=model, field="model", ours=None, litellm=None))
            continue
        for field in ("input", "output", "cache_read", "cache_write"):
            a, b = getattr(ours, field), getattr(theirs, field)
            if field == "cache_write" and not a and not b:
                continue  # no write price on either side: a provider that bills no writes
            if a is None or b is None or abs(a - b) > 1e-9:
                found.append(PriceDifference(model=model, field=field, ours=a, litellm=b))
    return found


def default_pricing_path() -> Path:
    """The pricing table the package carries (`piserini_ray/pricing.yaml`, package data, so a
    wheel installed anywhere has it; a checkout's `configs/pricing.yaml` links to it)."""
    return Path(str(resources.files("piserini_ray").joinpath("pricing.yaml")))


def load_pricing(path: Path | None = None, allow_litellm: bool = False) -> PricingTable:
    path = path or default_pricing_path()
    data = read_yaml(path, "pricing table")
    try:
        return PricingTable.model_validate(
            data | {"allow_litellm": allow_litellm, "path": str(path)}
        )
    except ValidationError as e:
        raise ConfigError(
            f"pricing table {path} is invalid: {describe_validation_error(e)}"
        ) from None


def pricing_for(config: RunConfig) -> PricingTable:
    return load_pricing(config.pricing.table, config.pricing.allow_litellm_prices)


class CostGuard:
    """`pricing.max_cost_usd`: no new query starts once what the run has spent (its agent's
    calls, resumed records included) plus the projected cost of the queries in flight and the
    one about to start would pass the cap. A query's projected cost is the mean of those done
    (nothing before the first one ends), so a run stops within about one query of the cap. It
    also halts the run when the provider refuses its calls (`halt`). Spend includes the
    estimated prompts of calls cut at the budget or failed after sending (`estimated`)."""

    def __init__(
        self,
        cap: float | None,
        price: Price | None,
        spent: float = 0.0,
        done: int = 0,
        estimated: float = 0.0,
    ):
        self.cap = cap
        self.price = price
        self.spent = spent
        self.done = done
        #: Of `spent`, the estimate for calls no provider reported (their prompts).
        self.estimated = estimated
        self.refused = 0  # queries not started because of the cap
        self.halted: str | None = None  # the provider refused the run: nothing more starts

    def halt(self, reason: str) -> None:
        """The provider refuses the run's calls (`ProviderRefused`): start nothing more."""
        self.halted = self.halted or reason

    def may_start(self, in_flight: int) -> bool:
        if self.halted is not None:
            self.refused += 1
            return False
        if self.cap is None or self.price is None:
            return True
        mean = self.spent / self.done if self.done else 0.0
        if self.spent + mean * (in_flight + 1) <= self.cap:
            return True
        self.refused += 1
        return False

    def finished(self, usage: Usage) -> None:
        if self.price is not None:
            self.spent += self.price.cost(usage)
            self.estimated += self.price.estimated_cost(usage)
        self.done += 1

    def stop_reason(self) -> str | None:
        if self.halted is not None:
            return (
                f"the provider refused the run ({self.halted}); no query after it was recorded "
                "or started: fix it, then resume to run them"
            )
        if not self.refused:
            return None
        estimated = (
            f" (of which ${self.estimated:.4f} estimated for calls cut at the budget or failed "
            "after sending)"
            if self.estimated
            else ""
        )
        return (
            f"cost cap: ${self.spent:.4f} spent{estimated} of pricing.max_cost_usd "
            f"${self.cap:g}; "
            f"{self.refused} queries not started (resume with a higher cap to run them)"
        )
